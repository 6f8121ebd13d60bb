"""Actor classes for the Ray tests, in an importable module (Ray loads them by reference)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import ray

import profctx
from profctx.process._owner import OWNER


def _where() -> dict[str, Any]:
    scope = profctx.current()
    runtime = OWNER.runtime
    identity = runtime.identity() if runtime is not None else None
    return {
        "step": scope.step,
        "path": scope.path,
        "group": identity.group if identity else None,
        "rank": identity.rank if identity else None,
        "world_size": identity.world_size if identity else None,
        "run_id": runtime.run_id if runtime is not None else None,
        "pid": os.getpid(),
    }


@ray.remote(num_cpus=0)
class Worker:
    """A worker whose profiled methods report where they ran; ``behaviour`` makes it fail on purpose."""

    def __init__(self, behaviour: str = "ok") -> None:
        self.behaviour = behaviour

    @profctx.profiled(role="work")
    def work(self, seconds: float = 0.0) -> dict[str, Any]:
        if self.behaviour == "raise":
            raise ValueError("boom from the worker")
        if self.behaviour == "die":
            os._exit(1)
        time.sleep(seconds)
        return _where()

    @profctx.profiled(role="async_work")
    async def async_work(self, seconds: float = 0.0) -> dict[str, Any]:
        await asyncio.sleep(seconds)
        return _where()

    def plain(self, x: int) -> int:
        return x + 1

    def reset(self) -> bool:
        profctx.reset()
        return True


class Plain:
    """Not made remote here: the driver calls ``ray.remote(Plain)`` itself (verl's pattern)."""

    @profctx.profiled(role="plain_work")
    def work(self, **kwargs: Any) -> dict[str, Any]:
        return {**_where(), "kwargs": sorted(kwargs)}

    def undecorated(self) -> dict[str, Any]:
        return _where()


class PlainAsync:
    """An async actor class (any ``async def`` makes Ray run the actor on an event loop)."""

    @profctx.profiled(role="async_work")
    async def work(self, **kwargs: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {**_where(), "kwargs": sorted(kwargs)}

    def undecorated(self) -> dict[str, Any]:
        return _where()


def where(actor: Any) -> dict[str, Any]:
    """Run through ``__ray_call__``: where this actor process stands."""
    return _where()
