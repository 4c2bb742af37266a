"""``DdpConfig(lr_scaling="adascale")`` on real gloo ranks against a one-process AdaScale written from the paper.

The reference replays each window's micro-batches (every rank's) in one process with plain PyTorch and computes,
itself, what AdaScale needs: each rank's window gradient, the reduced one, McCandlish et al.'s unbiased |G|^2 and
tr(Sigma) estimates, their EMA (decay 0.9), the gain ``(sigma^2 + mu^2) / (sigma^2 / s + mu^2)`` of a window of
``s`` micro-steps, the LR times the gain (SGD) or its square root (AdamW), and a schedule clock advanced by the
gain. The engine's documented timing is replayed too: the noise figures of a window are folded in one window late
(the reduced norm travels in the next window's metadata) and the gain is used once three windows were folded.
Final parameters and the LR of every optimizer step must match.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from dist_helpers import run_ranks, values
from exactness_harness import _batch, build, check_case, loss_sum_and_items, make_data, make_optimizer, \
    make_schedule, run_cases_on_rank

DECAY, MIN_WINDOWS = 0.9, 3


def make_adascale_case(seed: int, world: int) -> dict:
    rng = random.Random(10_000 + seed)
    batch = rng.randint(2, 5)
    global_batch = world * batch
    steps, epochs = rng.randint(14, 24), rng.choice((1, 2))
    cuts = sorted(rng.sample(range(1, global_batch), world - 1))
    edges = [0] + cuts + [global_batch]
    anchor = rng.randint(2, 4)
    events = [(rng.randrange(steps * epochs), "anchor", rng.randint(1, 4)) for _ in range(rng.randint(0, 2))]
    loss = rng.choice(("samples", "masked", "weighted", "token"))
    return {
        "seed": 5_000 + seed, "world": world, "batch": batch, "n": steps * global_batch, "epochs": epochs,
        "drop_last": True, "sizes": [edges[i + 1] - edges[i] for i in range(world)], "anchor": anchor,
        "adaptive": False, "frozen_at_setup": [], "events": sorted(events), "loss": loss,
        "mask": 0.0 if loss == "samples" else rng.choice((0.0, 0.3)),
        "optimizer": rng.choice(("sgd", "momentum", "adamw")), "lr": rng.choice((0.05, 0.2)),
        "clip": rng.choice((None, 0.3)), "schedule": rng.choice((None, "linear", "cosine")),
        "readahead": 0, "prefetch_thread": False, "data_seed": rng.randrange(1 << 30),
        "overlap": rng.random() < 0.5, "bucket_mb": 25.0, "user_schedule": False, "bind": rng.random() < 0.5,
        "skips": [], "evals": [], "continue_at": None, "eval_at_setup": [], "checkpointing": False,
        "dropout": 0.0, "lora": False, "lr_scaling": "adascale",
    }


def _flat_grads(model: torch.nn.Module) -> list:
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def _sq(grads: list, scale: float) -> float:
    return sum(float((g.double() / scale).pow(2).sum()) for g in grads if g is not None)


def adascale_reference(case: dict, micro_by_rank: list, exponent_override: float | None = None) -> tuple:
    """One process: per window, each rank's gradient, the reduced one, the AdaScale gain; (params, lrs, gains)."""
    data = make_data(case)
    model = build(case)
    optimizer = make_optimizer(case, model.parameters())
    per_epoch = case["n"] // (case["world"] * case["batch"])
    schedule = make_schedule(case, optimizer, per_epoch * case["epochs"])
    exponent = 0.5 if case["optimizer"] == "adamw" else 1.0
    if exponent_override is not None:
        exponent = exponent_override
    ema_g2 = ema_tr = 0.0
    folded, m0, carry = 0, None, 0.0
    pending = None  # (per-rank |G_r|^2, per-rank items, micro, |G_big|^2) of the last window, folded one window late
    lrs, gains, window = [], [], []
    stepped = [m[2] for m in micro_by_rank[0]]
    for k, ends in enumerate(stepped):
        window.append(k)
        if not ends:
            continue
        per_rank, items = [], []
        for r in range(case["world"]):
            model.zero_grad(set_to_none=True)
            b_r = 0.0
            for j in window:
                index, real, _ = micro_by_rank[r][j]
                _, ids, tok, cls = _batch(data, index)
                loss, n_items = loss_sum_and_items(case, model, ids, tok, cls)
                b_r += n_items
                if loss.requires_grad:
                    loss.backward()
            per_rank.append(_flat_grads(model))
            items.append(b_r)
        total = sum(items)
        reduced = []
        for i in range(len(per_rank[0])):
            parts = [g[i] for g in per_rank if g[i] is not None]
            reduced.append(None if not parts else sum(parts) / (total if total > 0 else 1.0))
        s = len(window)
        usable = folded >= MIN_WINDOWS and ema_g2 > 0 and m0
        if usable:
            rho = max(0.0, ema_tr) / ema_g2 / m0
            sigma2, mu2 = rho, 1.0  # in units of |G|^2: sigma^2 = tr(Sigma) / m0
            gain = (sigma2 + mu2) / (sigma2 / s + mu2)  # 1 at s = 1
        else:
            gain = 1.0  # no estimate yet: nothing is scaled
        gains.append(gain)
        small = [_sq(g, b) if b > 0 else 0.0 for g, b in zip(per_rank, items)]
        big = _sq(reduced, 1.0)
        for p, g in zip(model.parameters(), reduced):
            p.grad = g
        if case["clip"] is not None:
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], case["clip"])
        saved = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * gain ** exponent
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        for group, lr in zip(optimizer.param_groups, saved):
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        carry += gain if usable else s  # AdaScale's clock; unscaled windows count their micro-steps
        steps = math.floor(carry + 1e-9)
        carry -= steps
        if schedule is not None:
            for _ in range(steps):
                schedule.step()
        if pending is not None:  # the previous window's figures, now that its reduced norm "arrived"
            p_small, p_items, p_micro, p_big = pending
            ranks = [(q, b) for q, b in zip(p_small, p_items) if b > 0]
            if len(ranks) >= 2:
                kk, bb = len(ranks), sum(b for _, b in ranks)
                weighted = sum(b * q for q, b in ranks) / bb
                g2, tr = (kk * p_big - weighted) / (kk - 1), bb * (weighted - p_big) / (kk - 1)
                ema_g2, ema_tr = DECAY * ema_g2 + (1 - DECAY) * g2, DECAY * ema_tr + (1 - DECAY) * tr
                folded += 1
                m0 = bb / p_micro
        pending = (small, items, s, big)
        window = []
    return {name: p.detach() for name, p in model.named_parameters()}, lrs, gains


def _check(case: dict, results: list) -> list[float]:
    micro = [r["micro"] for r in results]
    want_params, want_lrs, want_gains = adascale_reference(case, micro)
    got = results[0]
    assert len(got["lrs"]) == len(want_lrs), f"case {case['seed']}: {len(got['lrs'])} steps, want {len(want_lrs)}"
    torch.testing.assert_close(torch.tensor(got["gains"][-len(want_gains):], dtype=torch.float64),
                               torch.tensor(want_gains, dtype=torch.float64), rtol=1e-4, atol=0,
                               msg=lambda m: f"case {case['seed']} gains: {m}")
    torch.testing.assert_close(torch.tensor(got["lrs"], dtype=torch.float64),
                               torch.tensor(want_lrs, dtype=torch.float64), rtol=1e-4, atol=1e-12,
                               msg=lambda m: f"case {case['seed']} LRs: {m}")
    for name, value in want_params.items():
        torch.testing.assert_close(got["params"][name], value, rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"case {case['seed']} {name}: {m}")
    for r in range(1, case["world"]):
        for name, p in results[r]["params"].items():
            assert torch.equal(p, got["params"][name]), f"case {case['seed']}: rank {r} {name} differs"
    return want_gains


@pytest.mark.parametrize("world", [2, 3])
def test_adascale_matches_a_one_process_adascale(world):
    cases = [make_adascale_case(seed, world) for seed in range(12)]
    per_rank = values(run_ranks(run_cases_on_rank, world, cases, timeout=240))
    failures, scaled = [], 0
    for i, case in enumerate(cases):
        try:
            gains = _check(case, [per_rank[r][i] for r in range(world)])
            scaled += any(g > 1.0 + 1e-6 for g in gains)
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0][:600])
    assert not failures, f"{len(failures)} of {len(cases)} cases differ from the reference:\n" + "\n".join(failures)
    assert scaled >= len(cases) // 2, f"only {scaled} of {len(cases)} cases ever scaled the LR: the test is weak"


def test_default_never_changes_the_lr():
    """lr_scaling="none" (the default) is the plain exactness contract: the user's LR, one schedule step per
    micro-step (the harness's own reference), on the same cases."""
    cases = [dict(make_adascale_case(seed, 2), lr_scaling="none") for seed in range(3)]
    per_rank = values(run_ranks(run_cases_on_rank, 2, cases, timeout=120))
    for i, case in enumerate(cases):
        results = [per_rank[r][i] for r in range(2)]
        assert results[0]["gains"] and all(g == 1.0 for g in results[0]["gains"])
        check_case(case, results)
