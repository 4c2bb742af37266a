"""The training job behind ``flodl-hf train``: settings -> data -> head -> loop -> evaluation -> output directory.

It exists so that the job runs in-process (tests, notebooks) exactly as the command runs it, and so that the CLI
stays a thin argument layer. It uses ``Trainer.setup_head_with`` and ``graph.epoch`` / ``graph.step`` exactly as a
user script would, so the same code trains on one CPU, one GPU or N ranks (``devices=["cpu", "cpu"]``). The head
*class* is a parameter: this engine-side module never imports ``heads`` (the CLI, a composition root, passes
``AutoHeadForSequenceClassification``). Its neighbours: ``training_loop`` (checkpoints, Ctrl-C, divergence,
periodic evaluation, early stopping), ``job_checkpoints`` (checkpoint directory, resume checks) and ``reporting``
(metrics.json, model card table, output directory, TensorBoard).

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
from .data import TextDataset, load_text_classification

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
    """Label names in id order (None: the sorted distinct labels of the data)."""
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
    """Held-out rows (seeded split, disjoint from training). None: 1000, capped at a fifth of the data."""
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
    """Stop when held-out accuracy has not improved for this many evaluations (needs ``eval_every``)."""
    report_to: str = "none"
    """``tensorboard``: write scalars (training loss, held-out accuracy and macro-F1) to ``<output_dir>/runs``."""
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
        if self.report_to not in REPORT_TO:
            raise ValueError(f"report_to={self.report_to!r} is invalid: use one of {', '.join(REPORT_TO)}")
        if self.speed_hint is not None:
            self.speed_hint = tuple(self.speed_hint)
            if self.devices is not None and len(self.speed_hint) == 2 and int(self.speed_hint[0]) >= len(self.devices):
                raise ValueError(f"speed hint rank {self.speed_hint[0]} does not exist with {len(self.devices)} "
                                 f"device(s): name a rank from 0 to {len(self.devices) - 1}")
        self.ddp_config()  # DdpConfig validates devices, speed_hint and overhead_target now, not after loading

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
    data_path = Path(settings.data)
    return _Sources(model_path, base_id, data_path, data_path.stem or data_path.name,
                    settings.text_column or "text", settings.label_column or "label", settings.encoding,
                    packaged_model, False)


def _split(dataset: TextDataset, settings: TrainSettings) -> tuple[TextDataset, TextDataset]:
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


# --- evaluation ---------------------------------------------------------------------------------------------

def _progress(iterable: Any, *, enabled: bool, **kwargs: Any) -> Any:
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=not enabled, file=sys.stderr, dynamic_ncols=True, **kwargs)


def predict_labels(head: Any, texts: Sequence[str], batch_size: int = 64, progress: bool = False) -> list[int]:
    """Arg-max label ids of ``head`` on ``texts``, in batches, in eval mode and without gradients."""
    import torch

    module = head.graph().module if hasattr(head, "graph") else None
    was_training = bool(module is not None and module.training)
    if module is not None:
        module.eval()
    if hasattr(head, "eval"):
        head.eval()
    predictions: list[int] = []
    starts = range(0, len(texts), batch_size)
    try:
        with torch.no_grad():
            for start in _progress(starts, enabled=progress, desc="eval", unit="batch", leave=False):
                logits = head.forward(head.encode(list(texts[start:start + batch_size])))
                logits = getattr(logits, "logits", logits)
                predictions.extend(int(i) for i in logits.argmax(dim=-1).tolist())
    finally:
        if was_training and module is not None:
            module.train()
    return predictions


def evaluate_head(head: Any, dataset: TextDataset, batch_size: int = 64, progress: bool = False) -> dict:
    """``classification_summary`` of ``head`` on ``dataset`` (accuracy, macro-F1, per-label, confusion matrix).

    The head's label names must be the dataset's (same names, same order); otherwise ids would not compare.
    """
    from .metrics import classification_summary

    head_labels = [str(label) for label in head.labels()]
    if head_labels != dataset.labels:
        raise ValueError(f"the model's labels {head_labels} differ from the data's labels {dataset.labels}: pass "
                         f"--labels {','.join(head_labels)} (the model's order), or use matching data")
    predictions = predict_labels(head, dataset.texts, batch_size, progress)
    return classification_summary(predictions, dataset.label_ids, dataset.labels)


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
    dataset = load_text_classification(sources.data_path, text_column=sources.text_column,
                                       label_column=sources.label_column, labels=settings.labels,
                                       encoding=sources.encoding)
    if len(dataset.labels) < 2:
        raise ValueError(f"{dataset.source} has a single label {dataset.labels} in column {sources.label_column!r}: "
                         "a classifier needs at least 2 classes; check --label-column, or name every class with "
                         "--labels")
    check_label_order(sources.model_path, dataset.labels, settings.labels is not None)
    train_ds, eval_ds = _split(dataset, settings)
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
    head = head_cls.from_pretrained(str(sources.model_path), labels=train_ds.labels, max_length=settings.max_length)
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
    say(f"flodl-hf: training on {len(train_ds)} rows ({dataset.source}), holding out {len(eval_ds)}; "
        f"{num_labels} labels {train_ds.labels}; {settings.epochs} epoch(s) x {steps} steps")

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


def _train_and_write(settings: TrainSettings, sources: _Sources, head: Any, graph: Any, state: Any, plan: dict,
                     checkpoint_dir: Path, dataset: TextDataset, train_ds: TextDataset, eval_ds: TextDataset,
                     steps: int, total: int, started: float, say: Callable[[str], None]) -> dict:
    """The loop, the final evaluation and the output directory (rank 0 writes)."""
    import torch

    from .job_checkpoints import RUNS_DIR, remove_job_checkpoint
    from .reporting import ScalarBoard, build_metrics, write_outputs
    from .training_loop import LoopOptions, run_loop

    main = graph.is_main
    board = None
    if settings.report_to == "tensorboard" and main:
        # purge_step hides what an earlier, killed attempt logged from this step on (everything, on a fresh run)
        board = ScalarBoard(checkpoint_dir / RUNS_DIR, purge_step=len(state.losses) + 1)
    options = LoopOptions(epochs=settings.epochs, steps_per_epoch=steps, checkpoint_dir=checkpoint_dir,
                          checkpoint_every=settings.checkpoint_every, eval_every=settings.eval_every,
                          patience=settings.early_stopping_patience, lr=settings.lr, progress=settings.progress)
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
            board.add("eval/accuracy", summary["accuracy"], len(state.losses))
            board.add("eval/macro_f1", summary["macro_f1"], len(state.losses))
    finally:
        if board is not None:
            board.close()
    metrics = build_metrics(settings=settings, sources=sources, dataset=dataset, train_ds=train_ds,
                            eval_ds=eval_ds, summary=summary, loop=state, graph=graph, total_steps=total,
                            eval_time=eval_time)
    write_outputs(head, settings, sources, metrics, started, runs_dir=checkpoint_dir / RUNS_DIR if board else None)
    if not settings.keep_checkpoint:
        remove_job_checkpoint(checkpoint_dir, runs=board is not None)  # runs/ was copied into the output
    stopped = "" if state.stop_reason == "completed" else f" ({state.stop_reason})"
    say(f"flodl-hf: accuracy={metrics['accuracy']:.3f} macro_f1={metrics['macro_f1']:.3f} "
        f"(majority baseline {metrics['majority_baseline']:.3f}) on {len(eval_ds)} held-out rows; "
        f"train {state.train_time_s:.1f} s, total {metrics['wall_time_s']:.1f} s{stopped}; "
        f"wrote {settings.output_dir}")
    return metrics
