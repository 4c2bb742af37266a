"""The opt-in AdaScale rule (``flodl_hf.elche.lr_scaling``) against its definitions, on many seeded random cases.

The references are the papers' formulas written out here from raw quantities (AdaScale's gain from sigma^2 and
mu^2, Pollux's efficiency, the square-root rule), not calls into the module under test.
"""

from __future__ import annotations

import math
import random

import pytest

from flodl_hf.config import LR_SCALINGS as CONFIG_LR_SCALINGS, DdpConfig
from flodl_hf.elche.goodput import goodput, goodput_anchor, GAIN_THRESHOLD
from flodl_hf.elche.lr_scaling import LR_SCALINGS, ScheduleClock, lr_exponent
from flodl_hf.elche.scheduler import ElChe
from test_goodput import _Holder  # what the job's outputs read from a graph: its El Che


def test_one_list_of_rules() -> None:
    assert CONFIG_LR_SCALINGS == LR_SCALINGS == ("none", "adascale")
    assert DdpConfig().lr_scaling == "none"  # the default never changes the user's LR
    with pytest.raises(ValueError, match=r"DdpConfig.lr_scaling='linear' is invalid: use one of none, adascale"):
        DdpConfig(lr_scaling="linear")


@pytest.mark.parametrize("seed", range(200))
def test_gain_is_adascale_from_sigma_and_mu(seed: int) -> None:
    rng = random.Random(seed)
    m0 = rng.choice((8.0, 16.0, 32.0, 100.0))
    trace = rng.uniform(0.0, 50.0)  # tr(Sigma) per item
    mu2 = rng.uniform(1e-3, 5.0)  # |G|^2
    s = rng.randint(1, 8)
    sigma2 = trace / m0  # the variance of an m0-batch gradient
    want = 1.0 if s == 1 else (sigma2 + mu2) / (sigma2 / s + mu2)  # Johnson et al. 2020, eq. (AdaScale gain)
    clock = ScheduleClock("adascale")
    got = clock.gain(s, trace / mu2, m0, usable=True)
    assert got == pytest.approx(want, rel=1e-12)
    assert 1.0 <= got <= s + 1e-12
    assert ScheduleClock("none").gain(s, trace / mu2, m0, usable=True) is None  # the default scales nothing
    assert clock.gain(s, trace / mu2, m0, usable=False) is None  # no estimate yet: nothing is scaled


@pytest.mark.parametrize("seed", range(50))
def test_schedule_advances_by_the_gain(seed: int) -> None:
    rng = random.Random(seed)
    clock, none = ScheduleClock("adascale"), ScheduleClock("none")
    total_gain = total_steps = total_micro = 0
    for _ in range(rng.randint(1, 40)):
        micro = rng.randint(1, 6)
        gain = 1.0 if micro == 1 else rng.uniform(1.0, micro)
        total_gain += gain
        total_micro += micro
        total_steps += clock.advance(micro, gain)
        assert total_steps == math.floor(total_gain + 1e-9)  # AdaScale's clock, stepped in whole steps
        assert none.advance(micro, None) == micro  # the default: one step per micro-step
    assert clock.schedule_progress == pytest.approx(total_gain / total_micro)
    assert none.schedule_progress == 1.0
    restored = ScheduleClock("adascale")
    restored.load_state_dict(clock.state_dict())
    assert restored.advance(3, 2.5) == clock.advance(3, 2.5)
    with pytest.raises(ValueError, match="AdaScale's gain is in"):
        clock.advance(2, 2.5)
    unscaled = ScheduleClock("adascale")  # before a usable estimate: as the default, one step per micro-step
    assert [unscaled.advance(m, None) for m in (3, 1, 2)] == [3, 1, 2] and unscaled.schedule_progress == 1.0


def test_optimizer_rules() -> None:
    import torch

    class MyAdamW(torch.optim.AdamW):
        pass

    def mro(opt_class: type) -> list[str]:
        return [c.__name__ for c in opt_class.__mro__]

    assert lr_exponent(mro(torch.optim.SGD)) == 1.0
    for cls in (torch.optim.Adam, torch.optim.AdamW, torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adamax,
                torch.optim.RMSprop, MyAdamW):
        assert lr_exponent(mro(cls)) == 0.5, cls
    with pytest.raises(ValueError, match=r"scaling the LR of Adagrad|LR of Adagrad.*lr_scaling='none'"):
        lr_exponent(mro(torch.optim.Adagrad))


def _pollux_goodput(a: int, o1: float, rho: float) -> float:
    return a / (a + o1) * (rho + 1.0) / (rho + a)  # throughput x Pollux's efficiency (OSDI 2021, eq. 6)


@pytest.mark.parametrize("seed", range(200))
def test_goodput_with_adascale_is_pollux(seed: int) -> None:
    rng = random.Random(seed)
    o1, rho = rng.uniform(0.0, 10.0), rng.uniform(0.0, 20.0)
    lo, hi = 1, rng.randint(1, 8)
    current = rng.randint(lo, hi)
    for a in range(lo, hi + 1):
        assert goodput(a, o1, rho, "adascale") == pytest.approx(_pollux_goodput(a, o1, rho), rel=1e-12)
    best = max(range(lo, hi + 1), key=lambda a: (_pollux_goodput(a, o1, rho), -a))
    want = best if _pollux_goodput(best, o1, rho) > (1 + GAIN_THRESHOLD) * _pollux_goodput(current, o1, rho) \
        else current
    assert goodput_anchor(current, o1, rho, lo, hi, lr_scaling="adascale") == want
    if hi >= 2 and current == 1:  # A = 2 beats 1 exactly when o1 * rho > 2 (before the hysteresis)
        assert (goodput(2, o1, rho, "adascale") > goodput(1, o1, rho, "adascale")) == (o1 * rho > 2)


def _fed(el_che: ElChe, windows: int, rng: random.Random, micro: int) -> None:
    for _ in range(windows):
        items = [rng.uniform(4, 16) for _ in range(el_che.world_size)]
        el_che.report([100.0] * el_che.world_size, [16.0] * el_che.world_size, 10.0, micro_batches=micro,
                      grad_sq=[rng.uniform(1.0, 3.0) for _ in items], grad_items=items,
                      reduced_grad_sq=rng.uniform(0.2, 0.9))


@pytest.mark.parametrize("seed", range(30))
def test_el_che_gain_uses_its_noise_estimate(seed: int) -> None:
    rng = random.Random(seed)
    el_che = ElChe(2, batch_size=16, anchor=2, min_anchor=2, max_anchor=2, lr_scaling="adascale")
    assert el_che.window_lr(2) == (1.0, 2)  # no estimate yet: the user's LR, the schedule by micro-steps
    _fed(el_che, 2, rng, micro=2)
    assert el_che.window_lr(2) == (1.0, 2)  # two windows: not trusted yet (the anchor rule waits for three)
    _fed(el_che, 1, rng, micro=2)
    phi, state = el_che.noise_scale, el_che.state_dict()
    m0 = state["noise"]["micro_items"]
    gain, steps = el_che.window_lr(2)
    if phi is None:
        assert gain == 1.0
    else:
        assert gain == pytest.approx((phi / m0 + 1) / (phi / m0 / 2 + 1), rel=1e-12)
    assert el_che.window_lr(1)[0] == 1.0  # a one-micro-step window is the unscaled batch
    copy = ElChe(2, batch_size=16, anchor=2, min_anchor=2, max_anchor=2, lr_scaling="adascale")
    copy.load_state_dict(el_che.state_dict())
    assert copy.window_lr(2) == el_che.window_lr(2)
    assert copy.schedule_progress == el_che.schedule_progress


def test_builder_mode_refuses_adascale() -> None:
    with pytest.raises(ValueError, match="lr_scaling='adascale' is invalid for builder mode"):
        ElChe(2, mode="builder", lr_scaling="adascale")


def test_gains_reach_metrics_json_tensorboard_and_the_card():
    import json

    from flodl_hf.job.outputs import el_che_info, el_che_scalars, training_table

    che = ElChe(2, batch_size=16, anchor=2, min_anchor=2, max_anchor=2, lr_scaling="adascale")
    gains = []
    for _ in range(6):  # |G|^2 = 1, tr(Sigma) = 960 per window: B_noise = 960 samples, M0 = 32
        gain, _ = che.window_lr(2)
        gains.append(gain)
        items = [32.0, 32.0]
        che.report([100.0, 100.0], [32, 32], 10.0, micro_batches=2, grad_sq=[1.0 + 960 / b for b in items],
                   grad_items=items, reduced_grad_sq=1.0 + 960 / 64)
    rho = 960 / 32
    assert gains[:3] == [1.0, 1.0, 1.0] and gains[3:] == [pytest.approx((rho + 1) / (rho / 2 + 1))] * 3
    info = el_che_info(_Holder(che))
    json.dumps(info)
    assert info["lr_scaling"] == "adascale" and [g for _, g in info["lr_gains"]] == [round(g, 4) for g in gains]
    assert info["lr_gain_max"] == round(max(gains), 4)
    assert info["schedule_progress"] == pytest.approx((3 * 2 + 3 * gains[-1]) / 12, abs=1e-4)
    assert el_che_scalars(_Holder(che))["el_che/lr_gain"] == pytest.approx(gains[-1])
    assert "el_che/lr_gain" not in el_che_scalars(_Holder(ElChe(2, batch_size=16)))  # the default logs no gain
    assert el_che_info(_Holder(ElChe(2, batch_size=16)))["lr_scaling"] == "none"
    settings = {"precision": "fp32", "epochs": 1, "batch_size": 16, "lr": 5e-5, "warmup_ratio": None,
                "max_length": 64, "seed": 0, "eval_every": None, "early_stopping_patience": None}
    metrics = {"settings": settings, "world_size": 2, "devices": ["cpu", "cpu"], "el_che": info, "steps": 12,
               "steps_run": 12, "train_size": 384, "stop_reason": "completed", "train_time_s": 1.0,
               "train_loss": [0.9], "eval_history": [], "resumed": []}
    row = training_table(metrics)["LR scaling"]
    assert row.startswith("AdaScale gain, mean ") and "schedule progress" in row
