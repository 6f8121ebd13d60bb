"""Process exit: stop and write an open capture at interpreter exit and on SIGTERM."""

from __future__ import annotations

import atexit
import os
import signal
import threading
from types import FrameType
from typing import Any

from . import _state
from ._log import logger

_installed = False
_previous: Any = None


def install() -> None:
    """Register the exit hooks once per process (SIGTERM only from the main thread)."""
    global _installed, _previous
    if _installed:
        return
    _installed = True
    atexit.register(_at_exit)
    if threading.current_thread() is threading.main_thread():
        try:
            _previous = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):  # not allowed here (embedded interpreter)
            _previous = None


def uninstall() -> None:
    """Remove the exit hooks, restoring any SIGTERM handler that was there before."""
    global _installed, _previous
    if not _installed:
        return
    _installed = False
    atexit.unregister(_at_exit)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, _previous if _previous is not None else signal.SIG_DFL)
    _previous = None


def finalize(timeout: float | None = 60.0) -> None:
    """Stop open engine sessions and this process's open capture; wait for files (``timeout`` seconds)."""
    for hook in list(_state.ROLE_HOOKS):
        shutdown = getattr(hook, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception as exc:  # noqa: BLE001 - exit paths must not raise
                logger.warning("profctx: could not stop %r at exit: %s", hook, exc)
    runtime = _state.RUNTIME
    if runtime is not None:
        try:
            runtime.shutdown(timeout)
        except Exception as exc:  # noqa: BLE001 - exit paths must not raise
            logger.warning("profctx: could not finish the open capture at exit: %s", exc)


def _at_exit() -> None:
    finalize()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    finalize()
    previous = _previous
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
