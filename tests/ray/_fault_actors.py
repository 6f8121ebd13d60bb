"""Actor classes for the fault tests, in an importable module (Ray loads them by reference)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, ClassVar

import ray

import profctx
from profctx.backends import CaptureSpec, register
from profctx.testing import RecordingBackend


class Member:
    """Not made remote here: the tests choose sync or threaded (``max_concurrency``) themselves."""

    @ray.method(num_returns=2)
    @profctx.profiled(role="pair")
    def pair(self, x: int) -> tuple[int, int]:
        return x, x + 1

    @profctx.profiled(role="work")
    def work(self) -> int | None:
        return profctx.current().step

    def die(self) -> None:
        os._exit(1)


class AsyncMember(Member):
    """An async actor (any ``async def`` makes Ray run the actor on an event loop)."""

    @ray.method(num_returns=2, max_task_retries=0)
    @profctx.profiled(role="pair_async")
    async def pair_async(self, x: int) -> tuple[int, str]:
        return x, profctx.current().path


#: How each kind of member is made remote.
KINDS = {
    "sync": lambda: ray.remote(num_cpus=0)(Member),
    "threaded": lambda: ray.remote(num_cpus=0, max_concurrency=2)(Member),
    "async": lambda: ray.remote(num_cpus=0)(AsyncMember),
}


def state(actor: Any) -> dict[str, Any]:
    """Run through ``__ray_call__``: what this member holds and imported."""
    return {"step": profctx.current().step, "torch": "torch" in sys.modules, "pid": os.getpid(),
            "warm": "torch._dynamo" in sys.modules}


class HangingStart(RecordingBackend):
    """The recording backend, except that rank 1's capture start hangs for ``HANG_S`` (a profiler stuck in start)."""

    name: ClassVar[str] = "hanging_start"
    HANG_S: ClassVar[float] = 30.0

    def start(self, spec: CaptureSpec) -> None:
        if spec.identity.rank == 1:
            time.sleep(self.HANG_S)
        super().start(spec)


class SlowPrepare(RecordingBackend):
    """The recording backend with a one-time warm-up of ``PREPARE_S`` (torch's imports, in miniature)."""

    name: ClassVar[str] = "slow_prepare"
    PREPARE_S: ClassVar[float] = 1.0

    def prepare(self) -> None:
        time.sleep(self.PREPARE_S)


def wait_for(actor: Any, path: str) -> bool:
    """Run through ``__ray_call__``: keep the actor busy until ``path`` exists (at most 60 s)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# Registered wherever this module is imported: the driver (the test) and every member (Ray loads the classes).
register(HangingStart.name, HangingStart)
register(SlowPrepare.name, SlowPrepare)


class SlowStart(Member):
    """A member whose ``__init__`` waits until ``gate`` exists (a model loading), at most 60 s."""

    def __init__(self, gate: str) -> None:
        wait_for(self, gate)
