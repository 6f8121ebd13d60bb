"""Process exit: open captures are stopped and written at interpreter exit and on SIGTERM.

The SIGTERM handler takes no lock and does no I/O: it turns the signal into ``SystemExit``
in the main thread (or calls the handler that was there before), so the program unwinds —
``with`` blocks end their captures on their own threads — and the exit hook then writes
everything and ends the process by SIGTERM, as the default action would have.

The exit is bounded: ``on_capture`` hooks are waited for at most ``exit_timeout`` seconds once
the process is exiting (the main thread ended, or SIGTERM arrived), and a second SIGTERM stops
the waiting at once (:meth:`profctx.process._runtime.Runtime.run_capture_hooks`); a capture
whose hooks were given up on has its record written again saying so. The exit hook's wait for
trace files is bounded by ``exit_timeout`` too.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any, Final

from ..core._config import DEFAULT_EXIT_TIMEOUT
from ..util._log import logger
from ._owner import OWNER

#: Seconds the exit hook waits for trace files still being written, without a configuration.
EXIT_TIMEOUT: Final = DEFAULT_EXIT_TIMEOUT


class _Exit:
    """The exit hooks' own state: whether they are installed, the previous handler, a pending SIGTERM."""

    __slots__ = ("finishing", "installed", "previous", "terminated")

    def __init__(self) -> None:
        self.installed = False
        self.previous: Any = None
        self.terminated = False
        self.finishing = False


_EXIT: Final = _Exit()


def install() -> None:
    """Register the exit hooks once per process (SIGTERM only from the main thread)."""
    if _EXIT.installed:
        return
    _EXIT.installed = True
    atexit.register(_at_exit)
    if threading.current_thread() is threading.main_thread():
        try:
            _EXIT.previous = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):  # not allowed here (embedded interpreter)
            _EXIT.previous = None


def uninstall() -> None:
    """Remove the exit hooks, restoring any SIGTERM handler that was there before."""
    if not _EXIT.installed:
        return
    _EXIT.installed = False
    atexit.unregister(_at_exit)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        previous = _EXIT.previous
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    _EXIT.previous = None


def _shut(hooks: list[Any]) -> None:
    for hook in list(hooks):
        try:
            hook.shutdown()
        except Exception as exc:  # noqa: BLE001 - exit paths must not raise
            logger.warning("profctx: could not stop %r at exit: %s", hook, exc)


def release_workers() -> None:
    """Tell the step hooks (a Ray driver's worker groups) that the step they are in ends now."""
    _shut(OWNER.step_hooks)


def finalize(timeout: float | None = None) -> bool:
    """Stop open engine sessions and this process's open captures; wait for files (``timeout`` seconds).

    ``timeout`` ``None``: the configuration's ``exit_timeout``.

    Return whether a capture is still recording on another thread that is alive (recorded
    ``interrupted``: the profiler stops only on the thread that started it).
    """
    _shut(OWNER.step_hooks)
    _shut(OWNER.hooks)
    runtime = OWNER.runtime
    if runtime is not None:
        try:
            return runtime.shutdown(runtime.config.exit_timeout if timeout is None else timeout)
        except Exception as exc:  # noqa: BLE001 - exit paths must not raise
            logger.warning("profctx: could not finish the open capture at exit: %s", exc)
    return False


def _at_exit() -> None:
    _EXIT.finishing = True
    running = finalize()
    if _EXIT.terminated:
        # The process was asked to terminate: end it by SIGTERM, as the default action would.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    if running:
        _end_now()


def _end_now() -> None:
    """End the process here, everything written: another thread is still inside a capture.

    Interpreter finalisation would make that thread exit where it stands (CPython ends a
    thread that wants the interpreter back during finalisation), and a thread inside torch's
    C++ code then aborts the whole process (SIGABRT, "terminate called without an active
    exception"). Standard streams and logging are flushed first; the exit status is 1 after
    an uncaught exception, else 0 (the status a ``sys.exit(n)`` asked for is not visible here).
    """
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    os._exit(1 if getattr(sys, "last_value", None) is not None else 0)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # No lock, no I/O here: the main thread may hold any lock when the signal lands.
    previous = _EXIT.previous
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    runtime = OWNER.runtime
    if _EXIT.finishing or _EXIT.terminated:
        # Already on the way out: a second SIGTERM stops waiting for hooks (an Event's flag, set from here).
        if runtime is not None:
            runtime.exit_forced.set()
        _EXIT.terminated = True
        return
    _EXIT.terminated = True
    if runtime is not None:
        runtime.exit_began()  # the exit deadline counts from now
    raise SystemExit(128 + signum)
