"""ElCheTrainer's ``eval_loss`` equals one Trainer process's on the same rows (differential, seeded random cases).

Trainer's ``compute_loss`` multiplies a loss by the number of processes whenever it passes ``num_items_in_batch``
(to cancel DDP's mean in training); a model that takes ``**kwargs`` but computes its own mean (BERT's sequence
classification) then reports W times its loss in evaluation, where no gradient is averaged. ElCheTrainer evaluates
each batch as one process does: the batch's own item count, no factor.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

import trainer_runs
from flodl_hf.distributed.launch import free_port
from warm_python import python_command, torchrun_command

SCRIPT = Path(__file__).with_name("trainer_eval.py")


def _cases(world: int, count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        batch = rng.randint(1, 5)
        cases.append({"model": rng.choice(("seq", "token")), "n": world * batch * rng.randint(1, 4),
                      "data_seed": rng.randrange(10_000), "init_seed": rng.randrange(10_000),
                      "max_len": rng.randint(3, 12), "mask": rng.choice((0.0, 0.3, 0.6)), "eval_batch": batch,
                      "average_tokens": rng.random() < 0.75, "loss_func": rng.random() < 0.3})
    return cases


def _losses(cases: list[dict], out: Path, world: int) -> list[float]:
    out.mkdir(parents=True)
    (out / "cases.json").write_text(json.dumps(cases))
    args = [str(SCRIPT), str(out / "cases.json"), str(out / "losses.json")]
    if world:
        cmd = torchrun_command(["--nproc-per-node", str(world), "--master-port", str(free_port())], *args)
    else:
        cmd = python_command(*args)
    proc = subprocess.run(cmd, env=trainer_runs.env(), cwd=trainer_runs.ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "losses.json").read_text())


@pytest.mark.parametrize("world", [2, 3])
def test_eval_loss_equals_one_process(tmp_path, world):
    cases = _cases(world, 8, seed=world)
    reference = _losses(cases, tmp_path / "one", 0)
    elche = _losses(cases, tmp_path / "elche", world)
    for case, want, got in zip(cases, reference, elche):
        assert got == pytest.approx(want, rel=1e-5), (case, want, got)
