"""Engines living in Ray actors: a driver-side adapter and the actor-side mixin it calls.

The driver holds one :class:`RayEngineAdapter` per replica (an actor handle); attached, they
start and stop concurrently (``await`` on the ``ObjectRef``s, never a blocking ``ray.get``).
The actor class mixes in :class:`EngineProfilingMixin` and sets ``profctx_adapter`` to the
in-process adapter of the engine it owns; the driver plans the capture (folder, name,
options) and records it in its manifest, the actor only executes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..core._config import EngineConfig
from ..util._errors import ConfigError
from . import sglang as _sglang
from . import vllm as _vllm
from ._base import AlreadyActive, EngineAdapter, EngineError, EngineRequest, Outcome

__all__ = ["EngineProfilingMixin", "RayEngineAdapter", "ray_adapters"]

START_METHOD = "profctx_start_profile"
STOP_METHOD = "profctx_stop_profile"


class EngineProfilingMixin:
    """Give a Ray actor class ``profctx_start_profile`` / ``profctx_stop_profile`` methods.

    Set ``self.profctx_adapter`` to the in-process adapter of the engine the actor owns
    (e.g. ``VLLMAsyncAdapter(self.engine)``). The methods are coroutines, so the actor
    is an async actor and the engine's own loop is the one they run on. Failures come back
    as data (``status``: ``ok``, ``already_active``, ``failed``), never as Ray task errors.
    """

    profctx_adapter: EngineAdapter | None = None

    def _profctx_get_adapter(self) -> EngineAdapter:
        adapter = getattr(self, "profctx_adapter", None)
        if not isinstance(adapter, EngineAdapter):
            raise EngineError(f"{type(self).__name__}.profctx_adapter is not set to an engine adapter")
        return adapter

    async def profctx_start_profile(self, request: dict[str, Any]) -> dict[str, Any]:
        """Start the owned engine for ``request`` (an :class:`EngineRequest` as a dict)."""
        try:
            adapter = self._profctx_get_adapter()
            outcome = await adapter.start_request(EngineRequest.from_dict(request))
        except AlreadyActive as exc:
            return {"status": "already_active", "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - reported to the driver as data
            return {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        return {"status": "ok", **outcome.to_dict(), "engine": outcome.engine or adapter.engine,
                "version": outcome.version or adapter.version}

    async def profctx_stop_profile(self) -> dict[str, Any]:
        """Stop the owned engine's open session (idempotent)."""
        try:
            outcome = await self._profctx_get_adapter().stop_request()
        except Exception as exc:  # noqa: BLE001 - reported to the driver as data
            return {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        return {"status": "ok", **(outcome or Outcome()).to_dict()}


class RayEngineAdapter(EngineAdapter):
    """Drive an engine inside the Ray actor ``handle`` (its class mixes in :class:`EngineProfilingMixin`).

    ``engine``: ``"vllm"`` or ``"sglang"`` (names the folders and selects the option checks).
    """

    def __init__(self, handle: Any, *, engine: str, replica: int = 0) -> None:
        if engine not in ("vllm", "sglang"):
            raise ConfigError("engine", engine, "'vllm' or 'sglang'")
        super().__init__(replica=replica)
        self.handle = handle
        self.engine = engine
        self._version: str | None = None

    @property
    def version(self) -> str | None:
        return self._version

    def planned_folder(self, request: EngineRequest) -> str | None:
        # A vLLM actor writes into its launch folder (by default this one); the actor's answer corrects it.
        if self.engine == "vllm":
            return _vllm.default_trace_dir(request.save_path, request.replica)
        return request.folder

    def check(self, engines: EngineConfig) -> None:
        if self.engine == "vllm":
            _vllm._check(engines, None)
        else:
            _sglang._check(engines, None)

    async def _start(self, request: EngineRequest) -> Outcome:
        reply = await getattr(self.handle, START_METHOD).remote(request.to_dict())
        status = reply.get("status")
        if status == "already_active":
            raise AlreadyActive(str(reply.get("error")))
        if status != "ok":
            raise EngineError(f"the engine actor failed to start profiling: {reply.get('error')}")
        outcome = Outcome.from_dict(reply)
        self._version = outcome.version or self._version
        return outcome

    async def _stop(self, request: EngineRequest) -> Outcome:
        reply = await getattr(self.handle, STOP_METHOD).remote()
        if reply.get("status") != "ok":
            raise EngineError(f"the engine actor failed to stop profiling: {reply.get('error')}")
        return Outcome.from_dict(reply)


def ray_adapters(handles: Iterable[Any], *, engine: str) -> list[RayEngineAdapter]:
    """Return one adapter per actor handle, the i-th being replica i."""
    return [RayEngineAdapter(h, engine=engine, replica=i) for i, h in enumerate(handles)]
