"""What a ``flodl-hf train`` run reports: metrics.json, the model card's training table, the output directory, and
TensorBoard scalars.

It exists to keep the job (``flodl_hf.job.run``) about training and to give every reported figure one home:
``run_metrics`` are the metrics.json fields of the run itself, which every task's plug-in puts beside its scores
(``flodl_hf.job.tasks``); ``training_table`` is the card's "Training" section
(devices, world size, policy, El Che anchor and shares on N ranks, precision, epochs, batch, LR, evaluation and
early stopping, resumes); ``write_outputs`` stages the model files, the task's ``README.md``, ``metrics.json``,
``loss_curve.png`` and ``runs/`` and swaps them into the output directory in one step; ``ScalarBoard`` writes
TensorBoard event files through ``torch.utils.tensorboard`` when the ``tensorboard`` package is installed.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional, Sequence

__all__ = ["ScalarBoard", "require_tensorboard", "el_che_info", "el_che_scalars", "step_scalars", "anchor_changes",
           "training_table",
           "write_outputs", "policy_name", "run_metrics", "settings_dict", "version"]


def require_tensorboard() -> None:
    """Raise a one-line ValueError when ``--report-to tensorboard`` cannot work (call before any long work)."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ValueError("--report-to tensorboard needs the tensorboard package, which is not installed: "
                         "pip install tensorboard (or leave --report-to out)")


class ScalarBoard:
    """TensorBoard scalars of one run (rank 0 only), appended across resumes.

    ``purge_step`` hides events a crashed earlier attempt logged at or after the step this attempt resumes from.
    """

    def __init__(self, log_dir: Path, purge_step: Optional[int] = None) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step, flush_secs=10)

    def add(self, tag: str, value: float, step: int) -> None:
        self._writer.add_scalar(tag, float(value), int(step))

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


def _rounded(value: Optional[float], digits: int = 4) -> Optional[float]:
    return None if value is None else round(float(value), digits)


def anchor_changes(history: Sequence[dict]) -> list[list[int]]:
    """``[[window, anchor], ...]``: the anchor El Che chose from each window on (the first, then every change)."""
    out: list[list[int]] = []
    for h in history:
        if not out or out[-1][1] != int(h["anchor"]):
            out.append([int(h["window"]), int(h["anchor"])])
    return out


def el_che_info(graph: Any) -> Optional[dict]:
    """The El Che plan at the end of training, the anchor over time and the gradient-noise estimate (None on one
    device)."""
    el_che = graph.el_che() if hasattr(graph, "el_che") else None
    if el_che is None:
        return None
    return {"anchor": int(el_che.anchor), "shares": [round(float(s), 4) for s in el_che.shares],
            "batch_sizes": list(el_che.batch_sizes()), "windows": int(el_che.windows),
            "micro_batch_caps": el_che.max_batch_sizes,
            "anchor_rule": el_che.anchor_rule, "overhead_target": el_che.overhead_target,
            "anchor_changes": anchor_changes(el_che.history),
            "noise_scale": _rounded(el_che.noise_scale, 2), "efficiency": _rounded(el_che.efficiency),
            **lr_scaling_info(el_che), "description": el_che.describe(),
            "replayed": getattr(getattr(graph, "config", None), "replay_plan", None) is not None,
            "plan": graph.el_che_plan() if hasattr(graph, "el_che_plan") else None}


def lr_scaling_info(el_che: Any) -> dict:
    """``lr_scaling``, and with ``adascale`` the gain of every window's step (``lr_gains``, [window, gain] for the
    windows El Che's history holds), its mean and maximum, and ``schedule_progress`` (LR-schedule steps over
    micro-steps: below 1 when the gain advanced the schedule by less than the window)."""
    rule = getattr(el_che, "lr_scaling", "none")
    if rule == "none":
        return {"lr_scaling": rule}
    gains = [[int(h["window"]), round(float(h["lr_gain"]), 4)] for h in el_che.history if "lr_gain" in h]
    values = [g for _, g in gains] or [1.0]
    return {"lr_scaling": rule, "lr_gains": gains, "lr_gain_mean": round(sum(values) / len(values), 4),
            "lr_gain_max": round(max(values), 4), "schedule_progress": round(float(el_che.schedule_progress), 4)}


def el_che_scalars(graph: Any) -> dict[str, float]:
    """TensorBoard scalars of El Che after an optimizer step: anchor, noise scale, efficiency, each rank's share of
    the global batch (``el_che/share/rank<r>``) and the last window's synchronisation share of its time
    (``el_che/sync_share``: sync / (compute + sync)), those known."""
    el_che = graph.el_che() if hasattr(graph, "el_che") else None
    if el_che is None:
        return {}
    values = {"el_che/anchor": el_che.anchor, "el_che/noise_scale": el_che.noise_scale,
              "el_che/efficiency": el_che.efficiency}
    if getattr(el_che, "lr_scaling", "none") != "none":
        values["el_che/lr_gain"] = el_che.lr_gain
    values.update({f"el_che/share/rank{r}": share for r, share in enumerate(el_che.shares)})
    overhead = el_che.history[-1].get("overhead") if el_che.history else None
    if overhead is not None:
        values["el_che/sync_share"] = overhead / (1.0 + overhead)
    return {k: float(v) for k, v in values.items() if v is not None}


def step_scalars(graph: Any) -> dict[str, float]:
    """TensorBoard scalars after an optimizer step: the gradient norm before clipping (``train/grad_norm``, with
    clipping on) and El Che's (:func:`el_che_scalars`)."""
    norm = getattr(graph, "grad_norm", None)
    return {**({"train/grad_norm": norm} if norm is not None else {}), **el_che_scalars(graph)}


def policy_name(world_size: int) -> str:
    return "setup mode, El Che" if world_size > 1 else "single device"


def version() -> str:
    """flodl-hf's version (metrics.json ``flodl_hf_version``)."""
    from .. import __version__

    return __version__


def settings_dict(settings: Any) -> dict:
    """Every field of a ``TrainSettings``, JSON-ready (lists for the sequences)."""
    out = asdict(settings)
    out["labels"] = list(settings.labels) if settings.labels is not None else None
    out["devices"] = list(settings.devices) if settings.devices is not None else None
    out["speed_hint"] = list(settings.speed_hint) if settings.speed_hint is not None else None
    return out


def run_metrics(*, settings: Any, loop: Any, graph: Any, total_steps: int, eval_time: float,
                sources: Any) -> dict:
    """The metrics.json fields every task's job records about the run itself: losses, evaluations, steps,
    devices, El Che, times and the model and data sources (in file order)."""
    devices = ([str(d) for d in settings.devices] if settings.devices
               else [str(graph.device)] * int(graph.world_size))
    return {
        "train_loss": list(loop.losses),
        "eval_history": list(loop.evals),
        "stop_reason": loop.stop_reason,
        "best_eval": ({"metric": loop.best_metric, "value": loop.best_value, "step": loop.best_step}
                      if loop.best_value is not None else None),
        "resumed": list(loop.resumes),
        "steps": total_steps,
        "steps_run": len(loop.losses),
        "optimizer_steps": int(graph.training_step),
        "world_size": graph.world_size,
        "devices": devices,
        "policy": policy_name(graph.world_size),
        "el_che": el_che_info(graph),
        "train_time_s": round(loop.train_time_s, 2),
        "eval_time_s": round(eval_time, 2),
        "wall_time_s": None,
        "model_path": str(sources.model_path),
        "base_model": sources.base_model_id,
        "data_path": str(sources.data_path),
        "dataset_name": sources.dataset_name,
        "dataset_hub_id": sources.hub_id,
    }


def _tail_mean(values: Sequence[float], n: int = 10) -> float:
    tail = list(values)[-n:]
    return sum(tail) / len(tail) if tail else float("nan")


def _resume_cell(record: dict) -> str:
    """One resume in the card: ``4 (checkpoint, 2 -> 1 devices)``; records of older runs have no device counts."""
    before, after = record.get("world_size_before"), record.get("world_size_after")
    devices = f", {before} -> {after} device(s)" if before is not None and after is not None else ""
    return f"{record['step']} (checkpoint{devices})"


def _optimizer_cell(settings: dict) -> str:
    """``AdamW, lr 5e-05, weight decay 0.01 (not on biases and norm weights)``."""
    cell = f"AdamW, lr {settings['lr']:g}"
    if "weight_decay" not in settings:  # metrics of a run before --weight-decay: torch's 0.01 on every parameter
        return cell
    decay = float(settings["weight_decay"] or 0.0)
    return cell + (f", weight decay {decay:g} (not on biases and norm weights)" if decay else ", no weight decay")


def _schedule_cell(settings: dict) -> str:
    """``linear, warmup 30 steps`` / ``cosine, warmup ratio 0.1`` / ``linear, no warmup``."""
    name, ratio, steps = settings.get("lr_scheduler_type"), settings.get("warmup_ratio"), settings.get("warmup_steps")
    if name is None:  # metrics of a run before --lr-scheduler-type
        return "constant" if ratio is None else f"linear, warmup ratio {ratio:g}"
    warmup = (f"warmup {steps} steps" if steps else f"warmup ratio {ratio:g}" if ratio else "no warmup")
    kwargs = settings.get("lr_scheduler_kwargs")
    keywords = " (" + ", ".join(f"{k} {v}" for k, v in kwargs.items()) + ")" if kwargs else ""
    return f"{name}{keywords}" + ("" if name == "constant" else f", {warmup}")


def training_table(metrics: dict) -> dict:
    """The model card's training setup, in display order (everything read from ``metrics``)."""
    settings = metrics["settings"]
    world = int(metrics["world_size"])
    table: dict[str, Any] = {
        "devices": ", ".join(metrics["devices"]),
        "world size": f"{world} rank(s)",
        "policy": metrics.get("policy") or policy_name(world),
    }
    el_che = metrics.get("el_che")
    if el_che:
        table["El Che anchor"] = el_che["anchor"]
        table["El Che shares"] = "[" + ", ".join(f"{s:.2f}" for s in el_che["shares"]) + "]"
        table["El Che batch sizes"] = str(el_che["batch_sizes"])
        if el_che.get("anchor_rule"):
            tau = el_che.get("overhead_target")
            table["El Che anchor rule"] = el_che["anchor_rule"] + (f", overhead ceiling {tau:g}" if tau else "")
        changes = el_che.get("anchor_changes") or []
        if changes:
            table["El Che anchor over time"] = ", ".join(f"{a} from window {w}" for w, a in changes)
        if el_che.get("noise_scale") is not None:
            table["gradient noise scale"] = f"{el_che['noise_scale']:.1f} samples"
        if el_che.get("efficiency") is not None:
            table["estimated statistical efficiency"] = f"{el_che['efficiency']:.3f}"
        if el_che.get("lr_scaling") == "adascale":
            table["LR scaling"] = (f"AdaScale gain, mean {el_che['lr_gain_mean']:.3f}, "
                                   f"max {el_che['lr_gain_max']:.3f}; "
                                   f"schedule progress {el_che['schedule_progress']:.3f}")
    if settings.get("speed_hint"):
        rank, ratio = settings["speed_hint"]
        table["speed hint"] = f"rank {rank} is {ratio:g}x slower"
    table.update({
        "precision": settings["precision"],
        "epochs": settings["epochs"],
        "batch size (per rank)": settings["batch_size"],
        "optimizer": _optimizer_cell(settings),
        "LR schedule": _schedule_cell(settings),
        "gradient clipping": (f"max norm {settings['max_grad_norm']:g}" if settings.get("max_grad_norm")
                              else "none"),
        "max length (tokens)": settings["max_length"],
        "training rows": metrics["train_size"],
        "steps": (f"{metrics['steps_run']} of {metrics['steps']}"
                  if metrics.get("steps_run", metrics["steps"]) != metrics["steps"] else metrics["steps"]),
        "seed": settings["seed"],
    })
    if settings.get("eval_every"):
        table["evaluation"] = f"every {settings['eval_every']} optimizer steps ({len(metrics['eval_history'])} runs)"
    if settings.get("early_stopping_patience"):
        table["early stopping"] = f"patience {settings['early_stopping_patience']} evaluations"
    if metrics.get("problem_type", "single_label") != "single_label":
        table["problem type"] = metrics["problem_type"]
    if metrics.get("text_pair_column"):
        table["sentence pairs"] = f"{settings.get('text_column') or 'text'} + {metrics['text_pair_column']}"
    written = metrics.get("written_weights") or {}
    if written.get("reason", "final weights") != "final weights":
        table["weights written"] = f"step {written['step']}: {written['reason']}"
    if metrics.get("stop_reason") and metrics["stop_reason"] != "completed":
        table["stopped"] = metrics["stop_reason"]
    resumed = metrics.get("resumed") or []
    table["resumed"] = "no" if not resumed else "yes, from step " + ", ".join(_resume_cell(r) for r in resumed)
    table["training time"] = f"{metrics['train_time_s']:.1f} s"
    table["final loss (mean of last 10 steps)"] = f"{_tail_mean(metrics['train_loss']):.4f}"
    return table


def write_outputs(head: Any, task: Any, settings: Any, sources: Any, metrics: dict, started: float,
                  runs_dir: Optional[Path] = None) -> None:
    """Write the output directory in one atomic swap: model files, the task's model card, metrics.json, the loss
    curve and runs/ (only a directory flodl-hf created is ever replaced, with ``--overwrite``)."""
    from ..files.ownership import staged_output_dir
    from ..metrics.curves import plot_loss_curve

    with staged_output_dir(settings.output_dir, overwrite=settings.overwrite) as staging:
        head.save_pretrained(str(staging))
        plot_loss_curve(metrics["train_loss"], staging / "loss_curve.png",
                        title=f"Training loss ({metrics['train_size']} rows, {settings.epochs} epoch(s))")
        if runs_dir is not None and runs_dir.is_dir():
            shutil.copytree(runs_dir, staging / "runs")
        task.write_card(staging, head, settings, sources, metrics)
        metrics["wall_time_s"] = round(time.perf_counter() - started, 2)
        (staging / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
