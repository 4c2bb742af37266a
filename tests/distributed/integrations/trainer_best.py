"""Trainer's evaluation, checkpoint rotation and ``load_best_model_at_end`` under ElCheTrainer (run by torchrun).

Prints one line per rank: the best checkpoint, its metric and a digest of the final parameters.
"""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np
import torch
import trainer_script
from transformers import TrainingArguments

from flodl_hf.integrations import ElCheTrainer


def accuracy(prediction) -> dict:
    return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}


def main() -> None:
    out = sys.argv[1]
    case = {"model": "seq", "n": 64, "data_seed": 1, "init_seed": 2, "max_len": 8}
    data = trainer_script.rows(case)
    args = TrainingArguments(out, per_device_train_batch_size=4, num_train_epochs=3, learning_rate=3e-3,
                             eval_strategy="steps", eval_steps=4, save_steps=4, load_best_model_at_end=True,
                             metric_for_best_model="accuracy", save_total_limit=2, use_cpu=True, report_to=[],
                             logging_steps=2, disable_tqdm=True, remove_unused_columns=False)
    trainer = ElCheTrainer(model=trainer_script.model(case), args=args, train_dataset=trainer_script.Rows(data),
                           eval_dataset=trainer_script.Rows(data[:20]),
                           data_collator=trainer_script.Collate(os.devnull), compute_metrics=accuracy)
    trainer.train()
    digest = hashlib.sha1(b"".join(p.detach().numpy().tobytes() for p in trainer.model.parameters())).hexdigest()
    print(f"rank {os.environ['RANK']} best {trainer.state.best_model_checkpoint} metric {trainer.state.best_metric} "
          f"digest {digest}", flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.stderr.flush()
    os._exit(0)  # gloo's threads sometimes abort interpreter teardown ("terminate called ...")


if __name__ == "__main__":
    main()
