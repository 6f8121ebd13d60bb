"""One rank of a 2-process torchrun job: the Hugging Face ``Trainer`` with ``ProfctxCallback`` (DDP over gloo).

Run by ``tests/integrations/test_transformers.py`` through ``torchrun --standalone --nproc_per_node=2``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import profctx
from profctx.integrations.transformers import ProfctxCallback
from tests.integrations import hf_models


def main(save: str) -> None:
    from transformers import Trainer, TrainingArguments

    profctx.configure(steps="2:4", mode="step", ranks="all", save_path=save, tool="recording")
    tok = hf_models.tokenizer()
    args = TrainingArguments(output_dir=os.path.join(save, "out"), per_device_train_batch_size=2, max_steps=4,
                             report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
                             ddp_backend="gloo", logging_steps=1)
    callback = ProfctxCallback()
    trainer = Trainer(model=hf_models.model(len(tok)), args=args, train_dataset=hf_models.lm_rows(16),
                      callbacks=[callback])
    with callback:
        trainer.train()


if __name__ == "__main__":
    main(sys.argv[1])
