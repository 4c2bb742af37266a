"""Running ``trainer_script.py`` under torchrun and as the one-process reference, for the integration's tests."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import torch

from dist_helpers import launch_env
from flodl_hf.distributed.launch import free_port
from warm_python import python_command, torchrun_command

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).with_name("trainer_script.py")


env = launch_env  # a launch's environment: this checkout first, offline, one thread, no launcher variables


def split_setting(rng, world: int, unit: int) -> dict:
    """The El Che split of a seeded random case, drawn from ``rng``: pinned (a random cut of the global micro-batch
    ``unit``), a speed hint, or measured (one rank made slower: ``slow``)."""
    how = rng.choice(["pinned", "hint", "measured"])
    if how == "pinned":
        cut = sorted(rng.sample(range(1, unit), world - 1))
        return {"elche": {"batch_sizes": [b - a for a, b in zip([0] + cut, cut + [unit])]}}
    if how == "hint":
        return {"elche": {"speed_hint": [rng.randrange(world), rng.choice([2.0, 3.5])]}}
    return {"slow": {str(rng.randrange(world)): 0.03}}


def run(case: dict | list, out: Path, world: int, timeout: float = 300,
        expect: int = 0) -> subprocess.CompletedProcess:
    """``case`` under ``torchrun --nproc-per-node world`` (ElCheTrainer), or one process (``world=0``) when it has
    ``orders`` (the reference). ``case`` may be a list of ``(case, out_dir)``: all run in turn in one launch."""
    out.mkdir(parents=True, exist_ok=True)
    spec = [[c, str(o)] for c, o in case] if isinstance(case, list) else case
    (out / "case.json").write_text(json.dumps(spec))
    if world == 0:
        cmd = python_command(str(SCRIPT), str(out / "case.json"), str(out))
    else:
        cmd = torchrun_command(["--nproc-per-node", str(world), "--master-port", str(free_port())],
                               str(SCRIPT), str(out / "case.json"), str(out))
    proc = subprocess.run(cmd, check=False, env=env(), cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert (proc.returncode == 0) == (expect == 0), proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def seen(out: Path, world: int) -> list[list[list[int]]]:
    """Each rank's micro-batches in order, as the collator recorded them (lists of dataset indices)."""
    return [[json.loads(line) for line in (out / f"seen_{r}.jsonl").read_text().splitlines()] for r in range(world)]


def windows_order(case: dict, micro: list[list[list[int]]], unit: int) -> list[list[int]]:
    """Per epoch, the union of every rank's micro-batches, micro-batch by micro-batch (the concatenated windows).

    A rank with nothing of a short micro-batch runs one repeated sample at weight 0; the union drops the repeat."""
    n = case["n"]
    per_epoch = n // unit if case.get("drop_last") else math.ceil(n / unit)
    assert all(len(m) == per_epoch * case["epochs"] for m in micro), [len(m) for m in micro]
    orders = []
    for epoch in range(case["epochs"]):
        order: list[int] = []
        for k in range(epoch * per_epoch, (epoch + 1) * per_epoch):
            union: list[int] = []
            for rank_batches in micro:
                union += [i for i in rank_batches[k] if i not in union]
            order += union
        orders.append(order)
    return orders


def params(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "params.pt")


def log(out: Path) -> list[dict]:
    return json.loads((out / "log.json").read_text())


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def tensorboard_tags(out: Path) -> set[str]:
    """The scalar tags Trainer's TensorBoard callback wrote under ``out``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for events in out.rglob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    return tags
