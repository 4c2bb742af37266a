"""The train job behind ``flodl-hf train``, for every task: settings -> data -> head -> loop -> evaluation ->
output directory.

It exists so that the job runs in-process (tests, notebooks) exactly as the command runs it, so that the CLI stays
a thin argument layer, and so that every task trains through the same steps, written once here: the validate-first
checks (``preflight``), the directory locks and ownership rules, ``Trainer.setup_head_with`` with the head's
``on_device`` as the replica factory, ``graph.epoch`` / ``graph.step`` through the loop (``loop``: checkpoints,
Ctrl-C, divergence, periodic evaluation, early stopping), ``--resume`` (``checkpoints``), the best evaluation's
weights (``evaluate``), and the output directory (``outputs``). What differs per task comes from its plug-in
(``flodl_hf.job.tasks``, chosen by ``settings.task``): the data and its packaged corpus, the head's keywords, the
held-out scores, baselines, metrics.json fields and the model card. The same code trains on one CPU, one GPU or N
ranks (``devices=["cpu", "cpu"]``). The head *class* is a parameter: this package never imports ``heads`` (the
CLI, the composition root, passes the task's auto head class).

Output directory (``settings.output_dir``), written atomically by rank 0 only and only when training finished:
the HF model files at the top level (``config.json``, ``model.safetensors``, tokenizer files), so the directory
loads with transformers' ``AutoModelFor<Task>.from_pretrained(dir)`` and can be pushed to the Hub as is, plus
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

from . import interrupt
from .settings import DEFAULT_EVAL_ROWS, PACKAGED_TRAIN_ROWS, TrainSettings
from .tasks import Task, get_task

__all__ = ["run_train", "Sources", "resolve_sources", "split_rows"]


# --- resolution of defaults ---------------------------------------------------------------------------------

@dataclass
class Sources:
    """Where the model and the data of a run come from (recorded in the job plan, metrics.json and the card)."""

    model_path: Path
    base_model_id: Optional[str]
    data_path: Path
    dataset_name: str
    text_column: Optional[str]
    label_column: Optional[str]
    encoding: Optional[str]
    packaged_model: bool
    packaged_data: bool
    hub_id: Optional[str] = None
    """The Hub dataset id ``data`` names (None: a local source)."""


def resolve_sources(settings: TrainSettings, task: Task) -> Sources:
    """The model and data of a run: the packaged MiniLM and the task's packaged corpus unless given."""
    from .. import defaults

    if settings.model is None:
        model_path, base_id, packaged_model = defaults.default_model_path(), defaults.DEFAULT_BASE_MODEL_ID, True
    else:
        from ..preflight import check_model_dir

        model_path, base_id, packaged_model = Path(settings.model), None, False
        check_model_dir(model_path)  # config, weights and tokenizer present, before anything else
    if settings.data is None:
        text_column, label_column, encoding, name = task.columns(settings, packaged=True)
        return Sources(model_path, base_id, defaults.default_corpus_path(), name, text_column, label_column,
                       encoding, packaged_model, True)
    from ..data.sources import looks_like_hub_id

    text_column, label_column, encoding, _ = task.columns(settings, packaged=False)
    data_path = Path(settings.data)
    hub_id = str(settings.data) if looks_like_hub_id(settings.data) else None
    return Sources(model_path, base_id, data_path, hub_id or data_path.stem or data_path.name, text_column,
                   label_column, encoding, packaged_model, False, hub_id)


def split_rows(dataset: Any, settings: TrainSettings, held_out: Optional[Any] = None) -> tuple[Any, Any]:
    """``(train, held-out)``: a seeded carve-out of ``dataset``, or ``held_out`` (a named split or file) when
    given, subset to ``eval_rows``; then ``train_rows`` drawn from the training rows (every row of
    ``data`` by default; ``PACKAGED_TRAIN_ROWS`` of the packaged corpus: ``TrainSettings.train_rows_cap``).
    ``dataset`` is any task's data (``TextDataset``, ``Rows``: ``split`` and ``subset`` with a seed)."""
    if held_out is not None:
        train = dataset
        if settings.eval_rows is not None:
            held_out = held_out.subset(settings.eval_rows, seed=settings.seed)
    else:
        n = len(dataset)
        if n < 2:
            raise ValueError(f"{dataset.source} has {n} usable row(s): training and evaluation need at least 2")
        n_eval = settings.eval_rows if settings.eval_rows is not None else min(DEFAULT_EVAL_ROWS, max(1, n // 5))
        if n_eval >= n:
            raise ValueError(f"cannot hold out {n_eval} of {n} rows for evaluation ({dataset.source}): give "
                             f"--eval-rows between 1 and {n - 1}, so that rows remain for training")
        train, held_out = dataset.split(n_eval, seed=settings.seed)
    if settings.train_rows_cap is not None:
        train = train.subset(settings.train_rows_cap, seed=settings.seed)
    return train, held_out


# --- the job ------------------------------------------------------------------------------------------------

def run_train(settings: TrainSettings, head_cls: Any, *, log: Callable[[str], None] = print) -> dict:
    """Train, evaluate and write ``settings.output_dir``; return the metrics (the content of ``metrics.json``).

    ``head_cls`` is the task's head class with ``from_pretrained`` and ``on_device`` (e.g.
    ``heads.AutoHeadForSequenceClassification``, ``heads.AutoHeadForTokenClassification``). On N ranks every rank
    trains; rank 0 alone evaluates, writes and returns the metrics, the other ranks return ``{"rank": r}``. Raises
    ``loop.TrainingInterrupted`` after a Ctrl-C (a checkpoint was written) and ``loop.TrainingDiverged`` on a
    NaN/inf loss.
    """
    from .preflight import check_train, is_main_process

    started = time.perf_counter()
    task = get_task(settings.task)
    sources = resolve_sources(settings, task)
    checkpoint_dir = check_train(settings, sources)  # validate first: paths, ownership, model files, devices, disk
    if sources.packaged_data and settings.train_rows is None and is_main_process():
        lr = f" at lr {settings.lr:g}" if settings.packaged_job else ""
        log(f"flodl-hf: the packaged corpus, {PACKAGED_TRAIN_ROWS} training rows{lr} for a fast run (--train-rows "
            "N for another number; --data FILE trains on every row of your data)")
    locks = _lock_directories(settings, checkpoint_dir) if is_main_process() else []
    try:
        return _run(settings, task, head_cls, sources, started, log)
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


def _run(settings: TrainSettings, task: Task, head_cls: Any, sources: Sources, started: float,
         log: Callable[[str], None]) -> dict:
    """The job after its preflight, with its directories locked."""
    from ..checkpoint.errors import ResumeError
    from ..files import ownership
    from .checkpoints import check_plan, job_plan, prepare_checkpoints, remove_job_checkpoint, start_or_resume
    from .outputs import require_tensorboard

    if settings.report_to == "tensorboard":
        require_tensorboard()
    dataset, held_out = task.load(settings, sources)
    task.check_data(settings, sources, dataset)
    train_rows, eval_rows = split_rows(dataset, settings, held_out)
    task.check_split(settings, train_rows)
    ranks = len(settings.devices) if settings.devices else 1
    if len(train_rows) < ranks * settings.batch_size:
        raise ValueError(f"{len(train_rows)} training rows are fewer than one global batch of "
                         f"{ranks * settings.batch_size} ({ranks} device(s) x batch size {settings.batch_size}): "
                         "lower --batch-size or add rows")
    _check_schedule(settings, len(train_rows), ranks)
    checkpoint_dir, saved = prepare_checkpoints(settings)  # reads a --resume checkpoint (torch) after the cheap checks
    plan = job_plan(settings, sources, train_rows.labels, len(settings.devices) if settings.devices else None)
    plan["lr"] = settings.lr
    plan.update(task.plan_extras())
    _record_contents(plan, settings, sources)
    if saved is not None:
        check_plan(saved["plan"], plan, settings.resume)  # before loading the model
        _check_contents(saved["plan"], plan, settings, sources)
        was = saved["plan"].get("task", "text-classification")
        if was != task.name:
            raise ResumeError(f"cannot resume from {settings.resume}: it was written with --task {was} but this "
                              f"run has --task {task.name}; resume with the same --task, or start afresh without "
                              "--resume")

    import torch

    from .. import Trainer
    from .optim import adamw

    torch.manual_seed(settings.seed)  # the new layers' initialisation
    head = head_cls.from_pretrained(str(sources.model_path), max_length=settings.max_length,
                                    **task.head_kwargs(settings, train_rows))
    task.check_head(head, settings)
    task.check_rows(head, [train_rows, eval_rows])  # every row, before the first step
    config, num_labels = head.config(), task.num_labels(head)
    lr, weight_decay, built = settings.lr, settings.weight_decay, []

    def replica(device: Any) -> Any:
        built.append(head_cls.on_device(config, num_labels, device))
        return built[-1]

    # Trainer's groups: weight decay on all but biases and normalisation weights (named by the replica's module)
    Trainer.setup_head_with(head, replica,
                            lambda params: adamw(params, lr, weight_decay, module=built[-1].graph().module),
                            settings.ddp_config())
    graph = head.graph()
    main = graph.is_main
    say = log if main else (lambda _line: None)
    graph.set_data_loader(train_rows, batch_size=settings.batch_size, collate_fn=head.collate,
                          lengths=task.lengths(settings, train_rows))
    steps, total, schedule, state = start_or_resume(graph, settings, len(train_rows), saved, plan, say)
    say(task.describe(settings, sources, dataset, train_rows, eval_rows, held_out is not None, num_labels, steps))

    if main:
        if settings.overwrite and (saved is None or checkpoint_dir.resolve() != Path(settings.resume).resolve()):
            remove_job_checkpoint(checkpoint_dir)  # --overwrite: a previous run's checkpoint (ours only) is replaced
        ownership.adopt_checkpoint_dir(checkpoint_dir, settings.report_to == "tensorboard")  # ours before any write
    try:
        return _train_and_write(settings, task, sources, head, graph, state, plan, checkpoint_dir, dataset,
                                train_rows, eval_rows, steps, total, started, say, saved)
    finally:
        if main:
            ownership.release_if_empty(checkpoint_dir)  # a marker alone (nothing saved) is not left behind


def _check_schedule(settings: TrainSettings, rows: int, ranks: int) -> None:
    """The LR of every micro-step the run will take, before the model loads (``schedule_check``)."""
    from ..config import DdpConfig
    from ..elche.partition import steps_per_epoch
    from .schedule import warmup_steps_for
    from .schedule_check import check_schedule

    total = steps_per_epoch(rows, ranks * settings.batch_size, DdpConfig.drop_last) * settings.epochs
    warmup = warmup_steps_for(total, settings.warmup_steps, settings.warmup_ratio)
    option = "--warmup-steps" if settings.warmup_steps is not None else "--warmup-ratio"
    check_schedule(settings.lr_scheduler_type, settings.lr_scheduler_kwargs, float(settings.lr), total, warmup,
                   option)


def _record_contents(plan: dict, settings: TrainSettings, sources: Sources) -> None:
    """SHA-256 of the data, the model and the settings a resume must repeat, in the plan (``fingerprints``)."""
    from .checkpoints import PLAN_FLAGS
    from .fingerprints import FINGERPRINT_KEY, fingerprints

    plan[FINGERPRINT_KEY] = fingerprints(settings, sources, compared_elsewhere=PLAN_FLAGS)


def _check_contents(saved: dict, plan: dict, settings: TrainSettings, sources: Sources) -> None:
    from .fingerprints import check_fingerprints

    shown = {"--model": sources.model_path, "--data": sources.hub_id or sources.data_path,
             "--eval-data": settings.eval_data}
    check_fingerprints(saved, plan, settings.resume, shown)


def _train_and_write(settings: TrainSettings, task: Task, sources: Sources, head: Any, graph: Any, state: Any,
                     plan: dict, checkpoint_dir: Path, dataset: Any, train_rows: Any, eval_rows: Any, steps: int,
                     total: int, started: float, say: Callable[[str], None], saved: Optional[dict]) -> dict:
    """The score before training (tasks that report it), the loop, the final evaluation and the output directory
    (rank 0 writes)."""
    import torch

    from .checkpoints import RUNS_DIR, remove_job_checkpoint
    from .evaluate import BestWeights
    from .loop import LoopOptions, run_loop
    from .outputs import ScalarBoard, run_metrics, write_outputs
    from .tasks.base import scalar_scores

    main = graph.is_main
    metric = settings.best_metric
    greater = task.greater_is_better(metric)

    def evaluate(progress: bool = False) -> dict:
        return task.score(head, eval_rows, settings.eval_batch_size, progress=progress, seed=settings.seed)

    before: dict = {}
    if task.scores_before_training:
        if saved is not None:  # scored when the run started; the checkpoint's plan carries it
            before = dict(saved["plan"].get("before_training") or {})
        elif main:
            before = evaluate()
            plan["before_training"] = scalar_scores(before)
            say(f"flodl-hf: before training: {task.headline(before, settings)} on {len(eval_rows)} held-out rows")
    board = None
    if settings.report_to == "tensorboard" and main:
        # purge_step hides what an earlier, killed attempt logged from this step on (everything, on a fresh run)
        board = ScalarBoard(checkpoint_dir / RUNS_DIR, purge_step=len(state.losses) + 1)
    best = BestWeights(metric, greater) if settings.eval_every and main else None
    options = LoopOptions(epochs=settings.epochs, steps_per_epoch=steps,
                          checkpoint_dir=checkpoint_dir, checkpoint_every=settings.checkpoint_every,
                          eval_every=settings.eval_every, patience=settings.early_stopping_patience, lr=settings.lr,
                          progress=settings.progress, metric=metric, greater_is_better=greater, total_steps=total,
                          on_best=(lambda step, summary: best.capture(head.model, step, summary)) if best else None)
    try:
        state = run_loop(head, graph, state, options, plan=plan, board=board, say=say, evaluate=evaluate)
        if not main:
            interrupt.work_done()  # this rank's share is done; rank 0 evaluates and writes
            return {"rank": graph.rank}
        if graph.world_size > 1 and graph.device.type == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(os.cpu_count() or 1)  # the other ranks are done: evaluate on every core
        eval_started = time.perf_counter()
        summary = evaluate(progress=settings.progress)
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
    run = run_metrics(settings=settings, loop=state, graph=graph, total_steps=total, eval_time=eval_time,
                      sources=sources)
    metrics = task.build_metrics(settings=settings, sources=sources, dataset=dataset, train=train_rows,
                                 eval_rows=eval_rows, summary=summary, before=before, run=run)
    metrics["written_weights"] = written
    write_outputs(head, task, settings, sources, metrics, started,
                  runs_dir=checkpoint_dir / RUNS_DIR if board else None)
    if not settings.keep_checkpoint:
        remove_job_checkpoint(checkpoint_dir, runs=board is not None)  # runs/ was copied into the output
    el_che = metrics.get("el_che") or {}
    if el_che.get("lr_scaling") == "adascale" and el_che.get("schedule_progress", 1.0) < 1.0:
        say(f"flodl-hf: --lr-scaling adascale scaled the LR by a gain of up to {el_che['lr_gain_max']:.2f} and moved "
            f"the LR schedule by {el_che['schedule_progress']:.0%} of the run's micro-steps, so the schedule did not "
            "reach its end (AdaScale's rule); raise --epochs to finish it")
    stopped = "" if state.stop_reason == "completed" else f" ({state.stop_reason})"
    say(f"flodl-hf: {task.headline(summary, settings)}{task.result_note(metrics, before)} on {len(eval_rows)} "
        f"held-out rows; train {state.train_time_s:.1f} s, total {metrics['wall_time_s']:.1f} s{stopped}; "
        f"wrote {settings.output_dir}")
    interrupt.work_done()
    return metrics
