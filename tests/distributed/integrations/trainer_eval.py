"""Trainer's ``evaluate()`` on seeded random cases, for the evaluation-loss test: one process runs plain
``transformers.Trainer`` (the reference), ``torchrun`` ranks run ``ElCheTrainer``. Every case evaluates the same
initial weights on the same rows, so the two ``eval_loss`` figures must agree.

    python trainer_eval.py CASES.json OUT.json
"""

from __future__ import annotations

import json
import os
import sys

import torch
import trainer_script
from transformers import Trainer, TrainingArguments


def evaluate(case: dict, out_dir: str) -> float:
    data = trainer_script.rows(case)
    args = TrainingArguments(out_dir, per_device_eval_batch_size=case["eval_batch"], use_cpu=True, report_to=[],
                             disable_tqdm=True, remove_unused_columns=False,
                             average_tokens_across_devices=case["average_tokens"])
    common = {"model": trainer_script.model(case), "args": args, "eval_dataset": trainer_script.Rows(data),
              "data_collator": trainer_script.Collate(os.devnull),
              "compute_loss_func": trainer_script.summed_loss if case["loss_func"] else None}
    if "RANK" in os.environ:
        from flodl_hf.integrations import ElCheTrainer

        trainer = ElCheTrainer(train_dataset=trainer_script.Rows(data), **common)
    else:
        trainer = Trainer(**common)
    return float(trainer.evaluate()["eval_loss"])


def main() -> None:
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    losses = [evaluate(case, os.path.join(os.path.dirname(sys.argv[2]), f"run{i}")) for i, case in enumerate(cases)]
    if int(os.environ.get("RANK", "0")) == 0:
        with open(sys.argv[2], "w") as f:
            json.dump(losses, f)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo's threads sometimes abort interpreter teardown ("terminate called ...")


if __name__ == "__main__":
    main()
