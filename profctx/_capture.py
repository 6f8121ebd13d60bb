"""One capture: claim the process's profiler, start the backend, stop it, write and record files."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _registry
from ._layout import capture_folder, trace_stem
from .backends import CaptureSpec

if TYPE_CHECKING:
    from ._runtime import Runtime


class Capture:
    """A device-profiler session over some steps and, in role mode, one role path.

    Status moves ``planned`` -> ``live`` -> ``stopping`` -> ``ok``/``failed``, or ``planned`` ->
    ``skipped`` (another capture owned the profiler) / ``failed`` (the start failed).
    """

    __slots__ = (
        "folder",
        "id",
        "kind",
        "owner",
        "ranges",
        "roles",
        "runtime",
        "spec",
        "start_mono",
        "start_wall",
        "status",
        "steps",
        "thread",
    )

    def __init__(self, runtime: Runtime, kind: str, steps: tuple[int, ...], roles: tuple[str, ...]) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.runtime = runtime
        self.kind = kind
        self.steps = steps
        self.roles = roles
        self.status = "planned"
        self.owner: Capture | None = None
        self.thread = threading.get_ident()
        self.folder = capture_folder(steps, roles)
        self.start_wall = 0.0
        self.start_mono = 0.0
        self.spec: CaptureSpec | None = None
        self.ranges = 0

    @property
    def live(self) -> bool:
        """Whether the capture is recording now."""
        return self.status == "live"

    @property
    def label(self) -> str:
        """A short human description: ``step 3 role actor_update``."""
        steps = f"step {self.steps[0]}" if len(self.steps) == 1 else f"steps {self.steps[0]}-{self.steps[-1]}"
        return f"{steps} role {'/'.join(self.roles)}" if self.roles else steps

    def _base_record(self) -> dict[str, Any]:
        return {
            "capture": self.id,
            "kind": self.kind,
            "steps": list(self.steps),
            "step": self.steps[0],
            "last_step": self.steps[-1],
            "role": "/".join(self.roles) or None,
            "backend": self.runtime.tool,
            "folder": self.folder.as_posix(),
        }

    def begin(self) -> bool:
        """Claim the profiler and start the backend; return whether the capture is live.

        Never raises unless ``on_error="raise"``; a refusal or failure is recorded.
        """
        rt = self.runtime
        owner = _registry.claim(self)
        if owner is not None:
            self.status = "skipped"
            self.owner = owner
            rt.record({
                **self._base_record(),
                "event": "finished",
                "status": "skipped",
                "time": time.time(),
                "reason": f"the process's profiler was owned by capture {owner.id} ({owner.label})",
                "owner": {"capture": owner.id, "label": owner.label},
            })
            return False
        identity = rt.identity()
        self.thread = threading.get_ident()
        self.start_wall = time.time()
        self.start_mono = time.perf_counter()
        metadata = {
            "capture": self.id,
            "run": rt.run_id,
            "steps": list(self.steps),
            "step": self.steps[0],
            "role": "/".join(self.roles) or None,
            "rank": identity.rank,
            "world_size": identity.world_size,
            "host": identity.host,
            "pid": identity.pid,
            "start_time": self.start_wall,
        }
        rt.record({**self._base_record(), "event": "started", "start_time": self.start_wall,
                   "thread": threading.current_thread().name})
        try:
            folder = rt.save_path / self.folder
            folder.mkdir(parents=True, exist_ok=True)
            self.spec = CaptureSpec(
                capture_id=self.id,
                steps=self.steps,
                roles=self.roles,
                folder=folder,
                stem=trace_stem(identity),
                identity=identity,
                run_id=rt.run_id,
                contents=rt.config.contents,
                options=rt.config.tool_options,
                compress=rt.config.compress,
                metadata=metadata,
                notes=[rt.tool_note] if rt.tool_note else [],
            )
            rt.backend.start(self.spec)
        except Exception as exc:  # noqa: BLE001 - profiling never breaks training
            _registry.release(self)
            self.status = "failed"
            self._finished("failed", error=exc)
            rt.failure("start", exc)
            return False
        self.status = "live"
        return True

    def range(self, name: str) -> Any:
        """Enter and return a named range in this live capture, or ``None`` if it cannot be opened."""
        if self.status != "live":
            return None
        try:
            cm = self.runtime.backend.range(name)
            cm.__enter__()
        except Exception as exc:  # noqa: BLE001
            self.runtime.failure("range", exc)
            return None
        self.ranges += 1
        return cm

    def end(self, *, in_flight: bool = False) -> None:
        """Stop the backend (on this thread) and hand the file writing to the writer thread.

        ``in_flight``: a user exception is propagating, so a profiling error is never raised.
        """
        if self.status != "live":
            return
        rt = self.runtime
        self.status = "stopping"
        notes: list[str] = []
        if threading.get_ident() != self.thread:
            notes.append("stopped on another thread than the one that started it")
        t0 = time.perf_counter()
        try:
            finish = rt.backend.stop()
        except Exception as exc:  # noqa: BLE001
            _registry.release(self)
            self.status = "failed"
            self._finished("failed", error=exc, blocked=time.perf_counter() - t0, notes=notes)
            rt.failure("stop", exc, in_flight=in_flight)
            return
        blocked = time.perf_counter() - t0
        end_wall = time.time()
        _registry.release(self)

        def write() -> None:
            w0 = time.perf_counter()
            try:
                files = finish()
            except BaseException as exc:  # noqa: BLE001 - recorded, then reported by flush()
                self.status = "failed"
                self._finished("failed", error=exc, blocked=blocked, end_wall=end_wall, notes=notes,
                               write_s=time.perf_counter() - w0)
                rt.failure("write", exc, in_flight=True)
                return
            self.status = "ok"
            self._finished("ok", files=files, blocked=blocked, end_wall=end_wall, notes=notes,
                           write_s=time.perf_counter() - w0)

        rt.submit(write)

    def _finished(
        self,
        status: str,
        *,
        error: BaseException | None = None,
        files: Sequence[Path] = (),
        blocked: float | None = None,
        end_wall: float | None = None,
        notes: Sequence[str] = (),
        write_s: float | None = None,
    ) -> None:
        rt = self.runtime
        end = time.time() if end_wall is None else end_wall
        listed = []
        for path in files:
            try:
                size = path.stat().st_size
            except OSError:
                size = None
            try:
                shown = path.relative_to(rt.save_path).as_posix()
            except ValueError:
                shown = str(path)
            listed.append({"path": shown, "bytes": size})
        all_notes = list(self.spec.notes if self.spec else ()) + list(notes)
        rt.record({
            **self._base_record(),
            "event": "finished",
            "status": status,
            "start_time": self.start_wall or None,
            "end_time": end,
            "duration_s": (end - self.start_wall) if self.start_wall else None,
            "blocked_s": blocked,
            "write_s": write_s,
            "files": listed,
            "bytes": sum(f["bytes"] or 0 for f in listed),
            "ranges": self.ranges,
            "error": None if error is None else f"{type(error).__name__}: {error}",
            "notes": all_notes,
        })
