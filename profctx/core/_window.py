"""Step windows: which global steps are profiled."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any, Final, final

from ..util._errors import ConfigError

#: Most steps one window may name; a profiled run of more steps is a mistake, not a plan.
MAX_STEPS: Final = 100_000


@final
class StepWindow:
    """An immutable, hashable set of global steps (non-negative integers).

    Build one with :meth:`parse` from a list ``[1, 2, 5]``, a half-open slice string
    ``"3:6"`` (steps 3, 4, 5) with optional stride ``"10:40:10"``, a comma list ``"1,2,5"``,
    a single int, or a ``range``. Unbounded forms (``"3:"``) are refused: a trace that never
    stops is the failure this type exists to prevent.
    """

    __slots__ = ("_hash", "_set", "_steps")

    def __init__(self, steps: Iterable[int] = ()) -> None:
        unique = set()
        for step in steps:
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise ConfigError("steps", step, "steps are integers >= 0")
            unique.add(step)
            if len(unique) > MAX_STEPS:  # checked while reading, so a huge iterable costs no more than this
                raise ConfigError("steps", f"<more than {MAX_STEPS} steps>", f"at most {MAX_STEPS} steps")
        ordered = sorted(unique)
        if len(ordered) > MAX_STEPS:
            raise ConfigError("steps", f"<{len(ordered)} steps>", f"at most {MAX_STEPS} steps")
        self._steps: tuple[int, ...] = tuple(ordered)
        self._set: frozenset[int] = frozenset(ordered)
        self._hash = hash(self._steps)

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def parse(cls, value: object, *, field: str = "steps") -> StepWindow:
        """Return the window described by ``value``; raise ``ConfigError`` naming ``field``."""
        if isinstance(value, StepWindow):
            return value
        if isinstance(value, range):
            return cls._checked(value, value, field)
        if isinstance(value, bool):
            raise ConfigError(field, value, _FORMS)
        if isinstance(value, int):
            return cls._checked([value], value, field)
        if isinstance(value, str):
            return cls._parse_text(value.strip(), field)
        if isinstance(value, (Mapping, bytes, bytearray, memoryview)):
            # bytes iterate as character codes: b"3:6" would silently mean steps 51, 54, 58.
            raise ConfigError(field, value, _FORMS)
        if isinstance(value, Collection):  # sized, so never an endless iterator
            if len(value) > MAX_STEPS:
                raise ConfigError(field, f"<{len(value)} items>", f"at most {MAX_STEPS} steps")
            items = list(value)
            for item in items:
                if isinstance(item, bool) or not isinstance(item, int):
                    raise ConfigError(field, value, "a list of integers >= 0")
            return cls._checked(items, value, field)
        raise ConfigError(field, value, _FORMS)

    @classmethod
    def _checked(cls, steps: Iterable[int], original: object, field: str) -> StepWindow:
        if isinstance(steps, range) and range_exceeds(steps, MAX_STEPS):
            raise ConfigError(field, original, f"at most {MAX_STEPS} steps")
        try:
            return cls(steps)
        except ConfigError as exc:
            raise ConfigError(field, original, exc.allowed) from None

    @classmethod
    def _parse_text(cls, text: str, field: str) -> StepWindow:
        if not text:
            raise ConfigError(field, text, _FORMS)
        if ":" in text:
            parts = [p.strip() for p in text.split(":")]
            if len(parts) > 3:
                raise ConfigError(field, text, _FORMS)
            if len(parts) < 2 or not parts[1]:
                raise ConfigError(field, text, "an unbounded window never stops; give an end, e.g. '3:6'")
            try:
                start = int(parts[0]) if parts[0] else 0
                stop = int(parts[1])
                stride = int(parts[2]) if len(parts) == 3 and parts[2] else 1
            except ValueError:
                raise ConfigError(field, text, _FORMS) from None
            if stride <= 0:
                raise ConfigError(field, text, "the stride must be a positive integer")
            if stop <= start:
                raise ConfigError(field, text, "the end must be greater than the start (the end is exclusive)")
            return cls._checked(range(start, stop, stride), text, field)
        try:
            steps = [int(p) for p in text.replace(" ", "").split(",") if p]
        except ValueError:
            raise ConfigError(field, text, _FORMS) from None
        return cls._checked(steps, text, field)

    @classmethod
    def from_verl(cls, steps: Iterable[int] | None) -> StepWindow:
        """Return the window for verl's ``global_profiler.steps`` list (``None`` means empty)."""
        return cls.parse([] if steps is None else list(steps), field="global_profiler.steps")

    @classmethod
    def from_torch_schedule(
        cls,
        *,
        wait: int,
        warmup: int,
        active: int,
        repeat: int = 1,
        skip_first: int = 0,
        first_step: int = 0,
    ) -> StepWindow:
        """Return the steps a ``torch.profiler.schedule`` records when step ``first_step`` is its index 0.

        ``repeat=0`` (torch: repeat forever) is refused as unbounded.
        """
        checks = (("wait", wait), ("warmup", warmup), ("skip_first", skip_first), ("first_step", first_step))
        for name, number in checks:
            if number < 0:
                raise ConfigError(f"schedule.{name}", number, "an integer >= 0")
        if active < 1:
            raise ConfigError("schedule.active", active, "an integer >= 1")
        if repeat < 1:
            raise ConfigError("schedule.repeat", repeat, "an integer >= 1 (0 repeats forever, an unbounded window)")
        if active * repeat > MAX_STEPS:
            raise ConfigError("schedule.repeat", repeat, f"at most {MAX_STEPS} recorded steps in all")
        period = wait + warmup + active
        base = first_step + skip_first + wait + warmup
        return cls(base + k * period + i for k in range(repeat) for i in range(active))

    # -- queries ------------------------------------------------------------------------------

    def contains(self, step: int) -> bool:
        """Return whether ``step`` is in the window."""
        return step in self._set

    __contains__ = contains

    @property
    def steps(self) -> tuple[int, ...]:
        """The steps, ascending."""
        return self._steps

    @property
    def first(self) -> int:
        """The smallest step; ``ValueError`` when empty."""
        if not self._steps:
            raise ValueError("the window is empty")
        return self._steps[0]

    @property
    def last(self) -> int:
        """The largest step; ``ValueError`` when empty."""
        if not self._steps:
            raise ValueError("the window is empty")
        return self._steps[-1]

    def runs(self) -> tuple[tuple[int, ...], ...]:
        """Return the maximal runs of consecutive steps, ascending."""
        out: list[tuple[int, ...]] = []
        current: list[int] = []
        for step in self._steps:
            if current and step != current[-1] + 1:
                out.append(tuple(current))
                current = []
            current.append(step)
        if current:
            out.append(tuple(current))
        return tuple(out)

    def run_of(self, step: int) -> tuple[int, ...] | None:
        """Return the run containing ``step``, or ``None`` when ``step`` is outside the window."""
        if step not in self._set:
            return None
        i = bisect.bisect_left(self._steps, step)
        lo = i
        while lo > 0 and self._steps[lo - 1] == self._steps[lo] - 1:
            lo -= 1
        hi = i
        while hi + 1 < len(self._steps) and self._steps[hi + 1] == self._steps[hi] + 1:
            hi += 1
        return self._steps[lo : hi + 1]

    def to_torch_schedule(self, *, first_step: int = 0, warmup: int = 1) -> dict[str, int]:
        """Return ``torch.profiler.schedule`` keywords recording exactly these steps.

        Step ``first_step`` is the schedule's index 0 (the first ``prof.step()`` boundary).
        A window maps only when its runs have one length and one spacing; ``warmup`` is
        reduced where the gap before a run is too short. Raise ``ValueError`` otherwise.
        """
        runs = self.runs()
        if not runs:
            raise ValueError("an empty window has no torch schedule")
        if runs[0][0] < first_step:
            raise ValueError(f"step {runs[0][0]} is before first_step {first_step}")
        active = len(runs[0])
        if any(len(run) != active for run in runs):
            raise ValueError("runs of different lengths have no torch schedule")
        starts = [run[0] for run in runs]
        gaps = {b - a for a, b in itertools.pairwise(starts)}
        if len(gaps) > 1:
            raise ValueError("runs at uneven spacing have no torch schedule")
        period = gaps.pop() if gaps else active + warmup
        idle = period - active
        warmup_used = max(0, min(warmup, idle, starts[0] - first_step))
        wait = idle - warmup_used
        skip_first = starts[0] - first_step - warmup_used - wait
        if skip_first < 0:
            wait += skip_first
            skip_first = 0
            if wait < 0:
                raise ValueError("the first run starts too early for this schedule")
        return {
            "skip_first": skip_first,
            "wait": wait,
            "warmup": warmup_used,
            "active": active,
            "repeat": len(runs),
        }

    # -- value behaviour ----------------------------------------------------------------------

    def __iter__(self) -> Iterator[int]:
        return iter(self._steps)

    def __len__(self) -> int:
        return len(self._steps)

    def __bool__(self) -> bool:
        return bool(self._steps)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepWindow) and self._steps == other._steps

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"StepWindow({self.describe()!r})"

    def describe(self) -> str:
        """Return the shortest text form that :meth:`parse` reads back to this window."""
        if not self._steps:
            return ""
        if len(self._steps) >= 3:
            stride = self._steps[1] - self._steps[0]
            if all(b - a == stride for a, b in zip(self._steps, self._steps[1:], strict=False)):
                end = self._steps[-1] + 1
                return f"{self._steps[0]}:{end}" if stride == 1 else f"{self._steps[0]}:{end}:{stride}"
        return ",".join(str(s) for s in self._steps)

    def __reduce__(self) -> tuple[Any, ...]:
        return (StepWindow, (self._steps,))


def range_exceeds(steps: range, limit: int) -> bool:
    """Return whether ``steps`` holds more than ``limit`` items, without expanding it.

    ``len()`` of a range raises ``OverflowError`` past 2**63 items; that counts as more.
    """
    try:
        return len(steps) > limit
    except OverflowError:
        return True


_FORMS: Final = (
    "allowed: a list of steps [1, 2, 5], a half-open slice '3:6' (steps 3, 4, 5) with optional "
    "stride '10:40:10', a comma list '1,2,5', a single step, or a range"
)
