"""The always-on step timeline: every step's wall time and its top-level roles', no profiler involved.

Blocks that mark a step (``profile_step(step)``, ``Steps.begin``/``end``, a held step) and role
blocks directly under a step read the monotonic clock on entry and exit and append one tuple; in or
out of the capture window, whatever the plan decides. Everything else happens on the runtime's
writer thread (:meth:`profctx.process._runtime.Runtime.submit`): folding nested and repeated roles,
the running totals of the end-of-run summary, and appending the steps, one JSON line each, to a
file of this process beside the manifest shard (``{save_path}/.profctx/{run}.{rank tag}.{host}.{pid}
.timeline``). The file is created through :func:`profctx.util._files.create` and only appended to
through its descriptor, a batch per write; a batch cut short is cut back to its last whole line,
and a reader skips a torn last line, so a crash loses at most the steps not flushed yet.

Bounds, whatever the run's length: at most :data:`MAX_EVENTS` entries (steps and roles) wait for
the writer; should it fall that far behind (a slow disk), what waits is dropped, its steps counted and
the count written as a ``dropped`` line. A step with very many role blocks is folded by the writer as
they come, and at most :data:`MAX_ROLE_NAMES` role names are kept per step and in the totals (the rest
fold into ``(other)``). Entries are handed to the writer every :data:`FLUSH_EVENTS` entries or
:data:`FLUSH_S` seconds, whichever comes first, so a crash loses at most that.
"""

from __future__ import annotations

import contextlib
import operator
import os
import sys
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Final, Protocol, TextIO

from ..core._layout import MANIFEST_DIR, safe
from ..core._scope import role_parts
from ..util._fs import walk
from ..util._log import warn_once
from ..util._units import seconds_text as _time

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from ..util._identity import Identity


class Host(Protocol):
    """What a timeline needs from the runtime that holds it (``_runtime.Runtime``)."""

    save_path: Path
    run_id: str

    def submit(self, job: Callable[[], None]) -> None: ...

    def identity(self) -> Identity: ...

    def failure(self, what: str, exc: BaseException, *, in_flight: bool = False) -> None: ...

#: How a timeline file's name ends (not ``.jsonl``: the manifest reader takes those as its shards).
SUFFIX: Final = ".timeline"
#: Version of the line format; readers accept this version or lower. 2: a role's value is
#: ``[seconds, blocks, first entry, last exit]``, the two offsets in seconds from the step's entry (read from the
#: clock readings the role blocks already took: nothing more on the training thread).
VERSION: Final = 2
#: Entries (steps and roles) handed to the writer at once, at the latest (about 1.3 MB of them). Waking the
#: writer costs the training thread more than the entries do (a GIL hand-over): fast loops hand over by count,
#: slow ones by time.
FLUSH_EVENTS: Final = 16_384
#: Seconds between two hand-overs to the writer, at the latest (checked when a step ends): what a crash can lose.
FLUSH_S: Final = 1.0
#: Entries waiting for the writer at most (about 16 MB); beyond, what waits is dropped and its steps counted.
MAX_EVENTS: Final = 200_000
#: Role names kept per step and in the totals; the others are summed as :data:`OTHER`.
MAX_ROLE_NAMES: Final = 64
OTHER: Final = "(other)"
#: Step times kept for the anomaly mark of the last step (as ``profctx timeline``'s default ``--window``).
RECENT: Final = 21

#: The clock every entry is read with: monotonic, no system call (vDSO).
clock = time.monotonic


class Totals:
    """Running totals of the steps seen: the end-of-run summary, bounded whatever the run's length."""

    __slots__ = ("first", "last", "max", "min", "roles", "steps", "total")

    def __init__(self) -> None:
        self.steps = 0
        self.total = 0.0
        self.min = float("inf")
        self.max = 0.0
        self.first: int | None = None
        self.last: int | None = None
        #: role -> [total seconds, blocks, steps it ran in]
        self.roles: dict[str, list[float]] = {}

    def add(self, step: int, seconds: float, roles: dict[str, list[float]]) -> None:
        """Count one step of ``seconds`` whose top-level roles took ``roles`` (name -> [seconds, blocks])."""
        self.steps += 1
        self.total += seconds
        self.min = min(self.min, seconds)
        self.max = max(self.max, seconds)
        if self.first is None:
            self.first = step
        self.last = step
        for name, (spent, count, *_) in roles.items():
            entry = self.roles.get(name)
            if entry is None:
                if len(self.roles) >= MAX_ROLE_NAMES:
                    name = OTHER
                entry = self.roles.setdefault(name, [0.0, 0.0, 0.0])
            entry[0] += spent
            entry[1] += count
            entry[2] += 1


class Timeline:
    """The step timeline of one runtime: the training thread appends, the writer thread folds and writes.

    Training-thread side (no lock, no system call): when a top-level role block ends,
    ``events.append((role, start, end))``; when a step ends, ``events.append((step, start, end))``
    (a role is a ``str``, a step is not);
    then, only when ``len(events) >= FLUSH_EVENTS`` (or, for a step, its end is past ``due``),
    :meth:`hand_over`. ``_block`` writes these out in ``profile_step.__exit__``; :meth:`role` and
    :meth:`step` are the same for the other callers. Roles noted before a step's entry belong to
    that step. Writer side: :meth:`flush`. ``write=False`` writes no file; ``totals=True`` keeps the
    running totals :meth:`print_summary` prints (``summary_at_exit``).
    """

    __slots__ = ("_bytes", "_current", "_fd", "_identity", "_lines", "_lock", "_names", "_written_dropped", "closed",
                 "dropped", "due", "events", "failed", "last", "max_bytes", "path", "queued", "recent", "runtime",
                 "totals", "write")

    def __init__(self, runtime: Host, *, write: bool, totals: bool = False, max_bytes: int | None = None) -> None:
        self.runtime = runtime
        self.write = write
        #: ``max_timeline_bytes``: the file never grows past it (see :meth:`_append`); ``None``: no cap.
        self.max_bytes = max_bytes
        self._bytes = 0
        #: (role, start, end) and (step, start, end) entries waiting for the writer, in order.
        self.events: deque[tuple[Any, ...]] = deque()
        self.dropped = 0
        self._written_dropped = 0
        #: The monotonic time at which the entries are handed to the writer whatever their number.
        self.due = clock() + FLUSH_S
        self.queued = False
        #: Set by :meth:`finish`: the last batch is queued, nothing is handed over after it.
        self.closed = False
        #: The running totals of :meth:`print_summary` (``totals=True``: ``summary_at_exit``).
        self.totals: Totals | None = Totals() if totals else None
        self.path: str | None = None
        self.failed: str | None = None
        self._fd: int | None = None
        self._identity: Identity | None = None
        #: The writer's fold of the roles of the step under way (name -> [seconds, blocks]).
        self._current: dict[str, list[float]] = {}
        #: Role names as JSON strings, as the writer formats them (bounded).
        self._names: dict[str, str] = {}
        #: Folding is done by the writer, or by the training thread asking for :attr:`last` (``last_step``).
        self._lock = threading.Lock()
        #: Lines folded and not written yet.
        self._lines: list[str] = []
        #: The last step folded: (step, wall-clock start, seconds, roles name -> [seconds, blocks]).
        self.last: tuple[int, float, float, dict[str, list[float]]] | None = None
        #: The times of the last steps folded (the anomaly mark of :attr:`last` compares with them).
        self.recent: deque[float] = deque(maxlen=RECENT)

    # -- the training thread -------------------------------------------------------------------

    def role(self, role: str, start: float, end: float) -> None:
        """Note a top-level role block from ``start`` to ``end`` (monotonic seconds) in the step under way."""
        events = self.events
        events.append((role, start, end))
        if len(events) >= FLUSH_EVENTS:
            self.hand_over(None)

    def step(self, step: int, start: float, end: float) -> None:
        """Note that ``step`` ran from ``start`` to ``end`` (monotonic seconds), with the roles noted since."""
        events = self.events
        events.append((step, start, end))
        if end >= self.due or len(events) >= FLUSH_EVENTS:
            self.hand_over(end)

    def hand_over(self, now: float | None) -> None:
        """Queue :meth:`flush` on the writer thread; drop (and count) what waits if the writer fell far behind."""
        if now is not None:
            self.due = now + FLUSH_S
        if self.closed:  # the last batch is queued (blocks that outlive their configuration add nothing more)
            return
        if not self.queued:
            self.queued = True
            self.runtime.submit(self.flush)
        elif len(self.events) >= MAX_EVENTS:
            events = self.events
            waiting = list(events)
            events.clear()
            self.dropped += sum(1 for entry in waiting if type(entry[0]) is not str)

    # -- the writer thread ------------------------------------------------------------------------

    def flush(self) -> None:
        """Fold the waiting entries, add the steps to the totals and append them to the file; never raises."""
        self.queued = False
        with self._lock:
            self._fold()
            lines, self._lines = self._lines, []
        dropped = self.dropped
        if self.write and dropped != self._written_dropped:
            lines.append(f'{{"dropped":{dropped}}}')
            self._written_dropped = dropped
        if lines:
            try:
                self._append(lines)
            except Exception as exc:  # noqa: BLE001 - the timeline never breaks training
                kept = exc.kept if isinstance(exc, _CutShortError) else 0  # whole lines the disk took: not dropped
                self.dropped += sum(1 for line in lines[kept:] if line.startswith('{"step"'))
                self.failed = f"{type(exc).__name__}: {exc}"
                self.runtime.failure("timeline write", exc, in_flight=True)

    def fold(self) -> None:
        """Fold the entries waiting so far (any thread): :attr:`last` is then the last step that ended."""
        with self._lock:
            self._fold()

    def _fold(self) -> None:
        """Fold the waiting entries into steps: totals, :attr:`last` and lines to write (holding ``_lock``)."""
        events = self.events
        offset = time.time() - clock()  # wall clock of a monotonic reading, as of now
        current = self._current
        lines = self._lines
        totals, write = self.totals, self.write
        popleft = events.popleft
        while events:
            raw, start, end = popleft()
            if type(raw) is str:
                found = current.get(raw)
                if found is None:
                    _add(current, raw, end - start, 1, start, end)
                else:
                    found[0] += end - start
                    found[1] += 1
                    if end > found[3]:
                        found[3] = end
                continue
            self._current, roles, current = {}, current, {}
            if type(raw) is not int:
                try:
                    raw = operator.index(raw)  # a numpy or tensor step, as blocks take them
                except TypeError:
                    continue
            if raw < 0:  # a warm-up or evaluation pass: not a training step (its roles go with it)
                continue
            seconds = end - start
            if totals is not None:
                totals.add(raw, seconds, roles)
            if write:
                lines.append(self._line(raw, start, offset, seconds, roles))
            self.last = (raw, start + offset, seconds, roles)
            self.recent.append(seconds)
        self._current = current

    def _line(self, step: int, start: float, offset: float, seconds: float, roles: dict[str, list[float]]) -> str:
        """Return one step's JSON line (written by hand: json.dumps per step costs several times more).

        ``start``: the step's entry (monotonic), ``offset``: the wall clock less the monotonic one."""
        names = self._names
        parts = []
        for name, (spent, count, first, last) in roles.items():
            quoted = names.get(name)
            if quoted is None:
                import json

                quoted = json.dumps(name)
                if len(names) < 4 * MAX_ROLE_NAMES:
                    names[name] = quoted
            # %-formatting: a third of the time of the same f-string with four floats (the writer's cost per role)
            parts.append("%s:[%.6f,%d,%.6f,%.6f]" % (quoted, spent, count, first - start, last - start))  # noqa: UP031
        return '{"step":%d,"start":%.6f,"time_s":%.6f,"roles":{%s}}' % (  # noqa: UP031
            step, start + offset, seconds, ",".join(parts))

    def _append(self, lines: list[str]) -> None:
        identity = self.runtime.identity()
        if self._fd is None or identity != self._identity:
            self._open(identity)
        fd = self._fd
        assert fd is not None
        data = ("\n".join(lines) + "\n").encode()
        if self.max_bytes is not None and self._bytes + len(data) > self.max_bytes:
            data = self._capped(lines)
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            written = os.write(fd, data)
        except OSError:
            os.ftruncate(fd, start)
            raise
        if written != len(data):  # the disk filled up mid-batch: keep whole lines only
            end = data.rfind(b"\n", 0, written) + 1
            os.ftruncate(fd, start + end)
            self._bytes += end
            error = _CutShortError(28, "No space left on device (timeline batch cut short)", self.path)
            error.kept = data.count(b"\n", 0, end)
            raise error
        self._bytes += written

    def _capped(self, lines: list[str]) -> bytes:
        """Return the lines that fit under ``max_bytes``, then a ``capped`` line; stop writing from here on.

        The file then says where it stops and why (``{"capped": {...}}``); later steps still reach
        the end-of-run summary's totals. Logged once.
        """
        assert self.max_bytes is not None
        room = self.max_bytes - self._bytes - 512  # the capped line's room
        kept: list[bytes] = []
        last = None
        for line in lines:
            encoded = line.encode() + b"\n"
            if len(encoded) > room:
                break
            room -= len(encoded)
            kept.append(encoded)
            if line.startswith('{"step":'):
                last = int(line[8:line.index(",")])
        self.write = False
        note = (f"max_timeline_bytes ({self.max_bytes}) reached: the steps after "
                f"{'step ' + str(last) if last is not None else 'the last one above'} are not written to this file")
        import json

        kept.append(json.dumps({"capped": {"max_timeline_bytes": self.max_bytes, "last_step": last,
                                           "note": note}}, separators=(",", ":")).encode() + b"\n")
        warn_once("timeline-capped", "profctx: %s (%s)", note, self.path)
        return b"".join(kept)

    def _open(self, identity: Identity) -> None:
        import json

        self.close()
        rt = self.runtime
        stem = f"{safe(rt.run_id)}.{identity.tag}.{safe(identity.host)}.{identity.pid}"
        with walk(rt.save_path, MANIFEST_DIR) as folder:  # no link followed below save_path
            name = stem + SUFFIX
            try:
                fd = folder.create(name)
            except FileExistsError:  # taken (a planted file, a restart with the same pid): a fresh name
                name = f"{stem}.{os.urandom(4).hex()}{SUFFIX}"
                fd = folder.create(name)
        self._fd = fd
        self._identity = identity
        self.path = str(folder.path / name)
        header = {"v": VERSION, "schema": "profctx.timeline", "run": rt.run_id, "rank": identity.rank,
                  "world_size": identity.world_size, "group": identity.group, "host": identity.host,
                  "pid": identity.pid, "time": round(time.time(), 6)}
        head = (json.dumps(header, separators=(",", ":")) + "\n").encode()
        os.write(fd, head)
        self._bytes = len(head)

    def close(self) -> None:
        """Close the file (the writer's last job, or before a new identity's file)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- the end ----------------------------------------------------------------------------------

    def finish(self) -> None:
        """Hand the steps still waiting to the writer, then close the file there (shutdown); once."""
        if self.closed:
            return
        self.closed = True
        self.runtime.submit(self.flush)
        self.runtime.submit(self.close)

    def print_summary(self, stream: TextIO | None = None) -> None:
        """Print :func:`summary` of the totals to ``stream`` (default ``sys.stderr``); never raises."""
        try:
            text = summary(self.totals or Totals(), self.runtime.identity(), self.dropped)
            out = sys.stderr if stream is None else stream
            if out is not None:
                out.write(text + "\n")
                out.flush()
        except Exception as exc:  # noqa: BLE001 - exit paths must not raise
            warn_once("timeline-summary", "profctx: could not print the end-of-run summary: %s", exc)


class _CutShortError(OSError):
    """A batch the disk took only part of: its first ``kept`` lines are in the file."""

    kept = 0


def _add(roles: dict[str, list[float]], raw: Any, seconds: Any, count: int, start: float, end: float) -> None:
    """Add a role block of ``seconds`` from ``start`` to ``end`` to ``roles`` under its top-level name (the first
    part of a path): ``[seconds, blocks, first entry, last exit]``."""
    try:
        name = role_parts(raw)[0] if "/" in raw else raw
    except (TypeError, ValueError):
        return
    found = roles.get(name)
    if found is None:
        if len(roles) >= MAX_ROLE_NAMES:
            name = OTHER
        found = roles.setdefault(name, [0.0, 0, start, end])
    found[0] += seconds
    found[1] += count
    found[3] = max(found[3], end)


def summary(totals: Totals, identity: Identity, dropped: int = 0) -> str:
    """Return the phases per step of ``totals`` as a small table, as Lightning prints its profiler summary."""
    who = f"{identity.group}/" if identity.group else ""
    head = f"profctx: phases per step, {who}rank {identity.rank} of {identity.world_size} (pid {identity.pid})"
    if not totals.steps:
        return f"{head}: no step ended"
    steps = totals.steps
    lines = [f"{head}: {steps} step{'s' if steps != 1 else ''} ({totals.first}..{totals.last}), "
             f"{_time(totals.total)} in steps",
             f"  step time: mean {_time(totals.total / steps)}, min {_time(totals.min)}, max {_time(totals.max)}"]
    rows = [["ROLE", "TOTAL", "MEAN/STEP", "COUNT", "% OF STEP"]]
    in_roles = 0.0
    for name, (spent, count, _) in sorted(totals.roles.items(), key=lambda item: -item[1][0]):
        in_roles += spent
        share = spent / totals.total if totals.total > 0 else 0.0
        rows.append([name, _time(spent), _time(spent / steps), str(int(count)), f"{share:.1%}"])
    outside = max(totals.total - in_roles, 0.0)
    rows.append(["(outside roles)", _time(outside), _time(outside / steps), "-",
                 f"{outside / totals.total:.1%}" if totals.total > 0 else "-"])
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        lines.append("  " + "  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
                                      for i, cell in enumerate(row)).rstrip())
    if dropped:
        lines.append(f"  {dropped} step(s) missing from the timeline file (the writer fell behind or could not "
                     "write them)")
    return "\n".join(lines)
