"""El Che's own settings for `ElCheTrainer`, and the Trainer settings it refuses, each in one line.

Why it exists: the integration promises that a Trainer script changes in its class name only, so everything a
Trainer user relies on either works or is refused at construction, before any step, naming the argument and a fix
that exists. The refusals live here, apart from the trainer, so they read as one list.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from ..elche.plan_record import PlanReplay, check_plan
from ..elche.settings_check import check_batch_sizes, check_speed_hint
from ..files.reader import RefusedFile, UnreadableJson, read_json
from .plan import equal_sizes

__all__ = ["MIN_TRANSFORMERS", "ElCheArguments", "check_trainer"]

#: The oldest transformers the integration was tested with (the exactness cases pass unchanged on 5.0.0 and 5.24;
#: 4.57 passes too but lacks `train_sampling_strategy`; before 4.55 Trainer divides a short last accumulation window
#: by `gradient_accumulation_steps`, not its length, which no split can match step for step).
MIN_TRANSFORMERS = "5.0.0"


@dataclass
class ElCheArguments:
    """Optional El Che settings for :class:`ElCheTrainer` (``elche=ElCheArguments(...)``); the defaults need none.

    ``speed_hint=(slow_rank, ratio)``: the other ranks are ``ratio`` times faster than ``slow_rank``; seeds the split
    until the first measurement replaces it. ``batch_sizes=[b_0, ..., b_{W-1}]``: pin each global micro-batch's split
    (El Che stops adapting; the run repeats exactly whatever the machine's load). The effective batch is never
    changed: it stays ``per_device_train_batch_size x world size x gradient_accumulation_steps``.

    ``loss_items=fn``: what the loss of a collated batch is a mean over, ``fn(batch) -> float``, when it is not the
    batch's samples or labelled items, e.g. the sum of the class weights of its labelled rows for a class-weighted
    cross-entropy (whose mean divides by that sum). Each rank's part of a micro-batch is then weighted by its share
    of the micro-batch's total, so the update is exactly one process's on the whole micro-batch, as setup mode's
    ``graph.loss_items`` does.

    ``replay_plan=path``: the ``elche_plan.json`` an earlier multi-rank run wrote in its ``output_dir`` (or its
    parsed content), played back instead of El Che's measured split, so that the same script on the same number of
    ranks repeats that run bit for bit (dropout included) whatever the machine's load.
    """

    speed_hint: tuple[int, float] | None = None
    batch_sizes: list[int] | None = None
    loss_items: Callable[[Any], float] | None = None
    replay_plan: str | os.PathLike | dict | None = None

    def __post_init__(self) -> None:
        hint, sizes = self.speed_hint, self.batch_sizes
        if hint is not None:
            self.speed_hint = check_speed_hint(hint, "ElCheArguments.speed_hint")
        if sizes is not None:
            self.batch_sizes = check_batch_sizes(sizes, "ElCheArguments.batch_sizes")
        if self.loss_items is not None and not callable(self.loss_items):
            raise ValueError(f"ElCheArguments(loss_items={self.loss_items!r}) is invalid: give a function of a "
                             "collated batch returning what its loss is a mean over, e.g. loss_items=lambda batch: "
                             "float(class_weights[batch['labels']].sum())")
        if sizes is not None and hint is not None:
            raise ValueError("ElCheArguments: speed_hint and batch_sizes both set: a pinned split needs no hint, "
                             "keep one of them")
        plan = self.replay_plan
        if plan is not None and not isinstance(plan, (str, os.PathLike, dict)):
            raise ValueError(f"ElCheArguments(replay_plan={plan!r}) is invalid: give the path of an elche_plan.json "
                             "an earlier run wrote in its output_dir")
        if plan is not None and (sizes is not None or hint is not None):
            raise ValueError("ElCheArguments: replay_plan and " + ("batch_sizes" if sizes is not None else "speed_hint")
                             + " both set: a replayed plan decides every split, keep one of them")


def _refuse(argument: str, value: Any, why: str, fix: str) -> None:
    raise ValueError(f"ElCheTrainer: {argument}={value!r} {why}: {fix}")


_PLAN_FIX = "pass the elche_plan.json an earlier ElCheTrainer run wrote in its output_dir"
_PLAN_LIMIT = 64 * 1024 * 1024  # bytes: a recorded plan is a few kB; more is not one


def load_replay(plan: Any, world: int, per_device: int, ga: int) -> PlanReplay:
    """``ElCheArguments.replay_plan`` read and checked against this run, refused in one line when it does not fit."""
    name = "ElCheArguments.replay_plan"
    if not isinstance(plan, dict):
        path = os.fspath(plan)
        try:
            plan = read_json(path, name, limit=_PLAN_LIMIT)
        except RefusedFile:
            raise  # one line naming the option, the path and a fix already
        except UnreadableJson as exc:
            raise ValueError(f"{exc}: {_PLAN_FIX}") from None
        except OSError as exc:
            raise ValueError(f"{name}={path!r} cannot be read as a recorded plan ({type(exc).__name__}: "
                             f"{str(exc)[:200]}): {_PLAN_FIX}") from None
    check_plan(plan, name=name, fix=_PLAN_FIX)
    if plan["world"] != world or plan["batch_size"] != per_device:
        _refuse(name, f"<plan of {plan['world']} ranks x {plan['batch_size']}>", f"was recorded on {plan['world']} "
                f"ranks with per_device_train_batch_size={plan['batch_size']}, but this run has {world} x {per_device}",
                "replay it with the same number of ranks and per_device_train_batch_size, or drop replay_plan")
    anchors = {a for _, a in plan["anchors"]}
    if anchors != {ga}:
        _refuse(name, f"<plan of {plan['world']} ranks x {plan['batch_size']}>", f"was recorded with "
                f"gradient_accumulation_steps={min(anchors)}, this run has {ga}",
                f"pass gradient_accumulation_steps={min(anchors)}, or drop replay_plan")
    return PlanReplay(plan, world, per_device)


def check_trainer(trainer: Any) -> PlanReplay | None:
    """Refuse, before any step, what the integration cannot do as one process would; returns the plan to replay
    (``ElCheArguments.replay_plan`` on several ranks), read and checked."""
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) < Version(MIN_TRANSFORMERS):
        _refuse("transformers", transformers.__version__, "is older than the integration supports",
                f"install transformers>={MIN_TRANSFORMERS}")
    args = trainer.args
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if launched > 1 and args.world_size == 1:
        if not args.use_cpu and args.device.type == "cpu":
            _refuse("use_cpu", args.use_cpu, f"on a machine without CUDA leaves each of the {launched} launched ranks "
                    "training alone on the whole data set (transformers sees no distributed run)",
                    "pass use_cpu=True to TrainingArguments")
        _refuse("world_size", args.world_size, f"but the launcher started {launched} ranks (WORLD_SIZE): each would "
                "train alone", "launch with torchrun or accelerate launch so that TrainingArguments sees them")
    sizes = trainer.elche_args.batch_sizes
    world = args.world_size
    if world == 1:
        return None  # one process: nothing is split, so it is transformers.Trainer (the same script runs)
    if getattr(trainer, "is_deepspeed_enabled", False) or args.deepspeed:
        _refuse("deepspeed", args.deepspeed, "is not supported by El Che (DeepSpeed owns the reduction)",
                "remove deepspeed, or use transformers.Trainer for DeepSpeed runs")
    if getattr(trainer, "is_fsdp_enabled", False) or args.fsdp:
        _refuse("fsdp", args.fsdp, "is not supported by El Che (FSDP shards the gradients El Che reduces)",
                "remove fsdp, or use transformers.Trainer for FSDP runs")
    pc = getattr(trainer.accelerator, "parallelism_config", None)
    if pc is not None and any(getattr(pc, f"{k}_enabled", False) for k in ("tp", "cp", "sp")):
        _refuse("parallelism_config", pc, "shards the model or the sequence", "remove parallelism_config")
    if args.n_gpu > 1:
        _refuse("n_gpu", args.n_gpu, "means one process drives several GPUs (DataParallel)",
                "launch one process per GPU with `torchrun --nproc-per-node N script.py`")
    strategy = getattr(args, "train_sampling_strategy", None)
    if strategy == "batch_rebalance":
        _refuse("train_sampling_strategy", strategy,
                "would give ranks unequal batches a second time (El Che already splits each batch by measured "
                "speed)", "use 'random', 'sequential' or 'group_by_length'")
    if args.auto_find_batch_size:
        _refuse("auto_find_batch_size", True, "would change one rank's batch after an out-of-memory error",
                "set per_device_train_batch_size yourself and drop auto_find_batch_size")
    if str(args.optim).lower().endswith("lomo"):
        _refuse("optim", str(args.optim), "updates parameters inside backward, before El Che reduces gradients",
                "use another optimizer, e.g. optim='adamw_torch'")
    if getattr(args, "neftune_noise_alpha", None) is not None:
        _refuse("neftune_noise_alpha", args.neftune_noise_alpha, f"on {world} ranks: NEFTune scales its noise by each "
                "batch's padded shape, and each rank draws it for its own share, so the update would not be one "
                "process's", "train with NEFTune on one process, or with transformers.Trainer on N ranks")
    unit = args.train_batch_size * world
    if sizes is not None and len(sizes) != world:
        _refuse("ElCheArguments.batch_sizes", sizes, f"has {len(sizes)} entries for {world} ranks",
                f"give one size per rank summing to {unit}, e.g. batch_sizes={equal_sizes(world, unit)!r}")
    if sizes is not None and sum(sizes) != unit:
        _refuse("ElCheArguments.batch_sizes", sizes, f"sums to {sum(sizes)}",
                f"give {world} sizes >= 1 summing to per_device_train_batch_size x world size = {unit}, "
                f"e.g. batch_sizes={equal_sizes(world, unit)!r}")
    hint = trainer.elche_args.speed_hint
    if hint is not None and not 0 <= hint[0] < world:
        _refuse("ElCheArguments.speed_hint", hint, f"names rank {hint[0]}, outside 0..{world - 1}",
                "name the slow rank by its RANK")
    plan = trainer.elche_args.replay_plan
    return None if plan is None else load_replay(plan, world, args.train_batch_size, args.gradient_accumulation_steps)
