"""The training job behind ``flodl-hf train``: settings -> data -> head -> loop -> evaluation -> output directory.

It exists so that the job runs in-process (tests, notebooks) exactly as the command runs it, and so that the CLI
stays a thin argument layer. It uses ``Trainer.setup_head_with`` and ``graph.epoch`` / ``graph.step`` exactly as a
user script would, so the same code trains on one CPU, one GPU or N ranks (``devices=["cpu", "cpu"]``). The head
*class* is a parameter: this module never imports ``heads`` (the CLI, a composition root, passes
``AutoHeadForSequenceClassification``). It only orchestrates; its neighbours in ``flodl_hf.job``: ``settings``
(``TrainSettings``), ``preflight`` (the job's validate-first checks), ``schedule`` (``LinearSchedule``), ``loop``
(checkpoints, Ctrl-C, divergence, periodic evaluation, early stopping), ``evaluate`` (scoring a head, and the best
evaluation's weights, written when they beat the final ones), ``problems`` (scores per problem type),
``checkpoints`` (checkpoint directory, resume checks) and ``outputs`` (metrics.json, model card table, output
directory, TensorBoard).
Data (``datasources``, ``labels``, ``data``) is loaded for the problem type ``problem_type``, with labels matched
by name, and held-out rows are carved out of ``data`` unless ``eval_data`` / ``eval_split`` name them.

Output directory (``settings.output_dir``), written atomically by rank 0 only and only when training finished:
the HF model files at the top level (``config.json``, ``model.safetensors``, tokenizer files), so the directory
loads with ``AutoModelForSequenceClassification.from_pretrained(dir)`` and can be pushed to the Hub as is, plus
``README.md`` (the model card), ``metrics.json``, ``loss_curve.png`` and, with TensorBoard, ``runs/``.
``train_loss`` (and the loss shown by the progress bar) is rank 0's loss of each of its micro-batches: reducing it
across ranks would add a collective per step to what is only a progress signal; the held-out metrics are the
figures to trust.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..data import TextDataset, load_text_classification
from .evaluate import evaluate_head
from .settings import DEFAULT_EVAL_ROWS, TrainSettings

__all__ = ["run_train"]


# --- resolution of defaults ---------------------------------------------------------------------------------

@dataclass
class _Sources:
    model_path: Path
    base_model_id: Optional[str]
    data_path: Path
    dataset_name: str
    text_column: str
    label_column: str
    encoding: Optional[str]
    packaged_model: bool
    packaged_data: bool
    hub_id: Optional[str] = None
    """The Hub dataset id ``data`` names (None: a local source)."""


def _resolve(settings: TrainSettings) -> _Sources:
    from .. import defaults

    if settings.model is None:
        model_path, base_id, packaged_model = defaults.default_model_path(), defaults.DEFAULT_BASE_MODEL_ID, True
    else:
        from ..preflight import check_model_dir

        model_path, base_id, packaged_model = Path(settings.model), None, False
        check_model_dir(model_path)  # config, weights and tokenizer present, before anything else
    if settings.data is None:
        data_path = defaults.default_corpus_path()
        return _Sources(model_path, base_id, data_path, defaults.DEFAULT_DATASET_NAME,
                        settings.text_column or defaults.CORPUS_TEXT_COLUMN,
                        settings.label_column or defaults.CORPUS_LABEL_COLUMN,
                        settings.encoding or defaults.CORPUS_ENCODING, packaged_model, True)
    from ..data.sources import looks_like_hub_id

    data_path = Path(settings.data)
    hub_id = str(settings.data) if looks_like_hub_id(settings.data) else None
    return _Sources(model_path, base_id, data_path, hub_id or data_path.stem or data_path.name,
                    settings.text_column or "text", settings.label_column or "label", settings.encoding,
                    packaged_model, False, hub_id)


def _split(dataset: TextDataset, settings: TrainSettings,
           held_out: Optional[TextDataset] = None) -> tuple[TextDataset, TextDataset]:
    """``(train, held-out)``: a seeded carve-out of ``dataset``, or ``held_out`` (a named split or file) when
    given, subset to ``eval_rows``; then ``train_rows`` drawn from the training rows."""
    if held_out is not None:
        train = dataset
        if settings.eval_rows is not None:
            held_out = held_out.subset(settings.eval_rows, seed=settings.seed)
        if settings.train_rows is not None:
            train = train.subset(settings.train_rows, seed=settings.seed)
        return train, held_out
    n = len(dataset)
    if n < 2:
        raise ValueError(f"{dataset.source} has {n} usable row(s): training and evaluation need at least 2")
    n_eval = settings.eval_rows if settings.eval_rows is not None else min(DEFAULT_EVAL_ROWS, max(1, n // 5))
    if n_eval >= n:
        raise ValueError(f"cannot hold out {n_eval} of {n} rows for evaluation ({dataset.source}): give --eval-rows "
                         f"between 1 and {n - 1}, so that rows remain for training")
    train, held_out = dataset.split(n_eval, seed=settings.seed)
    if settings.train_rows is not None:
        train = train.subset(settings.train_rows, seed=settings.seed)
    return train, held_out


# --- the job ------------------------------------------------------------------------------------------------

def run_train(settings: TrainSettings, head_cls: Any, *, log: Callable[[str], None] = print) -> dict:
    """Train, evaluate and write ``settings.output_dir``; return the metrics (the content of ``metrics.json``).

    ``head_cls`` is a task-head class with ``from_pretrained`` and ``on_device`` (e.g.
    ``heads.AutoHeadForSequenceClassification``). On N ranks every rank trains; rank 0 alone evaluates, writes and
    returns the metrics, the other ranks return ``{"rank": r}``. Raises ``loop.TrainingInterrupted``
    after a Ctrl-C (a checkpoint was written) and ``loop.TrainingDiverged`` on a NaN/inf loss.
    """
    from .preflight import check_train, is_main_process

    started = time.perf_counter()
    sources = _resolve(settings)
    checkpoint_dir = check_train(settings, sources)  # validate first: paths, ownership, model files, devices, disk
    locks = _lock_directories(settings, checkpoint_dir) if is_main_process() else []
    try:
        return _run(settings, head_cls, sources, started, log)
    finally:
        for lock in reversed(locks):
            lock.release()


def _lock_directories(settings: TrainSettings, checkpoint_dir: Path) -> list:
    """Lock the checkpoint and output directories for this run (``flodl_hf.files.dirlock``): a second run writing
    either is refused naming this one."""
    from ..files import dirlock

    locks = [dirlock.acquire(checkpoint_dir, "checkpoint directory", "choose another --checkpoint-dir")]
    try:
        locks.append(dirlock.acquire(settings.output_dir, "output directory", "choose another --output-dir"))
    except BaseException:
        locks[0].release()
        raise
    return locks


def _run(settings: TrainSettings, head_cls: Any, sources: "_Sources", started: float,
         log: Callable[[str], None]) -> dict:
    """The job after its preflight, with its directories locked."""
    from ..files import ownership
    from .checkpoints import check_plan, job_plan, prepare_checkpoints, remove_job_checkpoint, start_or_resume
    from .outputs import require_tensorboard
    from .preflight import check_label_order

    if settings.report_to == "tensorboard":
        require_tensorboard()
    dataset, held_out = _load_data(settings, sources)
    if settings.problem_type == "single_label" and len(dataset.labels) < 2:
        raise ValueError(f"{dataset.source} has a single label {dataset.labels} in column {sources.label_column!r}: "
                         "a classifier needs at least 2 classes; check --label-column, or name every class with "
                         "--labels")
    if settings.problem_type != "regression":
        check_label_order(sources.model_path, dataset.labels, settings.labels is not None)
    train_ds, eval_ds = _split(dataset, settings, held_out)
    ranks = len(settings.devices) if settings.devices else 1
    if len(train_ds) < ranks * settings.batch_size:
        raise ValueError(f"{len(train_ds)} training rows are fewer than one global batch of "
                         f"{ranks * settings.batch_size} ({ranks} device(s) x batch size {settings.batch_size}): "
                         "lower --batch-size or add rows")
    checkpoint_dir, saved = prepare_checkpoints(settings)  # reads a --resume checkpoint (torch) after the cheap checks
    plan = job_plan(settings, sources, train_ds.labels, len(settings.devices) if settings.devices else None)
    plan["lr"] = settings.lr
    if saved is not None:
        check_plan(saved["plan"], plan, settings.resume)  # before loading the model

    import torch

    from .. import Trainer
    from ..optim import adamw

    torch.manual_seed(settings.seed)  # the classifier layer's initialisation
    head = head_cls.from_pretrained(str(sources.model_path), max_length=settings.max_length,
                                    **_head_labels(settings.problem_type, train_ds.labels))
    if settings.text_pair_column is not None:
        from .evaluate import require_pairs

        require_pairs(head)  # a head without pair support would train on the first texts alone
    config, num_labels = head.config(), len(head.labels())
    lr = settings.lr
    Trainer.setup_head_with(head, lambda dev: head_cls.on_device(config, num_labels, dev),
                            lambda params: adamw(params, lr), settings.ddp_config())
    graph = head.graph()
    main = graph.is_main
    say = log if main else (lambda _line: None)
    lengths = None
    if settings.group_by_length:  # characters stand in for tokens: no tokenising pass over the data
        pairs = train_ds.text_pairs or [""] * len(train_ds.texts)
        lengths = [len(t) + len(p) for t, p in zip(train_ds.texts, pairs)]
    graph.set_data_loader(train_ds, batch_size=settings.batch_size, collate_fn=head.collate, lengths=lengths)
    steps, total, schedule, state = start_or_resume(graph, settings, len(train_ds), saved, plan, say)
    what = "regression (1 output)" if settings.problem_type == "regression" else \
        f"{settings.problem_type}, {num_labels} labels {train_ds.labels}"
    pairs = f" (pairs: {sources.text_column} + {settings.text_pair_column})" if settings.text_pair_column else ""
    say(f"flodl-hf: training on {len(train_ds)} rows{pairs} ({dataset.source}), evaluating on {len(eval_ds)} "
        f"({eval_ds.source if held_out is not None else 'held out'}); {what}; {settings.epochs} epoch(s) x "
        f"{steps} steps")

    if main:
        if settings.overwrite and (saved is None or checkpoint_dir.resolve() != Path(settings.resume).resolve()):
            remove_job_checkpoint(checkpoint_dir)  # --overwrite: a previous run's checkpoint (ours only) is replaced
        ownership.adopt_checkpoint_dir(checkpoint_dir, settings.report_to == "tensorboard")  # ours before any write
    try:
        return _train_and_write(settings, sources, head, graph, state, plan, checkpoint_dir, dataset, train_ds,
                                eval_ds, steps, total, started, say)
    finally:
        if main:
            ownership.release_if_empty(checkpoint_dir)  # a marker alone (nothing saved) is not left behind


def _load_data(settings: TrainSettings, sources: _Sources) -> tuple[TextDataset, Optional[TextDataset]]:
    """The training data and, with ``--eval-data`` / ``--eval-split``, the named held-out data (its labels
    matched by name to the training labels)."""
    common = dict(text_column=sources.text_column, label_column=sources.label_column,
                  text_pair_column=settings.text_pair_column, problem_type=settings.problem_type)
    dataset = load_text_classification(sources.data_path, labels=settings.labels, encoding=sources.encoding,
                                       split=settings.split, **common)
    if settings.eval_data is None and settings.eval_split is None:
        return dataset, None
    source = settings.eval_data if settings.eval_data is not None else sources.data_path
    held_out = load_text_classification(
        source, labels=dataset.labels if settings.problem_type != "regression" else None,
        encoding=settings.encoding if settings.eval_data is not None else sources.encoding,
        split=settings.eval_split, prefer_splits=("validation", "test") if settings.eval_data is None else
        ("validation", "test", "train"), split_option="--eval-split", known="the training labels",
        label_fix="evaluate on data with the training labels, or name every class with --labels", **common)
    return dataset, held_out


def _head_labels(problem_type: str, labels: list) -> dict:
    """``from_pretrained`` keywords of a problem type: label names, or one output for regression."""
    from .problems import HF_PROBLEM_TYPES

    if problem_type == "regression":
        return {"num_labels": 1, "problem_type": HF_PROBLEM_TYPES[problem_type]}
    if problem_type == "multi_label":
        return {"labels": labels, "problem_type": HF_PROBLEM_TYPES[problem_type]}
    return {"labels": labels}


def _train_and_write(settings: TrainSettings, sources: _Sources, head: Any, graph: Any, state: Any, plan: dict,
                     checkpoint_dir: Path, dataset: TextDataset, train_ds: TextDataset, eval_ds: TextDataset,
                     steps: int, total: int, started: float, say: Callable[[str], None]) -> dict:
    """The loop, the final evaluation and the output directory (rank 0 writes)."""
    import torch

    from .checkpoints import RUNS_DIR, remove_job_checkpoint
    from .evaluate import BestWeights
    from .loop import LoopOptions, run_loop
    from .outputs import ScalarBoard, build_metrics, write_outputs
    from .problems import greater_is_better, headline

    main = graph.is_main
    board = None
    if settings.report_to == "tensorboard" and main:
        # purge_step hides what an earlier, killed attempt logged from this step on (everything, on a fresh run)
        board = ScalarBoard(checkpoint_dir / RUNS_DIR, purge_step=len(state.losses) + 1)
    metric = settings.best_metric
    best = BestWeights(metric, greater_is_better(metric)) if settings.eval_every and main else None
    options = LoopOptions(epochs=settings.epochs, steps_per_epoch=steps, checkpoint_dir=checkpoint_dir,
                          checkpoint_every=settings.checkpoint_every, eval_every=settings.eval_every,
                          patience=settings.early_stopping_patience, lr=settings.lr, progress=settings.progress,
                          metric=metric, greater_is_better=greater_is_better(metric), total_steps=total,
                          on_best=(lambda step, summary: best.capture(head.model, step, summary)) if best else None)
    try:
        state = run_loop(head, graph, state, options, plan=plan, board=board, say=say,
                         evaluate=lambda: evaluate_head(head, eval_ds, settings.eval_batch_size))
        if not main:
            return {"rank": graph.rank}
        if graph.world_size > 1 and graph.device.type == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(os.cpu_count() or 1)  # the other ranks are done: evaluate on every core
        eval_started = time.perf_counter()
        summary = evaluate_head(head, eval_ds, settings.eval_batch_size, progress=settings.progress)
        eval_time = time.perf_counter() - eval_started
        if board is not None:
            for name, value in summary.items():
                if isinstance(value, float):
                    board.add(f"eval/{name}", value, len(state.losses))
        written = {"step": int(graph.training_step), "reason": "final weights"}
        if best is not None and best.beats(summary):
            best.restore(head.model)  # load_best_model_at_end: write the best evaluation's weights
            final = {k: v for k, v in summary.items() if isinstance(v, float)}
            summary = dict(best.summary, final_weights=final)
            written = {"step": best.step, "reason": f"best held-out {metric} (periodic evaluation)"}
            say(f"flodl-hf: writing the weights of step {best.step}, the best held-out {metric} "
                f"({best.summary[metric]:.4f}; the final weights scored {final[metric]:.4f})")
    finally:
        if board is not None:
            board.close()
    metrics = build_metrics(settings=settings, sources=sources, dataset=dataset, train_ds=train_ds,
                            eval_ds=eval_ds, summary=summary, loop=state, graph=graph, total_steps=total,
                            eval_time=eval_time)
    metrics["written_weights"] = written
    write_outputs(head, settings, sources, metrics, started, runs_dir=checkpoint_dir / RUNS_DIR if board else None)
    if not settings.keep_checkpoint:
        remove_job_checkpoint(checkpoint_dir, runs=board is not None)  # runs/ was copied into the output
    stopped = "" if state.stop_reason == "completed" else f" ({state.stop_reason})"
    baseline = metrics.get("majority_baseline")
    say(f"flodl-hf: {headline(summary, settings.problem_type)}"
        + (f" (majority baseline {baseline:.3f})" if baseline is not None else "")
        + f" on {len(eval_ds)} held-out rows; "
        f"train {state.train_time_s:.1f} s, total {metrics['wall_time_s']:.1f} s{stopped}; "
        f"wrote {settings.output_dir}")
    return metrics
