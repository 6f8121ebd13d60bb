"""The capture plan: what a block opens, as a pure function of the config and what is live.

No I/O, no globals, no clocks. The runtime (``_runtime``) executes the :class:`Actions` this
module returns; the nsys range count, the engine role match, the CLI role filter and the
oracle users property-test their loops with (``profctx.testing.expected_captures``, in
``_oracle``, which executes :func:`decide`) all come from here, so decision and effect cannot
drift apart.

Modelled on torch.profiler's ``schedule -> ProfilerAction -> action_map``: a block's entry is
an event, the plan answers with actions, and the block's exit undoes exactly those actions.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, final

from ._scope import role_parts
from ._vocab import CaptureKind, Mode, assert_never
from ._window import StepWindow

if TYPE_CHECKING:
    from ._config import ProfilerConfig

def role_matches(patterns: Sequence[str], roles: Sequence[str]) -> bool:
    """Return whether ``patterns`` select the role path ``roles`` (fnmatch on its last name or whole path).

    No patterns selects every role; an empty path matches nothing.
    """
    if not roles:
        return False
    if not patterns:
        return True
    name, path = roles[-1], "/".join(roles)
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(path, p) for p in patterns)


def _may_match_a_path(patterns: Sequence[str]) -> bool:
    """Return whether a pattern may match a nested role by its whole path, whatever its own name."""
    return any(c in p for p in patterns for c in "/*?[")


@final
@dataclass(frozen=True)
class Policy:
    """The configuration as the plan sees it, for one process (``selected``: its rank captures)."""

    window: StepWindow
    mode: Mode = "step"
    contiguous: bool = False
    roles: tuple[str, ...] = ()
    engine_roles: tuple[str, ...] = ("rollout",)
    selected: bool = True

    @classmethod
    def of(cls, config: ProfilerConfig, selected: bool, *, steps: Sequence[int] | None = None,
           mode: Mode | None = None, roles: tuple[str, ...] | None = None) -> Policy:
        """Return the policy of an active ``config`` for a process whose rank is (not) ``selected``.

        ``steps``, ``mode``, ``roles``: what an on-demand request asks for in place of the config's
        window, mode and role filter (``None``: the config's); ``contiguous`` holds in step mode only.
        """
        mode = config.mode if mode is None else mode
        return cls(
            window=(config.steps or StepWindow()) if steps is None else StepWindow(steps),
            mode=mode,
            contiguous=config.contiguous and mode == "step",
            roles=config.roles if roles is None else roles,
            engine_roles=config.engines.roles,
            selected=selected,
        )

    def run_of(self, step: int) -> tuple[int, ...]:
        """Return the steps one capture opened at ``step`` covers."""
        if self.mode == "step" and self.contiguous:
            return self.window.run_of(step) or (step,)
        return (step,)

    def wants_role(self, role: str, *, capturing: bool, engines: bool) -> bool:
        """Return whether a ``@profiled(role=role)`` call inside an in-window step must run its wrapper.

        ``capturing``: a capture is live in this process; ``engines``: engine adapters are
        attached. A role matters only as a capture of its own, a range in a live capture, a
        parent in the path of a role capture (role mode keeps every role in), or an engine
        switch; patterns that may match a whole path (``a/b``, and any wildcard: fnmatch's
        ``*`` crosses ``/``, so ``actor_*`` matches ``actor_update/fwd``) keep every role in.
        ``role`` is matched by its parts, as a block's role is (``train/update`` ends in ``update``).
        """
        parts = role_parts(role)
        if engines and (role_matches(self.engine_roles, parts) or _may_match_a_path(self.engine_roles)):
            return True
        if not self.selected:
            return False
        mode = self.mode
        if mode == "step":
            return capturing and (role_matches(self.roles, parts) or _may_match_a_path(self.roles))
        elif mode == "role":
            # Live capture: nested roles are its ranges, whatever the filter. None: a role the
            # filter leaves out may hold one it selects, and that capture's path names both.
            return True
        else:
            assert_never(mode)


@final
@dataclass(frozen=True)
class CaptureKey:
    """What a capture covers: its kind, its steps and, in role mode, its role path."""

    kind: CaptureKind
    steps: tuple[int, ...]
    roles: tuple[str, ...] = ()


@final
class Enter:
    """A block is entered.

    ``step``/``roles``: the block's scope; ``sets_step``/``sets_role``: what the block itself
    sets. ``context``: what the enclosing blocks of this task hold — ``None`` (no capture),
    ``"live"`` (ranges can go to a live capture) or ``"dead"`` (a capture that is not
    recording: skipped with no live owner, failed or stopped). ``run``: the steps of the
    contiguous capture open in this process, if any. Not changed once built.
    """

    __slots__ = ("context", "roles", "run", "sets_role", "sets_step", "step")

    def __init__(self, step: int | None, roles: tuple[str, ...] = (), sets_step: bool = False,
                 sets_role: bool = False, context: Literal["live", "dead"] | None = None,
                 run: tuple[int, ...] | None = None) -> None:
        self.step = step
        self.roles = roles
        self.sets_step = sets_step
        self.sets_role = sets_role
        self.context = context
        self.run = run

    def __repr__(self) -> str:
        return (f"Enter(step={self.step!r}, roles={self.roles!r}, sets_step={self.sets_step!r}, "
                f"sets_role={self.sets_role!r}, context={self.context!r}, run={self.run!r})")


@final
class Actions:
    """What the runtime does for one block, and undoes at its exit.

    In order at entry: ``close_run`` (end the open contiguous capture), ``open`` (start a
    capture; ``keep_run``: it becomes the contiguous capture), ``ranges`` (named ranges in the
    capture this block records into; ``marker``: the top range of what the block opens —
    ``ProfilerStep#N`` for a step, the role's name for a role capture), ``engines`` (start attached
    engines), ``workers`` (tell the driver's worker groups the step began: every in-window step
    block, whatever this process itself captures). At exit, in reverse: workers leave the step,
    engines stop, ranges close, the opened capture ends (``close_run_at_exit``: the contiguous
    capture ends with this block). Equal when every field is; not changed once built (the runtime
    memoises them).
    """

    __slots__ = ("close_run", "close_run_at_exit", "engines", "join_run", "keep_run", "marker", "open", "ranges",
                 "workers")

    def __init__(self, *, close_run: bool = False, open: CaptureKey | None = None, keep_run: bool = False,
                 join_run: bool = False, close_run_at_exit: bool = False, marker: str | None = None,
                 ranges: tuple[str, ...] = (), engines: bool = False, workers: bool = False) -> None:
        self.close_run = close_run
        self.open = open
        self.keep_run = keep_run
        self.join_run = join_run
        self.close_run_at_exit = close_run_at_exit
        self.marker = marker
        self.ranges = ranges
        self.engines = engines
        self.workers = workers

    def _fields(self) -> tuple[Any, ...]:
        return (self.close_run, self.open, self.keep_run, self.join_run, self.close_run_at_exit, self.marker,
                self.ranges, self.engines, self.workers)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Actions) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        names = ("close_run", "open", "keep_run", "join_run", "close_run_at_exit", "marker", "ranges", "engines",
                 "workers")
        return "Actions(" + ", ".join(f"{n}={v!r}" for n, v in zip(names, self._fields(), strict=True)) + ")"


#: The block does nothing (outside the window, or nothing selected).
NOTHING: Actions = Actions()


#: Prefix of the range that marks a global step: torch's own name (``torch.profiler.schedule``
#: draws ``ProfilerStep#N``), so TensorBoard's profiler plugin and HTA find the step in the trace.
STEP_MARKER_PREFIX = "ProfilerStep#"
#: Trace metadata key under which a backend lists the ranges profctx drew in that trace:
#: ``{"version": 1, "roles": [role range names], "steps": [step marker names]}``. The analysis
#: takes roles from these ranges only; the user's and torch's own ranges are operators.
RANGES_KEY = "profctxRanges"


def step_range(step: int) -> str:
    """Return the name of the range marking ``step`` in a capture (``ProfilerStep#3``), in every backend."""
    return f"{STEP_MARKER_PREFIX}{step}"


def decide(policy: Policy, event: Enter) -> Actions:
    """Return what a block entering ``event`` opens under ``policy``.

    Rules (docs/concepts.md, "What is captured"): out of the window nothing opens, and a step
    block leaving the contiguous run closes it. Step mode: a step block on a selected rank
    opens a capture of its step (or joins/opens the contiguous run) with a ``ProfilerStep#N`` range;
    a role block inside a live capture is a range when it matches the role filter. Role
    mode: a matching role with no capture around it opens one (the role is its top range);
    roles inside a live capture are ranges. Engines start for roles matching
    ``engines.roles`` on every rank.
    """
    step = event.step
    if step is None or step not in policy.window:
        if event.sets_step and event.run is not None:
            return Actions(close_run=True)
        return NOTHING
    close_run = False
    opened: CaptureKey | None = None
    keep_run = join_run = close_run_at_exit = False
    ranges: list[str] = []
    marker: str | None = None
    context = event.context
    mode = policy.mode
    if mode == "step":  # a step block opens a capture; roles in it are ranges, by the filter
        step_captures, role_captures, every_role = True, False, False
    elif mode == "role":  # a matching role opens a capture; every role inside it is a range
        step_captures, role_captures, every_role = False, True, True
    else:
        assert_never(mode)
    if event.sets_step and step_captures and policy.selected:
        steps = policy.run_of(step)
        if policy.contiguous:
            if event.run is not None and step not in event.run:
                close_run = True
            if event.run is not None and step in event.run:
                join_run = True
            else:
                opened, keep_run = CaptureKey("step", steps), True
            close_run_at_exit = step == steps[-1]
        else:
            opened = CaptureKey("step", steps)
        marker = step_range(step)
        context = "live"
    engines = False
    if event.sets_role:
        roles = event.roles
        if context == "live":
            if every_role or role_matches(policy.roles, roles):
                ranges.append(roles[-1])
        elif context is None and role_captures and policy.selected and role_matches(policy.roles, roles):
            opened = CaptureKey("role", (step,), roles)
            marker = roles[-1]
        engines = role_matches(policy.engine_roles, roles)
    return Actions(
        workers=event.sets_step,
        close_run=close_run,
        open=opened,
        keep_run=keep_run,
        join_run=join_run,
        close_run_at_exit=close_run_at_exit,
        marker=marker,
        ranges=tuple(ranges),
        engines=engines,
    )
