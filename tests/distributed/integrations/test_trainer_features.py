"""Trainer features under ElCheTrainer on 2 gloo ranks: evaluation at steps, checkpoints with El Che's state,
``save_total_limit`` rotation and ``load_best_model_at_end`` (both ranks end on the same best weights)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import trainer_runs

from flodl_hf.distributed.launch import free_port
from warm_python import torchrun_command


LINE = re.compile(r"rank (\d) best (\S+) metric (\S+) digest ([0-9a-f]+)")


def test_eval_rotation_and_best_model_at_end(tmp_path):
    out = tmp_path / "run"
    cmd = torchrun_command(["--nproc-per-node", "2", "--master-port", str(free_port())],
                           str(Path(__file__).with_name("trainer_best.py")), str(out))
    proc = subprocess.run(cmd, check=False, env=trainer_runs.env(), cwd=trainer_runs.ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = {int(m[0]): m[1:] for m in LINE.findall(proc.stdout)}
    assert sorted(found) == [0, 1] and found[0] == found[1], found  # same best checkpoint and weights on both
    best = Path(found[0][0])
    kept = sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))
    assert len(kept) == 2 and best.name in kept, kept  # save_total_limit=2 keeps the best and the last
    for name in kept:
        assert (out / name / "elche_trainer.json").is_file() and (out / name / "model.safetensors").is_file()
