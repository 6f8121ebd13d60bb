"""The configuration entry points: configure, reset, is_configured, get_config, flush."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..backends import backend_class, check_config, known, resolve_tool
from ..backends._base import named_unselected
from ..core._config import ProfilerConfig, from_environment, load
from ..core._scope import ROOT, forget
from ..util import _log
from ..util._errors import ConfigError, one_of
from ..util._resets import run_resets
from . import _lifecycle
from ._owner import OWNER
from ._runtime import Runtime

if TYPE_CHECKING:
    from ..engines._base import EngineAdapter


def configure(config: object = None, /, **fields: Any) -> ProfilerConfig | None:
    """Set the process's profiling configuration; return it (``None`` means disabled).

    ``config`` is a :class:`ProfilerConfig`, a mapping, an OmegaConf ``DictConfig`` or a
    path to a YAML file (or keyword ``verl=``: a verl profiler config, converted by
    :func:`profctx.interop.verl.from_verl`); keyword ``fields`` override it and ``PROFCTX_*``
    environment variables override both. Raise :class:`ConfigError` for any invalid value,
    before anything runs; ``tool`` must name a backend registered in this process. A previous
    configuration is shut down first (its open capture is stopped and written). When this
    process can capture (its rank is selected), the backend's one-time set-up (torch: its
    profiler and compiler imports, a few seconds) runs here, on the calling thread, so it
    never lands in a profiled step nor races the program's own imports; a process that
    cannot capture never imports its backend.
    """
    verl = fields.pop("verl", None)  # a source, not a field: converted before any field is checked
    if verl is not None:
        if config is not None:
            raise ConfigError("verl", type(verl).__name__, "a verl config alone: not together with another "
                              f"config source ({type(config).__name__} given too)")
        from ..interop.verl import from_verl  # only verl users import the converter

        config = from_verl(verl)
    new = load(config, **fields)
    OWNER.env_read = True
    if new is not None:
        check_tool(new)
    if new is not None and new.active:
        if not named_unselected(new):  # one it names unselected never runs the backend: not even imported
            check_config(backend_class(resolve_tool(new.tool)), new)
        for hook in list(OWNER.hooks):  # attached engines refuse options they cannot honour
            hook.check_config(new)
    _shutdown()
    OWNER.config = new
    if new is None or not (new.active or new.timeline_only):
        OWNER.refresh()
        return new
    runtime = Runtime(OWNER, new)
    if new.exit_hooks:
        _lifecycle.install()
    if new.warmup and new.active and runtime.rank_selected():  # only a process that can capture imports its backend
        runtime.prepare()
    OWNER.runtime = runtime
    OWNER.refresh()
    return new


def check_tool(config: ProfilerConfig) -> None:
    """Raise :class:`ConfigError` unless ``config.tool`` names a backend registered in this process.

    Checked here, not in the config value: a config carried to another process is valid there
    as soon as that process registers the same backend.
    """
    if config.tool not in known():
        raw = os.environ.get("PROFCTX_TOOL", "").strip()
        field = "PROFCTX_TOOL" if raw == config.tool else "tool"
        raise ConfigError(field, config.tool, one_of(known()) + " (backends registered in this process; register "
                          "others with profctx.backends.register() before configure())")


def configure_from_environment() -> None:
    """Configure from the ``PROFCTX_*`` variables alone, once, in a process that never called configure().

    Called by the first block such a process enters (``docs/configuration.md``, "Without
    configure()"): a program that only marks steps and roles is profiled when, e.g.,
    ``PROFCTX_STEPS`` is set. Raise :class:`ConfigError` for a bad variable, at that first block.
    """
    if OWNER.env_read or OWNER.config is not None:
        return
    OWNER.env_read = True
    config = from_environment()
    if config is not None:
        configure(config)


def reset() -> None:
    """Return profctx to its unconfigured state: stop and write any open capture, forget the config.

    Everything profctx holds for the process ends here: attached engines are detached, exit
    hooks removed, warnings may be logged again.
    """
    _shutdown()
    OWNER.end()
    forget(ROOT)  # the role scopes kept for top-level role blocks (_scope.keep)
    run_resets()  # the modules with state of their own that were loaded (engines, a backend's watch)
    _lifecycle.uninstall()
    _log.reset()


def is_configured() -> bool:
    """Return whether :func:`configure` was called with a configuration (since the last reset)."""
    return OWNER.config is not None


def get_config() -> ProfilerConfig | None:
    """Return the current configuration, or ``None``."""
    return OWNER.config


def flush(timeout: float | None = None) -> bool:
    """Wait until every stopped capture's files are written; return whether all finished in time."""
    runtime = OWNER.runtime
    if runtime is None:
        return True
    done = runtime.flush(timeout)
    runtime.tell_if_nothing_captured(final=False)  # said once the window is over
    return done


def attach(*adapters: EngineAdapter) -> None:
    """Attach engine adapters: they start and stop with every role matching ``engines.roles``.

    See :func:`profctx.engines.attach` (imported on first use, so ``import profctx`` stays light).
    """
    from ..engines import _attach  # engines pull asyncio and HTTP: only when used

    _attach.attach(*adapters)


def detach(*adapters: EngineAdapter) -> None:
    """Detach engine adapters (all when none is given); see :func:`profctx.engines.detach`."""
    from ..engines import _attach

    _attach.detach(*adapters)


def _shutdown() -> None:
    _lifecycle.release_workers()
    held, OWNER.held = OWNER.held, None
    if held is not None:  # a worker's held step: closed here, or abandoned by the runtime if on another thread
        try:
            held.release(in_flight=True)
        except Exception as exc:  # noqa: BLE001 - shutting down must go on
            _log.warn_once("release-held", "profctx: could not end the held step: %s", exc)
    runtime, OWNER.runtime = OWNER.runtime, None
    if runtime is not None:
        runtime.shutdown(_lifecycle.EXIT_TIMEOUT)
