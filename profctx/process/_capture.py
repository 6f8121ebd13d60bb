"""One capture: claim the process's profiler, start the backend, draw ranges, stop, hand off the writing.

Start and stop are safe against interrupts (Ctrl-C, SIGTERM turned into ``SystemExit``)
landing at any statement: the native-capture token is always given back, a half-started
backend session is always stopped, and the capture is recorded as ``interrupted``.
"""

from __future__ import annotations

import contextlib
import errno
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ..backends import CaptureSpec
from ..core._layout import capture_folder
from ..core._plan import CaptureKey
from ..core._status import HOLDING, State
from ..records._manifest import Record, Status, capture_record, file_entries
from ..util._identity import capture_id
from ..util._log import logger


class Disk(Protocol):
    """The runtime's watch on free space (``_runtime.DiskWatch``)."""

    reason: str

    def failed(self, exc: BaseException) -> None: ...

    def wrote(self, files: Any) -> None: ...

    def waiting(self, folder: Path) -> bool: ...


class Runtime(Protocol):
    """What a capture needs from the runtime that opened it (``_runtime.Runtime``, which imports this module)."""

    save_path: Path

    @property
    def tool(self) -> str: ...
    @property
    def backend(self) -> Any: ...

    @property
    def disk(self) -> Disk: ...

    @property
    def traces(self) -> Any: ...

    def claim(self, capture: Capture) -> Capture | None: ...

    def release(self, capture: Capture) -> None: ...

    def holder(self) -> Capture | None: ...

    def defer_stop(self, capture: Capture) -> None: ...

    def spec_for(self, capture: Capture) -> CaptureSpec: ...

    def record(self, record: Record | dict[str, Any]) -> None: ...

    def failure(self, what: str, exc: BaseException, *, in_flight: bool = False) -> None: ...

    def submit(self, job: Callable[[], None]) -> None: ...


class Range:
    """A named range open in one thread's stack of a capture (closed last-in, first-out)."""

    __slots__ = ("cm", "open")

    def __init__(self, cm: Any) -> None:
        self.cm = cm
        self.open = True


class Capture:
    """A device-profiler session over some steps and, in role mode, one role path.

    Status: ``planned`` -> ``starting`` -> ``live`` -> ``stopping`` -> ``ok``/``failed``/
    ``interrupted``; or ``planned`` -> ``skipped`` (another capture held the profiler:
    ``holder``) / ``failed`` / ``interrupted`` (the start did not complete).
    """

    __slots__ = (
        "folder",
        "holder",
        "id",
        "key",
        "raised",
        "ranges",
        "runtime",
        "seq",
        "spec",
        "stacks",
        "start_wall",
        "status",
        "thread",
    )

    def __init__(self, runtime: Runtime, key: CaptureKey, seq: int) -> None:
        self.id = capture_id()
        self.runtime = runtime
        self.key = key
        self.seq = seq
        self.status: State = "planned"
        self.holder: Capture | None = None
        self.thread = threading.get_ident()
        self.folder = capture_folder(key.steps, key.roles)
        self.start_wall = 0.0
        self.spec: CaptureSpec | None = None
        self.ranges = 0
        #: The exception that left the block this capture covers, as a note (``note_raised``), if any.
        self.raised: str | None = None
        #: Thread id -> that thread's open ranges, innermost last.
        self.stacks: dict[int, list[Range]] = {}

    @property
    def recording(self) -> bool:
        """Whether the capture is recording now."""
        return self.status == "live"

    @property
    def steps(self) -> tuple[int, ...]:
        """The steps the capture covers."""
        return self.key.steps

    @property
    def roles(self) -> tuple[str, ...]:
        """The role path of a role capture (empty for a step capture)."""
        return self.key.roles

    @property
    def label(self) -> str:
        """A short human description: ``step 3 role actor_update``."""
        steps = self.key.steps
        text = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
        return f"{text} role {'/'.join(self.key.roles)}" if self.key.roles else text

    def _record(self, event: str, **fields: Any) -> None:
        rt = self.runtime
        rt.record(capture_record(
            event,  # type: ignore[arg-type]
            capture=self.id, kind=self.key.kind, steps=self.key.steps, roles=self.key.roles,
            backend=rt.tool, folder=self.folder.as_posix(), seq=self.seq, **fields,
        ))

    # -- start --------------------------------------------------------------------------------

    def begin(self) -> bool:
        """Claim the profiler and start the backend; return whether the capture is recording.

        Never raises unless ``on_error="raise"`` (``ProfilingError``) or an interrupt arrives
        (re-raised after cleaning up). A refusal or failure is recorded.
        """
        rt = self.runtime
        if rt.disk.waiting(rt.save_path):
            self.status = "skipped"
            self._record("finished", status="skipped", time=time.time(), reason=rt.disk.reason)
            return False
        capped = rt.traces.refuses()
        if capped is not None:
            self.status = "skipped"
            self._record("finished", status="skipped", time=time.time(), reason=capped)
            return False
        try:
            holder = rt.claim(self)
            if holder is not None:
                self.status = "skipped"
                self.holder = holder
                self._record("finished", status="skipped", time=time.time(),
                             reason=f"the process's profiler was owned by capture {holder.id} ({holder.label})",
                             owner={"capture": holder.id, "label": holder.label})
                return False
            self.thread = threading.get_ident()
            self.start_wall = time.time()
            self._record("started", start_time=self.start_wall, thread=threading.current_thread().name)
            self.spec = rt.spec_for(self)
            rt.backend.start(self.spec)
            self.status = "live"
            return True
        except BaseException as exc:
            if rt.holder() is self:  # claimed (even if the interrupt came before claim() returned)
                self._abandon(exc)
            if isinstance(exc, Exception):
                rt.failure("start", exc)
                return False
            raise

    def _abandon(self, exc: BaseException) -> None:
        """Undo a start or stop that did not complete: stop what the backend started, give back the token."""
        rt = self.runtime
        if self.status not in HOLDING:
            return
        try:
            abort = getattr(rt.backend, "abort", None)
            if abort is not None:
                abort()
        except Exception as err:  # noqa: BLE001 - best effort; the record says how the capture ended
            logger.warning("profctx: could not stop the profiler session of capture %s: %s", self.id, err)
        finally:
            rt.release(self)
            self.close_folder()  # nothing is written: the stop never completed
        self.status = "failed" if isinstance(exc, Exception) else "interrupted"
        self._finished(self.status, error=exc)  # type: ignore[arg-type]

    # -- ranges -------------------------------------------------------------------------------

    def open_range(self, name: str, *, marker: bool = False) -> Range | None:
        """Open a named range on the calling thread, or return ``None`` if none can be drawn.

        ``marker``: a step marker (``ProfilerStep#N``) or a role capture's own role, not a role
        range (backends with a ``marker`` method draw it there; others draw it as a range).
        """
        if self.status != "live":
            return None
        backend = self.runtime.backend
        try:
            cm = ((getattr(backend, "marker", None) or backend.range) if marker else backend.range)(name)
            cm.__enter__()
        except Exception as exc:  # noqa: BLE001
            self.runtime.failure("range", exc)
            return None
        entry = Range(cm)
        me = threading.get_ident()
        stack = self.stacks.get(me)
        if stack is None:
            stack = self.stacks[me] = []
        stack.append(entry)
        if not marker:
            self.ranges += 1
        return entry

    def close_range(self, entry: Range) -> None:
        """Close ``entry``; ranges entered after it on its thread and still open close with it later.

        Concurrent asyncio tasks on one thread leave blocks out of order; the backend's ranges
        (``record_function``) must still close last-in first-out, so a range left early stays
        open until the ones above it close.
        """
        entry.open = False
        stack = self.stacks.get(threading.get_ident())
        while stack and not stack[-1].open:
            top = stack.pop()
            if top.cm is not None:
                cm, top.cm = top.cm, None
                try:
                    cm.__exit__(None, None, None)
                except Exception as exc:  # noqa: BLE001
                    self.runtime.failure("range", exc, in_flight=True)

    def _close_own_ranges(self) -> None:
        """Close every range still open on this thread (innermost first) before the backend stops."""
        stack = self.stacks.get(threading.get_ident(), [])
        for entry in stack:
            entry.open = False
        if stack:
            self.close_range(stack[-1])

    # -- stop ---------------------------------------------------------------------------------

    def end(self, *, in_flight: bool = False) -> None:
        """Stop the backend on this thread and hand the file writing to the writer thread.

        Called on another thread than the one that started the capture, the stop is deferred
        to that thread's next block (:meth:`Runtime.defer_stop`). ``in_flight``: a user
        exception is propagating, so a profiling error is never raised.
        """
        rt = self.runtime
        stopped = submitted = False
        blocked = 0.0
        try:
            if self.status != "live":
                return
            if threading.get_ident() != self.thread:
                rt.defer_stop(self)
                return
            self.status = "stopping"
            self._close_own_ranges()
            t0 = time.perf_counter()
            finish = rt.backend.stop()
            stopped = True
            blocked = time.perf_counter() - t0
            rt.release(self)
            end_wall = time.time()
            rt.submit(lambda: self._write(finish, blocked, end_wall))
            submitted = True
        except BaseException as exc:
            if not stopped:
                self._abandon(exc)
            elif not submitted:
                rt.release(self)
                self.status = "interrupted"
                self._finished("interrupted", error=exc, blocked=blocked)
            if isinstance(exc, Exception):
                rt.failure("stop", exc, in_flight=in_flight)
                return
            raise

    def abandon(self, reason: str) -> None:
        """Record a recording capture as ``interrupted`` without stopping it (its thread is not here)."""
        if self.status != "live":
            return
        self.status = "interrupted"
        self._finished("interrupted", notes=[reason])

    def _write(self, finish: Any, blocked: float, end_wall: float) -> None:
        w0 = time.perf_counter()
        try:
            try:
                files = finish()
                self._check_folder(files)
            finally:
                self.close_folder()
        except BaseException as exc:  # noqa: BLE001 - recorded, then reported by flush()
            self.runtime.disk.failed(exc)
            self.status = "failed"
            self._finished("failed", error=exc, blocked=blocked, end_wall=end_wall,
                           write_s=time.perf_counter() - w0)
            self.runtime.failure("write", exc, in_flight=True)
            return
        self.status = "ok"
        self.runtime.disk.wrote(files)
        self._finished("ok", files=files, blocked=blocked, end_wall=end_wall, write_s=time.perf_counter() - w0)

    def _check_folder(self, files: Any) -> None:
        """Raise ``OSError`` when the capture folder was moved during the capture (its files are then removed).

        The files were written through the folder's held descriptor, so wherever the folder went
        (renamed away, a link put in its place) nothing landed outside it; but the paths the record
        would give are no longer the files', so the capture fails, saying why.
        """
        spec = self.spec
        at = spec.at if spec is not None else None
        if at is None or at.still_at(self.runtime.save_path, self.folder):
            return
        for path in files or ():
            with contextlib.suppress(OSError, TypeError):
                at.remove(Path(path).name, re.compile(re.escape(Path(path).name)))
        raise OSError(errno.EXDEV, "the capture folder was renamed or replaced (by a link?) during the capture; "
                      "its files, written into the folder profctx held, were removed", str(at.path))

    def close_folder(self) -> None:
        """Close the capture folder's descriptor once its files are written or none will be.

        Where that is not known (an interrupt between handing the write over and noting it), the
        descriptor is closed when the spec is collected (:meth:`profctx.util._fs.Folder.__del__`).
        """
        spec = self.spec
        if spec is not None and spec.at is not None:
            with contextlib.suppress(OSError):
                spec.at.close()

    def _finished(
        self,
        status: Status,
        *,
        error: BaseException | None = None,
        files: Any = (),
        blocked: float | None = None,
        end_wall: float | None = None,
        notes: list[str] | None = None,
        write_s: float | None = None,
    ) -> None:
        rt = self.runtime
        end = time.time() if end_wall is None else end_wall
        listed = file_entries(files, rt.save_path)
        if status == "ok":
            rt.traces.add(sum(f["bytes"] or 0 for f in listed))
        all_notes = list(self.spec.notes if self.spec else ()) + list(notes or ())
        if self.raised is not None:
            all_notes.append(self.raised)
        self._record(
            "finished",
            status=status,
            start_time=self.start_wall or None,
            end_time=end,
            duration_s=(end - self.start_wall) if self.start_wall else None,
            blocked_s=blocked,
            write_s=write_s,
            files=listed,
            bytes=sum(f["bytes"] or 0 for f in listed),
            ranges=self.ranges,
            error=None if error is None else _describe(error),
            notes=all_notes,
        )


def _describe(error: BaseException) -> str:
    text = str(error)
    if isinstance(error, KeyboardInterrupt):
        return "KeyboardInterrupt: interrupted (Ctrl-C)"
    if isinstance(error, SystemExit):
        return f"SystemExit: the process is exiting ({text or 0})"
    return f"{type(error).__name__}: {text}"

