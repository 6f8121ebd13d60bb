"""Step windows: which global steps are profiled."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Collection, Container, Iterable, Iterator, Mapping
from typing import Any, Final, cast, final

from ..util._errors import ConfigError

#: Most steps one window may name; a profiled run of more steps is a mistake, not a plan.
MAX_STEPS: Final = 100_000
#: Most steps a window also keeps as a set for membership (tens of microseconds to build).
SMALL_WINDOW: Final = 1024


@final
class StepWindow:
    """An immutable, hashable set of global steps (non-negative integers).

    Build one with :meth:`parse` from a list ``[1, 2, 5]``, a half-open slice string
    ``"3:6"`` (steps 3, 4, 5) with optional stride ``"10:40:10"``, a comma list ``"1,2,5"``,
    a single int, or a ``range``. Unbounded forms (``"3:"``) are refused: a trace that never
    stops is the failure this type exists to prevent.

    Held compactly, as ascending arithmetic progressions (``range`` objects): a slice, a range
    or a torch schedule costs the same whatever its length, and membership, ``first``, ``last``
    and ``len`` never list the steps. :attr:`steps` lists them, once, on first use.
    """

    __slots__ = ("_hash", "_len", "_member", "_parts", "_starts", "_steps")

    def __init__(self, steps: Iterable[int] = ()) -> None:
        if isinstance(steps, range):
            self._set_parts(_range_parts(steps))
            return
        unique = set()
        for step in steps:
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise ConfigError("steps", step, "steps are integers >= 0")
            unique.add(step)
            if len(unique) > MAX_STEPS:  # checked while reading, so a huge iterable costs no more than this
                raise ConfigError("steps", f"<more than {MAX_STEPS} steps>", f"at most {MAX_STEPS} steps")
        self._set_parts(_progressions(sorted(unique)))

    def _set_parts(self, parts: tuple[range, ...]) -> None:
        #: Ascending, non-empty progressions; each ends before the next starts. The split is the
        #: one a greedy pass over the sorted steps makes (:func:`_progressions`), so equal windows
        #: hold equal parts: equality and hashing compare parts, never steps.
        self._parts = parts
        self._starts: tuple[int, ...] = tuple(part.start for part in parts)
        self._len = sum(len(part) for part in parts)
        self._hash = hash(parts)
        self._steps: tuple[int, ...] | None = None
        #: A small window's steps as a set: membership is then one C-level lookup, as blocks ask it often.
        self._member: frozenset[int] | None = (
            frozenset(itertools.chain.from_iterable(parts)) if self._len <= SMALL_WINDOW else None)

    @classmethod
    def _of(cls, parts: tuple[range, ...]) -> StepWindow:
        window = cls.__new__(cls)
        window._set_parts(parts)
        return window

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
        if active == 1 or period == active:  # one progression: every period-th step, or one run
            stride = period if active == 1 else 1
            return cls._of(_range_parts(range(base, base + (repeat - 1) * period + active, stride)))
        # Runs of ``active`` >= 2 steps with gaps between them: already the greedy split.
        return cls._of(tuple(range(start, start + active) for start in range(base, base + repeat * period, period)))

    # -- queries ------------------------------------------------------------------------------

    def contains(self, step: int) -> bool:
        """Return whether ``step`` is in the window (an integral number of another type counts by value)."""
        member = self._member
        if member is not None:
            return step in member
        if type(step) is not int:
            found = _integral(step)
            if found is None:
                return False
            step = found
        parts = self._parts
        if len(parts) == 1:
            return step in parts[0]
        i = bisect.bisect_right(self._starts, step) - 1
        return i >= 0 and step in parts[i]

    __contains__ = contains

    def lookup(self) -> Container[int]:
        """Return the fastest container to ask ``step in``: the set of a small window, else the window itself."""
        member = self._member
        return cast("Container[int]", self) if member is None else member  # contains() is __contains__

    @property
    def steps(self) -> tuple[int, ...]:
        """The steps, ascending (listed on first use, then kept)."""
        steps = self._steps
        if steps is None:
            steps = self._steps = tuple(itertools.chain.from_iterable(self._parts))
        return steps

    @property
    def first(self) -> int:
        """The smallest step; ``ValueError`` when empty."""
        if not self._parts:
            raise ValueError("the window is empty")
        return self._parts[0][0]

    @property
    def last(self) -> int:
        """The largest step; ``ValueError`` when empty."""
        if not self._parts:
            raise ValueError("the window is empty")
        return self._parts[-1][-1]

    def runs(self) -> tuple[tuple[int, ...], ...]:
        """Return the maximal runs of consecutive steps, ascending."""
        out: list[tuple[int, ...]] = []
        current: list[int] = []
        for step in self:
            if current and step != current[-1] + 1:
                out.append(tuple(current))
                current = []
            current.append(step)
        if current:
            out.append(tuple(current))
        return tuple(out)

    def run_of(self, step: int) -> tuple[int, ...] | None:
        """Return the run containing ``step``, or ``None`` when ``step`` is outside the window."""
        if not self.contains(step):
            return None
        step = int(step)
        lo = hi = step
        # A stride-1 progression is one run: jump over it; elsewhere the run grows one step at a time.
        while (part := self._part_of(lo - 1)) is not None:
            lo = part.start if part.step == 1 else lo - 1
        while (part := self._part_of(hi + 1)) is not None:
            hi = part[-1] if part.step == 1 else hi + 1
        return tuple(range(lo, hi + 1))

    def _part_of(self, step: int) -> range | None:
        i = bisect.bisect_right(self._starts, step) - 1
        if i >= 0 and step in self._parts[i]:
            return self._parts[i]
        return None

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
        if self._steps is not None:
            return iter(self._steps)
        return itertools.chain.from_iterable(self._parts)

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return bool(self._parts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepWindow) and self._parts == other._parts

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"StepWindow({self.describe()!r})"

    def describe(self) -> str:
        """Return the shortest text form that :meth:`parse` reads back to this window."""
        parts = self._parts
        if len(parts) == 1 and len(parts[0]) >= 3:  # one progression is always one part
            part = parts[0]
            end = part[-1] + 1
            return f"{part.start}:{end}" if part.step == 1 else f"{part.start}:{end}:{part.step}"
        return ",".join(str(s) for s in self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (self._parts,))


def _restore(parts: tuple[range, ...]) -> StepWindow:
    """Rebuild a pickled window from its parts."""
    return StepWindow._of(parts)


def _range_parts(steps: range) -> tuple[range, ...]:
    """Return the parts of the window of ``steps``; raise ``ConfigError`` as reading it step by step would."""
    if not steps:
        return ()
    # The first negative step in iteration order, and whether it comes before the size limit.
    if steps.start < 0:
        negative: int | None = 0
    elif steps.step > 0 or steps[-1] >= 0:
        negative = None
    else:
        negative = steps.start // -steps.step + 1
    if negative is not None and negative <= MAX_STEPS:
        raise ConfigError("steps", steps[negative], "steps are integers >= 0")
    if range_exceeds(steps, MAX_STEPS):
        raise ConfigError("steps", f"<more than {MAX_STEPS} steps>", f"at most {MAX_STEPS} steps")
    ascending = steps if steps.step > 0 else steps[::-1]
    if len(ascending) == 1:
        return (range(ascending.start, ascending.start + 1),)
    return (range(ascending.start, ascending[-1] + 1, ascending.step),)


def _progressions(ordered: list[int]) -> tuple[range, ...]:
    """Split ascending unique steps greedily into progressions: each takes the next step, then every
    following one at the stride its first two set."""
    parts: list[range] = []
    i, n = 0, len(ordered)
    while i < n:
        start = ordered[i]
        if i + 1 == n:
            parts.append(range(start, start + 1))
            break
        stride = ordered[i + 1] - start
        j = i + 1
        while j + 1 < n and ordered[j + 1] - ordered[j] == stride:
            j += 1
        parts.append(range(start, ordered[j] + 1, stride))
        i = j + 1
    return tuple(parts)


def _integral(value: object) -> int | None:
    """Return the int a non-int step stands for (a bool, a NumPy integer, ``3.0``), or ``None``."""
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return None
    try:
        return number if number == value else None
    except Exception:  # noqa: BLE001 - a value that cannot be compared is no step
        return None


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
