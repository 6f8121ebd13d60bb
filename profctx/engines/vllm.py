"""vLLM adapters: in-process ``AsyncLLM`` and ``LLM``, and the OpenAI server's HTTP endpoints.

vLLM fixes the profiler kind and output folder at launch (:func:`launch_settings` produces
them from the profctx config); per session profctx can only pass a file-name prefix (0.17+
in-process, 0.32+ over HTTP), iteration bounds (0.32+) and profiler keyword overrides
(0.33+). Capabilities are read from the installed ``start_profile`` signature, or from the
version given for a remote server.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core._config import EngineConfig, ProfilerConfig
from ..util._errors import ConfigError
from ._base import AlreadyActive, EngineAdapter, EngineError, EngineRequest, HttpAdapter, Outcome
from ._host import process
from ._http import Unreachable, request

__all__ = [
    "LaunchSettings",
    "VLLMAdapter",
    "VLLMAsyncAdapter",
    "VLLMCapabilities",
    "VLLMHttpAdapter",
    "launch_settings",
    "parse_version",
    "profile_prefix",
]

_PREFIX_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def parse_version(version: str) -> tuple[int, int]:
    """Return ``(major, minor)`` of a version string such as ``"0.32.1"`` or ``"0.33.0rc1"``.

    Raise :class:`ConfigError` when it has no leading ``major.minor``.
    """
    match = re.match(r"\s*v?(\d+)\.(\d+)", str(version))
    if not match:
        raise ConfigError("version", version, "a version string such as '0.32.1'")
    return int(match.group(1)), int(match.group(2))


def version_numbers(version: str) -> tuple[int, ...]:
    """Return every leading number of ``version``: ``"0.10.1rc2"`` -> ``(0, 10, 1)``."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(version))
    return tuple(int(x) for x in match.group(1).split(".")) if match else ()


def profile_prefix(name: str) -> str:
    """Return ``name`` made acceptable to vLLM's ``profile_prefix`` check.

    vLLM accepts 1-128 ASCII characters, the first a letter or digit, the rest letters,
    digits, ``.``, ``_`` or ``-``; anything else becomes ``-``.
    """
    cleaned = _PREFIX_BAD.sub("-", name)
    cleaned = cleaned.lstrip("._-")[:128].rstrip("-") or "profctx"
    return cleaned


@dataclass(frozen=True)
class VLLMCapabilities:
    """What one vLLM version lets a client do per profiling session.

    ``prefix``: ``start_profile(profile_prefix)`` (0.17+). ``iterations``: per-session
    ``delay_iterations``/``max_iterations`` (0.32+). ``profiler_kwargs`` (0.33+).
    ``http_body``: ``/start_profile`` reads a JSON body (0.32+). ``prefix_each_session``:
    the prefix is honoured on every session, not only the first (0.30+); ``None`` unknown.
    """

    version: str | None
    prefix: bool
    iterations: bool
    profiler_kwargs: bool
    http_body: bool
    prefix_each_session: bool | None

    @property
    def range(self) -> str:
        """The vLLM versions with these capabilities, e.g. ``"0.17-0.31"``."""
        if self.profiler_kwargs:
            return "0.33+"
        if self.iterations:
            return "0.32"
        return "0.17-0.31" if self.prefix else "0.10-0.16"

    @classmethod
    def from_version(cls, version: str) -> VLLMCapabilities:
        """Return the capabilities of vLLM ``version``."""
        v = parse_version(version)
        return cls(str(version), v >= (0, 17), v >= (0, 32), v >= (0, 33), v >= (0, 32), v >= (0, 30))

    @classmethod
    def from_signature(cls, start_profile: Callable[..., Any], version: str | None = None) -> VLLMCapabilities:
        """Return the capabilities an installed ``start_profile`` method accepts."""
        params = inspect.signature(start_profile).parameters
        iterations = "delay_iterations" in params
        each: bool | None = iterations or None
        if version is not None:
            each = parse_version(version) >= (0, 30)
        return cls(version, "profile_prefix" in params, iterations, "profiler_kwargs" in params, iterations, each)


def _session(request: EngineRequest, caps: VLLMCapabilities) -> tuple[dict[str, Any], list[str]]:
    """Return the ``start_profile`` keyword arguments for ``request`` and notes on what was not sent."""
    kwargs: dict[str, Any] = {}
    notes: list[str] = []
    if caps.prefix:
        kwargs["profile_prefix"] = profile_prefix(request.name)
        if caps.prefix_each_session is not True:
            notes.append("vLLM before 0.30 keeps the first session's profile_prefix; later traces carry that name")
    else:
        notes.append("this vLLM version cannot name traces per session (profile_prefix needs 0.17+ in-process, "
                     "0.32+ over HTTP); files are named by host, pid or worker rank")
    if request.delay or request.count:
        if caps.iterations:
            if request.delay:
                # vLLM starts at the N-th step after start_profile, i.e. skips N-1 steps.
                kwargs["delay_iterations"] = request.delay + 1
            if request.count:
                kwargs["max_iterations"] = request.count
        else:
            notes.append("engines.delay/count reach this vLLM version only through its launch settings "
                         "(profctx.engines.launch_settings); not sent per session")
    if request.contents:
        if caps.profiler_kwargs:
            kwargs["profiler_kwargs"] = {
                "record_shapes": "shapes" in request.contents,
                "with_stack": "stack" in request.contents,
                "profile_memory": "memory" in request.contents,
            }
        else:
            notes.append("engines.contents reach this vLLM version only through its launch settings "
                         "(profctx.engines.launch_settings); not sent per session")
    return kwargs, notes


def _check(engines: EngineConfig, version: str | None) -> None:
    for name in ("by_stage", "merge_profiles"):
        if getattr(engines, name):
            raise ConfigError(f"engines.{name}", True, "an SGLang-only option; vLLM cannot honour it")
    if engines.absolute_start_step is not None:
        raise ConfigError("engines.absolute_start_step", engines.absolute_start_step,
                          "an SGLang-only option; for vLLM use engines.delay (engine steps after the start)")
    if version is not None and parse_version(version) < (0, 12) and (engines.delay or engines.count):
        raise ConfigError("engines.delay/count", (engines.delay, engines.count),
                          f"vLLM {version} has no iteration bounds (they need vLLM 0.12+); leave them unset")


def _not_enabled(version: str | None) -> str:
    return "the vLLM server was launched without profiling; " + launch_hint(version)


def launch_hint(version: str | None) -> str:
    """Return how to launch vLLM ``version`` so that profctx can drive its profiler."""
    general = ("launch it with the settings from profctx.engines.launch_settings(config, version=...): "
               "--profiler-config '{\"profiler\": \"torch\", \"torch_profiler_dir\": \"/abs/dir\"}' on vLLM 0.13+, "
               "or VLLM_TORCH_PROFILER_DIR=/abs/dir in the server's environment on vLLM 0.15 and older")
    return general if version is None else f"vLLM {version}: {general}"


def _translate(exc: BaseException, version: str | None) -> BaseException:
    if type(exc).__name__ == "ProfilerAlreadyActiveError":
        return AlreadyActive(f"the engine already has a profiling session open ({exc})")
    # The worker raises RuntimeError; through the engine core's RPC it arrives as a plain Exception.
    if isinstance(exc, Exception) and "Profiling is not enabled" in str(exc):
        return EngineError(_not_enabled(version))
    return exc


def _installed_version(engine: object) -> str | None:
    if not type(engine).__module__.startswith("vllm"):
        return None
    module = sys.modules.get("vllm")
    version = getattr(module, "__version__", None)
    return version if isinstance(version, str) else None


class _InProcess(EngineAdapter):
    engine = "vllm"

    def __init__(self, target: Any, *, replica: int = 0, loop: asyncio.AbstractEventLoop | None = None,
                 trace_dir: str | None = None, version: str | None = None) -> None:
        super().__init__(replica=replica, loop=loop)
        self.target = target
        self._version = version or _installed_version(target)
        self.capabilities = VLLMCapabilities.from_signature(target.start_profile, self._version)
        self.trace_dir = trace_dir

    @property
    def version(self) -> str | None:
        return self._version

    def check(self, engines: EngineConfig) -> None:
        _check(engines, self._version)

    def _folder(self, request: EngineRequest) -> str:
        return self.trace_dir or default_trace_dir(request.save_path, request.replica)

    def planned_folder(self, request: EngineRequest) -> str | None:
        return self._folder(request)

    async def _invoke(self, name: str, kwargs: Mapping[str, Any]) -> None:
        raise NotImplementedError

    async def _start(self, request: EngineRequest) -> Outcome:
        kwargs, notes = _session(request, self.capabilities)
        try:
            await self._invoke("start_profile", kwargs)
        except Exception as exc:
            raise _translate(exc, self._version) from exc
        version = self._version or f"{self.capabilities.range} (from the start_profile signature)"
        return _started(notes, self._folder(request), version, request, self.capabilities)

    async def _stop(self, request: EngineRequest) -> Outcome:
        try:
            await self._invoke("stop_profile", {})
        except Exception as exc:
            raise _translate(exc, self._version) from exc
        return Outcome()


def _folder_note() -> str:
    return "vLLM writes into the folder fixed at its launch (torch_profiler_dir); files carry the prefix"


def _started(notes: list[str], folder: str, version: str | None, request: EngineRequest,
             caps: VLLMCapabilities) -> Outcome:
    """Return the outcome of a start: where files land and how this capture's files are told apart."""
    if caps.prefix and caps.prefix_each_session is True:
        # vLLM names worker traces '{prefix}_{rank suffix}...'.
        return Outcome(notes, folder, version, facts=[_folder_note()], files_by="prefix",
                       prefix=profile_prefix(request.name) + "_")
    return Outcome(notes, folder, version, facts=[_folder_note()], files_by="time")


class VLLMAsyncAdapter(_InProcess):
    """Drive an in-process ``vllm.v1.engine.async_llm.AsyncLLM`` (or any ``EngineClient``).

    ``loop``: the loop the engine runs in (default: the loop running when the adapter is
    made, if any). ``trace_dir``: the ``torch_profiler_dir`` it was launched with (default
    the one :func:`launch_settings` chooses). ``version``: overrides the detected version.
    """

    def __init__(self, engine: Any, *, replica: int = 0, loop: asyncio.AbstractEventLoop | None = None,
                 trace_dir: str | None = None, version: str | None = None) -> None:
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        super().__init__(engine, replica=replica, loop=loop, trace_dir=trace_dir, version=version)

    async def _invoke(self, name: str, kwargs: Mapping[str, Any]) -> None:
        method = getattr(self.target, name)
        await self._call(lambda: method(**kwargs))


class VLLMAdapter(_InProcess):
    """Drive an in-process ``vllm.LLM`` (blocking calls run in a helper thread)."""

    def __init__(self, llm: Any, *, replica: int = 0, trace_dir: str | None = None,
                 version: str | None = None) -> None:
        super().__init__(llm, replica=replica, trace_dir=trace_dir, version=version)

    async def _invoke(self, name: str, kwargs: Mapping[str, Any]) -> None:
        method = getattr(self.target, name)
        await self._blocking(lambda: method(**kwargs))


class VLLMHttpAdapter(HttpAdapter):
    """Drive a vLLM OpenAI server through ``POST /start_profile`` and ``/stop_profile``.

    ``version``: the server's vLLM version; without it profctx asks ``GET /version`` once
    and, failing that, sends no body (what every version accepts). ``api_key`` is sent as a
    bearer token. ``trace_dir``: the folder the server was launched to write into.
    """

    engine = "vllm"
    example_url = "http://host:8000"
    server_name = "vLLM"
    version_path = "/version"
    _parse_version = staticmethod(parse_version)
    _check_options = staticmethod(_check)

    def __init__(self, url: str, *, replica: int = 0, version: str | None = None, api_key: str | None = None,
                 trace_dir: str | None = None) -> None:
        super().__init__(url, replica=replica, version=version, api_key=api_key)
        self.trace_dir = trace_dir

    async def _post(self, path: str, body: Any, timeout: float) -> None:
        try:
            response = await request("POST", self.url + path, body=body, headers=self._headers(), timeout=timeout)
        except Unreachable as exc:
            raise EngineError(f"vLLM server {self.url} is unreachable: {exc}") from exc
        if response.status == 200:
            return
        if response.status == 404:
            raise EngineError(f"{self.url}{path} answered 404: " + _not_enabled(self._version))
        if response.status == 409:
            raise AlreadyActive(f"{self.url} answered 409: a profiling session is already active on the server")
        raise EngineError(f"{self.url}{path} answered {response.status}: {response.text.strip()[:300]}")

    async def _start(self, request_: EngineRequest) -> Outcome:
        await self._detect(request_.start_timeout)
        notes: list[str] = []
        if self._version is None:
            caps = VLLMCapabilities(None, False, False, False, False, None)
            notes.append("the server's vLLM version is unknown (GET /version failed); started without a body. "
                         "Pass version= to send the prefix and iteration bounds")
        else:
            caps = VLLMCapabilities.from_version(self._version)
            caps = VLLMCapabilities(caps.version, caps.http_body, caps.iterations, caps.profiler_kwargs,
                                    caps.http_body, caps.prefix_each_session)
        kwargs, more = _session(request_, caps)
        notes += more
        # The HTTP call may outlive start_timeout (profctx then stops the engine once it answers).
        await self._post("/start_profile", kwargs if caps.http_body else None,
                         request_.start_timeout + request_.stop_timeout)
        return _started(notes, self.planned_folder(request_), self._version, request_, caps)

    def planned_folder(self, request: EngineRequest) -> str:
        return self.trace_dir or default_trace_dir(request.save_path, request.replica)

    async def _stop(self, request_: EngineRequest) -> Outcome:
        await self._post("/stop_profile", None, request_.stop_timeout)
        return Outcome()


# -- launch settings -----------------------------------------------------------------------------


def default_trace_dir(save_path: str, replica: int) -> str:
    """Return the folder vLLM replica ``replica`` writes into by default: ``{save_path}/engines/vllm-replica{R}``."""
    return f"{save_path.rstrip('/')}/engines/vllm-replica{replica}"


@dataclass(frozen=True)
class LaunchSettings:
    """How to launch one vLLM replica so profctx can drive its profiler.

    ``args``: extra ``vllm serve`` arguments. ``env``: variables for the server process
    (set before it starts). ``profiler_config``: the same as a dict for
    ``LLM(profiler_config=...)`` / ``AsyncEngineArgs(profiler_config=...)`` (``None`` before
    0.13). ``trace_dir``: where the traces land (pass it to the adapter).
    """

    version: str
    trace_dir: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    profiler_config: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = ()


def launch_settings(
    config: ProfilerConfig | None = None,
    *,
    version: str | None = None,
    replica: int = 0,
    trace_dir: str | None = None,
) -> LaunchSettings:
    """Return the launch settings for vLLM ``version`` from ``config`` (default: the current one).

    ``--profiler-config`` JSON for 0.13+, the ``VLLM_TORCH_PROFILER_*`` environment for
    0.15 and older (both, with the same values, for 0.13-0.15). ``version`` defaults to the
    installed vLLM. Raise :class:`ConfigError` when the version is unknown or an engine
    option cannot be honoured by it.
    """
    from os.path import abspath, expanduser

    config = config if config is not None else process().config
    if config is None:
        raise ConfigError("config", None, "a ProfilerConfig, or call profctx.configure() first")
    if version is None:
        version = getattr(sys.modules.get("vllm"), "__version__", None)
        if version is None:
            try:
                import vllm  # type: ignore[import-not-found]

                version = str(vllm.__version__)
            except ImportError:
                raise ConfigError("version", None, "the vLLM version of the server (vllm is not installed here)")\
                    from None
    v = parse_version(version)
    full = version_numbers(version)
    if v < (0, 10):
        raise ConfigError("version", version, "vLLM 0.10 or newer")
    engines = config.engines
    _check(engines, version)
    save_path = abspath(expanduser(config.save_path))
    folder = abspath(expanduser(trace_dir)) if trace_dir else default_trace_dir(save_path, replica)
    contents = engines.contents
    notes: list[str] = []
    delay = engines.delay + 1 if engines.delay else 0
    count = engines.count or 0
    env: dict[str, str] = {}
    args: tuple[str, ...] = ()
    profiler_config: dict[str, Any] | None = None
    if v <= (0, 15):
        env = {"VLLM_TORCH_PROFILER_DIR": folder}
        if full[:3] != (0, 10, 0):
            env.update({
                "VLLM_TORCH_PROFILER_RECORD_SHAPES": "1" if "shapes" in contents else "0",
                "VLLM_TORCH_PROFILER_WITH_PROFILE_MEMORY": "1" if "memory" in contents else "0",
                "VLLM_TORCH_PROFILER_WITH_STACK": "1" if "stack" in contents else "0",
            })
        else:
            notes.append(f"vLLM {version} reads only VLLM_TORCH_PROFILER_DIR: it records stacks and no shapes "
                         "or memory whatever engines.contents says (the other variables need 0.10.1+)")
        if v >= (0, 12):
            # The frontend's own CPU profiler would run a second torch profiler in the driver process.
            env["VLLM_TORCH_PROFILER_DISABLE_ASYNC_LLM"] = "1"
            if delay or count:
                env["VLLM_PROFILER_DELAY_ITERS"] = str(delay)
                env["VLLM_PROFILER_MAX_ITERS"] = str(count)
        elif v >= (0, 11):
            notes.append(f"vLLM {version}'s AsyncLLM always runs its own CPU torch profiler in the process that "
                         "holds it: do not run profctx's torch backend in that process (tool='noop' there)")
    if v >= (0, 13):
        profiler_config = {
            "profiler": "torch",
            "torch_profiler_dir": folder,
            "torch_profiler_with_stack": "stack" in contents,
            "torch_profiler_record_shapes": "shapes" in contents,
            "torch_profiler_with_memory": "memory" in contents,
            # Off always: the frontend's CPU profiler is a second torch profiler in the process holding
            # AsyncLLM, which crashes next to profctx's own (and records no engine step).
            "ignore_frontend": True,
        }
        if delay or count:
            profiler_config.update(delay_iterations=delay, max_iterations=count)
        activities = [a for c, a in (("cpu", "CPU"), ("cuda", "CUDA")) if c in contents]
        if activities and v >= (0, 32):
            profiler_config["torch_profiler_activities"] = activities
        args = ("--profiler-config", json.dumps(profiler_config, separators=(",", ":")))
    if any(c in contents for c in ("cpu", "cuda")) and v < (0, 32):
        notes.append(f"vLLM {version} records its platform's default activities (CPU and CUDA on GPUs); "
                     "choosing them needs 0.32+")
    return LaunchSettings(str(version), folder, args, env, profiler_config, tuple(notes))
