"""The job's optimizer groups, LR schedule and clipping against transformers' ``Trainer`` making the same choices.

The reference is transformers itself, never a copy of its rules: ``Trainer.get_decay_parameter_names`` and
``Trainer.create_optimizer`` for the weight-decay groups, ``transformers.get_scheduler`` (a ``LambdaLR``) and
``TrainingArguments.get_warmup_steps`` for the schedule, ``TrainingArguments``' own defaults, and a plain loop with
Trainer's optimizer and scheduler and ``torch.nn.utils.clip_grad_norm_`` for whole training runs, on one process
and on two real gloo ranks. Cases are seeded random draws (scheduler types, warmup, weight decay, clipping norms).
The N -> M behaviour of every schedule (:class:`~flodl_hf.job.schedule.TrainerSchedule.continue_over`) is checked
against the schedule's own function read at the run's sample position.
"""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch
import transformers

from dist_helpers import run_ranks, values
from flodl_hf import Graph
from flodl_hf import Trainer as SetupTrainer
from flodl_hf.job.optim import adamw, no_decay_names
from flodl_hf.job.schedule import NEEDS_KWARGS, SCHEDULES, TrainerSchedule, warmup_steps_for
from flodl_hf.job.settings import TrainSettings
from tiny_models import FAMILIES, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

_KWARGS = {name: __import__("json").loads(example) for name, example in NEEDS_KWARGS.items()}
_COMPONENTS = ("norm", "final_norm", "normal", "enorm", "x_norm_y", "bias", "biases", "LayerNorm", "ln", "RMSNorm",
               "dense", "Norm", "layer_norm", "head")


def _hf_args(tmp_path, **kwargs) -> transformers.TrainingArguments:
    return transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **kwargs)


def _hf_decay(model: torch.nn.Module) -> set[str]:
    return set(transformers.Trainer.get_decay_parameter_names(None, model))


def _random_module(rng: random.Random, depth: int = 0) -> torch.nn.Module:
    """A module tree with names drawn from norm-like and plain components, some children LayerNorms."""
    module = torch.nn.Module()
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(_COMPONENTS)
        if hasattr(module, name):
            continue
        kind = rng.random()
        if depth < 2 and kind < 0.4:
            child = _random_module(rng, depth + 1)
        elif kind < 0.6:
            child = torch.nn.LayerNorm(3)
        else:
            child = torch.nn.Linear(2, 2, bias=rng.random() < 0.5)
        module.add_module(name, child)
    name = rng.choice(_COMPONENTS)
    if rng.random() < 0.5 and not hasattr(module, name):
        module.register_parameter(name, torch.nn.Parameter(torch.zeros(2)))
    return module


# --- weight decay: the parameters exempt, and the optimizer's groups ------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_no_decay_names_are_trainers_on_every_family(family):
    model = tiny_model(family)
    names = {name for name, _ in model.named_parameters()}
    assert names - no_decay_names(model) == _hf_decay(model) & names
    assert any("bias" in n for n in no_decay_names(model)) and any("eight" in n for n in no_decay_names(model))


def test_no_decay_names_are_trainers_on_random_module_trees():
    rng = random.Random(28)
    for case in range(200):
        model = _random_module(rng)
        names = {name for name, _ in model.named_parameters()}
        assert names - no_decay_names(model) == _hf_decay(model) & names, (case, sorted(names))


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_optimizer_groups_are_trainers(tmp_path, weight_decay):
    model = tiny_model("bert")
    hf = transformers.Trainer(model=model, args=_hf_args(tmp_path, weight_decay=weight_decay))
    reference = hf.create_optimizer()
    ours = adamw(model.parameters(), 5e-5, weight_decay, module=model)
    assert [({id(p) for p in g["params"]}, g["weight_decay"]) for g in ours.param_groups] == \
        [({id(p) for p in g["params"]}, g["weight_decay"]) for g in reference.param_groups]
    assert type(ours) is type(reference) and ours.defaults["fused"] and reference.defaults.get("fused")
    for key in ("lr", "betas", "eps"):
        assert ours.defaults[key] == reference.defaults[key]
    with pytest.raises(ValueError, match="the parameters are not the module's"):
        adamw(tiny_model("bert").parameters(), 5e-5, weight_decay, module=model)


def test_settings_defaults_are_training_arguments_defaults(tmp_path):
    args, ours = _hf_args(tmp_path), TrainSettings(data="x.csv")
    assert ours.lr == args.learning_rate and ours.weight_decay == args.weight_decay
    assert ours.max_grad_norm == args.max_grad_norm and ours.lr_scheduler_type == args.lr_scheduler_type
    assert warmup_steps_for(100, ours.warmup_steps, ours.warmup_ratio) == args.get_warmup_steps(100) == 0
    assert ours.ddp_config().max_grad_norm == 1.0
    assert TrainSettings(max_grad_norm=0).ddp_config().max_grad_norm is None
    assert TrainSettings().train_rows_cap == 4000 and TrainSettings(data="x.csv").train_rows_cap is None
    assert TrainSettings().lr == 2e-4 and TrainSettings(lr=5e-5).lr == 5e-5  # the packaged job's own peak
    assert TrainSettings(task="token-classification").lr == 5e-5


# --- the schedule -----------------------------------------------------------------------------------------------

def _draw(rng: random.Random) -> dict:
    name = rng.choice(SCHEDULES)
    total = rng.randint(4, 60)
    warmup = 0 if name == "constant" else rng.choice([0, 1, rng.randint(0, total)])
    kwargs = dict(_KWARGS.get(name, {}))
    if name == "cosine_with_restarts":
        kwargs = {"num_cycles": rng.randint(1, 3)}
    if name == "warmup_stable_decay":
        kwargs = {"num_decay_steps": rng.randint(1, total)}
    return {"name": name, "total": total, "warmup": warmup, "kwargs": kwargs}


def _two_groups(lr: float = 1e-3) -> torch.optim.Optimizer:
    return torch.optim.AdamW([{"params": [torch.nn.Parameter(torch.zeros(2))], "weight_decay": 0.1},
                              {"params": [torch.nn.Parameter(torch.zeros(1))], "weight_decay": 0.0}], lr=lr)


def test_every_schedule_steps_as_get_scheduler():
    rng = random.Random(7)
    seen = set()
    for _ in range(120):
        case = _draw(rng)
        seen.add(case["name"])
        ours_opt, ref_opt = _two_groups(), _two_groups()
        ours = TrainerSchedule(ours_opt, case["name"], case["total"], case["warmup"], case["kwargs"])
        ref = transformers.get_scheduler(case["name"], ref_opt, num_warmup_steps=case["warmup"],
                                         num_training_steps=case["total"],
                                         scheduler_specific_kwargs=case["kwargs"] or None)
        for step in range(case["total"] + 2):
            assert [g["lr"] for g in ours_opt.param_groups] == [g["lr"] for g in ref_opt.param_groups], (case, step)
            ref_opt.step()  # no gradients: nothing moves; torch wants it before the scheduler's step
            ours.step()
            ref.step()
    assert seen == set(SCHEDULES)


def test_warmup_ratio_gives_trainers_warmup_steps(tmp_path):
    rng = random.Random(3)
    for _ in range(50):
        total, ratio = rng.randint(1, 5000), rng.choice([0.0, 0.05, 0.1, 0.3, rng.random() * 0.99])
        assert warmup_steps_for(total, None, ratio) == _hf_args(tmp_path, warmup_steps=ratio).get_warmup_steps(total)
    assert warmup_steps_for(100, 7, None) == 7


@pytest.mark.parametrize("name", SCHEDULES)
def test_a_resume_on_another_device_count_keeps_the_sample_position(name):
    """First run: T micro-steps, stopped after k. Resumed where R micro-steps remain (another global batch): the LR
    at the resume point is unchanged, step j of the rest has the schedule's LR at k + j (T - k) / R of the first
    run's clock (the sample position), and the clock ends at T on the last one; a same-size resume changes nothing."""
    rng = random.Random(SCHEDULES.index(name))
    for _ in range(6):
        case = _draw(random.Random(rng.random()))
        case["name"] = name
        case["kwargs"] = _KWARGS.get(name, {"num_cycles": 2} if name == "cosine_with_restarts" else {})
        case["warmup"] = 0 if name == "constant" else case["warmup"]
        total, warmup = case["total"], case["warmup"]
        k = rng.randint(0, total - 1)
        remaining = rng.choice([1, 2 * (total - k), max(1, (total - k) // 3), rng.randint(1, 3 * total)])
        first = TrainerSchedule(_two_groups(), name, total, warmup, case["kwargs"])
        for _ in range(k):
            first.step()
        lr_at_stop = first.get_last_lr()
        # the job builds the schedule for the new run's length, then loads the checkpoint's state into it
        again = TrainerSchedule(_two_groups(), name, k + remaining, 0, case["kwargs"])
        again.load_state_dict(first.state_dict())
        again.continue_over(remaining)
        assert again.get_last_lr() == lr_at_stop
        factor = transformers.get_scheduler(name, _two_groups(), num_warmup_steps=warmup, num_training_steps=total,
                                            scheduler_specific_kwargs=case["kwargs"] or None).lr_lambdas[0]
        for j in range(1, remaining + 1):
            again.step()
            x = k + j * (total - k) / remaining
            assert again.get_last_lr()[0] == pytest.approx(1e-3 * factor(x), rel=1e-9, abs=1e-15), (case, k, j)
        assert again.clock == total
        same = TrainerSchedule(_two_groups(), name, total, warmup, case["kwargs"])
        same.load_state_dict(first.state_dict())
        same.continue_over(total - k)
        assert same.state_dict() == first.state_dict()


# --- whole runs: the engine with the job's pieces against a loop with Trainer's optimizer and scheduler ---------

def _batches(seed: int, n: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(5, 60, (size, 6), generator=g), torch.randint(0, 2, (size,), generator=g))
            for _ in range(n)]


def _reference_run(case: dict, batches: list, tmp_path) -> list[torch.Tensor]:
    """A plain loop with transformers' Trainer's own optimizer and scheduler, clipping as Trainer does."""
    model = tiny_model("bert", seed=case["seed"])  # eval mode: no dropout, so both runs see the same function
    warmup = case["warmup_steps"] if case["warmup_steps"] is not None else (case["warmup_ratio"] or 0.0)
    args = _hf_args(tmp_path, learning_rate=case["lr"], weight_decay=case["weight_decay"],
                    max_grad_norm=case["max_grad_norm"], lr_scheduler_type=case["schedule"], warmup_steps=warmup,
                    lr_scheduler_kwargs=case["kwargs"] or {})
    hf = transformers.Trainer(model=model, args=args)
    hf.create_optimizer_and_scheduler(num_training_steps=len(batches))
    for ids, labels in batches:
        model(input_ids=ids, labels=labels).loss.backward()
        if args.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        hf.optimizer.step()
        hf.lr_scheduler.step()
        hf.optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _job_run(rank: int, world: int, case: dict, batches: list) -> list[torch.Tensor]:
    """The job's pieces on the engine: its settings, optimizer groups, schedule and DdpConfig clipping; on N ranks
    each rank takes its slice of every batch (fixed anchor 1: one optimizer step per global batch)."""
    settings = TrainSettings(data="x.csv", lr=case["lr"], weight_decay=case["weight_decay"],
                             max_grad_norm=case["max_grad_norm"], lr_scheduler_type=case["schedule"],
                             lr_scheduler_kwargs=case["kwargs"], warmup_steps=case["warmup_steps"],
                             warmup_ratio=case["warmup_ratio"], devices=["cpu"] * world,
                             fixed_anchor=1 if world > 1 else None)
    model = tiny_model("bert", seed=case["seed"])
    graph = Graph(model)
    built = []

    def factory(device):
        built.append(copy.deepcopy(model))
        return built[-1]

    config = settings.ddp_config()
    config.verbose, config.timeout_s = False, 60
    SetupTrainer.setup_with(graph, factory, lambda p: adamw(p, settings.lr, settings.weight_decay, module=built[-1]),
                            config)
    total = len(batches)
    graph.set_scheduler(TrainerSchedule(graph.optimizer, settings.lr_scheduler_type, total,
                                        warmup_steps_for(total, settings.warmup_steps, settings.warmup_ratio),
                                        settings.lr_scheduler_kwargs))
    for ids, labels in batches:
        share = len(labels) // world
        part = slice(rank * share, (rank + 1) * share)
        loss = graph.module(input_ids=ids[part], labels=labels[part]).loss
        graph.loss_items(share, loss=loss)
        loss.backward()
        graph.step()
    graph.close()
    return [p.detach().clone() for p in graph.module.parameters()]


def _run_case(rng: random.Random) -> dict:
    schedule = rng.choice(["linear", "cosine", "cosine_with_restarts", "polynomial", "constant_with_warmup",
                           "inverse_sqrt", "cosine_with_min_lr"])
    ratio = rng.random() < 0.5
    return {"seed": rng.randint(0, 99), "lr": rng.choice([1e-3, 3e-3]), "schedule": schedule,
            "kwargs": _KWARGS.get(schedule), "weight_decay": rng.choice([0.0, 0.05]),
            "max_grad_norm": rng.choice([0.0, 0.05, 1.0]),
            "warmup_steps": None if ratio else rng.randint(0, 4),
            "warmup_ratio": rng.choice([0.1, 0.5]) if ratio else None}


def _assert_same(ours: list, reference: list, case: dict) -> None:
    moved = 0
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{case}: {m}")
        moved += 1
    assert moved == len(reference)


@pytest.mark.parametrize("draw", range(6))
def test_one_device_trains_as_trainers_optimizer_scheduler_and_clipping(tmp_path, draw):
    case = _run_case(random.Random(100 + draw))
    batches = _batches(draw, 8, 4)
    _assert_same(_job_run(0, 1, case, batches), _reference_run(case, batches, tmp_path), case)


def test_two_gloo_ranks_train_as_trainers_loop_on_the_global_batch(tmp_path):
    case = dict(_run_case(random.Random(5)), max_grad_norm=0.05, weight_decay=0.05, schedule="cosine", kwargs=None)
    batches = _batches(9, 6, 4)
    ours = values(run_ranks(_job_run, 2, case, batches, timeout=240))
    reference = _reference_run(case, batches, tmp_path)
    for rank in ours:
        _assert_same(rank, reference, case)
    assert not math.isnan(float(ours[0][0].sum()))
