"""An N -> M resume against a one-process reference written out by hand: every step's learning rate, the AdamW
state and the order of the samples (2 -> 1, 1 -> 2, 3 -> 2 real gloo ranks on CPU).

The engine side is what a setup-mode user runs: ``Graph`` + ``Trainer.setup_with`` + ``graph.epoch``, a schedule
set with ``graph.set_scheduler`` (the job's ``TrainerSchedule``, transformers' ``get_scheduler`` on the run's
clock, or the earlier ``LinearSchedule``), a checkpoint mid-epoch, and a resume on another number of ranks
(``load_checkpoint``, then ``continue_over(graph.steps_remaining(...))``, as the job does).

The reference shares nothing with the engine's plan objects: one process, one ``torch.optim.AdamW``, each epoch's
permutation drawn with ``torch.randperm`` from a generator seeded with ``SEED + epoch``, the windows cut from it
by position (``G = ranks x batch``: whole windows while the first run lasts, then windows of the new ``G`` from the
sample where it stopped, the epoch's last partial window kept, whole windows after), the mean loss over each
window's samples, and the learning rate of each step from the schedule's rule stated below (for
``TrainerSchedule``: transformers' own LR function read at the run's sample position). With a fixed anchor of
1 every micro-step is one window (one optimizer step) on every rank.
"""

from __future__ import annotations

import pytest
import torch

from dist_helpers import run_ranks, values
from flodl_hf import DdpConfig, Graph, Trainer
from flodl_hf.job.schedule import LinearSchedule, TrainerSchedule, warmup_steps_for
from test_elastic_resume import BATCH, EPOCHS, N, SEED, _build, _collate, _data  # that run, with an LR schedule

LR, WARMUP = 0.05, 0.5


def _adam_state(optimizer: torch.optim.Optimizer) -> list:
    return [{k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in optimizer.state[p].items()}
            for group in optimizer.param_groups for p in group["params"]]


def _schedule(name: str, optimizer: torch.optim.Optimizer, total: int):
    """``linear-v1``: the job's earlier LinearSchedule; any other name: TrainerSchedule (warmup ratio WARMUP)."""
    if name == "linear-v1":
        return LinearSchedule(optimizer, total, WARMUP)
    return TrainerSchedule(optimizer, name, total, warmup_steps_for(total, None, WARMUP))


def _engine(rank: int, world: int, ckpt: str, stop_after: int | None, resume: bool,
            schedule_name: str = "linear-v1") -> dict:
    """One rank of the run: record each window's learning rate and real sample ids; checkpoint after
    ``stop_after`` windows, or resume from ``ckpt`` and finish the run."""
    graph = Graph(_build())
    Trainer.setup_with(graph, _build, lambda p: torch.optim.AdamW(p, lr=LR),
                       DdpConfig(verbose=False, seed=SEED, fixed_anchor=1, timeout_s=60))
    graph.set_data_loader(_data(), batch_size=BATCH, collate_fn=_collate)
    schedule = _schedule(schedule_name, graph.optimizer, graph.total_steps(EPOCHS))
    graph.set_scheduler(schedule)
    loaded = None
    if resume:
        graph.load_checkpoint(ckpt)
        loaded = _adam_state(graph.optimizer)
        schedule.continue_over(graph.steps_remaining(EPOCHS))
    windows: list[tuple[int, float, list[int]]] = []
    for epoch in range(EPOCHS):
        for idx, xb, yb in graph.epoch(epoch):
            real = graph._pending[-1][2]  # padding (zero weight) is appended after the real samples
            lr = graph.optimizer.param_groups[0]["lr"]
            torch.nn.functional.cross_entropy(graph.module(xb), yb).backward()
            graph.step()
            windows.append((epoch, lr, idx[:real].tolist()))
            if stop_after is not None and len(windows) == stop_after:
                graph.save_checkpoint(ckpt)
                graph.close()
                return {"windows": windows, "saved": _adam_state(graph.optimizer)}
    graph.close()
    return {"windows": windows, "loaded": loaded, "state": _adam_state(graph.optimizer),
            "params": [p.detach().clone() for p in graph.module.parameters()]}


def _on(world: int, *args) -> list[dict]:
    return [_engine(0, 1, *args)] if world == 1 else values(run_ranks(_engine, world, *args, timeout=180))


def _factor(x: float, warmup: float, total: float) -> float:
    """The schedule's rule: (x + 1) / (warmup + 1) during warmup, then a linear decay reaching 0 at ``total``."""
    return (x + 1) / (warmup + 1) if x < warmup else max(0.0, (total - x) / max(1.0, total - warmup))


def _reference_plan(before: int, after: int, stop_after: int, schedule: str = "linear-v1") -> tuple[list, list]:
    """(windows as (epoch, sample ids), each window's learning rate) of the interrupted-then-resumed run."""
    perms = [torch.randperm(N, generator=torch.Generator().manual_seed(SEED + e)).tolist() for e in range(EPOCHS)]
    g1, g2 = before * BATCH, after * BATCH
    first = [(e, perms[e][k * g1:(k + 1) * g1]) for e in range(EPOCHS) for k in range(N // g1)][:stop_after]
    epoch, done = first[-1][0], sum(len(ids) for e, ids in first if e == first[-1][0])
    end = N // g1 * g1  # the interrupted epoch was planned with the first run's global batch (drop_last)
    rest = [(epoch, perms[epoch][s:min(s + g2, end)]) for s in range(done, end, g2)]
    if done == end:
        rest = []
    rest += [(e, perms[e][k * g2:(k + 1) * g2]) for e in range(epoch + 1, EPOCHS) for k in range(N // g2)]
    total = N // g1 * EPOCHS
    if schedule != "linear-v1":
        # transformers' schedule for the first run (T micro-steps, ceil(T x WARMUP) of warmup), read at the
        # sample position: step j of the rest is at stop_after + j (T - stop_after) / len(rest) of its clock
        from transformers import get_scheduler

        probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=LR)
        factor = get_scheduler(schedule, probe, num_warmup_steps=warmup_steps_for(total, None, WARMUP),
                               num_training_steps=total).lr_lambdas[0]
        lrs = [LR * factor(k) for k in range(stop_after)]
        lrs += [LR * factor(stop_after + j * (total - stop_after) / len(rest)) for j in range(len(rest))]
        return first + rest, lrs
    # the first run's schedule: T micro-steps, int(T x WARMUP) of warmup
    warmup = int(total * WARMUP)
    lrs = [LR * _factor(k, warmup, total) for k in range(stop_after)]
    # the resume rescales the clock by remaining / left: the decay factor at the resume point is unchanged and the
    # last remaining step is the schedule's last
    scale = len(rest) / (total - stop_after)
    lrs += [LR * _factor(stop_after * scale + j, warmup * scale, stop_after * scale + len(rest))
            for j in range(len(rest))]
    return first + rest, lrs


def _reference(before: int, after: int, stop_after: int, schedule: str = "linear-v1") -> dict:
    plan, lrs = _reference_plan(before, after, stop_after, schedule)
    data = _data()
    model = _build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    saved = None
    for k, ((_, ids), lr) in enumerate(zip(plan, lrs)):
        if k == stop_after:
            saved = _adam_state(optimizer)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x = torch.stack([data[i][1] for i in ids])
        y = torch.stack([data[i][2] for i in ids])
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {"plan": plan, "lrs": lrs, "saved": saved, "state": _adam_state(optimizer),
            "params": [p.detach().clone() for p in model.parameters()]}


def _close(a: list, b: list, what: str) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        for key in x:
            got, want = torch.as_tensor(x[key]).double(), torch.as_tensor(y[key]).double()
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (what, i, key, float((got - want).abs().max()))


@pytest.mark.parametrize("before,after,stop_after,schedule", [
    (2, 1, 11, "linear-v1"), (1, 2, 15, "linear-v1"), (3, 2, 5, "linear-v1"),
    (2, 1, 11, "cosine"), (1, 2, 4, "linear"),  # the second resumes inside the warmup
])
def test_resume_on_another_device_count_equals_the_hand_computed_run(tmp_path, before, after, stop_after, schedule):
    ckpt = str(tmp_path / "ckpt")
    first = _on(before, ckpt, stop_after, False, schedule)
    rest = _on(after, ckpt, None, True, schedule)
    ref = _reference(before, after, stop_after, schedule)
    # sample order: every window, in rank order, is the reference's slice of the epoch's permutation
    windows = [[first[0]["windows"][k][0], [i for r in first for i in r["windows"][k][2]]]
               for k in range(len(first[0]["windows"]))]
    windows += [[rest[0]["windows"][k][0], [i for r in rest for i in r["windows"][k][2]]]
                for k in range(len(rest[0]["windows"]))]
    assert windows == [[e, ids] for e, ids in ref["plan"]]
    # per-step learning rate, the same on every rank
    for run in (first, rest):
        assert all([w[1] for w in r["windows"]] == [w[1] for w in run[0]["windows"]] for r in run)
    lrs = [w[1] for w in first[0]["windows"] + rest[0]["windows"]]
    assert lrs == pytest.approx(ref["lrs"], rel=1e-12, abs=1e-15)
    total = N // (before * BATCH) * EPOCHS
    if schedule == "linear-v1" and stop_after >= int(total * WARMUP):  # resumed in the decay: LR unchanged
        assert lrs[stop_after] == pytest.approx(LR * (total - stop_after) / (total - int(total * WARMUP)), rel=1e-12)
    # optimizer state: loaded exactly as saved, on every rank; equal to the reference's at that step and at the end
    for r in rest:
        assert all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k]))
                   for a, b in zip(r["loaded"], first[0]["saved"]) for k in a)
    _close(first[0]["saved"], ref["saved"], "at the checkpoint")
    for r in rest:
        _close(r["state"], ref["state"], "at the end")
        for got, want in zip(r["params"], ref["params"]):
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), float((got - want).abs().max())
