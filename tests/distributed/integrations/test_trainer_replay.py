"""ElCheTrainer repeats a run bit for bit on request: every multi-rank run records its split plan in ``output_dir``
(``elche_plan.json``), and ``ElCheArguments(replay_plan=...)`` plays it back instead of El Che's measurements.

With dropout on, a run whose slow rank is rank 1 records its plan; a second run on a machine loaded the other way
(rank 0 slow), replaying that plan, takes the same samples on each rank and ends with bit-identical parameters. The
same second run without the replay measures its own split and ends elsewhere: what the replay changes is what the
check sees.
"""

from __future__ import annotations

import json

import torch
import trainer_runs

CASE = {"model": "seq", "n": 48, "data_seed": 41, "init_seed": 42, "per_device": 4, "ga": 2, "epochs": 2,
        "lr": 3e-3, "warmup": 2, "wd": 0.01, "clip": 1.0, "seed": 43, "dropout": 0.2}


def test_a_recorded_plan_replays_the_run_bit_for_bit(tmp_path):
    first, again, measured = tmp_path / "first", tmp_path / "again", tmp_path / "measured"
    trainer_runs.run(dict(CASE, slow_rows={"1": 0.01}), first, 2)
    plan_file = first / "trainer" / "elche_plan.json"
    plan = json.loads(plan_file.read_text())
    assert plan["world"] == 2 and plan["batch_size"] == 4 and plan["anchors"] == [[0, 2]], plan
    assert any(sizes[0] > sizes[1] for _, sizes in plan["splits"]), plan  # El Che gave the fast rank 0 more
    replay = dict(CASE, slow_rows={"0": 0.01}, elche={"replay_plan": str(plan_file)})
    trainer_runs.run(replay, again, 2)
    assert trainer_runs.seen(again, 2) == trainer_runs.seen(first, 2)
    ours, theirs = trainer_runs.params(again), trainer_runs.params(first)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert json.loads((again / "trainer" / "elche_plan.json").read_text()) == plan  # the replay records itself
    trainer_runs.run(dict(CASE, slow_rows={"0": 0.01}), measured, 2)
    assert trainer_runs.max_diff(trainer_runs.params(measured), theirs) > 1e-4
