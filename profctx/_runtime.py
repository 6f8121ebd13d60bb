"""The runtime of one configuration: decides captures for each block and owns their lifecycle."""

from __future__ import annotations

import contextlib
import fnmatch
import os
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import _registry, _state
from ._capture import Capture
from ._config import ProfilerConfig
from ._errors import ProfilingError
from ._identity import Identity, resolve
from ._log import logger, warn_once
from ._manifest import ManifestWriter
from ._scope import Scope
from ._window import StepWindow
from .backends import backend_class, choose_tool


class Frame:
    """What one block did on entry, so its exit can undo exactly that."""

    __slots__ = ("closes_run", "hooks", "live", "owned", "range")

    def __init__(self) -> None:
        self.live: Capture | None = None
        self.owned: Capture | None = None
        self.closes_run = False
        self.range: Any = None
        self.hooks: list[tuple[Any, object]] = []


def new_run_id() -> str:
    """Return a fresh run id: UTC time plus 6 random hex digits."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


class Runtime:
    """Everything derived from one active configuration in this process."""

    def __init__(self, config: ProfilerConfig) -> None:
        self.config = config
        self.window: StepWindow = config.steps or StepWindow()
        self.tool, self.tool_note = choose_tool(config.tool)
        if self.tool_note is not None:
            logger.info("profctx: %s", self.tool_note)
        self.backend: Any = backend_class(self.tool)()
        self.save_path = Path(config.save_path).expanduser().absolute()
        self.run_id = config.run_id or os.environ.get("PROFCTX_RUN_ID") or new_run_id()
        self.contiguous: Capture | None = None
        self.errors: list[str] = []
        self._identity: Identity | None = None
        self._manifest: ManifestWriter | None = None
        self._lock = threading.RLock()
        self._writer: ThreadPoolExecutor | None = None
        self._pending: set[Future[None]] = set()
        self.listeners: list[Callable[[dict[str, Any]], None]] = []

    # -- identity and selection ---------------------------------------------------------------

    def identity(self) -> Identity:
        """Return this process's identity (cached once it comes from config, env or torch.distributed)."""
        if self._identity is not None:
            return self._identity
        identity = resolve(self.config.rank, self.config.world_size)
        if identity.source != "default":
            self._identity = identity
        return identity

    def rank_selected(self) -> bool:
        """Whether this process's rank is one the config profiles."""
        ranks = self.config.ranks
        return ranks == "all" or self.identity().rank in ranks

    def role_selected(self, roles: tuple[str, ...]) -> bool:
        """Whether the role filter matches the innermost role name or the whole path."""
        patterns = self.config.roles
        if not patterns:
            return True
        name, path = roles[-1], "/".join(roles)
        return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(path, p) for p in patterns)

    # -- blocks -------------------------------------------------------------------------------

    def enter(self, scope: Scope, sets_step: bool, sets_role: bool) -> Frame | None:
        """Decide what a block entering ``scope`` opens; return the frame, or ``None`` for nothing."""
        step = scope.step
        if step is None or step not in self.window:
            if sets_step and self.contiguous is not None:
                self._close_contiguous()
            return None
        frame = Frame()
        frame.live = _state.LIVE.get()
        _state.GATE.append(frame)
        try:
            self._open(frame, scope, sets_step, sets_role)
        except ProfilingError:
            self.exit(frame)
            raise
        return frame

    def _open(self, frame: Frame, scope: Scope, sets_step: bool, sets_role: bool) -> None:
        cfg = self.config
        step = scope.step
        assert step is not None
        selected = self.rank_selected()
        if sets_step and cfg.mode == "step" and selected:
            if cfg.contiguous:
                run = self.window.run_of(step) or (step,)
                with self._lock:
                    capture = self.contiguous
                    if capture is not None and step not in capture.steps:
                        self._close_contiguous()
                        capture = None
                    if capture is None:
                        capture = Capture(self, "step", run, ())
                        capture.begin()
                        self.contiguous = capture if capture.live else None
                frame.live = capture
                frame.closes_run = step == run[-1]
            else:
                capture = Capture(self, "step", (step,), ())
                capture.begin()
                frame.live = capture
                frame.owned = capture
        if not sets_role:
            return
        roles = scope.roles
        target = _target(frame.live)
        if target is not None and target.live:
            if cfg.mode == "role" or self.role_selected(roles):
                frame.range = target.range(roles[-1])
        elif cfg.mode == "role" and selected and self.role_selected(roles) and frame.live is None:
            capture = Capture(self, "role", (step,), roles)
            capture.begin()
            frame.live = capture
            frame.owned = capture
            owner = capture.owner
            if owner is not None and owner.live:
                frame.range = owner.range(roles[-1])

    def exit(self, frame: Frame, *, in_flight: bool = False) -> None:
        """Undo what :meth:`enter` opened for ``frame``."""
        try:
            if frame.range is not None:
                try:
                    frame.range.__exit__(None, None, None)
                except Exception as exc:  # noqa: BLE001
                    self.failure("range", exc, in_flight=True)
                frame.range = None
            if frame.owned is not None:
                frame.owned.end(in_flight=in_flight)
            elif frame.closes_run:
                with self._lock:
                    if self.contiguous is not None and self.contiguous is frame.live:
                        self._close_contiguous(in_flight=in_flight)
        finally:
            with contextlib.suppress(ValueError):
                _state.GATE.remove(frame)

    def _close_contiguous(self, *, in_flight: bool = False) -> None:
        with self._lock:
            capture, self.contiguous = self.contiguous, None
        if capture is not None:
            capture.end(in_flight=in_flight)

    # -- records, failures, writing -------------------------------------------------------------

    def record(self, record: dict[str, Any]) -> None:
        """Append ``record`` to this process's manifest shard and tell listeners."""
        identity = self.identity()
        with self._lock:
            if self._manifest is None or self._manifest.identity != identity:
                self._manifest = ManifestWriter(self.save_path, self.run_id, identity)
            manifest = self._manifest
        full = manifest.envelope(record)
        manifest.write(full)
        for listener in list(self.listeners):
            listener(dict(full))

    def failure(self, what: str, exc: BaseException, *, in_flight: bool = False) -> None:
        """Handle a profiling failure: log once, keep it, raise only when asked to and safe."""
        message = f"{type(exc).__name__}: {exc}"
        self.errors.append(f"{what}: {message}")
        # One warning per kind of failure; the manifest records every occurrence.
        key = f"{what}:{type(exc).__name__}:{getattr(exc, 'errno', '')}"
        warn_once(key, "profctx: %s failed: %s (training continues; repeats are logged at debug level)", what, message)
        if self.config.on_error == "raise" and not in_flight:
            raise ProfilingError(f"profiling {what} failed: {message}") from exc

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the writer thread (created on first use; joined at exit)."""
        with self._lock:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="profctx-writer")
            try:
                future = self._writer.submit(job)
            except RuntimeError:  # the interpreter is shutting down: write here
                job()
                return
            self._pending.add(future)
        future.add_done_callback(self._pending.discard)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every stopped capture's files are written; return whether all finished in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                pending = list(self._pending)
            if not pending:
                return True
            for future in pending:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    future.result(timeout=left)
                except TimeoutError:
                    return False
                except Exception:  # noqa: BLE001 - already recorded by the job
                    pass

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop any open capture, write everything, close the manifest."""
        self._close_contiguous(in_flight=True)
        owner = _registry.owner()
        if owner is not None and owner.runtime is self:
            owner.end(in_flight=True)
        self.flush(timeout)
        with self._lock:
            writer, self._writer = self._writer, None
            manifest = self._manifest
        if writer is not None:
            writer.shutdown(wait=False)
        if manifest is not None:
            manifest.close()
        logger.debug("profctx runtime %s shut down", self.run_id)


def _target(live: Capture | None) -> Capture | None:
    """The capture ranges go to: the live one, or the owner of a skipped one."""
    if live is None:
        return None
    if live.status == "skipped":
        return live.owner
    return live
