"""The settings of one ``flodl-hf train`` job, validated at construction.

It exists so that every option of the job (the CLI's ``train`` options, one field each) is checked in one place,
before anything loads: a bad value is one ``ValueError`` line naming the setting and a valid example, whether the
job comes from the command line or from a script (``TrainSettings(...)``). The engine settings of the run
(devices, precision, El Che) are validated by building the job's ``DdpConfig`` right away.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..config import PRECISIONS, DdpConfig
from ..data import PROBLEM_TYPES

__all__ = ["TrainSettings", "DEFAULT_EVAL_ROWS", "PACKAGED_TRAIN_ROWS", "DEFAULT_LR", "PACKAGED_LR", "REPORT_TO"]

#: Held-out rows when ``eval_rows`` is not given (capped at a fifth of a small dataset).
DEFAULT_EVAL_ROWS = 1000
#: Training rows of the packaged corpus (no ``data``) when ``train_rows`` is not given: a fast demonstration run.
#: A user's ``data`` trains on every row unless ``train_rows`` says otherwise.
PACKAGED_TRAIN_ROWS = 4000
#: AdamW's peak learning rate when ``lr`` is not given: transformers' ``TrainingArguments`` default.
DEFAULT_LR = 5e-5
#: The packaged job's (text classification on the packaged corpus, ``lr`` not given). Its 125 steps under Trainer's
#: linear decay reached held-out accuracy 0.712 at a 5e-5 peak (the earlier constant 5e-5: 0.753), 0.744 at 1e-4
#: and 0.762 at 2e-4 (one run each, 2026-12-02): a short run needs the higher peak once the LR decays. A user's
#: data gets ``DEFAULT_LR``.
PACKAGED_LR = 2e-4
#: Values of ``report_to`` (``--report-to``).
REPORT_TO = ("none", "tensorboard")


def read_plan(path: str) -> dict:
    """The El Che plan recorded in an earlier run's ``metrics.json`` (``--replay-plan``), or a one-line error."""
    from pathlib import Path

    from ..files.reader import RefusedFile, read_json

    file = Path(path)
    if file.is_dir():
        file = file / "metrics.json"
    try:
        data = read_json(file, "--replay-plan")
    except RefusedFile:
        raise
    except (OSError, ValueError) as exc:
        raise ValueError(f"--replay-plan {path}: cannot read a metrics.json there ({exc}): pass the metrics.json "
                         "(or the output directory) of an earlier run on several devices") from None
    plan = (data.get("el_che") or {}).get("plan") if isinstance(data, dict) else None
    if plan is None:
        raise ValueError(f"--replay-plan {path}: {file} records no El Che plan (a one-device run, or one written "
                         "before plans were recorded): pass the metrics.json of a run on several devices")
    from ..elche.plan_record import check_plan

    return check_plan(plan, name=f"--replay-plan {path}",
                      fix="pass the metrics.json of an earlier run on several devices, as that run wrote it")


def check_plan_fits(plan: dict, path: str, config: DdpConfig, batch_size: int) -> None:
    """A replayed plan is of this run's devices and ``--batch-size``, or refused in one line before the model loads
    (the engine would find out only once the ranks had started; a plan of several devices on one, never)."""
    from ..distributed.context import planned_world

    world = planned_world(config)
    if plan["world"] != world or plan["batch_size"] != batch_size:
        devices = config.resolved_devices()
        shown = f" ({','.join(devices)})" if devices else ""
        raise ValueError(
            f"--replay-plan {path} was recorded on {plan['world']} device(s) with --batch-size {plan['batch_size']}, "
            f"but this run has {world} device(s){shown} with --batch-size {batch_size}: replay it on "
            f"{plan['world']} devices (--devices) with --batch-size {plan['batch_size']}, or drop --replay-plan")


def _positive_int(name: str, value: Any, example: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is invalid: use an integer >= 1, e.g. {example}")


def _optional_positive_int(name: str, value: Any, example: int) -> None:
    if value is not None:
        _positive_int(name, value, example)


def _real(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _check_optimisation(settings: "TrainSettings") -> None:
    """Weight decay, clipping and the LR schedule (``--weight-decay``, ``--max-grad-norm``,
    ``--lr-scheduler-type``, ``--lr-scheduler-kwargs``, ``--warmup-steps``, ``--warmup-ratio``): one line each."""
    from .schedule import METRIC_SCHEDULES, NEEDS_KWARGS, SCHEDULES

    if not _real(settings.weight_decay) or settings.weight_decay < 0:
        raise ValueError(f"weight_decay={settings.weight_decay!r} is invalid: use a finite value >= 0 "
                         "(--weight-decay), e.g. 0.01")
    if settings.lr is not None and _real(settings.lr) and settings.weight_decay * settings.lr >= 1:
        raise ValueError(f"weight_decay={settings.weight_decay!r} with lr={settings.lr!r} would scale the weights by "
                         f"1 - lr x weight decay = {1 - settings.weight_decay * settings.lr:.3g} at every step "
                         f"(--weight-decay, --lr): use a weight decay below 1 / lr = {1 / settings.lr:g}, e.g. 0.01")
    if settings.max_grad_norm is not None and (not _real(settings.max_grad_norm) or settings.max_grad_norm < 0):
        raise ValueError(f"max_grad_norm={settings.max_grad_norm!r} is invalid: use a finite norm >= 0 "
                         "(--max-grad-norm; 0 turns clipping off), e.g. 1.0")
    name = settings.lr_scheduler_type
    if name in METRIC_SCHEDULES:
        raise ValueError(f"lr_scheduler_type={name!r} follows a metric, not the step count, and this job's schedule "
                         "follows steps: use one of " + ", ".join(SCHEDULES) + " (--lr-scheduler-type), e.g. linear")
    if name not in SCHEDULES:
        raise ValueError(f"lr_scheduler_type={name!r} is invalid: use one of {', '.join(SCHEDULES)} "
                         "(--lr-scheduler-type), e.g. linear")
    if settings.warmup_ratio is not None and (not _real(settings.warmup_ratio)
                                              or not 0.0 <= float(settings.warmup_ratio) < 1.0):
        raise ValueError(f"warmup_ratio={settings.warmup_ratio!r} is invalid: use a fraction in [0, 1), e.g. 0.1")
    if settings.warmup_steps is not None and (isinstance(settings.warmup_steps, bool)
                                              or not isinstance(settings.warmup_steps, int)
                                              or settings.warmup_steps < 0):
        raise ValueError(f"warmup_steps={settings.warmup_steps!r} is invalid: use an integer >= 0 (--warmup-steps), "
                         "e.g. 100")
    if settings.warmup_steps is not None and settings.warmup_ratio is not None:
        raise ValueError(f"--warmup-steps {settings.warmup_steps} and --warmup-ratio {settings.warmup_ratio:g} both "
                         "set the warmup: give one of them, e.g. --warmup-ratio 0.1")
    if name == "constant" and (settings.warmup_steps or settings.warmup_ratio):
        raise ValueError("--lr-scheduler-type constant has no warmup: use --lr-scheduler-type constant_with_warmup, "
                         "or leave --warmup-steps / --warmup-ratio out")
    kwargs = settings.lr_scheduler_kwargs
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ValueError(f"lr_scheduler_kwargs={kwargs!r} is invalid: use a JSON object (--lr-scheduler-kwargs), "
                         "e.g. '{\"num_cycles\": 2}'")
    if name in NEEDS_KWARGS and not kwargs:
        raise ValueError(f"--lr-scheduler-type {name} needs its keywords: add --lr-scheduler-kwargs "
                         f"'{NEEDS_KWARGS[name]}'")
    if kwargs:
        _try_schedule(name, kwargs, float(settings.lr))


def _try_schedule(name: str, kwargs: dict, lr: float) -> None:
    """Build the schedule on a stand-in optimizer: keywords it does not take are one line now, not after loading."""
    import json

    import torch

    from .schedule import KWARGS_EXAMPLES, TrainerSchedule
    from .schedule_check import check_keywords

    example = KWARGS_EXAMPLES[name]
    fix = f"e.g. --lr-scheduler-kwargs '{example}'" if example else "leave --lr-scheduler-kwargs out"
    if example is None:
        raise ValueError(f"--lr-scheduler-type {name} takes no keywords, but --lr-scheduler-kwargs gives "
                         f"'{json.dumps(kwargs)}': {fix}")
    check_keywords(name, kwargs, lr, example)
    try:
        schedule = TrainerSchedule(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr), name, 10, 1, kwargs)
        for _ in range(10):
            schedule.step()
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"--lr-scheduler-kwargs '{json.dumps(kwargs)}' does not fit --lr-scheduler-type {name} "
                         f"({reason}): {fix}") from None


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
    """Held-out metric that picks the written checkpoint and drives early stopping (None: the task's default; for
    text classification accuracy, micro_f1 or pearson by problem type, ``flodl_hf.job.tasks.problems``)."""
    encoding: Optional[str] = None
    """Text encoding of the data file (None: utf-8, falling back to latin-1)."""
    epochs: int = 1
    batch_size: int = 32
    """Micro-batch per rank (the global batch is devices x batch_size)."""
    lr: Optional[float] = None
    """AdamW's peak learning rate. None: ``DEFAULT_LR`` (5e-5, Trainer's); for the packaged text-classification
    job (no ``data``) ``PACKAGED_LR``."""
    max_length: int = 64
    """Tokens per text; longer texts are truncated."""
    train_rows: Optional[int] = None
    """Rows drawn (seeded) from what the held-out split leaves; more than available: all of them. None: every row
    of ``data``; without ``data`` (the packaged corpus) a fast ``PACKAGED_TRAIN_ROWS`` (4000)."""
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
    lr_scheduler_type: str = "linear"
    """transformers' ``get_scheduler`` name (Trainer's default: linear decay to 0); the schedule counts micro-steps,
    global batches (optimizer steps on one device): ``flodl_hf.job.schedule.TrainerSchedule``."""
    lr_scheduler_kwargs: Optional[dict] = None
    """The schedule's own keywords (``scheduler_specific_kwargs``), e.g. ``{"num_cycles": 2}``."""
    warmup_steps: Optional[int] = None
    """Warmup micro-steps (None: from ``warmup_ratio``, else 0, Trainer's default). Not with ``warmup_ratio``."""
    warmup_ratio: Optional[float] = None
    """Warmup as a fraction in [0, 1) of the run's micro-steps: ``ceil(total x ratio)`` steps, as Trainer."""
    weight_decay: float = 0.0
    """AdamW weight decay (Trainer's default 0.0); biases and normalisation weights are always exempt."""
    max_grad_norm: Optional[float] = 1.0
    """Clip the reduced gradient to this total norm before each optimizer step (Trainer's default 1.0); 0 or
    None: no clipping."""
    progress: bool = True
    """Progress bars (rank 0 only)."""
    group_by_length: bool = False
    """Batches of similar text length (``--group-by-length``; ``Graph.set_data_loader(lengths=...)``, by
    characters): little compute goes to padding. Off by default, as in transformers' Trainer: where length
    correlates with the label, length-sorted runs of batches skew each step's labels (seen on a toy task)."""
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
    overhead_target: Optional[float] = None
    """DdpConfig.overhead_target: ceiling of synchronisation / compute time, in [0.01, 0.5] (None: none with the
    goodput rule, 0.10 with the throughput rule)."""
    anchor_rule: str = "goodput"
    """DdpConfig.anchor_rule: ``goodput`` (default) or ``throughput``."""
    fixed_anchor: Optional[int] = None
    """DdpConfig.fixed_anchor: micro-steps per optimizer step, constant (None: 1, unless ``max_anchor`` lets El Che
    lengthen it)."""
    max_anchor: Optional[int] = None
    """DdpConfig.max_anchor: the opt-in that lets El Che average up to this many micro-steps per optimizer step
    (fewer synchronisations for a larger, varying batch); None: every step averages one micro-step per rank."""
    lr_scaling: str = "none"
    """DdpConfig.lr_scaling: ``none`` (default: the LR is the user's) or ``adascale`` (opt-in)."""
    replay_plan: Optional[str] = None
    """A ``metrics.json`` of an earlier run on the same devices: its El Che plan (``el_che.plan``) is replayed
    (DdpConfig.replay_plan), so the run repeats it exactly."""
    max_micro_batch: Optional[int | str] = None
    """DdpConfig.max_micro_batch: no rank's micro-batch exceeds this many samples ("auto": each rank probes its
    largest; None: no cap)."""
    task: str = "text-classification"
    """What to train: ``text-classification`` (default), ``token-classification``, ``question-answering`` or
    ``fill-mask`` (``--task``; the plug-ins of ``flodl_hf.job.tasks``). Options a task cannot honour are refused."""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        from .tasks import get_task

        get_task(self.task).check_settings(self)  # a task's unsupported options first, named with the task
        _positive_int("epochs", self.epochs, 1)
        _positive_int("batch_size", self.batch_size, 32)
        _positive_int("max_length", self.max_length, 64)
        _positive_int("eval_batch_size", self.eval_batch_size, 64)
        if self.train_rows is not None:
            _positive_int("train_rows", self.train_rows, PACKAGED_TRAIN_ROWS)
        if self.eval_rows is not None:
            _positive_int("eval_rows", self.eval_rows, 1000)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed={self.seed!r} is invalid: use an integer from 0 to 2**63-1 (--seed), e.g. 0")
        if self.lr is None:
            self.lr = PACKAGED_LR if self.packaged_job else DEFAULT_LR
        if isinstance(self.lr, bool) or not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr)
                                             and self.lr > 0):
            raise ValueError(f"lr={self.lr!r} is invalid: use a positive learning rate, e.g. 5e-5")
        _check_optimisation(self)
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
            get_task(self.task).check_metric(self.metric_for_best, self)
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
        if self.replay_plan is not None and self.resume is not None:
            raise ValueError("--replay-plan replays a run from its start, and --resume continues another: drop one "
                             "of them")
        config = self.ddp_config()  # DdpConfig validates devices, speed_hint, overhead_target before loading
        if config.replay_plan is not None:
            check_plan_fits(config.replay_plan, str(self.replay_plan), config, self.batch_size)

    @property
    def packaged_job(self) -> bool:
        """Text classification on the packaged corpus (no ``data``): the fast demonstration run."""
        return self.data is None and self.task == "text-classification"

    @property
    def train_rows_cap(self) -> Optional[int]:
        """The training rows drawn: ``train_rows``, else ``PACKAGED_TRAIN_ROWS`` for the packaged corpus, else
        None (every row)."""
        if self.train_rows is None and self.data is None:
            return PACKAGED_TRAIN_ROWS
        return self.train_rows

    @property
    def clip_norm(self) -> Optional[float]:
        """The clipping norm the engine gets (None: no clipping)."""
        return float(self.max_grad_norm) if self.max_grad_norm else None

    @property
    def best_metric(self) -> str:
        """The metric that picks the best checkpoint (``metric_for_best``, else the task's default: for text
        classification the problem type's)."""
        from .tasks import get_task

        return self.metric_for_best or get_task(self.task).default_metric(self)

    def ddp_config(self) -> DdpConfig:
        """The engine configuration of this job."""
        return DdpConfig(seed=self.seed, devices=self.devices, precision=self.precision, verbose=True,
                         speed_hint=self.speed_hint, overhead_target=self.overhead_target, anchor_rule=self.anchor_rule,
                         fixed_anchor=self.fixed_anchor, max_anchor=self.max_anchor,
                         max_micro_batch=self.max_micro_batch,
                         max_grad_norm=self.clip_norm, lr_scaling=self.lr_scaling,
                         replay_plan=None if self.replay_plan is None else read_plan(self.replay_plan))
