"""``benchmarks/trainer_elche.py`` runs end to end in its smallest setting and reports both trainers.

One round of the 1.0/0.4 case, 4 steps of a 1-layer BERT of hidden size 32 on 2 gloo ranks, Trainer-DDP and
ElCheTrainer each under its own torchrun: both runs' samples/s, El Che's split and the ratio come out on stdout and
in results.json / table.md. No assertion on the ratio: a timing test on a shared machine must not assert speed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import trainer_runs
from warm_python import python_command


ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks" / "trainer_elche.py"


def test_smallest_run_reports_both_trainers_and_the_ratio(tmp_path):
    env = trainer_runs.env()
    cmd = python_command(str(BENCH), "--rounds", "1", "--case", "1.0/0.4", "--steps", "4", "--warmup", "2",
                         "--per-device", "4", "--layers", "1", "--hidden", "32", "--vocab", "64", "--seq-len", "8",
                         "--ms-per-sample", "1", "--logging-steps", "1", "--job-timeout", "240", "--output",
                         str(tmp_path))
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    said = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, said
    assert "round 0 1.0/0.4: Trainer-DDP" in proc.stdout and "| ratio " in proc.stdout, said
    result = json.loads((tmp_path / "results.json").read_text())
    (got,) = result["rounds"]
    for job in ("Trainer-DDP", "ElCheTrainer"):
        assert got[job]["samples_per_s"] > 0 and got[job]["timed_steps"] == 4 - 2, (job, got[job], said)
        assert [r["rank"] for r in got[job]["ranks"]] == [0, 1], (job, got[job])
    split = [r["samples_per_step"] for r in got["ElCheTrainer"]["ranks"]]
    assert sum(split) == pytest.approx(2 * 4), split  # every step's global micro-batch, split over the ranks
    assert any("elche_share_0" in entry for entry in got["ElCheTrainer"]["logs"]), got["ElCheTrainer"]["logs"]
    assert got["ratio"] == pytest.approx(got["ElCheTrainer"]["samples_per_s"] / got["Trainer-DDP"]["samples_per_s"])
    assert "| **1.0/0.4** | median |" in (tmp_path / "table.md").read_text()
