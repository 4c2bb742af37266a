"""The default DdpConfig trains the batch the loop asked for: El Che's window is one micro-batch per rank unless
the user opts in to a longer one, and every setting that only acts on a longer window is refused without it."""

from __future__ import annotations

import random

import pytest

from flodl_hf.config import DdpConfig
from flodl_hf.elche.scheduler import ElChe


def _drive(el: ElChe, windows: int, seed: int) -> list[int]:
    """Feed El Che windows whose synchronisation costs several times the compute, with a gradient noise scale far
    above the batch: the regime in which goodput lengthens the window when it is allowed to. Returns the anchor
    after each window."""
    rng = random.Random(seed)
    anchors = []
    for _ in range(windows):
        a = el.anchor
        items = [8.0 * a, 8.0 * a]
        noise = rng.uniform(200.0, 400.0)  # tr(Sigma) / |G|^2 with |G|^2 = 1: the unbiased estimate's inputs
        el.report([a * rng.uniform(9.0, 11.0) for _ in range(2)], items, rng.uniform(30.0, 40.0), micro_batches=a,
                  grad_sq=[1.0 + noise / b for b in items], grad_items=items,
                  reduced_grad_sq=1.0 + noise / sum(items))
        anchors.append(el.anchor)
    return anchors


@pytest.mark.parametrize("seed", range(6))
def test_the_default_window_never_grows_where_an_opt_in_one_does(seed):
    default = ElChe(2, batch_size=8, **DdpConfig().el_che_kwargs(2, 8))
    opted = ElChe(2, batch_size=8, **DdpConfig(max_anchor=8).el_che_kwargs(2, 8))
    assert set(_drive(default, 30, seed)) == {1}
    assert max(_drive(opted, 30, seed)) > 1  # the same timings move an allowed window: the check can fail


def test_window_bound():
    assert DdpConfig().window_bound() == 1
    assert DdpConfig(max_anchor=8).window_bound() == 8
    assert DdpConfig(anchor=3).window_bound() == 3
    assert DdpConfig(fixed_anchor=2).window_bound() == 2
    assert DdpConfig(max_anchor=0).window_bound() == 0
    assert DdpConfig().el_che_kwargs(2, 8)["max_anchor"] == 1


@pytest.mark.parametrize("field, value", [("overhead_target", 0.2), ("anchor_rule", "throughput"),
                                          ("lr_scaling", "adascale")])
def test_a_longer_window_setting_needs_the_opt_in(field, value):
    with pytest.raises(ValueError, match=rf"DdpConfig\.{field}={value!r} is invalid: .*max_anchor=N .*trades a "
                                         r"larger, varying effective batch for fewer synchronisations"):
        DdpConfig(**{field: value})
    with pytest.raises(ValueError, match=rf"DdpConfig\.{field}="):
        DdpConfig(max_anchor=1, **{field: value})
    for room in ({"max_anchor": 8}, {"fixed_anchor": 2}, {"anchor": 2}):
        DdpConfig(**room, **{field: value})


def test_anchor_above_max_anchor_is_refused():
    with pytest.raises(ValueError, match=r"DdpConfig\.anchor=4 is invalid: it exceeds max_anchor=2"):
        DdpConfig(anchor=4, max_anchor=2)
    with pytest.raises(ValueError, match=r"DdpConfig\.max_anchor=1\.5 is invalid"):
        DdpConfig(max_anchor=1.5)


def test_the_cli_opt_in_reaches_the_engine_config():
    from flodl_hf import cli

    parser = cli.build_parser()
    default = cli.settings_from_args(parser.parse_args(["train"])).ddp_config()
    assert default.max_anchor is None and default.window_bound() == 1
    opted = cli.settings_from_args(parser.parse_args(["train", "--max-anchor", "4", "--overhead-target", "0.2",
                                                      "--anchor-rule", "throughput"])).ddp_config()
    assert opted.window_bound() == 4 and opted.overhead_target == 0.2 and opted.anchor_rule == "throughput"
    with pytest.raises(ValueError, match=r"DdpConfig\.anchor_rule='throughput' is invalid: .*CLI --max-anchor N"):
        cli.settings_from_args(parser.parse_args(["train", "--anchor-rule", "throughput"]))
