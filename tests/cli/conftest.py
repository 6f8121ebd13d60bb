"""A real profiled run, made once per session by profctx itself with the torch backend on CPU."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import profctx  # noqa: E402
from profctx.core._layout import MANIFEST_DIR  # noqa: E402

RUN_ID = "clirun"
WORLD = 2


def make_run(save_path: Path) -> Path:
    """Profile steps 1-2 of a two-rank loop in role mode; return ``save_path``.

    Rank 0, step 2: a role entered on a second thread while ``rollout`` owns the profiler is
    skipped. Rank 1, step 2: ``actor_update`` fails to start because a torch profiler that
    profctx did not start is running. The last manifest line of rank 1 is cut, as by a crash.
    """
    for rank in range(WORLD):
        profctx.configure(save_path=str(save_path), tool="torch", steps="1:3", mode="role", ranks="all",
                          rank=rank, world_size=WORLD, run_id=RUN_ID, compress=True)
        for step in (1, 2, 3):
            with profctx.profile_step(step):
                with profctx.profile_step(role="rollout"):
                    x = torch.randn(48, 48) @ torch.randn(48, 48)
                    if rank == 0 and step == 2:
                        worker = threading.Thread(target=_reward, args=(step,))
                        worker.start()
                        worker.join()
                if rank == 1 and step == 2:
                    with torch.profiler.profile(), profctx.profile_step(role="actor_update"):
                        (x * 2).sum()
                else:
                    with profctx.profile_step(role="actor_update"):
                        (x * 2).relu().sum()
        profctx.flush()
        profctx.reset()
    shard = next((save_path / MANIFEST_DIR).glob(f"{RUN_ID}.rank1-*.jsonl"))
    with open(shard, "a", encoding="utf-8") as fh:
        fh.write('{"v":1,"run":"clirun","capture":"cut-by-a-cra')
    return save_path


def _reward(step: int) -> None:
    with profctx.profile_step(step, role="reward"):
        torch.ones(8).sum()


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return the folder of a finished two-rank run (read-only for tests: copy it before changing it)."""
    saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE") if k in os.environ}
    try:
        return make_run(tmp_path_factory.mktemp("run"))
    finally:
        os.environ.update(saved)
