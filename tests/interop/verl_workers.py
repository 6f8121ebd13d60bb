"""verl ``Worker`` subclasses for the tests that run verl's own worker groups (Ray loads them by reference).

Dispatch methods are ``@register``-ed as in verl's workers, with ``@profctx.profiled`` under
``@register`` where verl puts its ``DistProfiler.annotate``; each does a little CPU torch work
with its own operator, so a trace shows which methods it covers: ``update_actor`` multiplies
(``aten::mm``), ``compute_ref_log_prob`` takes a log-softmax (``aten::_log_softmax``) and the
undecorated ``prepare`` takes a cumulative sum (``aten::cumsum``).
"""

from __future__ import annotations

import os
from typing import Any

import ray
import torch
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup

import profctx
import profctx.ray

WIDTH = 16


def _where(worker: Worker) -> dict[str, Any]:
    return {"pid": os.getpid(), "rank": worker.rank, "step": profctx.current().step}


class ActorWorker(Worker):
    """The actor: one profiled stage (``actor_update``) and unprofiled helpers."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed + self.rank)
        self.weight = torch.randn(WIDTH, WIDTH, generator=generator)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @profctx.profiled(role="actor_update")
    def update_actor(self, rows: int) -> float:
        batch = torch.randn(rows, WIDTH)
        self.weight -= 1e-3 * torch.mm(batch.T, torch.mm(batch, self.weight))
        return float(self.weight.sum())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def prepare(self, rows: int) -> float:
        return float(torch.cumsum(torch.randn(rows, WIDTH), dim=0).sum())

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def where(self) -> dict[str, Any]:
        """Where this call ran: the process, verl's rank and the step profctx says this call is in."""
        return _where(self)


class RefWorker(Worker):
    """The reference model: one profiled stage (``ref_compute_log_prob``)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.randn(WIDTH, WIDTH)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @profctx.profiled(role="ref_compute_log_prob")
    def compute_ref_log_prob(self, rows: int) -> float:
        return float(torch.log_softmax(torch.randn(rows, WIDTH) @ self.weight, dim=-1).sum())

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def where(self) -> dict[str, Any]:
        return _where(self)


@ray.remote(num_cpus=0)  # verl's TaskRunner asks for a CPU; the test cluster's two are the workers' pool
class TaskRunner:
    """The driver in a Ray actor, as verl's ``main_ppo`` runs its trainer (``TaskRunner.run``)."""

    def run(self, workers: list[Any], save_path: str) -> list[list[dict[str, Any]]]:
        """Configure, attach a verl worker group to ``workers``, register it, run steps 1..3; return ``where``s."""
        profctx.configure(steps=[2], mode="step", ranks="all", save_path=save_path, tool="recording", warmup=False)
        wg = RayWorkerGroup.from_detached(worker_handles=workers,
                                          ray_cls_with_init=RayClassWithInitArgs(ray.remote(ActorWorker)))
        profctx.ray.group("actor", wg.workers)
        seen = []
        for step in (1, 2, 3):
            with profctx.profile_step(step):
                wg.prepare(4)
                wg.update_actor(4)
                seen.append(wg.where())
        assert profctx.ray.flush() == [True, True]
        assert profctx.flush(60)
        return seen
