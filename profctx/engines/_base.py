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
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..core._config import EngineConfig
from ..core._layout import capture_folder, safe
from ..core._scope import Scope
from ..core._status import Ended
from ..util._errors import ConfigError
from ..util._fs import walk
from ..util._identity import capture_id
from ..util._log import logger, warn_once
from ._host import Host, process
from ._loop import run_sync

T = TypeVar("T")


class EngineError(RuntimeError):
    """Raise when an engine refuses or fails a profiling call; the message says what to do."""


class AlreadyActive(EngineError):  # noqa: N818 - a state, not a failure of profctx
    """Raise when the engine reports a profiling session it did not get from this adapter."""


class StartTimedOut(EngineError):  # noqa: N818 - reads as what happened
    """Raise when a start passed ``engines.start_timeout``; the engine is stopped once it answers."""


class StopTimedOut(EngineError):  # noqa: N818
    """Raise when a stop passed ``engines.stop_timeout``; the engine's stop goes on in the background."""


#: Told what a start or stop that passed its timeout finally did: ``(status, state, outcome)``.
Report = Callable[[Ended, str, "Outcome | None"], None]


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
    #: How this capture's files are told apart in ``folder``: ``"folder"`` (everything in it is
    #: this capture's), ``"prefix"`` (names start with ``prefix``), or ``"time"`` (written while it ran).
    files_by: str = "folder"
    prefix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-safe dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Outcome:
        """Return the outcome a :meth:`to_dict` result describes."""
        return cls(list(data.get("notes") or ()), data.get("folder"), data.get("version"), data.get("engine"),
                   list(data.get("facts") or ()), str(data.get("files_by") or "folder"), data.get("prefix"))


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
        capture=capture_id(),
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
        self._runtime: Host | None = None
        self._started: Outcome | None = None
        self._settling: set[asyncio.Future[None]] = set()

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

    def planned_folder(self, request: EngineRequest) -> str | None:
        """Return the folder the engine will write ``request``'s files into, as far as known before it starts."""
        return request.folder

    async def start_request(self, request: EngineRequest, late: Report | None = None) -> Outcome:
        """Start the engine for ``request`` unless a session is open; raise on failure.

        Raise :class:`AlreadyActive` when this adapter already has a session open (or is still
        settling one), and :class:`StartTimedOut` after ``request.start_timeout``: the engine
        call is not cancelled (vLLM starts anyway), profctx stops the engine once it answers and
        hands ``late`` what happened. Until then this adapter starts nothing new.
        """
        with self._lock:
            if self._active is not None or self._busy:
                if self._active is None and self._settling:
                    raise AlreadyActive(f"{self.describe()} is still settling a start or stop that passed its "
                                        "timeout (engines.start_timeout / engines.stop_timeout); nothing new is "
                                        "started until it answers")
                raise AlreadyActive(f"{self.describe()} is already profiling (capture {self._active_id()})")
            self._busy = True
        call = asyncio.ensure_future(self._start(request))
        try:
            outcome = await asyncio.wait_for(asyncio.shield(call), request.start_timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            # The engine may still start: settle it in the background, keeping the slot busy until then.
            settle = asyncio.ensure_future(self._settle_late_start(call, request, late))
            self._settling.add(settle)
            settle.add_done_callback(self._settling.discard)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise StartTimedOut(
                f"no answer within {request.start_timeout:g} s (engines.start_timeout); the engine may start "
                "anyway: profctx stops it as soon as it answers and records what it found"
            ) from None
        except BaseException:
            with self._lock:
                self._busy = False
            raise
        with self._lock:
            self._busy = False
            self._active = request
        return outcome

    async def _settle_late_start(self, call: asyncio.Future[Outcome], request: EngineRequest,
                                 late: Report | None) -> None:
        try:
            done, _ = await asyncio.wait({call}, timeout=request.stop_timeout)
            if not done:
                _report(late, "failed", "the engine's start never answered (waited start_timeout + stop_timeout, "
                        f"{request.start_timeout + request.stop_timeout:g} s): it may be profiling; stop it by hand",
                        None)
                return
            error = call.exception()
            if error is not None and not isinstance(error, (TimeoutError, ConnectionError)):
                _report(late, "failed", "the start failed after start_timeout, so the engine is not profiling: "
                        f"{_error(error)}", None)
                return
            outcome = call.result() if error is None else None
            try:
                stopped = await asyncio.wait_for(asyncio.shield(self._stop(request)), request.stop_timeout)
            except Exception as exc:  # noqa: BLE001 - recorded with the engine's state
                state = ("the start answered after start_timeout and profctx's stop then failed "
                         f"({_error(_plain(exc, request.stop_timeout))}): the engine may still be profiling")
                if error is not None:
                    state = (f"the start's answer was lost ({_error(error)}); profctx's stop, sent in case it "
                             f"took effect, failed ({_error(exc)}): the engine is most likely not profiling")
                _report(late, "failed", state, outcome)
                return
            state = "the start answered after start_timeout; profctx stopped the engine at once (no training in it)"
            if error is not None:
                state = (f"the start's answer was lost ({_error(error)}); profctx stopped the engine in case it "
                         "took effect")
            _report(late, "failed", state, _merged(outcome, stopped))
        finally:
            with self._lock:
                self._busy = False

    async def stop_request(self, late: Report | None = None) -> Outcome | None:
        """Stop the open session; return ``None`` when none is open. Raise on failure.

        Raise :class:`StopTimedOut` after ``stop_timeout``: the engine call is not cancelled
        (cancelling it would leave vLLM's session flag set); it finishes in the background,
        hands ``late`` the result, and this adapter starts nothing new until then.
        """
        with self._lock:
            request, self._active = self._active, None
            if request is not None:
                self._busy = True
        if request is None:
            return None
        call = asyncio.ensure_future(self._stop(request))
        try:
            outcome = await asyncio.wait_for(asyncio.shield(call), request.stop_timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            settle = asyncio.ensure_future(self._settle_late_stop(call, late))
            self._settling.add(settle)
            settle.add_done_callback(self._settling.discard)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise StopTimedOut(
                f"no answer within {request.stop_timeout:g} s (engines.stop_timeout); the engine is still "
                "stopping (writing its trace): profctx lets it finish and records the result"
            ) from None
        except BaseException:
            with self._lock:
                self._busy = False
            raise
        with self._lock:
            self._busy = False
        return outcome

    async def _settle_late_stop(self, call: asyncio.Future[Outcome], late: Report | None) -> None:
        try:
            outcome = await call
        except Exception as exc:  # noqa: BLE001 - recorded with the engine's state
            _report(late, "failed", f"the stop answered after stop_timeout with an error: {_error(exc)}", None)
        else:
            _report(late, "ok", "the stop answered after stop_timeout; the trace was written then", outcome)
        finally:
            with self._lock:
                self._busy = False

    async def settle(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout`` seconds) for late starts and stops still being settled."""
        # Only tasks of this loop can be awaited here (a start made in another loop settles there).
        loop = asyncio.get_running_loop()
        pending = [t for t in self._settling if t.get_loop() is loop]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    def _active_id(self) -> str:
        active = self._active
        return active.capture if active is not None else "a start or stop still settling"

    @property
    def active(self) -> bool:
        """Whether a session started by this adapter is open."""
        return self._active is not None

    @property
    def settling(self) -> bool:
        """Whether a start or stop that passed its timeout is still being waited for."""
        return bool(self._settling)

    # -- driver entry points ---------------------------------------------------------------------

    async def start(self, scope: Scope | None = None, *, runtime: Host | None = None,
                    _blocked_loop: object = None) -> bool:
        """Start profiling for ``scope`` (default: the ambient one); return whether it started.

        ``runtime``: the configuration's runtime (profctx passes it; direct callers may leave
        it out to use the process's). Does nothing (``False``) when profctx is not
        configured, this replica is not in ``engines.replicas``, or a session is already open.
        """
        runtime = runtime if runtime is not None else process().host()
        scope = scope if scope is not None else process().scope()
        if runtime is None or scope.step is None or not scope.roles:
            return False
        engines = runtime.config.engines
        if engines.replicas != "all" and self.replica not in engines.replicas:
            return False
        with self._lock:
            if self._active is not None:
                logger.debug("profctx: %s already profiling; not started again", self.describe())
                return False
        # A start or stop still settling (one passed its timeout) reaches start_request: recorded skipped.
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
            "folder": self.planned_folder(request),
            "backend": self.engine,
        }
        start_wall = time.time()
        runtime.record({**base, "event": "started", "start_time": start_wall})
        save_path = runtime.save_path

        def late(status: Ended, state: str, outcome: Outcome | None) -> None:
            found, more = _found(outcome, save_path, start_wall, base)
            runtime.record({**base, **found, "event": "finished", "status": status, "start_time": start_wall,
                            "end_time": time.time(), "error": None if status == "ok" else state,
                            "notes": [state, *more]})
            if status != "ok":
                warn_once(f"engine-late:{self.describe()}", "profctx: %s: %s", self.describe(), state)

        try:
            if _blocked_loop is not None and _blocked_loop is self.loop:
                raise EngineError(
                    f"{self.describe()} lives in the event loop that entered the role with a plain `with`; "
                    "use `async with profctx.profile_step(...)` there"
                )
            outcome = await self.start_request(request, late)
        except AlreadyActive as exc:
            runtime.record({**base, "event": "finished", "status": "skipped", "end_time": time.time(),
                            "error": None, "reason": str(exc), "notes": []})
            warn_once(f"engine-active:{self.describe()}", "profctx: %s not started: %s", self.describe(), exc)
            return False
        except BaseException as exc:
            shown = _plain(exc, request.start_timeout)
            runtime.record({**base, "event": "finished", "status": "failed", "end_time": time.time(),
                            "start_time": start_wall, "duration_s": round(time.time() - start_wall, 6),
                            "files": [], "bytes": 0, "error": _error(shown), "notes": []})
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
            self._runtime = runtime
            self._started = outcome
        return True

    async def stop(self) -> None:
        """Stop the session :meth:`start` opened and record how it ended; idempotent."""
        with self._lock:
            request, base, notes, started = self._active, self._record_base, self._notes, self._started
            runtime = self._runtime
        if request is None:
            return
        start_wall = float(base.get("start_time") or time.time())

        def late(status: Ended, state: str, outcome: Outcome | None) -> None:
            if runtime is None:
                return
            found, more = _found(_merged(started, outcome), runtime.save_path, start_wall, base)
            runtime.record({**base, **found, "event": "finished", "status": status, "end_time": time.time(),
                            "error": None if status == "ok" else state, "notes": [*notes, state, *more]})

        try:
            outcome = await self.stop_request(late)
        except BaseException as exc:
            shown = _plain(exc, request.stop_timeout)
            if runtime is not None:
                found, more = _found(started, runtime.save_path, start_wall, base)
                runtime.record({**base, **found, "event": "finished", "status": "failed", "end_time": time.time(),
                                "error": _error(shown), "notes": [*notes, *more]})
            if isinstance(exc, Exception):
                if runtime is not None:
                    runtime.failure(f"engine {self.describe()} stop", shown)
                return
            raise
        if runtime is not None and outcome is not None:
            for note in outcome.notes:
                warn_once(f"engine-note:{self.engine}:{note}", "profctx: %s: %s", self.describe(), note)
            found, more = _found(_merged(started, outcome), runtime.save_path, start_wall, base)
            runtime.record({**base, **found, "event": "finished", "status": "ok", "end_time": time.time(),
                            "error": None, "notes": [*notes, *outcome.notes, *outcome.facts, *more]})

    def start_sync(self, scope: Scope | None = None) -> bool:
        """Blocking twin of :meth:`start` (safe inside a running event loop)."""
        scope = scope if scope is not None else process().scope()
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


def _report(late: Report | None, status: Ended, state: str, outcome: Outcome | None) -> None:
    if late is None:
        logger.warning("profctx: engine: %s", state)
        return
    try:
        late(status, state, outcome)
    except Exception as exc:  # noqa: BLE001 - a background settle must not raise into the loop
        logger.warning("profctx: could not record a late engine answer (%s): %s", exc, state)


def _merged(start: Outcome | None, stop: Outcome | None) -> Outcome | None:
    """Return the start's naming facts, with the folder the stop reported if it gave one."""
    if start is None or stop is None:
        return start or stop
    return dataclasses.replace(start, folder=stop.folder or start.folder)


def _found(outcome: Outcome | None, save_path: Path, start_wall: float,
           base: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Return the record fields listing the files a capture produced, and notes on what could not be seen.

    Paths are relative to ``save_path`` where they lie under it. Files are told apart as the
    outcome says: everything in the capture's own folder, a name prefix, or (engines that can
    name nothing) files written between the start and now.
    """
    end = time.time()
    fields: dict[str, Any] = {"duration_s": round(end - start_wall, 6), "files": [], "bytes": 0}
    folder = (outcome.folder if outcome else None) or base.get("folder")
    if not folder:
        return fields, ["the engine chose where its files went; none listed"]
    root = Path(str(folder))
    try:  # from save_path when the folder is below it: no link followed on the way, nor listed inside
        below = root.relative_to(save_path) if root.is_relative_to(save_path) else None
        with (walk(root, create=False) if below is None else walk(save_path, below, create=False)) as held:
            found = held.files()
    except OSError:
        return fields, [f"{folder} is not visible from this process (the engine's host writes it): files not listed"]
    by = outcome.files_by if outcome else "folder"
    prefix = outcome.prefix if outcome else None
    listed: list[dict[str, Any]] = []
    for relative, stat in found:
        path = root / relative
        name = path.name
        if name.startswith(".") or name.endswith(".tmp"):
            continue
        if by == "prefix" and prefix and not name.startswith(prefix):
            continue
        # In a shared launch folder a rerun writes the same names again: the write time tells them apart.
        if by in ("prefix", "time") and not start_wall - 0.5 <= stat.st_mtime <= end + 1.0:
            continue
        try:
            shown = path.relative_to(save_path).as_posix()
        except ValueError:
            shown = str(path)
        listed.append({"path": shown, "bytes": stat.st_size})
    fields.update(files=listed, bytes=sum(f["bytes"] for f in listed))
    notes = ["files matched by write time (this engine cannot name them per capture)"] if by == "time" else []
    return fields, notes


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

    Subclasses set ``engine``, ``example_url``, ``server_name``, ``version_path``, and the
    version parser and option check of their engine (``_parse_version``, ``_check_options``).
    """

    #: Shown in the error for an unusable URL.
    example_url: str = "http://host:8000"
    #: The engine's name in error messages ("vLLM").
    server_name: str = "engine"
    #: The GET endpoint whose JSON ``{"version": ...}`` names the server's version.
    version_path: str = "/version"

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

    async def _detect(self, timeout: float) -> None:
        """Ask the server its version once (``GET version_path``); keep ``None`` if it cannot say."""
        from ._http import Unreachable, request

        if self._version is not None:
            return
        try:
            response = await request("GET", self.url + self.version_path, headers=self._headers(), timeout=timeout)
        except Unreachable as exc:
            raise EngineError(f"{self.server_name} server {self.url} is unreachable: {exc}") from exc
        data = response.json()
        if response.status == 200 and isinstance(data, dict) and isinstance(data.get("version"), str):
            try:
                self._parse_version(data["version"])
            except ConfigError:
                return
            self._version = data["version"]
