"""SGLang adapters: in-process ``TokenizerManager`` and ``Engine``, and the HTTP server's endpoints.

Each capture gets its own ``output_dir`` (step, role, replica) and, from 0.5.15, a
``profile_id`` naming its files; ``with_stack`` and ``record_shapes`` are always sent
(SGLang turns both on unless told otherwise). A stop answered with "Profiling is not in
progress" after a ``num_steps`` auto-stop is a normal end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import re
import sys
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ..core._config import EngineConfig
from ..util._errors import ConfigError
from ..util._fs import walk
from ._base import AlreadyActive, EngineAdapter, EngineError, EngineRequest, HttpAdapter, Outcome
from ._http import Unreachable, request

T = TypeVar("T")

__all__ = [
    "NOT_IN_PROGRESS",
    "NotInProgress",
    "SGLangEngineAdapter",
    "SGLangHttpAdapter",
    "SGLangTokenizerAdapter",
    "fields_for_version",
    "start_arguments",
]

#: SGLang's exact reply to a stop when no session runs (e.g. after a ``num_steps`` auto-stop).
NOT_IN_PROGRESS = "Profiling is not in progress. Call /start_profile first."
_ALREADY = "Profiling is already in progress"

#: ``start_profile`` fields by the SGLang version that introduced them.
#: Read from the ``ProfileReq`` of each released wheel.
_FIELDS_SINCE: tuple[tuple[tuple[int, int, int], tuple[str, ...]], ...] = (
    ((0, 4, 9), ("output_dir", "num_steps", "activities", "profile_by_stage", "with_stack", "record_shapes")),
    ((0, 4, 10), ("start_step",)),
    ((0, 5, 4), ("merge_profiles",)),
    ((0, 5, 6), ("profile_prefix", "profile_stages")),  # both in the 0.5.6 wheel's ProfileReqInput, not 0.5.5's
    ((0, 5, 15), ("profile_id",)),
    ((0, 5, 19), ("detailed_annotations",)),
)
#: ``sglang.Engine.start_profile`` takes keyword arguments from this version (none before).
ENGINE_KWARGS_SINCE = (0, 5, 3)
_BASE_FIELDS = frozenset(_FIELDS_SINCE[0][1])


def parse_version(version: str) -> tuple[int, int, int]:
    """Return ``(major, minor, patch)`` of ``version``; raise :class:`ConfigError` if it has none."""
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    if not match:
        raise ConfigError("version", version, "a version string such as '0.5.15'")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def fields_for_version(version: str) -> frozenset[str]:
    """Return the ``start_profile`` fields SGLang ``version`` accepts."""
    v = parse_version(version)
    return frozenset(f for since, names in _FIELDS_SINCE if v >= since for f in names)


def start_arguments(
    request: EngineRequest, accepted: frozenset[str] | None, version: str | None
) -> tuple[dict[str, Any], list[str]]:
    """Return the ``start_profile`` fields for ``request`` and notes on what could not be sent.

    ``accepted``: the fields the engine takes (``None``: unknown, send all; the HTTP server
    ignores unknown keys). Values are real ints and bools (msgspec does not convert).
    """
    notes: list[str] = []
    args: dict[str, Any] = {
        "output_dir": request.folder,
        "with_stack": "stack" in request.contents,
        "record_shapes": "shapes" in request.contents,
    }
    activities = [a for c, a in (("cpu", "CPU"), ("cuda", "GPU"), ("memory", "MEM")) if c in request.contents]
    if activities:
        args["activities"] = activities
    # SGLang reads start_step=0 as "no start step": the capture starts now.
    start_step = request.absolute_start_step or None
    if request.count:
        num_steps = int(request.count)
        immediate = start_step is None and not request.by_stage
        older = None if version is None else parse_version(version) < (0, 5, 16)
        if immediate and older:
            num_steps += 1  # before 0.5.16 SGLang records num_steps - 1 batches in this mode
        elif immediate and older is None:
            notes.append("SGLang before 0.5.16 records count-1 batches; give version= to correct for it")
        args["num_steps"] = num_steps
    if start_step is not None:
        args["start_step"] = int(start_step)
    if request.by_stage:
        args["profile_by_stage"] = True
    if request.merge_profiles:
        args["merge_profiles"] = True
    if accepted is None or "profile_id" in accepted:
        args["profile_id"] = request.name
    elif "profile_prefix" in accepted and not request.merge_profiles:
        # Never with merge_profiles: the merger globs '{profile_id}*' and finds no prefixed file.
        args["profile_prefix"] = request.name
    else:
        notes.append("this SGLang version cannot name files per capture; they carry a time-based id "
                     "in the capture's own folder")
    if accepted is not None:
        dropped = sorted(k for k in args if k not in accepted)
        for key in dropped:
            value = args.pop(key)
            if key in ("with_stack", "record_shapes") and value is False:
                continue
            notes.append(f"this SGLang version has no start_profile field {key!r}; {key}={value!r} not sent")
    return args, notes


def _check(engines: EngineConfig, version: str | None) -> None:
    if engines.delay is not None:
        raise ConfigError("engines.delay", engines.delay,
                          "SGLang has no relative delay; use engines.absolute_start_step (the scheduler's "
                          "absolute batch count) or leave delay unset")
    if engines.by_stage and engines.absolute_start_step is not None:
        raise ConfigError("engines.absolute_start_step", engines.absolute_start_step,
                          "unset with engines.by_stage (SGLang ignores start_step when profiling by stage)")
    if version is None:
        return
    fields = fields_for_version(version)
    if engines.absolute_start_step and "start_step" not in fields:
        raise ConfigError("engines.absolute_start_step", engines.absolute_start_step,
                          f"unset: SGLang {version} has no start_step (it needs 0.4.10+)")
    if engines.merge_profiles and "merge_profiles" not in fields:
        raise ConfigError("engines.merge_profiles", True, f"false: SGLang {version} cannot merge (needs 0.5.4+)")


def _installed_version(obj: object) -> str | None:
    if not type(obj).__module__.startswith("sglang"):
        return None
    version = getattr(sys.modules.get("sglang"), "__version__", None)
    return version if isinstance(version, str) else None


def _translate(exc: BaseException) -> BaseException:
    if isinstance(exc, RuntimeError) and _ALREADY in str(exc):
        return AlreadyActive(f"the engine already has a profiling session open ({exc})")
    return exc


def _stopped_on_its_own(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and str(exc).strip() == NOT_IN_PROGRESS


_AUTO_STOP_NOTE = "the engine had already stopped on its own (num_steps reached); its trace was written then"


def request_class(tokenizer_manager: object) -> type[Any]:
    """Return the ``ProfileReq`` class a 0.5.15+ ``TokenizerManager.start_profile`` takes."""
    method = type(tokenizer_manager).start_profile  # type: ignore[attr-defined]
    try:
        hint = typing.get_type_hints(method).get("req")
    except Exception:  # noqa: BLE001 - unresolvable annotations: fall back to the import
        hint = None
    for candidate in (*typing.get_args(hint), hint):
        if isinstance(candidate, type) and candidate is not type(None):
            return candidate
    from sglang.srt.managers.io_struct import ProfileReq  # type: ignore[import-not-found]

    cls: type[Any] = ProfileReq
    return cls


def _class_fields(cls: type[Any]) -> frozenset[str]:
    names = getattr(cls, "__struct_fields__", None)
    if names is None and dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls)]
    if names is None:
        names = [p for p in inspect.signature(cls).parameters if p != "self"]
    return frozenset(names)


class NotInProgress(EngineError):  # noqa: N818 - the engine's own words
    """Raise when SGLang answers a stop with "Profiling is not in progress"."""


class _SGLang(EngineAdapter):
    """Start/stop logic every SGLang adapter shares; subclasses only send the two calls.

    A stop answered "not in progress" is a normal end after a ``num_steps`` auto-stop. With
    ``absolute_start_step`` it can also mean the deferred start never began (no batch reached
    that step before the role ended): SGLang keeps that start armed and would begin later,
    under this capture's name, and refuse every later start. profctx then disarms it (an
    immediate start and a stop clear SGLang's pending start step) and records the capture
    failed with no trace.
    """

    engine = "sglang"
    accepted: frozenset[str] | None = None

    async def _send_start(self, args: dict[str, Any]) -> None:
        raise NotImplementedError

    async def _send_stop(self) -> None:
        raise NotImplementedError

    async def _stop(self, request_: EngineRequest) -> Outcome:
        try:
            await self._send_stop()
        except NotInProgress:
            return await self._not_in_progress(request_)
        return Outcome()

    async def _not_in_progress(self, request_: EngineRequest) -> Outcome:
        if not request_.absolute_start_step:
            return Outcome([_AUTO_STOP_NOTE])
        folder = Path(request_.folder)
        with contextlib.suppress(OSError), walk(folder, create=False) as held:  # links neither followed nor counted
            if held.files(limit=1):
                return Outcome([_AUTO_STOP_NOTE])
        disarm = folder / ".disarmed"
        args = {"output_dir": str(disarm), "activities": ["CPU"], "with_stack": False, "record_shapes": False}
        if self.accepted is not None:
            args = {k: v for k, v in args.items() if k in self.accepted}
        try:
            await self._send_start(args)
            await self._send_stop()
        except Exception as exc:
            raise EngineError(
                f"the deferred start (absolute_start_step={request_.absolute_start_step}) had not begun when the "
                f"role ended, and disarming it failed ({type(exc).__name__}: {exc}): SGLang still holds it and "
                "will start profiling when its batch count reaches that step"
            ) from exc
        finally:
            with contextlib.suppress(OSError), walk(folder, create=False) as held:  # by descriptor, no link followed
                held.remove_tree(disarm.name)
        seen = "" if folder.parent.is_dir() else " (the engine's folder is not visible here, so profctx could not " \
            "tell whether it ran; it may have written a trace there)"
        raise EngineError(
            f"the deferred start (absolute_start_step={request_.absolute_start_step}) had not begun when the role "
            f"ended (no batch reached that step): no trace for this capture; profctx disarmed it{seen}"
        )


class SGLangTokenizerAdapter(_SGLang):
    """Drive an in-process ``TokenizerManager`` (the object SGLang's HTTP server calls).

    0.5.15+ takes a ``ProfileReq`` object, earlier versions keywords: detected from the
    installed ``start_profile`` signature. ``loop``: the loop the manager runs in (default:
    the loop running when the adapter is made, if any).
    """

    def __init__(self, tokenizer_manager: Any, *, replica: int = 0, loop: asyncio.AbstractEventLoop | None = None,
                 version: str | None = None) -> None:
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        super().__init__(replica=replica, loop=loop)
        self.target = tokenizer_manager
        self._version = version or _installed_version(tokenizer_manager)
        params = inspect.signature(tokenizer_manager.start_profile).parameters
        self.request_type: type[Any] | None = request_class(tokenizer_manager) if "req" in params else None
        if self.request_type is not None:
            self.accepted = _class_fields(self.request_type) - {"req_type", "rid", "http_worker_ipc"}
        else:
            self.accepted = frozenset(p for p in params if p != "self")

    @property
    def version(self) -> str | None:
        return self._version

    def check(self, engines: EngineConfig) -> None:
        _check(engines, self._version)
        accepted = self.accepted or frozenset()
        if engines.absolute_start_step and "start_step" not in accepted:
            raise ConfigError("engines.absolute_start_step", engines.absolute_start_step,
                              "unset: this SGLang has no start_step")
        if engines.merge_profiles and "merge_profiles" not in accepted:
            raise ConfigError("engines.merge_profiles", True, "false: this SGLang cannot merge profiles")

    async def _send_start(self, args: dict[str, Any]) -> None:
        start = self.target.start_profile
        req_type = self.request_type
        try:
            if req_type is not None:
                await self._call(lambda: start(req_type(**args)))
            else:
                await self._call(lambda: start(**args))
        except Exception as exc:
            raise _translate(exc) from exc

    async def _send_stop(self) -> None:
        try:
            await self._call(self.target.stop_profile)
        except Exception as exc:
            if _stopped_on_its_own(exc):
                raise NotInProgress(str(exc)) from exc
            raise

    async def _start(self, request_: EngineRequest) -> Outcome:
        args, notes = start_arguments(request_, self.accepted, self._version)
        await self._send_start(args)
        return Outcome(notes, request_.folder, self._version)


class SGLangEngineAdapter(_SGLang):
    """Drive an in-process ``sglang.Engine`` (``start_profile(**kwargs)``; blocking, run in a helper thread).

    Fields are those of its ``tokenizer_manager`` when it has one; an ``Engine`` whose
    ``start_profile`` takes no arguments (before 0.5.3) is started with none, and the
    manifest says so. The helper thread has an event loop of its own: ``Engine`` before
    0.5.4 runs its calls on ``asyncio.get_event_loop()``, which a bare thread lacks.
    """

    def __init__(self, engine: Any, *, replica: int = 0, version: str | None = None) -> None:
        super().__init__(replica=replica)
        self.target = engine
        self._version = version or _installed_version(engine)
        params = inspect.signature(engine.start_profile).parameters
        self.takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        accepted: frozenset[str] | None = None
        manager = getattr(engine, "tokenizer_manager", None)
        if manager is not None:
            accepted = SGLangTokenizerAdapter(manager, loop=None).accepted
        elif self._version is not None:
            accepted = fields_for_version(self._version)
        self.accepted = accepted if accepted is not None else _BASE_FIELDS

    @property
    def version(self) -> str | None:
        return self._version

    def check(self, engines: EngineConfig) -> None:
        _check(engines, self._version)

    def planned_folder(self, request: EngineRequest) -> str | None:
        # Without options the engine writes where its own environment says: not known here.
        return request.folder if self.takes_kwargs else None

    async def _send_start(self, args: dict[str, Any]) -> None:
        start = self.target.start_profile
        try:
            await self._blocking(_with_loop(lambda: start(**args) if self.takes_kwargs else start()))
        except Exception as exc:
            raise _translate(exc) from exc

    async def _send_stop(self) -> None:
        try:
            await self._blocking(_with_loop(self.target.stop_profile))
        except Exception as exc:
            if _stopped_on_its_own(exc):
                raise NotInProgress(str(exc)) from exc
            raise

    async def _start(self, request_: EngineRequest) -> Outcome:
        if not self.takes_kwargs:
            await self._send_start({})
            return Outcome(["this sglang.Engine.start_profile takes no options: files go to "
                            "$SGLANG_TORCH_PROFILER_DIR (default /tmp) of the engine, with its defaults"],
                           None, self._version)
        args, notes = start_arguments(request_, self.accepted, self._version)
        await self._send_start(args)
        return Outcome(notes, request_.folder, self._version)


def _with_loop(func: Callable[[], T]) -> Callable[[], T]:
    """Wrap ``func`` so that it runs with an event loop set as current in its (helper) thread."""

    def run() -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            return func()
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            return func()
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    return run


class SGLangHttpAdapter(_SGLang, HttpAdapter):
    """Drive an SGLang server through ``POST /start_profile`` and ``/stop_profile``.

    ``api_key``: the server's admin (or API) key, sent as a bearer token. ``version``: the
    server's SGLang version (default: asked once from ``GET /get_server_info``, which every
    version answers; when that fails every field is sent and the server ignores those it
    lacks). ``output_dir`` is the capture's folder as the server's host sees it.
    """

    engine = "sglang"
    example_url = "http://host:30000"
    server_name = "SGLang"
    version_path = "/get_server_info"
    _parse_version = staticmethod(parse_version)
    _check_options = staticmethod(_check)

    async def _post(self, path: str, body: Mapping[str, Any] | None, timeout: float) -> tuple[int, str]:
        try:
            response = await request("POST", self.url + path, body=body, headers=self._headers(), timeout=timeout)
        except Unreachable as exc:
            raise EngineError(f"SGLang server {self.url} is unreachable: {exc}") from exc
        if response.status in (401, 403):
            raise EngineError(f"{self.url}{path} answered {response.status}: the server needs its admin or API key "
                              "(api_key=...)")
        return response.status, response.text.strip()

    async def _send_start(self, args: dict[str, Any]) -> None:
        status, text = await self._post("/start_profile", args, 120.0)
        if status != 200:
            if _ALREADY in text:
                raise AlreadyActive(f"{self.url} has a profiling session open already ({text[:200]})")
            raise EngineError(f"{self.url}/start_profile answered {status}: {text[:300]}")

    async def _send_stop(self) -> None:
        status, text = await self._post("/stop_profile", None, 1800.0)
        if status == 200:
            return
        # SGLang answers a stop with no session (after a num_steps auto-stop) with a bare 500: the
        # message stays in the server's log.
        if NOT_IN_PROGRESS in text or status == 500:
            raise NotInProgress(f"{self.url}/stop_profile answered {status}: {text[:200]}")
        raise EngineError(f"{self.url}/stop_profile answered {status}: {text[:300]}")

    async def _start(self, request_: EngineRequest) -> Outcome:
        await self._detect(request_.start_timeout)
        self.accepted = None if self._version is None else fields_for_version(self._version)
        args, notes = start_arguments(request_, self.accepted, self._version)
        await self._send_start(args)
        if self._version is None:
            notes.append("the server's SGLang version is unknown (GET /get_server_info failed): every field was "
                         "sent; pass version= so that profctx corrects for the version's counting")
        return Outcome(notes, request_.folder, self._version)

    async def _stop(self, request_: EngineRequest) -> Outcome:
        try:
            await self._send_stop()
        except NotInProgress as exc:
            if not request_.absolute_start_step and not request_.count and "500" in str(exc):
                raise EngineError(str(exc)) from exc  # no auto-stop can explain it: a real failure
            return await self._not_in_progress(request_)
        return Outcome()
