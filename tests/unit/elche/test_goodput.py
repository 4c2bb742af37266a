"""El Che's anchor by goodput (``flodl_hf.elche.goodput`` and ``ElChe`` fed with gradient-noise figures)."""

from __future__ import annotations

import json
import random

import pytest

from flodl_hf.elche.scheduler import ElChe
from flodl_hf.elche.goodput import combined_anchor, goodput, goodput_anchor, overhead_anchor


def _noise_inputs(noise_scale: float, items: list[float]) -> dict:
    """Window figures whose unbiased estimate is exactly |G|^2 = 1, tr(Sigma) = noise_scale."""
    return {"grad_sq": [1.0 + noise_scale / b for b in items], "grad_items": items,
            "reduced_grad_sq": 1.0 + noise_scale / sum(items)}


def _run(che: ElChe, windows: int, compute_per_micro: float, sync: float, noise_scale=None, b: int = 16):
    """``windows`` reports at the current anchor; compute grows with the anchor, sync does not."""
    anchors = []
    for _ in range(windows):
        a = che.anchor
        noise = {} if noise_scale is None else _noise_inputs(noise_scale, [a * b, a * b])
        che.report([compute_per_micro * a] * 2, [a * b] * 2, sync, micro_batches=a, **noise)
        anchors.append(che.anchor)
    return anchors


def test_goodput_formula_is_throughput_times_fixed_lr_efficiency():
    from flodl_hf.elche.noise_scale import fixed_lr_efficiency

    assert goodput(1, 0.0, 5.0) == 1.0  # anchor 1 with free sync is the unit
    rng = random.Random(0)
    for _ in range(200):
        a, o1, rho, m0 = rng.randint(1, 16), rng.uniform(0, 20), rng.uniform(0, 100), rng.choice((16, 32, 64))
        throughput = a / (a + o1)
        assert goodput(a, o1, rho) == pytest.approx(throughput * fixed_lr_efficiency(rho * m0, m0, a * m0))
    # between 1 and 2 the switch is at k (1 + o1) = 2, k = rho / (1 + rho): sync must cost more than compute
    for o1 in (1.5, 3.0, 8.0):
        k = 2 / (1 + o1)
        rho = k / (1 - k)
        assert goodput_anchor(1, o1, rho * 0.95, 1, 2, threshold=0.0) == 1
        assert goodput_anchor(1, o1, rho * 1.05, 1, 2, threshold=0.0) == 2
    for rho in (0.0, 1.0, 30.0, 1e6):  # sync no dearer than compute: anchor 1 however noisy the gradient
        assert goodput_anchor(1, 1.0, rho, 1, 64, threshold=0.0) == 1


def test_large_noise_scale_and_costly_sync_give_a_larger_anchor():
    che = ElChe(2, batch_size=16)  # goodput by default, no overhead ceiling; M0 = 32 samples per micro-step
    anchors = _run(che, 12, compute_per_micro=100.0, sync=800.0, noise_scale=32 * 30)  # o1 8, rho 30
    assert anchors[:2] == [1, 1]  # three windows of evidence first
    assert che.anchor == 3  # goodput 1.35x anchor 1's (2: 1.34x, 4: 1.29x)
    assert che.noise_scale == pytest.approx(960.0)
    k = 30 / 31
    assert che.efficiency == pytest.approx((1 + k * (1 - 1 / 3)) / 3)
    assert che.history[-1]["noise_scale"] == pytest.approx(960.0)
    cheap = ElChe(2, batch_size=16)  # the same noise with sync as long as compute: k (1 + o1) < 2
    _run(cheap, 12, compute_per_micro=100.0, sync=100.0, noise_scale=32 * 30)
    assert cheap.anchor == 1


@pytest.mark.parametrize("noise_scale", [None, 0.0, 16.0, 32.0])
def test_small_or_unknown_noise_scale_keeps_anchor_one_even_with_costly_sync(noise_scale):
    che = ElChe(2, batch_size=16)
    # sync as long as compute (o1 = 1): the throughput rule would go to 8 (1 / 0.1 = 10, capped)
    assert _run(che, 20, compute_per_micro=100.0, sync=100.0, noise_scale=noise_scale) == [1] * 20
    slow = ElChe(2, batch_size=16)  # even a link 8x slower than compute: rho <= 1 is not worth a longer window...
    anchors = _run(slow, 20, compute_per_micro=100.0, sync=800.0, noise_scale=noise_scale)
    assert anchors == [1] * 20 or (noise_scale == 32.0 and anchors[-1] == 2)  # ...except at k (1 + o1) = 4.5 > 2
    old = ElChe(2, batch_size=16, anchor_rule="throughput")
    assert _run(old, 20, compute_per_micro=100.0, sync=100.0, noise_scale=noise_scale)[-1] == 8


def test_the_issue_case_stays_at_one():
    # the measured table in goodput.py's docstring: the throughput rule rose to 5 (o1 ~ 0.45) within 20 micro-steps; a fine-tune noise scale
    # of the order of the global batch (rho ~ 1-3) gives rho * o1 < 2: anchor 1 throughout
    che = ElChe(2, batch_size=16)
    assert _run(che, 20, compute_per_micro=100.0, sync=45.0, noise_scale=96.0) == [1] * 20
    old = ElChe(2, batch_size=16, overhead_target=0.1, anchor_rule="throughput")
    assert _run(old, 20, compute_per_micro=100.0, sync=45.0, noise_scale=96.0)[-1] == 5


def test_overhead_target_is_a_ceiling_on_sync_that_goodput_may_exceed():
    floor = ElChe(2, batch_size=16, overhead_target=0.25)  # o1 1: tau needs A = 4 whatever the noise
    _run(floor, 12, compute_per_micro=100.0, sync=100.0, noise_scale=None)
    assert floor.anchor == 4  # no noise estimate: exactly the overhead rule
    more = ElChe(2, batch_size=16, overhead_target=0.25)
    _run(more, 12, compute_per_micro=100.0, sync=100.0, noise_scale=32 * 48)  # goodput alone: 1
    assert more.anchor == 4
    assert combined_anchor(1, 1.0, 48.0, 0.25, 1, 8, "goodput") == 4
    assert combined_anchor(1, 1.0, 48.0, None, 1, 8, "goodput") == 1
    assert combined_anchor(1, 8.0, 30.0, None, 1, 8, "goodput") == 3
    assert combined_anchor(1, 1.5, 1e6, 0.5, 1, 8, "goodput") == 3  # overhead's 3 beats goodput's 2
    assert combined_anchor(1, 8.0, 30.0, 0.5, 1, 8, "goodput") == 8  # tau wants 16: the bound holds
    assert combined_anchor(1, 1.0, 48.0, 0.25, 1, 8, "throughput") == 4
    assert combined_anchor(1, 8.0, 30.0, None, 1, 2, "goodput") == 2  # bounds hold


def test_hysteresis_holds():
    # near the 1 <-> 2 boundary (o1 3: k = 0.5, rho = 1) the two goodputs differ by < 5 %: no move either way
    assert goodput_anchor(1, 3.0, 1.3, 1, 8) == 1
    assert goodput_anchor(2, 3.0, 0.8, 1, 8) == 2
    assert goodput_anchor(1, 8.0, 1.6, 1, 8) == 2  # a clear gain moves
    rng = random.Random(0)
    che = ElChe(2, batch_size=16)
    anchors = []
    for _ in range(60):  # 5 % timing noise around o1 = 3 and a noise scale wobbling 10 % around rho = 1
        a = che.anchor
        phi = 32.0 * (1 + 0.1 * rng.uniform(-1, 1))
        che.report([100.0 * a * (1 + 0.05 * rng.gauss(0, 1))] * 2, [16 * a] * 2,
                   300.0 * (1 + 0.05 * rng.gauss(0, 1)), micro_batches=a, **_noise_inputs(phi, [16 * a] * 2))
        anchors.append(che.anchor)
    changes = sum(1 for x, y in zip(anchors, anchors[1:]) if x != y)
    assert changes <= 1, anchors


def test_goodput_anchor_comes_back_down_when_the_noise_scale_falls():
    che = ElChe(2, batch_size=16)
    _run(che, 12, compute_per_micro=100.0, sync=800.0, noise_scale=32 * 30)
    high = che.anchor
    _run(che, 80, compute_per_micro=100.0, sync=800.0, noise_scale=2.0)  # the EMA forgets the old noise
    assert high == 3 and che.anchor == 1


def test_goodput_state_round_trip_continues_identically():
    a = ElChe(2, batch_size=16)
    _run(a, 7, compute_per_micro=100.0, sync=100.0, noise_scale=500.0)
    state = json.loads(json.dumps(a.state_dict()))
    assert state["noise"]["windows"] == 7 and state["noise"]["micro_items"] == 32.0
    b = ElChe(2, batch_size=16)
    b.load_state_dict(state)
    assert b.state_dict() == a.state_dict() and b.noise_scale == a.noise_scale
    assert _run(b, 10, 100.0, 100.0, 900.0) == _run(a, 10, 100.0, 100.0, 900.0)
    old = {k: v for k, v in a.state_dict().items() if k != "noise"}
    old["version"] = 2  # a checkpoint from before the noise estimate: loads, with no estimate
    c = ElChe(2, batch_size=16)
    c.load_state_dict(old)
    assert c.noise_scale is None and c.anchor == a.anchor


def test_anchor_rule_and_noise_input_validation():
    with pytest.raises(ValueError, match=r"anchor_rule='fast' is invalid for setup mode"):
        ElChe(2, batch_size=8, anchor_rule="fast")
    with pytest.raises(ValueError, match=r"anchor_rule='goodput' is invalid for builder mode"):
        ElChe(2, mode="builder", anchor_rule="goodput")
    assert ElChe(2, mode="builder").overhead_target == 0.1 and ElChe(2, batch_size=8).overhead_target is None
    assert ElChe(2, batch_size=8, anchor_rule="throughput").overhead_target == 0.1
    che = ElChe(2, batch_size=8)
    with pytest.raises(ValueError, match="go together: pass all three or none"):
        che.report([100, 100], [8, 8], 10, grad_sq=[1.0, 1.0])
    with pytest.raises(ValueError, match="grad_sq is setup-mode only"):
        ElChe(2, mode="builder").report([100, 100], [10, 10], 10, **_noise_inputs(10.0, [10, 10]))
    with pytest.raises(ValueError, match="the throughput rule needs overhead_target"):
        combined_anchor(1, 1.0, None, None, 1, 8, "throughput")
    with pytest.raises(ValueError, match=r"rho=-1.0 is invalid"):
        goodput(2, 1.0, -1.0)
    assert overhead_anchor(1, 0.5, 0.1, 1, 8) == 5


class _Holder:
    """What the job's outputs read from a graph: its El Che."""

    def __init__(self, el_che: ElChe) -> None:
        self._el_che = el_che

    def el_che(self) -> ElChe:
        return self._el_che


def test_metrics_json_and_tensorboard_figures_of_a_goodput_run():
    from flodl_hf.job.outputs import el_che_info, el_che_scalars

    che = ElChe(2, batch_size=16)
    _run(che, 12, compute_per_micro=100.0, sync=800.0, noise_scale=32 * 30)
    info = el_che_info(_Holder(che))
    assert info["anchor_rule"] == "goodput" and info["overhead_target"] is None
    assert info["anchor_changes"][0] == [0, 1] and info["anchor_changes"][-1][1] == che.anchor > 1
    assert info["noise_scale"] == pytest.approx(960.0) and 0 < info["efficiency"] < 1
    json.dumps(info)
    scalars = el_che_scalars(_Holder(che))
    overhead = che.history[-1]["overhead"]
    assert scalars == {"el_che/anchor": float(che.anchor), "el_che/noise_scale": pytest.approx(960.0),
                       "el_che/efficiency": pytest.approx(che.efficiency),
                       "el_che/share/rank0": pytest.approx(che.shares[0]),
                       "el_che/share/rank1": pytest.approx(che.shares[1]),
                       "el_che/sync_share": pytest.approx(overhead / (1 + overhead))}
    assert 0 < scalars["el_che/sync_share"] < 1 and scalars["el_che/share/rank0"] + scalars["el_che/share/rank1"] \
        == pytest.approx(1.0)
    assert el_che_scalars(_Holder(ElChe(2, batch_size=16))) == {"el_che/anchor": 1.0, "el_che/share/rank0": 0.5,
                                                               "el_che/share/rank1": 0.5}


def test_ddp_config_anchor_rule_and_simulate_sync():
    from flodl_hf.config import DdpConfig

    cfg = DdpConfig()
    assert cfg.anchor_rule == "goodput" and cfg.overhead_target is None
    kwargs = cfg.el_che_kwargs(2, 16)
    assert kwargs["anchor_rule"] == "goodput" and kwargs["overhead_target"] is None
    assert ElChe(2, batch_size=16, **kwargs).overhead_target is None
    old = DdpConfig(anchor_rule="throughput", max_anchor=8)
    assert ElChe(2, batch_size=16, **old.el_che_kwargs(2, 16)).overhead_target == 0.1
    with pytest.raises(ValueError, match=r"DdpConfig.anchor_rule='fastest' is invalid: use one of goodput, throughput"):
        DdpConfig(anchor_rule="fastest")
    with pytest.raises(ValueError, match=r"DdpConfig.simulate_sync=-1 is invalid"):
        DdpConfig(simulate_sync=-1)
    with pytest.raises(ValueError, match=r"DdpConfig.overhead_target=0.9 is invalid"):
        DdpConfig(overhead_target=0.9)
