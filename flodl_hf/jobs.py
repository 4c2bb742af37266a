"""The training job behind ``flodl-hf train``: settings -> data -> head -> loop -> evaluation -> output directory.

It exists so that the job runs in-process (tests, notebooks) exactly as the command runs it, and so that the CLI
stays a thin argument layer. It uses ``Trainer.setup_head_with`` and ``graph.epoch`` / ``graph.step`` exactly as a
user script would, so the same code trains on one CPU, one GPU or N ranks (``devices=["cpu", "cpu"]``). The head
*class* is a parameter: this engine-side module never imports ``heads`` (the CLI, a composition root, passes
``AutoHeadForSequenceClassification``). Its neighbours: ``training_loop`` (checkpoints, Ctrl-C, divergence,
periodic evaluation, early stopping), ``best_model`` (the best evaluation's weights, written when they beat the
final ones), ``evaluation`` and ``problem`` (scores per problem type), ``job_checkpoints`` (checkpoint
directory, resume checks) and ``reporting`` (metrics.json, model card table, output directory, TensorBoard).
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

import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .config import PRECISIONS, DdpConfig
from .data import PROBLEM_TYPES, TextDataset, load_text_classification
from .evaluation import evaluate_head, predict_labels

__all__ = ["TrainSettings", "run_train", "evaluate_head", "predict_labels", "LinearSchedule", "DEFAULT_EVAL_ROWS",
           "REPORT_TO"]

#: Held-out rows when ``eval_rows`` is not given (capped at a fifth of a small dataset).
DEFAULT_EVAL_ROWS = 1000
#: Values of ``report_to`` (``--report-to``).
REPORT_TO = ("none", "tensorboard")


def _positive_int(name: str, value: Any, example: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is invalid: use an integer >= 1, e.g. {example}")


def _optional_positive_int(name: str, value: Any, example: int) -> None:
    if value is not None:
        _positive_int(name, value, example)


@dataclass
class TrainSettings:
    """Every setting of one training job (the CLI's ``train`` options, one field each)."""

    model: Optional[str] = None
    """Checkpoint directory (base or with a classifier). None: the packaged MiniLM."""
    data: Optional[str] = None
    """CSV / JSON / JSON-lines file or saved ``datasets`` directory. None: the packaged sentiment corpus."""
    text_column: Optional[str] = None
    """Column holding the text (None: ``text``)."""
    label_column: Optional[str] = None
    """Column holding the label (None: ``label``, or ``sentiment`` for the packaged corpus)."""
    labels: Optional[Sequence[str]] = None
    """Label names in id order (None: the data's ``ClassLabel`` names, else its sorted distinct labels). The data's
    labels are matched to them by name."""
    split: Optional[str] = None
    """Split of a ``DatasetDict`` / Hub dataset to train on (None: ``train``, else the only split)."""
    eval_data: Optional[str] = None
    """A separate held-out source (any ``data`` format), instead of carving rows out of ``data``."""
    eval_split: Optional[str] = None
    """A split of ``eval_data`` (or, without it, of ``data``) to evaluate on, instead of carving rows out."""
    problem_type: str = "single_label"
    """``single_label``, ``multi_label`` or ``regression`` (see ``flodl_hf.data``)."""
    text_pair_column: Optional[str] = None
    """Column with the second text of sentence pairs (None: single texts)."""
    metric_for_best: Optional[str] = None
    """Held-out metric that picks the written checkpoint and drives early stopping (None: accuracy, micro_f1 or
    pearson by problem type; ``flodl_hf.problem.DEFAULT_METRIC``)."""
    encoding: Optional[str] = None
    """Text encoding of the data file (None: utf-8, falling back to latin-1)."""
    epochs: int = 1
    batch_size: int = 32
    """Micro-batch per rank (the global batch is devices x batch_size)."""
    lr: float = 5e-5
    max_length: int = 64
    """Tokens per text; longer texts are truncated."""
    train_rows: Optional[int] = 4000
    """Rows drawn (seeded) from what the held-out split leaves; None or more than available: all of them."""
    eval_rows: Optional[int] = None
    """Held-out rows (seeded split, disjoint from training). None: 1000, capped at a fifth of the data. With
    ``eval_data`` / ``eval_split``: a seeded subset of those rows (None: all of them)."""
    seed: int = 0
    """Seed of the split, the row subset, the shuffling and the classifier initialisation."""
    output_dir: str = "flodl-hf-output"
    overwrite: bool = False
    """Replace a previous flodl-hf output in ``output_dir`` (other directories are never replaced)."""
    devices: Optional[Sequence[str]] = None
    """One rank per entry (``["cpu", "cpu"]``, ``["cuda:0", "cuda:1"]``); None: DdpConfig's automatic choice."""
    precision: str = "fp32"
    warmup_ratio: Optional[float] = None
    """None: constant LR. A value in [0, 1): linear warmup over that fraction of the steps, then linear decay."""
    progress: bool = True
    """Progress bars (rank 0 only)."""
    eval_batch_size: int = 64
    checkpoint_every: Optional[int] = None
    """Write a checkpoint every N optimizer steps (None: only on Ctrl-C)."""
    checkpoint_dir: Optional[str] = None
    """Where checkpoints go. None: the ``resume`` directory, else ``<output_dir>.checkpoint`` beside the output."""
    keep_checkpoint: bool = False
    """Keep the checkpoint directory after a successful run (default: removed once the output is written)."""
    resume: Optional[str] = None
    """Continue the run whose checkpoint is in this directory (same data plan and model required)."""
    eval_every: Optional[int] = None
    """Evaluate on the held-out split every N optimizer steps (None: only at the end)."""
    early_stopping_patience: Optional[int] = None
    """Stop when the ``metric_for_best`` has not improved for this many evaluations (needs ``eval_every``)."""
    report_to: str = "none"
    """``tensorboard``: write scalars (training loss, the held-out metrics) to ``<output_dir>/runs``."""
    speed_hint: Optional[tuple] = None
    """``(slow_rank, ratio)``: DdpConfig.speed_hint, the other ranks are ``ratio`` (>= 1) times faster."""
    overhead_target: float = 0.10
    """DdpConfig.overhead_target: El Che's ceiling of synchronisation / compute time, in [0.01, 0.5]."""
    fixed_anchor: Optional[int] = None
    """DdpConfig.fixed_anchor: micro-steps per optimizer step, constant (None: El Che adapts it)."""
    max_micro_batch: Optional[int] = None
    """DdpConfig.max_micro_batch: no rank's micro-batch exceeds this many samples (None: no cap)."""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        _positive_int("epochs", self.epochs, 1)
        _positive_int("batch_size", self.batch_size, 32)
        _positive_int("max_length", self.max_length, 64)
        _positive_int("eval_batch_size", self.eval_batch_size, 64)
        if self.train_rows is not None:
            _positive_int("train_rows", self.train_rows, 4000)
        if self.eval_rows is not None:
            _positive_int("eval_rows", self.eval_rows, 1000)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed={self.seed!r} is invalid: use an integer from 0 to 2**63-1 (--seed), e.g. 0")
        if isinstance(self.lr, bool) or not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr)
                                             and self.lr > 0):
            raise ValueError(f"lr={self.lr!r} is invalid: use a positive learning rate, e.g. 5e-5")
        if self.warmup_ratio is not None and not 0.0 <= float(self.warmup_ratio) < 1.0:
            raise ValueError(f"warmup_ratio={self.warmup_ratio!r} is invalid: use a fraction in [0, 1), e.g. 0.1")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} is invalid: use one of {', '.join(PRECISIONS)}")
        if self.labels is not None:
            self.labels = [str(label) for label in self.labels]
        if self.devices is not None:
            if isinstance(self.devices, str):
                self.devices = [d.strip() for d in self.devices.split(",") if d.strip()]
            if not self.devices:
                raise ValueError("devices is empty: give at least one, e.g. cpu or cpu,cpu")
        _optional_positive_int("checkpoint_every", self.checkpoint_every, 500)
        _optional_positive_int("eval_every", self.eval_every, 200)
        _optional_positive_int("early_stopping_patience", self.early_stopping_patience, 3)
        if self.early_stopping_patience is not None and self.eval_every is None:
            raise ValueError(f"--early-stopping-patience {self.early_stopping_patience} needs --eval-every N: early "
                             "stopping counts held-out evaluations, e.g. --eval-every 200")
        if self.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"problem_type={self.problem_type!r} is invalid: use one of {', '.join(PROBLEM_TYPES)} "
                             "(--problem-type)")
        if self.metric_for_best is not None:
            from .problem import check_metric

            check_metric(self.metric_for_best, self.problem_type)
        if self.eval_data is None and self.eval_split is not None and self.eval_split == (self.split or "train"):
            raise ValueError(f"--eval-split {self.eval_split} is the split training uses (--split): evaluating on "
                             "the training rows says nothing; name another split, e.g. --eval-split validation")
        if self.problem_type == "regression" and self.labels is not None:
            raise ValueError("--labels names classes, but --problem-type regression has none: leave --labels out")
        if self.report_to not in REPORT_TO:
            raise ValueError(f"report_to={self.report_to!r} is invalid: use one of {', '.join(REPORT_TO)}")
        if self.speed_hint is not None:
            self.speed_hint = tuple(self.speed_hint)
            if self.devices is not None and len(self.speed_hint) == 2 and int(self.speed_hint[0]) >= len(self.devices):
                raise ValueError(f"speed hint rank {self.speed_hint[0]} does not exist with {len(self.devices)} "
                                 f"device(s): name a rank from 0 to {len(self.devices) - 1}")
        self.ddp_config()  # DdpConfig validates devices, speed_hint and overhead_target now, not after loading

    @property
    def best_metric(self) -> str:
        """The metric that picks the best checkpoint (``metric_for_best`` or the problem type's default)."""
        from .problem import DEFAULT_METRIC

        return self.metric_for_best or DEFAULT_METRIC[self.problem_type]

    def ddp_config(self) -> DdpConfig:
        """The engine configuration of this job."""
        return DdpConfig(seed=self.seed, devices=self.devices, precision=self.precision, verbose=True,
                         speed_hint=self.speed_hint, overhead_target=self.overhead_target,
                         fixed_anchor=self.fixed_anchor, max_micro_batch=self.max_micro_batch)


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
    from . import defaults

    if settings.model is None:
        model_path, base_id, packaged_model = defaults.default_model_path(), defaults.DEFAULT_BASE_MODEL_ID, True
    else:
        from .preflight import check_model_dir

        model_path, base_id, packaged_model = Path(settings.model), None, False
        check_model_dir(model_path)  # config, weights and tokenizer present, before anything else
    if settings.data is None:
        data_path = defaults.default_corpus_path()
        return _Sources(model_path, base_id, data_path, defaults.DEFAULT_DATASET_NAME,
                        settings.text_column or defaults.CORPUS_TEXT_COLUMN,
                        settings.label_column or defaults.CORPUS_LABEL_COLUMN,
                        settings.encoding or defaults.CORPUS_ENCODING, packaged_model, True)
    from .datasources import looks_like_hub_id

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

class LinearSchedule:
    """Linear warmup then linear decay to 0 over the run's micro-steps (batches of ``graph.epoch``).

    ``graph.step()`` steps an LR scheduler once per micro-step (A times after a window of A micro-batches), so this
    schedule ends exactly at the run's last micro-batch whatever El Che's anchor does; on one device it is the
    usual per-step linear schedule. A checkpoint saves ``done`` and the base LRs.
    """

    def __init__(self, optimizer: Any, total: int, warmup_ratio: float) -> None:
        self.optimizer = optimizer
        self.total = max(1, int(total))
        self.warmup = int(self.total * warmup_ratio)
        self.done = 0
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        self._apply()

    def factor(self) -> float:
        if self.done < self.warmup:
            return (self.done + 1) / (self.warmup + 1)
        return max(0.0, (self.total - self.done) / max(1, self.total - self.warmup))

    def _apply(self) -> None:
        factor = self.factor()
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * factor

    def step(self) -> None:
        self.done += 1
        self._apply()

    def state_dict(self) -> dict:
        return {"total": self.total, "warmup": self.warmup, "done": self.done, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state: dict) -> None:
        self.total, self.warmup, self.done = int(state["total"]), int(state["warmup"]), int(state["done"])
        self.base_lrs = [float(lr) for lr in state["base_lrs"]]

    def set_base_lr(self, lr: float) -> None:
        """Change the peak LR (on resume with another --lr) and apply it to the next step."""
        self.base_lrs = [float(lr)] * len(self.optimizer.param_groups)
        self._apply()


def run_train(settings: TrainSettings, head_cls: Any, *, log: Callable[[str], None] = print) -> dict:
    """Train, evaluate and write ``settings.output_dir``; return the metrics (the content of ``metrics.json``).

    ``head_cls`` is a task-head class with ``from_pretrained`` and ``on_device`` (e.g.
    ``heads.AutoHeadForSequenceClassification``). On N ranks every rank trains; rank 0 alone evaluates, writes and
    returns the metrics, the other ranks return ``{"rank": r}``. Raises ``training_loop.TrainingInterrupted``
    after a Ctrl-C (a checkpoint was written) and ``training_loop.TrainingDiverged`` on a NaN/inf loss.
    """
    from . import ownership
    from .job_checkpoints import check_plan, job_plan, prepare_checkpoints, remove_job_checkpoint, resume
    from .preflight import check_label_order, check_train
    from .reporting import require_tensorboard

    started = time.perf_counter()
    sources = _resolve(settings)
    check_train(settings, sources)  # validate first: paths, ownership, model files, devices, disk space
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

    from . import Trainer
    from .training_loop import LoopState

    torch.manual_seed(settings.seed)  # the classifier layer's initialisation
    head = head_cls.from_pretrained(str(sources.model_path), max_length=settings.max_length,
                                    **_head_labels(settings.problem_type, train_ds.labels))
    if settings.text_pair_column is not None:
        from .evaluation import require_pairs

        require_pairs(head)  # a head without pair support would train on the first texts alone
    config, num_labels = head.config(), len(head.labels())
    lr = settings.lr
    Trainer.setup_head_with(head, lambda dev: head_cls.on_device(config, num_labels, dev),
                            lambda params: torch.optim.AdamW(params, lr=lr), settings.ddp_config())
    graph = head.graph()
    main = graph.is_main
    say = log if main else (lambda _line: None)
    graph.set_data_loader(train_ds, batch_size=settings.batch_size, collate_fn=head.collate)
    steps = graph.steps_per_epoch()
    if steps == 0:
        raise ValueError(f"{len(train_ds)} training rows are fewer than one global batch of "
                         f"{graph.world_size * settings.batch_size}: lower --batch-size or add rows")
    total = steps * settings.epochs
    schedule = None
    if settings.warmup_ratio is not None:
        schedule = LinearSchedule(graph.optimizer, total, float(settings.warmup_ratio))
        graph.set_scheduler(schedule)
    plan["world_size"] = graph.world_size
    state = resume(graph, settings, saved, plan, schedule, say) if saved is not None else LoopState()
    what = "regression (1 output)" if settings.problem_type == "regression" else \
        f"{settings.problem_type}, {num_labels} labels {train_ds.labels}"
    pairs = f" (pairs: {sources.text_column} + {settings.text_pair_column})" if settings.text_pair_column else ""
    say(f"flodl-hf: training on {len(train_ds)} rows{pairs} ({dataset.source}), evaluating on {len(eval_ds)} "
        f"({eval_ds.source if held_out is not None else 'held out'}); {what}; {settings.epochs} epoch(s) x "
        f"{steps} steps")

    if main:
        if settings.overwrite and (saved is None or checkpoint_dir.resolve() != Path(settings.resume).resolve()):
            remove_job_checkpoint(checkpoint_dir)  # --overwrite: a previous run's checkpoint (ours only) is replaced
        ownership.adopt_checkpoint_dir(checkpoint_dir)  # marked ours before anything is written there
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
    from .problem import HF_PROBLEM_TYPES

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

    from .best_model import BestWeights
    from .job_checkpoints import RUNS_DIR, remove_job_checkpoint
    from .problem import greater_is_better, headline
    from .reporting import ScalarBoard, build_metrics, write_outputs
    from .training_loop import LoopOptions, run_loop

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
                          metric=metric, greater_is_better=greater_is_better(metric),
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
