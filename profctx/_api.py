"""The configuration entry points: configure, reset, is_configured, flush."""

from __future__ import annotations

from typing import Any

from . import _lifecycle, _log, _propagate, _state
from ._config import ProfilerConfig, load
from ._log import logger
from ._runtime import Runtime
from .backends import backend_class, check_config, resolve_tool


def configure(config: object = None, /, **fields: Any) -> ProfilerConfig | None:
    """Set the process's profiling configuration; return it (``None`` means disabled).

    ``config`` is a :class:`ProfilerConfig`, a mapping, an OmegaConf ``DictConfig`` or a
    path to a YAML file (or keyword ``verl=``: a verl profiler config, converted by
    :meth:`ProfilerConfig.from_verl`); keyword ``fields`` override it and ``PROFCTX_*`` environment
    variables override both. Raise :class:`ConfigError` for any invalid value, before
    anything runs. A previous configuration is shut down first (its open capture is
    stopped and written). When this process can capture, the backend's one-time set-up
    (about a second for torch) happens here, not in the first profiled step.
    """
    new = load(config, **fields)
    if new is not None and new.active:
        check_config(backend_class(resolve_tool(new.tool)), new)
        for hook in list(_state.ROLE_HOOKS):  # attached engines refuse options they cannot honour
            check = getattr(hook, "check_config", None)
            if check is not None:
                check(new)
    _shutdown()
    _state.CONFIG = new
    if new is None or not new.active:
        return new
    runtime = Runtime(new)
    if new.exit_hooks:
        _lifecycle.install()
    if new.warmup and runtime.rank_selected():
        try:
            runtime.backend.prepare()
        except Exception as exc:  # noqa: BLE001 - a failed warm-up only costs time later
            logger.warning("profctx: backend %s could not prepare: %s", runtime.tool, exc)
    _state.RUNTIME = runtime
    return new


def reset() -> None:
    """Return profctx to its unconfigured state: stop and write any open capture, forget the config."""
    _shutdown()
    _state.CONFIG = None
    _state.GATE.clear()
    _propagate.open_worker_gate()  # a Ray worker must keep removing the reserved keyword
    for hook in list(_state.ROLE_HOOKS):
        detach = getattr(hook, "reset", None)
        if detach is not None:
            detach()
    _state.ROLE_HOOKS.clear()
    _lifecycle.uninstall()
    _log.reset()


def is_configured() -> bool:
    """Return whether :func:`configure` was called with a configuration (since the last reset)."""
    return _state.CONFIG is not None


def get_config() -> ProfilerConfig | None:
    """Return the current configuration, or ``None``."""
    return _state.CONFIG


def flush(timeout: float | None = None) -> bool:
    """Wait until every stopped capture's files are written; return whether all finished in time."""
    runtime = _state.RUNTIME
    return True if runtime is None else runtime.flush(timeout)


def _shutdown() -> None:
    runtime, _state.RUNTIME = _state.RUNTIME, None
    if runtime is not None:
        runtime.shutdown()
