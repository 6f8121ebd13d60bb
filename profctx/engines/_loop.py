"""A private event loop on a daemon thread, so blocking callers can drive async engine calls.

It works whether or not the caller is itself inside a running loop (a plain ``with`` in
``async def`` code): the coroutine never runs on the caller's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def _ensure() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _lock:
        if _loop is None or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="profctx-engines", daemon=True)
            thread.start()
            _loop, _thread = loop, thread
        return _loop


def stop(timeout: float = 5.0) -> None:
    """End the private loop and its thread (``profctx.reset()``); the next engine call starts a fresh one.

    From the loop's own thread the loop is only asked to stop (it cannot wait for itself).
    """
    global _loop, _thread
    with _lock:
        loop, thread = _loop, _thread
        _loop = _thread = None
    if loop is None:
        return
    loop.call_soon_threadsafe(loop.stop)
    if thread is None or thread is threading.current_thread():
        return
    thread.join(timeout)
    if not thread.is_alive():
        loop.close()


def in_private_loop() -> bool:
    """Return whether the caller runs on the private loop's thread."""
    return _thread is not None and threading.current_thread() is _thread


def run_sync(make: Callable[[], Awaitable[T]], timeout: float | None = None) -> T:
    """Run ``make()`` on the private loop and wait for its result (at most ``timeout`` seconds).

    Raise ``RuntimeError`` if called from the private loop itself (it would wait on itself),
    and ``TimeoutError`` when ``timeout`` passes first (the coroutine is then cancelled).
    """
    if in_private_loop():
        raise RuntimeError("profctx: a blocking engine call was made from profctx's own engine loop")
    loop = _ensure()

    async def wrapper() -> T:
        return await make()

    future = asyncio.run_coroutine_threadsafe(wrapper(), loop)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise
