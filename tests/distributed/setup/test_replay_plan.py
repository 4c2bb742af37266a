"""A recorded El Che plan repeats a run exactly (``DdpConfig(replay_plan=...)``, CLI ``--replay-plan``).

Run A decides its split and anchor from (modelled) timing; run B, the same command on a machine that times
differently, decides otherwise and, with dropout on, trains another model. Run C is B with A's recorded plan: it
must be A to the bit (parameters, splits, anchors), whatever its own timing says.
"""

from __future__ import annotations

import json

import pytest
import torch

from dist_helpers import run_ranks, values
from exactness_harness import TokenNet, collate, loss_sum_and_items, make_data

CASE = {"data_seed": 11, "n": 96, "mask": 0.0, "loss": "samples"}


def _rank(rank: int, world: int, speeds: list, sync: float | None, plan: dict | None) -> dict:
    from flodl_hf import DdpConfig, Graph, Trainer

    torch.manual_seed(0)
    graph = Graph(TokenNet(dropout=0.3))
    cfg = DdpConfig(verbose=False, timeout_s=60, seed=5, simulate_speeds=speeds, simulate_sync=sync,
                    anchor_rule="throughput", max_anchor=3, replay_plan=plan)
    Trainer.setup_with(graph, lambda dev: TokenNet(dropout=0.3), lambda ps: torch.optim.AdamW(ps, lr=0.05), cfg)
    torch.manual_seed(100 + rank)  # each rank's dropout stream
    graph.set_data_loader(make_data(CASE), batch_size=4, collate_fn=collate)
    for epoch in range(2):
        for _, ids, tok, cls in graph.epoch(epoch):
            loss, items = loss_sum_and_items(CASE, graph.module, ids, tok, cls)
            (loss / items).backward()
            graph.step()
    graph.close()
    return {"params": {n: p.detach().clone() for n, p in graph.module.named_parameters()},
            "plan": graph.el_che_plan(), "windows": graph.training_step}


def _run(speeds: list, sync: float | None, plan: dict | None = None) -> dict:
    return values(run_ranks(_rank, 2, speeds, sync, plan, timeout=180))[0]


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def test_replayed_plan_repeats_the_run_bit_for_bit():
    a = _run([1.0, 0.4], 1.5)  # rank 1 slow, a slow link: El Che moves the split and lengthens the window
    b = _run([0.4, 1.0], None)  # the same command where rank 0 is the slow one and sync is cheap
    plan = json.loads(json.dumps(a["plan"]))  # as metrics.json carries it
    assert len(plan["splits"]) > 1 and max(x for _, x in plan["anchors"]) > 1, plan
    assert b["plan"] != plan, "the two timings should lead El Che to different plans"
    assert _max_diff(a["params"], b["params"]) > 1e-4, "different plans should train different models (dropout)"
    c = _run([0.4, 1.0], None, plan)
    assert c["plan"] == plan
    assert c["windows"] == a["windows"]
    for name, value in a["params"].items():
        assert torch.equal(c["params"][name], value), f"{name} differs from the recorded run"


def test_a_plan_for_other_ranks_is_refused():
    from flodl_hf import DdpConfig

    with pytest.raises(ValueError, match="DdpConfig.replay_plan is not a recorded El Che plan"):
        DdpConfig(replay_plan={"format": 1, "world": 2})
    bad = {"format": 1, "world": 2, "batch_size": 4, "anchors": [[0, 1]], "splits": [[0, [3, 3]]]}
    with pytest.raises(ValueError, match=r"split \[3, 3\] is not 2 sizes >= 1 summing to 2 x 4"):
        DdpConfig(replay_plan=bad)
    plan = {"format": 1, "world": 3, "batch_size": 4, "anchors": [[0, 1]], "splits": [[0, [4, 4, 4]]]}
    status = run_ranks(_rank, 2, [1.0, 1.0], None, plan, timeout=120)
    assert all(s == "error" for s, _ in status), status
    assert "was recorded on 3 rank(s) with batch size 4, but this run has 2 rank(s)" in status[0][1]


def test_cli_reads_the_plan_of_metrics_json(tmp_path):
    from flodl_hf.job.settings import read_plan

    plan = {"format": 1, "world": 2, "batch_size": 4, "anchors": [[0, 2]], "splits": [[0, [5, 3]]]}
    (tmp_path / "metrics.json").write_text(json.dumps({"el_che": {"plan": plan}}))
    assert read_plan(str(tmp_path)) == plan == read_plan(str(tmp_path / "metrics.json"))
    (tmp_path / "one.json").write_text(json.dumps({"el_che": None}))
    with pytest.raises(ValueError, match="records no El Che plan"):
        read_plan(str(tmp_path / "one.json"))
    with pytest.raises(ValueError, match="cannot read a metrics.json there"):
        read_plan(str(tmp_path / "missing.json"))


def test_cli_options_reach_the_engine_config(tmp_path):
    from flodl_hf import cli

    plan = {"format": 1, "world": 2, "batch_size": 4, "anchors": [[0, 2]], "splits": [[0, [5, 3]]]}
    (tmp_path / "metrics.json").write_text(json.dumps({"el_che": {"plan": plan}}))
    parser = cli.build_parser()
    args = parser.parse_args(["train", "--devices", "cpu,cpu", "--batch-size", "4", "--lr-scaling", "adascale",
                              "--replay-plan", str(tmp_path / "metrics.json")])
    config = cli.settings_from_args(args).ddp_config()
    assert config.lr_scaling == "adascale" and config.replay_plan == plan
    assert cli.settings_from_args(parser.parse_args(["train"])).ddp_config().lr_scaling == "none"
    with pytest.raises(ValueError, match="--replay-plan replays a run from its start, and --resume continues"):
        cli.settings_from_args(parser.parse_args(["train", "--replay-plan", str(tmp_path), "--resume",
                                                  str(tmp_path)]))
    with pytest.raises((SystemExit, cli.UsageError)):
        parser.parse_args(["train", "--lr-scaling", "linear"])
