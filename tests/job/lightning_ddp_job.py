"""A tiny Lightning DDP fit on CPU, started as ``python lightning_ddp_job.py DIR``: Lightning starts rank 1 itself.

Run by ``tests/job/test_lightning_run_id.py``; configures profctx before the Trainer exists, as a
user's script does, so rank 0 knows nothing of the launch when its runtime is made.
"""

from __future__ import annotations

import logging
import sys
import warnings

import lightning as L  # noqa: N812 - as Lightning writes it
import torch

import profctx
from profctx.integrations.lightning import ProfctxProfiler

SAVE = sys.argv[1]
profctx.configure(steps=[1, 2], mode="step", ranks="all", save_path=SAVE)
logging.getLogger("lightning").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=2)
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=4, profiler=ProfctxProfiler(summary=False),
                    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Net(), data)
profctx.flush()
