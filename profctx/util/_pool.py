"""``ScopedThreadPoolExecutor``: in its own module, so ``import profctx`` does not load ``concurrent.futures``."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

R = TypeVar("R")


class ScopedThreadPoolExecutor(ThreadPoolExecutor):
    """A ``ThreadPoolExecutor`` whose ``submit`` (and so ``map`` and ``run_in_executor``) keeps the scope.

    Each task runs in a copy of the submitting thread's context, as ``asyncio.to_thread`` does.
    """

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        """Schedule ``fn(*args, **kwargs)`` in a copy of the caller's context."""
        context = contextvars.copy_context()
        return super().submit(context.run, fn, *args, **kwargs)
