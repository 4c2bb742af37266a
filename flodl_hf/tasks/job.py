"""The training job of ``flodl-hf train --task token-classification | question-answering | fill-mask``.

It exists so that the tasks beyond text classification train exactly as the text-classification job does (same
validate-first checks, same directory locks and ownership rules, ``Trainer.setup_head_with`` with the head's
``on_device`` as the replica factory, ``graph.epoch`` / ``graph.step`` through the job's loop, so one CPU, one GPU
or N ranks with El Che, checkpoints, Ctrl-C, ``--resume``, ``--eval-every`` and early stopping), with only what
differs per task here: the data (``token_data``, ``qa_data``, ``text_data``, or the packaged corpora of
``corpora`` without ``--data``), the head class (passed in by the CLI) and the held-out scores (``scoring``).

The held-out rows are scored twice on rank 0, before and after training (``before_training`` in metrics.json; the
first score rides in the checkpoint's job plan, so a resumed run reports it too), beside a task baseline that needs
no model: all-``O`` tags (token classification) or the context's first word (question answering).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from .names import QUESTION_ANSWERING, TOKEN_CLASSIFICATION
from .options import TaskSettings, lower_is_better
from .rows import Rows

__all__ = ["run_task_train", "load_task_rows"]


@dataclass
class _Sources:
    """The fields of ``flodl_hf.job.run``'s sources the shared preflight, checkpoint plan and card read."""

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


def _resolve(ts: TaskSettings) -> _Sources:
    from .. import defaults
    from ..data.sources import looks_like_hub_id
    from .corpora import PACKAGED_TASK_DATA

    settings = ts.train
    if settings.model is None:
        model_path, base_id, packaged_model = defaults.default_model_path(), defaults.DEFAULT_BASE_MODEL_ID, True
    else:
        from ..preflight import check_model_dir

        model_path, base_id, packaged_model = Path(settings.model), None, False
        check_model_dir(model_path)
    if settings.data is None:
        given = [flag for flag, value in (("--split", settings.split), ("--eval-split", settings.eval_split),
                                          ("--text-column", settings.text_column),
                                          ("--label-column", settings.label_column), ("--labels", settings.labels),
                                          ("--encoding", settings.encoding)) if value is not None]
        if given:
            raise ValueError(f"{given[0]} describes --data, but without --data --task {ts.task} trains on its packaged "
                             f"corpus, generated with fixed columns, tags and no splits: leave {given[0]} out, or give "
                             "--data")
        return _Sources(model_path, base_id, defaults.default_corpus_path(), PACKAGED_TASK_DATA[ts.task],
                        settings.text_column, settings.label_column, settings.encoding, packaged_model, True)
    hub_id = str(settings.data) if looks_like_hub_id(settings.data) else None
    data_path = Path(settings.data)
    return _Sources(model_path, base_id, data_path, hub_id or data_path.stem or data_path.name, settings.text_column,
                    settings.label_column, settings.encoding, packaged_model, False, hub_id)


def load_task_rows(task: str, source: Any, *, labels: Any = None, text_column: Optional[str] = None,
                   label_column: Optional[str] = None, encoding: Optional[str] = None, split: Optional[str] = None,
                   prefer: tuple = ("train",), known: str = "--labels") -> Rows:
    """Read ``source`` with the reader of ``task``."""
    if task == TOKEN_CLASSIFICATION:
        from .token_data import load_token_data

        return load_token_data(source, labels=labels, words_column=text_column, tags_column=label_column,
                               encoding=encoding, split=split, prefer=prefer, known=known)
    if task == QUESTION_ANSWERING:
        from .qa_data import load_qa_data

        return load_qa_data(source, encoding=encoding, split=split, prefer=prefer)
    from .text_data import load_texts

    return load_texts(source, text_column=text_column, encoding=encoding, split=split, prefer=prefer)


def _load(ts: TaskSettings, sources: _Sources) -> tuple[Rows, Optional[Rows]]:
    settings = ts.train
    if sources.packaged_data:
        from .corpora import packaged_rows

        dataset = packaged_rows(ts.task)
    else:
        dataset = load_task_rows(ts.task, sources.data_path if sources.hub_id is None else sources.hub_id,
                                 labels=settings.labels, text_column=settings.text_column,
                                 label_column=settings.label_column, encoding=settings.encoding, split=settings.split)
    if settings.eval_data is None and settings.eval_split is None:
        return dataset, None
    source = settings.eval_data if settings.eval_data is not None else (sources.hub_id or sources.data_path)
    held_out = load_task_rows(ts.task, source, labels=dataset.labels or None, text_column=settings.text_column,
                              label_column=settings.label_column, encoding=settings.encoding,
                              split=settings.eval_split, prefer=("validation", "test", "train"),
                              known="the training tags")
    return dataset, held_out


def _split(dataset: Rows, held_out: Optional[Rows], settings: Any) -> tuple[Rows, Rows]:
    from ..job.settings import DEFAULT_EVAL_ROWS

    if held_out is not None:
        if settings.eval_rows is not None:
            held_out = held_out.subset(settings.eval_rows, seed=settings.seed)
        train = dataset
    else:
        n = len(dataset)
        if n < 2:
            raise ValueError(f"{dataset.source} has {n} usable row(s): training and evaluation need at least 2")
        n_eval = settings.eval_rows if settings.eval_rows is not None else min(DEFAULT_EVAL_ROWS, max(1, n // 5))
        train, held_out = dataset.split(n_eval, seed=settings.seed)
    if settings.train_rows is not None:
        train = train.subset(settings.train_rows, seed=settings.seed)
    return train, held_out


def run_task_train(ts: TaskSettings, head_cls: Any, *, log: Callable[[str], None] = print) -> dict:
    """Train, evaluate and write ``ts.train.output_dir``; return the metrics (the content of ``metrics.json``;
    ``{"rank": r}`` on ranks other than 0). ``head_cls`` is the task's head class (``from_pretrained``,
    ``on_device``; e.g. ``heads.AutoHeadForTokenClassification``: this package never imports ``heads``). Raises the
    loop's ``TrainingInterrupted`` / ``TrainingDiverged``."""
    from ..job.preflight import check_train, is_main_process
    from ..job.run import _lock_directories

    started = time.perf_counter()
    sources = _resolve(ts)
    checkpoint_dir = check_train(ts.train, sources)
    locks = _lock_directories(ts.train, checkpoint_dir) if is_main_process() else []
    try:
        return _run(ts, head_cls, sources, checkpoint_dir, started, log)
    finally:
        for lock in reversed(locks):
            lock.release()


def _baselines(task: str, eval_rows: Rows) -> dict:
    from .scoring import all_o_baseline, first_word_baseline

    if task == TOKEN_CLASSIFICATION and "O" in eval_rows.labels:
        return {"all O tags": all_o_baseline(eval_rows)}
    if task == QUESTION_ANSWERING:
        return {"first word of the context": {k: v for k, v in first_word_baseline(eval_rows).items()
                                              if k != "questions"}}
    return {}


def _run(ts: TaskSettings, head_cls: Any, sources: _Sources, checkpoint_dir: Path, started: float,
         log: Callable[[str], None]) -> dict:
    from ..files import ownership
    from ..job.checkpoints import check_plan, job_plan, prepare_checkpoints, remove_job_checkpoint

    settings, task = ts.train, ts.task
    dataset, held_out = _load(ts, sources)
    train_rows, eval_rows = _split(dataset, held_out, settings)
    if task == TOKEN_CLASSIFICATION:
        from .entity_metrics import is_iob_tagset

        iob = is_iob_tagset(train_rows.labels)
        if settings.eval_every and ts.metric in ("f1", "precision", "recall") and not iob:
            raise ValueError(f"the tags {','.join(train_rows.labels)} are not IOB2 (O, B-TYPE, I-TYPE), so entity "
                             f"{ts.metric} is undefined and cannot pick the best weights (--eval-every): pass "
                             "--metric-for-best accuracy, or give IOB2 tags")
    ranks = len(settings.devices) if settings.devices else 1
    if len(train_rows) < ranks * settings.batch_size:
        raise ValueError(f"{len(train_rows)} training rows are fewer than one global batch of "
                         f"{ranks * settings.batch_size} ({ranks} device(s) x batch size {settings.batch_size}): "
                         "lower --batch-size or add rows")
    checkpoint_dir, saved = prepare_checkpoints(settings)
    plan = job_plan(settings, sources, train_rows.labels, len(settings.devices) if settings.devices else None)
    plan.update(lr=settings.lr, task=task)
    if saved is not None:
        check_plan(saved["plan"], plan, settings.resume)
        if saved["plan"].get("task", "text-classification") != task:
            from ..checkpoint.errors import ResumeError

            raise ResumeError(f"cannot resume from {settings.resume}: it was written with --task "
                              f"{saved['plan'].get('task', 'text-classification')} but this run has --task {task}; "
                              "resume with the same --task, or start afresh without --resume")

    import torch

    from .. import Trainer
    from ..job.checkpoints import start_or_resume
    from ..optim import adamw

    torch.manual_seed(settings.seed)
    extra = {"labels": list(train_rows.labels)} if task == TOKEN_CLASSIFICATION else {}
    head = head_cls.from_pretrained(str(sources.model_path), max_length=settings.max_length, **extra)
    config, num_labels = head.config(), head.num_labels
    lr = settings.lr
    Trainer.setup_head_with(head, lambda dev: head_cls.on_device(config, num_labels, dev),
                            lambda params: adamw(params, lr), settings.ddp_config())
    graph = head.graph()
    main = graph.is_main
    say = log if main else (lambda _line: None)
    graph.set_data_loader(train_rows, batch_size=settings.batch_size, collate_fn=head.collate)
    steps, total, schedule, state = start_or_resume(graph, settings, len(train_rows), saved, plan, say)
    labels = f", tags {train_rows.labels}" if task == TOKEN_CLASSIFICATION else ""
    say(f"flodl-hf: {task}: training on {len(train_rows)} rows ({dataset.source}), evaluating on {len(eval_rows)} "
        f"({eval_rows.source if held_out is not None else 'held out'}){labels}; {settings.epochs} epoch(s) x "
        f"{steps} steps")
    if main:
        if settings.overwrite and (saved is None or checkpoint_dir.resolve() != Path(settings.resume).resolve()):
            remove_job_checkpoint(checkpoint_dir)
        ownership.adopt_checkpoint_dir(checkpoint_dir, ts.train.report_to == "tensorboard")
    try:
        return _train_and_write(ts, sources, head, graph, state, plan, checkpoint_dir, dataset, train_rows,
                                eval_rows, steps, total, started, say, saved)
    finally:
        if main:
            ownership.release_if_empty(checkpoint_dir)


def _train_and_write(ts: TaskSettings, sources: _Sources, head: Any, graph: Any, state: Any, plan: dict,
                     checkpoint_dir: Path, dataset: Rows, train_rows: Rows, eval_rows: Rows, steps: int,
                     total: int, started: float, say: Callable[[str], None], saved: Optional[dict]) -> dict:
    import torch

    from ..job.checkpoints import remove_job_checkpoint
    from ..job.evaluate import BestWeights
    from ..job.loop import LoopOptions, run_loop
    from .report import build_task_metrics, scalar_scores, write_task_outputs
    from .scoring import headline, score

    settings, task, metric = ts.train, ts.task, ts.metric
    main = graph.is_main
    greater = not lower_is_better(metric)

    def evaluate() -> dict:
        return score(head, task, eval_rows, settings.eval_batch_size, seed=settings.seed)

    before: dict = {}
    if saved is not None:  # scored when the run started; the checkpoint's plan carries it
        before = dict(saved["plan"].get("before_training") or {})
    elif main:
        before = evaluate()
        plan["before_training"] = scalar_scores(before)
        say(f"flodl-hf: before training: {headline(before, task)} on {len(eval_rows)} held-out rows")
    best = BestWeights(metric, greater) if settings.eval_every and main else None
    options = LoopOptions(epochs=settings.epochs, steps_per_epoch=steps, checkpoint_dir=checkpoint_dir,
                          checkpoint_every=settings.checkpoint_every, eval_every=settings.eval_every,
                          patience=settings.early_stopping_patience, lr=settings.lr, progress=settings.progress,
                          metric=metric, greater_is_better=greater, total_steps=total,
                          on_best=(lambda step, summary: best.capture(head.model, step, summary)) if best else None)
    state = run_loop(head, graph, state, options, plan=plan, say=say, evaluate=evaluate)
    if not main:
        return {"rank": graph.rank}
    if graph.world_size > 1 and graph.device.type == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(os.cpu_count() or 1)
    eval_started = time.perf_counter()
    summary = score(head, task, eval_rows, settings.eval_batch_size, progress=settings.progress, seed=settings.seed)
    eval_time = time.perf_counter() - eval_started
    written = {"step": int(graph.training_step), "reason": "final weights"}
    if best is not None and best.beats(summary):
        best.restore(head.model)
        final = {k: v for k, v in summary.items() if isinstance(v, float)}
        summary = dict(best.summary, final_weights=final)
        written = {"step": best.step, "reason": f"best held-out {metric} (periodic evaluation)"}
        say(f"flodl-hf: writing the weights of step {best.step}, the best held-out {metric} "
            f"({best.summary[metric]:.4f}; the final weights scored {final[metric]:.4f})")
    metrics = build_task_metrics(task=task, metric=metric, settings=settings, sources=sources, dataset=dataset,
                                 train_rows=train_rows, eval_rows=eval_rows, summary=summary, before=before,
                                 baselines=_baselines(task, eval_rows), loop=state, graph=graph, total_steps=total,
                                 eval_time=eval_time)
    metrics["written_weights"] = written
    write_task_outputs(head, task, settings, sources, metrics, started)
    if not settings.keep_checkpoint:
        remove_job_checkpoint(checkpoint_dir)
    stopped = "" if state.stop_reason == "completed" else f" ({state.stop_reason})"
    was = f" (before training: {headline(before, task)})" if before else ""
    say(f"flodl-hf: {headline(summary, task)}{was} on {len(eval_rows)} held-out rows; train "
        f"{state.train_time_s:.1f} s, total {metrics['wall_time_s']:.1f} s{stopped}; wrote {settings.output_dir}")
    return metrics
