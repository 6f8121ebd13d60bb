"""``profctx.last_step()``: the step that just ended, as the timeline saw it, for the user's tracker."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, final

from ..util._errors import ConfigError
from ._owner import OWNER

if TYPE_CHECKING:
    from collections.abc import Mapping

#: The anomaly mark: a step slower than ``FACTOR`` times the median of the ``WINDOW`` steps before it
#: (at least ``MIN_STEPS`` of them), by ``MIN_S`` at least: ``profctx timeline``'s defaults.
FACTOR: Final = 2.0
WINDOW: Final = 20
MIN_STEPS: Final = 5
MIN_S: Final = 0.001


@final
@dataclass(frozen=True)
class RoleTime:
    """One top-level role's wall time in a step (``seconds``) over its ``count`` blocks."""

    seconds: float
    count: int


@final
@dataclass(frozen=True)
class StepTimes:
    """The wall times of one step and of its top-level roles (a nested role is part of its parent's).

    ``start`` is the wall clock (``time.time()``) at the step's entry; ``time_s`` its duration
    (monotonic clock); ``roles`` maps each top-level role to its :class:`RoleTime`, in the order
    first entered; ``marks`` holds ``"anomaly"`` when the step took over twice the median of the
    20 steps before it (at least 5 of them, and 1 ms more), the rule ``profctx timeline`` marks
    with by default.
    """

    step: int
    start: float
    time_s: float
    roles: Mapping[str, RoleTime]
    marks: tuple[str, ...] = ()

    @property
    def outside_roles_s(self) -> float:
        """The step's time in no top-level role (data loading, the loop's own code), never negative."""
        return max(self.time_s - sum(role.seconds for role in self.roles.values()), 0.0)

    def metrics(self, prefix: str = "timing_s/", *, step_name: str = "step",
                counts: str | None = None) -> dict[str, float]:
        """Return the times as tracker scalars: ``{prefix + step_name: time_s, prefix + role: seconds, ...}``.

        ``counts``, when given, is a second prefix under which each role's block count is added
        (``counts="timing_n/"`` gives ``timing_n/training_step: 2.0``). verl logs ``timing_s/...``.
        """
        out = {prefix + step_name: self.time_s}
        for name, role in self.roles.items():
            out[prefix + name] = role.seconds
        if counts is not None:
            for name, role in self.roles.items():
                out[counts + name] = float(role.count)
        return out


def last_step() -> StepTimes | None:
    """Return the times of the last step this process ended, or ``None`` (no step ended, no timeline).

    Read right after the step ends (the Trainer's ``on_step_end``, the line after a
    ``with profile_step(n):`` block): it folds what the timeline holds so far on the calling
    thread (a few microseconds per step not yet folded). Needs the timeline (``timeline=True``,
    the default, or ``summary_at_exit=True``) and a configured process; thread-safe.
    """
    runtime = OWNER.runtime
    timeline = runtime.timeline if runtime is not None else None
    if timeline is None:
        return None
    ondemand = getattr(runtime, "ondemand", None)
    if ondemand is not None:  # the anomaly watch reads the entries before they are folded away (as at a hand-over)
        ondemand.read_roles()
    timeline.fold()
    last = timeline.last
    if last is None:
        return None
    step, start, seconds, roles = last
    before = list(timeline.recent)[:-1][-WINDOW:]
    marks: tuple[str, ...] = ()
    if len(before) >= MIN_STEPS:
        median = statistics.median(before)
        if seconds > FACTOR * median and seconds - median >= MIN_S:
            marks = ("anomaly",)
    return StepTimes(step, start, seconds,
                     MappingProxyType({name: RoleTime(entry[0], int(entry[1])) for name, entry in roles.items()}),
                     marks)


def check_metrics(metrics: object, prefix: object, counts: object) -> None:
    """Refuse, with ``ConfigError``, an integration's tracker options (see :meth:`StepTimes.metrics`)."""
    if not isinstance(metrics, bool):
        raise ConfigError("metrics", metrics, "True or False")
    if not isinstance(prefix, str):
        raise ConfigError("prefix", prefix, "a string such as 'timing_s/'")
    if counts is not None and (not isinstance(counts, str) or counts == prefix):
        raise ConfigError("counts", counts, "None, or a prefix other than `prefix` such as 'timing_n/'")
