"""The engine adapter protocol: start and stop an inference engine's profiler for one scope.

An adapter owns one engine replica. :meth:`EngineAdapter.start` plans the capture from the
ambient configuration (folder, file name, options), records it in the manifest and asks the
engine to start; :meth:`EngineAdapter.stop` stops it and records the outcome. Subclasses only
implement the engine calls (:meth:`EngineAdapter._start` and :meth:`EngineAdapter._stop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .. import _state
from .._config import EngineConfig
from .._errors import ConfigError
from .._layout import capture_folder, safe
from .._log import logger, warn_once
from .._scope import Scope
from ._loop import run_sync

T = TypeVar("T")


class EngineError(RuntimeError):
    """Raise when an engine refuses or fails a profiling call; the message says what to do."""


class AlreadyActive(EngineError):  # noqa: N818 - a state, not a failure of profctx
    """Raise when the engine reports a profiling session it did not get from this adapter."""


@dataclass(frozen=True)
class EngineRequest:
    """What one engine capture asks for: where, under which name, with which options.

    Plain data (``to_dict``/``from_dict``) so it can cross to an engine living in another
    process. ``folder`` is an absolute path as the engine's host should see it.
    """

    capture: str
    step: int
    roles: tuple[str, ...]
    replica: int
    engine: str
    folder: str
    name: str
    save_path: str = ""
    contents: tuple[str, ...] = ()
    delay: int | None = None
    count: int | None = None
    by_stage: bool = False
    merge_profiles: bool = False
    absolute_start_step: int | None = None
    start_timeout: float = 120.0
    stop_timeout: float = 1800.0

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-safe dict that :meth:`from_dict` reads back."""
        data = dataclasses.asdict(self)
        data["roles"] = list(self.roles)
        data["contents"] = list(self.contents)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineRequest:
        """Return the request a :meth:`to_dict` result describes (unknown keys are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["roles"] = tuple(kwargs.get("roles", ()))
        kwargs["contents"] = tuple(kwargs.get("contents", ()))
        return cls(**kwargs)


@dataclass
class Outcome:
    """What the engine call did: notes for the manifest, and where files really land."""

    notes: list[str] = field(default_factory=list)
    folder: str | None = None
    version: str | None = None
    engine: str | None = None
    #: Notes for the manifest only (facts, not options dropped): never logged as warnings.
    facts: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-safe dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Outcome:
        """Return the outcome a :meth:`to_dict` result describes."""
        return cls(list(data.get("notes") or ()), data.get("folder"), data.get("version"), data.get("engine"),
                   list(data.get("facts") or ()))


def plan(scope: Scope, engines: EngineConfig, save_path: str, engine: str, replica: int) -> EngineRequest:
    """Return the request for ``engine`` replica ``replica`` in ``scope`` (a pure function).

    The folder is ``{save_path}/step{S:06d}/{role path}/{engine}-replica{R}``; the name, used
    for file names where the engine allows it, is ``step{S:06d}-{role path with '.'}-replica{R}``.
    """
    if scope.step is None or not scope.roles:
        raise ValueError(f"scope: {scope!r} has no step or no role; engines start inside a role of a step")
    relative = capture_folder((scope.step,), scope.roles).as_posix()
    folder = f"{save_path.rstrip('/')}/{relative}/{engine}-replica{replica}"
    name = f"step{scope.step:06d}-{'.'.join(safe(r) for r in scope.roles)}-replica{replica}"
    return EngineRequest(
        capture=uuid.uuid4().hex[:12],
        step=scope.step,
        roles=scope.roles,
        replica=replica,
        engine=engine,
        folder=folder,
        name=name,
        save_path=save_path.rstrip("/"),
        contents=engines.contents,
        delay=engines.delay,
        count=engines.count,
        by_stage=engines.by_stage,
        merge_profiles=engines.merge_profiles,
        absolute_start_step=engines.absolute_start_step,
        start_timeout=engines.start_timeout,
        stop_timeout=engines.stop_timeout,
    )


class EngineAdapter(ABC):
    """Drive one engine replica's profiler from the ambient scope.

    ``start(scope)`` / ``stop()`` are coroutines; ``start_sync`` / ``stop_sync`` are their
    blocking twins (they run on a private event loop thread, so they also work when the
    caller is inside a running loop). One session at a time: a start while a session is
    open does nothing and returns ``False``; ``stop`` is idempotent. Failures are logged
    once and recorded in the manifest, never raised, unless ``on_error="raise"``.
    Thread- and task-safe.

    ``loop``: the event loop the engine object lives in (in-process async engines); engine
    calls are made there. ``None``: whatever loop runs the adapter.
    """

    #: The engine's name in folders and records (``vllm``, ``sglang``).
    engine: str = "engine"

    def __init__(self, *, replica: int = 0, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if isinstance(replica, bool) or not isinstance(replica, int) or replica < 0:
            raise ConfigError("replica", replica, "an integer >= 0 (this engine's replica index)")
        self.replica = replica
        self.loop = loop
        self._lock = threading.Lock()
        self._active: EngineRequest | None = None
        self._busy = False
        self._record_base: dict[str, Any] = {}
        self._notes: list[str] = []

    # -- what subclasses provide ------------------------------------------------------------

    @property
    def version(self) -> str | None:
        """The engine version this adapter targets, or ``None`` if only known at run time."""
        return None

    def check(self, engines: EngineConfig) -> None:  # noqa: B027 - optional for subclasses
        """Raise :class:`ConfigError` for an option this engine version cannot honour.

        Called at attach and at configure time; only raises when the version is known.
        """

    def describe(self) -> str:
        """Return a short label for logs: ``vllm-replica0``."""
        return f"{self.engine}-replica{self.replica}"

    @abstractmethod
    async def _start(self, request: EngineRequest) -> Outcome:
        """Ask the engine to start profiling; raise :class:`EngineError` on refusal."""

    @abstractmethod
    async def _stop(self, request: EngineRequest) -> Outcome:
        """Ask the engine to stop profiling; an already-stopped engine is not an error."""

    # -- engine-side entry points (no manifest; used by servers) ---------------------------------

    async def start_request(self, request: EngineRequest) -> Outcome:
        """Start the engine for ``request`` unless a session is open; raise on failure.

        Raise :class:`AlreadyActive` when this adapter already has a session open.
        """
        with self._lock:
            if self._active is not None or self._busy:
                raise AlreadyActive(f"{self.describe()} is already profiling (capture {self._active_id()})")
            self._busy = True
        try:
            outcome = await asyncio.wait_for(self._start(request), request.start_timeout)
        except BaseException:
            with self._lock:
                self._busy = False
            raise
        with self._lock:
            self._busy = False
            self._active = request
        return outcome

    async def stop_request(self) -> Outcome | None:
        """Stop the open session; return ``None`` when none is open. Raise on failure."""
        with self._lock:
            request, self._active = self._active, None
        if request is None:
            return None
        return await asyncio.wait_for(self._stop(request), request.stop_timeout)

    def _active_id(self) -> str:
        active = self._active
        return active.capture if active is not None else "starting"

    @property
    def active(self) -> bool:
        """Whether a session started by this adapter is open."""
        return self._active is not None

    # -- driver entry points ---------------------------------------------------------------------

    async def start(self, scope: Scope | None = None, *, _blocked_loop: object = None) -> bool:
        """Start profiling for ``scope`` (default: the ambient one); return whether it started.

        Does nothing (``False``) when profctx is not configured, this replica is not in
        ``engines.replicas``, or a session is already open.
        """
        runtime = _state.RUNTIME
        scope = scope if scope is not None else _current()
        if runtime is None or scope.step is None or not scope.roles:
            return False
        engines = runtime.config.engines
        if engines.replicas != "all" and self.replica not in engines.replicas:
            return False
        with self._lock:
            if self._active is not None or self._busy:
                logger.debug("profctx: %s already profiling; not started again", self.describe())
                return False
        request = plan(scope, engines, runtime.save_path.as_posix(), self.engine, self.replica)
        base = {
            "capture": request.capture,
            "kind": "engine",
            "engine": self.engine,
            "version": self.version,
            "replica": self.replica,
            "step": request.step,
            "steps": [request.step],
            "last_step": request.step,
            "role": "/".join(request.roles),
            "folder": request.folder,
            "backend": self.engine,
        }
        start_wall = time.time()
        runtime.record({**base, "event": "started", "start_time": start_wall})
        try:
            if _blocked_loop is not None and _blocked_loop is self.loop:
                raise EngineError(
                    f"{self.describe()} lives in the event loop that entered the role with a plain `with`; "
                    "use `async with profctx.profile_step(...)` there"
                )
            outcome = await self.start_request(request)
        except AlreadyActive as exc:
            runtime.record({**base, "event": "finished", "status": "skipped", "end_time": time.time(),
                            "error": None, "reason": str(exc), "notes": []})
            warn_once(f"engine-active:{self.describe()}", "profctx: %s not started: %s", self.describe(), exc)
            return False
        except BaseException as exc:
            shown = _plain(exc, request.start_timeout)
            runtime.record({**base, "event": "finished", "status": "failed", "end_time": time.time(),
                            "start_time": start_wall, "error": _error(shown), "notes": []})
            if isinstance(exc, Exception):
                runtime.failure(f"engine {self.describe()} start", shown)
                return False
            raise
        base.update({k: v for k, v in (("folder", outcome.folder), ("version", outcome.version),
                                        ("engine", outcome.engine)) if v is not None})
        for note in outcome.notes:
            warn_once(f"engine-note:{self.engine}:{note}", "profctx: %s: %s", self.describe(), note)
        notes = list(outcome.notes) + list(outcome.facts)
        with self._lock:
            self._record_base = base | {"start_time": start_wall}
            self._notes = notes
        return True

    async def stop(self) -> None:
        """Stop the session :meth:`start` opened and record how it ended; idempotent."""
        with self._lock:
            request, base, notes = self._active, self._record_base, self._notes
        if request is None:
            return
        runtime = _state.RUNTIME
        try:
            outcome = await self.stop_request()
        except BaseException as exc:
            shown = _plain(exc, request.stop_timeout)
            if runtime is not None:
                runtime.record({**base, "event": "finished", "status": "failed", "end_time": time.time(),
                                "error": _error(shown), "notes": notes})
            if isinstance(exc, Exception):
                if runtime is not None:
                    runtime.failure(f"engine {self.describe()} stop", shown)
                return
            raise
        if runtime is not None and outcome is not None:
            for note in outcome.notes:
                warn_once(f"engine-note:{self.engine}:{note}", "profctx: %s: %s", self.describe(), note)
            runtime.record({**base, "event": "finished", "status": "ok", "end_time": time.time(),
                            "error": None, "notes": [*notes, *outcome.notes, *outcome.facts]})

    def start_sync(self, scope: Scope | None = None) -> bool:
        """Blocking twin of :meth:`start` (safe inside a running event loop)."""
        scope = scope if scope is not None else _current()
        return run_sync(lambda: self.start(scope))

    def stop_sync(self) -> None:
        """Blocking twin of :meth:`stop` (safe inside a running event loop)."""
        run_sync(self.stop)

    # -- helpers for subclasses ------------------------------------------------------------------

    async def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Await ``make()`` in the engine's loop (this loop when none was given)."""
        loop = self.loop
        if loop is None or loop is asyncio.get_running_loop():
            return await make()
        if loop.is_closed():
            raise EngineError(f"{self.describe()}: the engine's event loop is closed")

        async def wrapper() -> T:
            return await make()

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(wrapper(), loop))

    @staticmethod
    async def _blocking(func: Callable[[], T]) -> T:
        """Run a blocking engine call in a daemon thread so replicas proceed concurrently.

        A daemon thread, not the loop's executor: a call that never returns must not keep
        the interpreter from exiting once the timeout gave up on it.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def deliver(ok: bool, value: Any) -> None:
            if not future.done():
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

        def run() -> None:
            try:
                result: Any = func()
                ok = True
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                result, ok = exc, False
            with contextlib.suppress(RuntimeError):  # the loop closed while the engine call ran
                loop.call_soon_threadsafe(deliver, ok, result)

        threading.Thread(target=run, name="profctx-engine-call", daemon=True).start()
        return await future


def _current() -> Scope:
    from .._scope import current

    return current()


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _plain(exc: BaseException, timeout: float) -> BaseException:
    """Give a timeout a message that says which limit was hit and how to raise it."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) and not str(exc):
        return EngineError(
            f"no answer within {timeout:g} s (engines.start_timeout / engines.stop_timeout set the limits)"
        )
    return exc


class HttpAdapter(EngineAdapter):
    """The part every HTTP-server adapter shares: URL, known version, bearer token.

    Subclasses set ``engine``, ``example_url``, and the version parser and option check
    of their engine (``_parse_version``, ``_check_options``).
    """

    #: Shown in the error for an unusable URL.
    example_url: str = "http://host:8000"

    def __init__(self, url: str, *, replica: int = 0, version: str | None = None,
                 api_key: str | None = None) -> None:
        from ._http import normalise, require_client

        require_client()
        super().__init__(replica=replica)
        try:
            self.url = normalise(url)
        except ValueError as exc:
            raise ConfigError("url", url, f"an http:// or https:// address such as {self.example_url}") from exc
        if version is not None:
            self._parse_version(version)
        self._version = version
        self.api_key = api_key

    @staticmethod
    def _parse_version(version: str) -> object:
        """Parse ``version``; raise ``ConfigError`` for one this adapter cannot read."""
        return version

    @staticmethod
    def _check_options(engines: EngineConfig, version: str | None) -> None:
        """Raise ``ConfigError`` for an option ``version`` of the engine cannot honour."""

    @property
    def version(self) -> str | None:
        return self._version

    def check(self, engines: EngineConfig) -> None:
        self._check_options(engines, self._version)

    def describe(self) -> str:
        return f"{self.engine}-replica{self.replica} ({self.url})"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
