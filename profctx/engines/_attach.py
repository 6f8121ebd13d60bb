"""Attach engine adapters to role scopes: one role hook starts and stops them all concurrently."""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Sequence

from ..core._config import ProfilerConfig
from ..core._scope import Scope
from ..util._log import logger
from ..util._resets import on_reset
from . import _loop
from ._base import EngineAdapter
from ._host import Host, process
from ._loop import run_sync


class EngineHook:
    """The role hook of attached engines (registered with the owner while any adapter is attached).

    The runtime calls ``enter``/``aenter`` for blocks whose role matches ``engines.roles``
    (the plan decides); they start every attached adapter concurrently; the handle lists the adapters this block
    started, which ``exit``/``aexit`` stop concurrently. An adapter already profiling (an
    overlapping role in another task) is not started again and not stopped by this block.
    """

    def __init__(self) -> None:
        self.adapters: list[EngineAdapter] = []
        self._lock = threading.Lock()

    def check_config(self, config: ProfilerConfig) -> None:
        """Raise ``ConfigError`` if an attached adapter cannot honour ``config.engines``."""
        for adapter in list(self.adapters):
            adapter.check(config.engines)

    async def _start_all(self, runtime: Host, scope: Scope, blocked: object) -> list[EngineAdapter] | None:
        adapters = list(self.adapters)
        results = await asyncio.gather(*(a.start(scope, runtime=runtime, _blocked_loop=blocked) for a in adapters),
                                       return_exceptions=True)
        started = [a for a, r in zip(adapters, results, strict=True) if r is True]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:  # only with on_error="raise" (or cancellation): leave nothing running behind
            await _stop_all(started)
            raise errors[0]
        return started or None

    def enter(self, runtime: Host, scope: Scope) -> object:
        """Start the attached adapters for ``scope`` (blocking; runs them concurrently)."""
        try:
            blocked: object = asyncio.get_running_loop()
        except RuntimeError:
            blocked = None
        return run_sync(lambda: self._start_all(runtime, scope, blocked))

    def exit(self, runtime: Host, handle: object) -> None:
        """Stop the adapters ``enter`` started (blocking; concurrently)."""
        if isinstance(handle, list) and handle:
            run_sync(lambda: _stop_all(handle))

    async def aenter(self, runtime: Host, scope: Scope) -> object:
        """Start the attached adapters for ``scope`` concurrently."""
        return await self._start_all(runtime, scope, None)

    async def aexit(self, runtime: Host, handle: object) -> None:
        """Stop the adapters ``aenter`` started, concurrently."""
        if isinstance(handle, list) and handle:
            await _stop_all(handle)

    def shutdown(self) -> None:
        """Stop every open engine session (called at process exit and on SIGTERM)."""
        stop_all()

    def reset(self) -> None:
        """Detach every adapter and end the engines' process state (called by ``profctx.reset()``)."""
        end()


async def _stop_all(adapters: Sequence[EngineAdapter]) -> None:
    results = await asyncio.gather(*(a.stop() for a in adapters), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


_hook = EngineHook()
_atexit_installed = False


def attach(*adapters: EngineAdapter) -> None:
    """Attach ``adapters``: they start and stop with every role matching ``engines.roles``.

    Raise ``ConfigError`` right away if profctx is configured and an adapter whose engine
    version is known cannot honour ``engines`` options; a later ``configure()`` checks too.
    Attaching the same adapter twice has no further effect.
    """
    global _atexit_installed
    config = process().config
    for adapter in adapters:
        if not isinstance(adapter, EngineAdapter):
            raise TypeError(f"attach: {adapter!r} is not an engine adapter (profctx.engines.EngineAdapter)")
        if config is not None:
            adapter.check(config.engines)
    with _hook._lock:
        for adapter in adapters:
            if adapter not in _hook.adapters:
                _hook.adapters.append(adapter)
        if _hook.adapters:
            process().add_hook(_hook)
        if not _atexit_installed:
            atexit.register(_stop_open_at_exit)
            _atexit_installed = True


def detach(*adapters: EngineAdapter) -> None:
    """Detach ``adapters`` (all of them when none is given); an open session is left to its block."""
    with _hook._lock:
        if adapters:
            _hook.adapters[:] = [a for a in _hook.adapters if a not in adapters]
        else:
            _hook.adapters.clear()
        if not _hook.adapters:
            process().remove_hook(_hook)


@on_reset
def end() -> None:
    """Detach every adapter, remove the exit hook and end the private engine loop.

    ``profctx.reset()`` calls it (registered at import) whenever engines were imported, attached
    now or not: an adapter detached earlier still left the loop thread running.
    """
    global _atexit_installed
    detach()
    if _atexit_installed:
        atexit.unregister(_stop_open_at_exit)
        _atexit_installed = False
    _loop.stop()


def attached() -> tuple[EngineAdapter, ...]:
    """Return the attached adapters, in attach order."""
    return tuple(_hook.adapters)


def stop_all() -> None:
    """Stop every attached adapter's open session, then wait for late starts and stops to settle.

    Each is bounded by ``engines.stop_timeout``; a start that passed its timeout is stopped
    here if it answered, so the process does not exit leaving an engine profiling.
    """
    open_ = [a for a in _hook.adapters if a.active]
    if open_:
        run_sync(lambda: _stop_all(open_))
    settling = [a for a in _hook.adapters if a.settling]
    if settling:
        run_sync(lambda: _settle_all(settling))


async def _settle_all(adapters: Sequence[EngineAdapter]) -> None:
    await asyncio.gather(*(a.settle() for a in adapters))


def _stop_open_at_exit() -> None:
    try:
        stop_all()
    except Exception as exc:  # noqa: BLE001 - exit paths must not raise
        logger.warning("profctx: could not stop an engine's profiler at exit: %s", exc)
