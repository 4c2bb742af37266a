"""The gradient-noise estimator (``flodl_hf.elche.noise_scale``) on synthetic gradients of known mean and covariance."""

from __future__ import annotations

import json
import random

import pytest
import torch

from flodl_hf.elche.noise_scale import (
    NoiseScale,
    WindowNoise,
    adascale_gain,
    fixed_lr_efficiency,
    pooled_estimates,
    statistical_efficiency,
    window_estimates,
)


def _expected_inputs(g2: float, trace: float, items: list[float]) -> tuple[list[float], float]:
    """E|G_r|^2 = |G|^2 + tr/B_r and E|G_big|^2 = |G|^2 + tr/B: the estimator is linear in them, so feeding the
    expectations must give back (|G|^2, tr) exactly if (and only if) it is unbiased."""
    return [g2 + trace / b if b else 0.0 for b in items], g2 + trace / sum(items)


@pytest.mark.parametrize("items", [[16, 16], [3, 29], [7, 25, 12], [1, 1, 1, 61], [5, 0, 11]])
def test_unbiased_in_expectation_for_any_split(items):
    small, big = _expected_inputs(2.5, 40.0, items)
    g2, trace = window_estimates(small, items, big)
    assert g2 == pytest.approx(2.5, rel=1e-12) and trace == pytest.approx(40.0, rel=1e-12)


def test_equal_counts_are_mccandlish_appendix_a():
    b_small, k = 8.0, 4
    b_big = k * b_small
    small, big = [3.0, 5.0, 4.0, 6.0], 2.0
    mean_small = sum(small) / k
    g2, trace = window_estimates(small, [b_small] * k, big)
    assert g2 == pytest.approx((b_big * big - b_small * mean_small) / (b_big - b_small))
    assert trace == pytest.approx((mean_small - big) / (1 / b_small - 1 / b_big))


def test_trace_is_the_pooled_between_rank_scatter():
    gen = torch.Generator().manual_seed(1)
    items = [4.0, 9.0, 20.0]
    grads = [torch.randn(30, generator=gen, dtype=torch.float64) for _ in items]
    big = sum(b * gr for b, gr in zip(items, grads)) / sum(items)
    _, trace = window_estimates([float(gr.dot(gr)) for gr in grads], items, float(big.dot(big)))
    scatter = sum(b * float((gr - big).dot(gr - big)) for b, gr in zip(items, grads)) / (len(items) - 1)
    assert trace == pytest.approx(scatter, rel=1e-10)


def test_no_noise_gives_zero_trace_and_the_exact_norm():
    g = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    sq = float(g.dot(g))
    g2, trace = window_estimates([sq, sq, sq], [3, 10, 7], sq)
    assert g2 == pytest.approx(sq) and trace == pytest.approx(0.0, abs=1e-12)


def _sampled_window(gen: torch.Generator, mean: torch.Tensor, std: torch.Tensor, items: list[int]):
    """Item gradients ~ N(mean, diag(std^2)); returns each rank's |G_r|^2 and |G_big|^2."""
    rank_means = [(mean + std * torch.randn(b, mean.numel(), generator=gen, dtype=torch.float64)).mean(0)
                  for b in items]
    big = sum(b * g for b, g in zip(items, rank_means)) / sum(items)
    return [float(g.dot(g)) for g in rank_means], float(big.dot(big))


def test_noisy_estimates_average_to_the_truth_with_unequal_counts():
    gen = torch.Generator().manual_seed(0)
    d = 40
    mean = torch.linspace(-0.3, 0.3, d, dtype=torch.float64)  # |G|^2 = 1.23...
    std = torch.linspace(0.5, 1.5, d, dtype=torch.float64)  # tr(Sigma) = sum(std^2)
    true_g2, true_trace = float(mean.dot(mean)), float(std.dot(std))
    items = [6, 23, 11]
    sums = [0.0, 0.0]
    runs = 3000
    for _ in range(runs):
        small, big = _sampled_window(gen, mean, std, items)
        g2, tr = window_estimates(small, items, big)
        sums[0] += g2
        sums[1] += tr
    # standard errors over 3000 windows: about 2 % of |G|^2 and 1 % of tr(Sigma) here
    assert sums[0] / runs == pytest.approx(true_g2, rel=0.08)
    assert sums[1] / runs == pytest.approx(true_trace, rel=0.04)


def test_smoothed_noise_scale_tracks_the_truth_and_a_biased_weighting_would_not():
    gen = torch.Generator().manual_seed(7)
    d = 40
    mean = torch.full((d,), 0.25, dtype=torch.float64)
    std = torch.full((d,), 1.0, dtype=torch.float64)
    truth = float(std.dot(std)) / float(mean.dot(mean))  # B_noise = 16
    items = [4, 28]
    est, naive = NoiseScale(decay=0.99), NoiseScale(decay=0.99)
    for _ in range(1500):
        small, big = _sampled_window(gen, mean, std, items)
        est.update(small, items, big)
        # treating the ranks as equal batches of the mean size ignores the split: biased
        naive.update(small, [sum(items) / 2] * 2, big)
    assert est.noise_scale == pytest.approx(truth, rel=0.15)
    assert naive.noise_scale is None or abs(naive.noise_scale - truth) > 0.15 * truth


def test_noise_scale_states():
    ns = NoiseScale(decay=0.5)
    assert ns.noise_scale is None and ns.grad_sq is None and ns.windows == 0
    assert ns.update([1.0], [8], 1.0) is False and ns.windows == 0  # one rank: nothing to separate
    small, big = _expected_inputs(2.0, 64.0, [8, 8])
    assert ns.update(small, [8, 8], big) is True
    assert ns.grad_sq == pytest.approx(2.0) and ns.trace == pytest.approx(64.0)  # bias-corrected at once
    assert ns.noise_scale == pytest.approx(32.0)
    small, big = _expected_inputs(-3.0, 64.0, [8, 8])  # a window where noise swamps the signal
    ns.update(small, [8, 8], big)
    assert ns.noise_scale is None  # EMA(|G|^2) <= 0: no usable estimate
    zero = NoiseScale()
    small, big = _expected_inputs(1.0, -3.0, [8, 8])
    zero.update(small, [8, 8], big)
    assert zero.noise_scale == 0.0


def test_noise_scale_state_round_trip_is_json_and_exact():
    a = NoiseScale(decay=0.8)
    gen = torch.Generator().manual_seed(2)
    mean, std = torch.full((10,), 0.3, dtype=torch.float64), torch.ones(10, dtype=torch.float64)
    for _ in range(5):
        small, big = _sampled_window(gen, mean, std, [5, 9])
        a.update(small, [5, 9], big)
    b = NoiseScale()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict() and b.noise_scale == a.noise_scale
    with pytest.raises(ValueError, match=r"noise state is missing keys \['trace_ema'\]"):
        b.load_state_dict({"decay": 0.9, "grad_sq_ema": 1.0, "windows": 1})


def test_window_noise_needs_all_three_inputs():
    wn = WindowNoise()
    wn.observe(2, 1, None, None, None)
    assert wn.scale.windows == 0
    with pytest.raises(ValueError, match="go together: pass all three or none"):
        wn.observe(2, 1, [1.0, 1.0], None, 1.0)
    with pytest.raises(ValueError, match=r"pass one value per rank \(2\)"):
        wn.observe(2, 1, [1.0], [8], 1.0)
    small, big = _expected_inputs(1.0, 32.0, [16, 16])
    wn.observe(2, 2, small, [16, 16], big)  # two micro-batches of 16 items per rank: M0 = 16
    assert wn.micro_items == 16.0 and wn.rho(1) == pytest.approx(2.0) and wn.rho(2) is None
    assert wn.efficiency(3) == pytest.approx((1 + 2 / 3 * (1 - 1 / 3)) / 3)  # rho 2, k = 2/3, unchanged LR


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"small_sq": [1.0, 2.0], "items": [1], "big_sq": 1.0}, "give one of each per rank"),
    ({"small_sq": [1.0, -2.0], "items": [1, 1], "big_sq": 1.0}, r"rank 1: .* both must be >= 0"),
    ({"small_sq": [1.0, 2.0], "items": [1, 1], "big_sq": float("nan")}, "big_sq=nan is invalid"),
    ({"small_sq": [1.0, 2.0], "items": [1, 1], "big_sq": -1.0}, "a squared norm is >= 0"),
])
def test_window_estimates_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        window_estimates(**kwargs)
    with pytest.raises(ValueError, match=r"decay=1.0 is invalid: use an EMA decay in \[0, 1\)"):
        NoiseScale(decay=1.0)


def test_fixed_lr_efficiency_is_one_sgd_step_at_the_lr_tuned_for_m0():
    # the closed form against McCandlish's expected improvement of one SGD step, eps |G|^2 - eps^2/2 (G'HG +
    # tr(H Sigma)/B), with H = h I, |G|^2 = g, tr(Sigma) = B_noise g, eps the best LR for m0: per sample, a step
    # at s m0 over s steps' worth at m0
    rng = random.Random(3)
    for _ in range(200):
        g, h, m0 = rng.uniform(0.1, 5), rng.uniform(0.1, 5), rng.choice((8, 16, 32, 64))
        phi, s = rng.choice((0.0, rng.uniform(0, 10 * m0), rng.uniform(0, 1000 * m0))), rng.randint(1, 16)
        noise = phi * g

        def improvement(eps: float, batch: float) -> float:
            return eps * g - eps * eps / 2 * (h * g + h * noise / batch)

        eps = g / (h * g + h * noise / m0)  # argmax of improvement(eps, m0)
        expected = improvement(eps, s * m0) / (s * improvement(eps, m0))
        assert fixed_lr_efficiency(phi, m0, s * m0) == pytest.approx(expected, rel=1e-9)
        assert fixed_lr_efficiency(phi, m0, s * m0) <= statistical_efficiency(phi, m0, s * m0) + 1e-12
    assert fixed_lr_efficiency(0.0, 32, 128) == pytest.approx(0.25)  # no noise: one step's worth, m0 / m
    assert fixed_lr_efficiency(1e12, 32, 128) == pytest.approx((2 - 1 / 4) / 4)  # at most twice one step
    with pytest.raises(ValueError, match="need noise_scale >= 0 and positive batch sizes"):
        fixed_lr_efficiency(-1.0, 32, 64)


def test_statistical_efficiency_closed_form():
    assert statistical_efficiency(100.0, 32, 32) == 1.0
    assert statistical_efficiency(100.0, 32, 128) == pytest.approx(132 / 228)
    assert statistical_efficiency(0.0, 32, 128) == pytest.approx(0.25)  # no noise: m0 / m
    assert statistical_efficiency(1e12, 32, 128) == pytest.approx(1.0)  # pure noise: every sample counts
    with pytest.raises(ValueError, match="need noise_scale >= 0 and positive batch sizes"):
        statistical_efficiency(-1.0, 32, 64)


@pytest.mark.parametrize(("g2", "trace", "m0", "scale"), [(2.0, 300.0, 32, 4), (0.5, 10.0, 16, 8), (1.0, 0.0, 8, 3)])
def test_adascale_gain_matches_its_closed_form(g2, trace, m0, scale):
    sigma2, mu2 = trace / m0, g2  # variance of an m0-batch gradient, squared mean
    want = (sigma2 + mu2) / (sigma2 / scale + mu2)  # Johnson et al. 2020, eq. for r_t
    assert adascale_gain(trace / g2, m0, scale) == pytest.approx(want, rel=1e-12)
    assert adascale_gain(trace / g2, m0, 1) == pytest.approx(1.0)
    assert 1.0 <= adascale_gain(trace / g2, m0, scale) <= scale
    with pytest.raises(ValueError, match="scale=0.5 is invalid"):
        adascale_gain(1.0, m0, 0.5)


@pytest.mark.parametrize("seed", range(20))
def test_pooled_estimates_equal_the_per_rank_form(seed):
    """Builder SYNC sums ``B_r |G_r|^2`` and ``B_r`` in its scalar all-reduce instead of gathering lists: the
    pooled form must give exactly the per-rank estimates (ranks with no items left out of both)."""
    rng = random.Random(seed)
    world = rng.randint(2, 6)
    items = [rng.choice([0, rng.randint(1, 40)]) for _ in range(world)]
    small = [rng.uniform(0.0, 5.0) for _ in range(world)]
    big = rng.uniform(0.0, 3.0)
    per_rank = window_estimates(small, items, big)
    pooled = pooled_estimates(sum(n * s for s, n in zip(small, items)), sum(items), sum(1 for n in items if n), big)
    if per_rank is None:
        assert pooled is None
    else:
        assert pooled == pytest.approx(per_rank, rel=1e-12, abs=1e-12)
    a, b = NoiseScale(), NoiseScale()
    assert a.update(small, items, big) == b.update_pooled(sum(n * s for s, n in zip(small, items)), sum(items),
                                                          sum(1 for n in items if n), big)
    assert a.state_dict() == pytest.approx(b.state_dict())


@pytest.mark.parametrize("kwargs,match", [
    ({"weighted_sq_sum": -1.0, "total": 2.0, "ranks": 2, "big_sq": 1.0}, "must be >= 0"),
    ({"weighted_sq_sum": 1.0, "total": 2.0, "ranks": 2.5, "big_sq": 1.0}, "ranks=2.5"),
    ({"weighted_sq_sum": float("nan"), "total": 2.0, "ranks": 2, "big_sq": 1.0}, "finite"),
])
def test_pooled_estimates_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pooled_estimates(**kwargs)
