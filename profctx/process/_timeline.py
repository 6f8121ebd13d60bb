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

Bounds, whatever the run's length: at most :data:`MAX_PENDING` steps wait for the writer (a step
beyond is dropped and counted; the count is written as a ``dropped`` line), a step's role entries
are folded once there are :data:`MAX_ROLE_ENTRIES`, and at most :data:`MAX_ROLE_NAMES` role names are
kept per step and in the totals (the rest fold into ``(other)``). Steps are handed to the writer
every :data:`FLUSH_STEPS` steps or :data:`FLUSH_S` seconds, whichever comes first.
"""

from __future__ import annotations

import contextlib
import operator
import os
import sys
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Final, TextIO

from ..core._layout import MANIFEST_DIR, safe
from ..core._scope import role_parts
from ..util._files import create, make_folders, open_folder
from ..util._log import warn_once

if TYPE_CHECKING:
    from ..util._identity import Identity
    from ._runtime import Runtime

#: How a timeline file's name ends (not ``.jsonl``: the manifest reader takes those as its shards).
SUFFIX: Final = ".timeline"
#: Version of the line format; readers accept this version or lower.
VERSION: Final = 1
#: Steps handed to the writer at once, at the latest.
FLUSH_STEPS: Final = 64
#: Seconds between two hand-overs to the writer, at the latest (checked when a step ends).
FLUSH_S: Final = 5.0
#: Steps waiting for the writer at most; a step beyond is dropped and counted.
MAX_PENDING: Final = 8192
#: Role entries one step holds before they are folded (a step with very many role blocks).
MAX_ROLE_ENTRIES: Final = 1024
#: Role names kept per step and in the totals; the others are summed as :data:`OTHER`.
MAX_ROLE_NAMES: Final = 64
OTHER: Final = "(other)"

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
        for name, (spent, count) in roles.items():
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

    Training-thread side (no lock, no system call): ``roles.append((role, seconds))`` when a
    top-level role block ends, :meth:`step` when a step ends. Writer side: :meth:`flush`.
    ``write=False`` keeps the totals only (``timeline=False`` with ``summary_at_exit=True``).
    """

    __slots__ = ("_fd", "_identity", "_written_dropped", "dropped", "due", "failed", "path", "pending", "queued",
                 "roles", "runtime", "totals", "write")

    def __init__(self, runtime: Runtime, *, write: bool) -> None:
        self.runtime = runtime
        self.write = write
        #: (role, seconds) or, once folded, (role, seconds, blocks) of the step under way.
        self.roles: list[tuple[Any, ...]] = []
        #: (step, start, end, roles) of steps waiting for the writer.
        self.pending: deque[tuple[int, float, float, list[tuple[Any, ...]]]] = deque()
        self.dropped = 0
        self._written_dropped = 0
        #: The monotonic time at which the steps are handed to the writer whatever their number.
        self.due = clock() + FLUSH_S
        self.queued = False
        self.totals = Totals()
        self.path: str | None = None
        self.failed: str | None = None
        self._fd: int | None = None
        self._identity: Identity | None = None

    # -- the training thread -------------------------------------------------------------------

    def step(self, step: int, start: float, end: float) -> None:
        """Note that ``step`` ran from ``start`` to ``end`` (monotonic seconds), with the roles noted since."""
        roles = self.roles
        self.roles = []
        pending = self.pending
        if len(pending) < MAX_PENDING:
            pending.append((step, start, end, roles))
        else:
            self.dropped += 1
        if (len(pending) >= FLUSH_STEPS or end >= self.due) and not self.queued:
            self.queued = True
            self.due = end + FLUSH_S
            self.runtime.submit(self.flush)

    def fold(self) -> None:
        """Fold the roles of the step under way into one entry per name (many role blocks in one step)."""
        entries = self.roles
        self.roles = [(name, spent, count) for name, (spent, count) in _fold(entries).items()]

    # -- the writer thread ------------------------------------------------------------------------

    def flush(self) -> None:
        """Fold the waiting steps, add them to the totals and append them to the file; never raises."""
        self.queued = False
        pending = self.pending
        offset = time.time() - clock()  # wall clock of a monotonic reading, as of now
        lines: list[dict[str, Any]] = []
        while pending:
            raw, start, end, entries = pending.popleft()
            try:
                step = operator.index(raw)  # a numpy or tensor step, as blocks take them
            except TypeError:
                continue
            roles = _fold(entries)
            seconds = end - start
            self.totals.add(step, seconds, roles)
            if self.write:
                lines.append({"step": step, "start": round(start + offset, 6), "time_s": round(seconds, 6),
                              "roles": {name: [round(spent, 6), int(count)] for name, (spent, count) in roles.items()}})
        dropped = self.dropped
        if self.write and dropped != self._written_dropped:
            lines.append({"dropped": dropped})
            self._written_dropped = dropped
        if lines:
            try:
                self._append(lines)
            except Exception as exc:  # noqa: BLE001 - the timeline never breaks training
                self.dropped += sum(1 for line in lines if "step" in line)
                self.failed = f"{type(exc).__name__}: {exc}"
                self.runtime.failure("timeline write", exc, in_flight=True)

    def _append(self, lines: list[dict[str, Any]]) -> None:
        import json  # here, not at import profctx

        identity = self.runtime.identity()
        if self._fd is None or identity != self._identity:
            self._open(identity)
        fd = self._fd
        assert fd is not None
        data = "".join(json.dumps(line, separators=(",", ":"), default=str) + "\n" for line in lines).encode()
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            written = os.write(fd, data)
        except OSError:
            os.ftruncate(fd, start)
            raise
        if written != len(data):  # the disk filled up mid-batch: keep whole lines only
            os.ftruncate(fd, start + data.rfind(b"\n", 0, written) + 1)
            raise OSError(28, "No space left on device (timeline batch cut short)", self.path)

    def _open(self, identity: Identity) -> None:
        import json

        self.close()
        rt = self.runtime
        folder = make_folders(rt.save_path, MANIFEST_DIR)
        stem = f"{safe(rt.run_id)}.{identity.tag}.{safe(identity.host)}.{identity.pid}"
        dir_fd = open_folder(folder)
        try:
            name = stem + SUFFIX
            try:
                fd = create(name, dir_fd=dir_fd)
            except FileExistsError:  # taken (a planted file, a restart with the same pid): a fresh name
                name = f"{stem}.{os.urandom(4).hex()}{SUFFIX}"
                fd = create(name, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        self._fd = fd
        self._identity = identity
        self.path = str(folder / name)
        header = {"v": VERSION, "schema": "profctx.timeline", "run": rt.run_id, "rank": identity.rank,
                  "world_size": identity.world_size, "group": identity.group, "host": identity.host,
                  "pid": identity.pid, "time": round(time.time(), 6)}
        os.write(fd, (json.dumps(header, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        """Close the file (the writer's last job, or before a new identity's file)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- the end ----------------------------------------------------------------------------------

    def finish(self) -> None:
        """Hand the steps still waiting to the writer, then close the file there (shutdown)."""
        self.runtime.submit(self.flush)
        self.runtime.submit(self.close)

    def print_summary(self, stream: TextIO | None = None) -> None:
        """Print :func:`summary` of the totals to ``stream`` (default ``sys.stderr``); never raises."""
        try:
            text = summary(self.totals, self.runtime.identity(), self.dropped)
            out = sys.stderr if stream is None else stream
            if out is not None:
                out.write(text + "\n")
                out.flush()
        except Exception as exc:  # noqa: BLE001 - exit paths must not raise
            warn_once("timeline-summary", "profctx: could not print the end-of-run summary: %s", exc)


def _fold(entries: list[tuple[Any, ...]]) -> dict[str, list[float]]:
    """Return name -> [seconds, blocks] of a step's role entries, each under its top-level role name."""
    roles: dict[str, list[float]] = {}
    for entry in entries:
        raw = entry[0]
        try:
            name = role_parts(raw)[0] if "/" in raw else raw
        except (TypeError, ValueError):
            continue
        found = roles.get(name)
        if found is None:
            if len(roles) >= MAX_ROLE_NAMES:
                name = OTHER
            found = roles.setdefault(name, [0.0, 0])
        found[0] += entry[1]
        found[1] += entry[2] if len(entry) > 2 else 1
    return roles


def _time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


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
        lines.append(f"  {dropped} step(s) dropped (the writer fell behind or could not write): not counted")
    return "\n".join(lines)
