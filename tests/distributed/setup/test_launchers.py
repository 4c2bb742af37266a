"""The README quickstart under every launcher: flodl-hf's own, torchrun, two simulated nodes, accelerate launch.

Each run is a real subprocess tree with real gloo ranks; the test checks that every rank ends with the same
parameter fingerprint and that failures end the whole job with an error instead of hanging.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

import tiny_models
from dist_helpers import accelerate_launch, launch_env
from flodl_hf.distributed.launch import free_port
from warm_python import python_command, torchrun_command

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "examples" / "quickstart.py"
FINGERPRINT = re.compile(r"rank (\d+)/(\d+) steps (\d+) loss \S+ fingerprint ([0-9a-f]+)")


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory):
    base = tmp_path_factory.mktemp("launch")
    model = base / "tinybert"
    tiny_models.make_checkpoint("bert", model, with_classifier=False)
    data = base / "toy.csv"
    with data.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        writer.writerows(tiny_models.toy_task(128, seed=0))
    return ["--model", str(model), "--data", str(data), "--rows", "128", "--batch-size", "8"]


_env = launch_env


def _run(cmd: list[str], env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _fingerprints(*outputs: str, world: int) -> dict[int, str]:
    found = {}
    for out in outputs:
        for rank, size, _, digest in FINGERPRINT.findall(out):
            assert int(size) == world
            found[int(rank)] = digest
    assert sorted(found) == list(range(world)), outputs
    assert len(set(found.values())) == 1, found  # every replica bit-identical
    return found


def test_plain_python_starts_the_other_ranks(tiny_job):
    proc = _run(python_command(str(QUICKSTART), *tiny_job, "--devices", "cpu,cpu"), _env())
    assert proc.returncode == 0, proc.stderr
    _fingerprints(proc.stdout, world=2)
    assert "flodl-hf: 2 ranks (homogeneous, gloo)" in proc.stderr


def test_devices_environment_variable(tiny_job):
    proc = _run(python_command(str(QUICKSTART), *tiny_job), _env(FLODL_HF_DEVICES="cpu,cpu"))
    assert proc.returncode == 0, proc.stderr
    _fingerprints(proc.stdout, world=2)


def test_torchrun_two_processes(tiny_job):
    cmd = torchrun_command(["--nproc-per-node", "2", "--master-port", str(free_port())], str(QUICKSTART), *tiny_job)
    proc = _run(cmd, _env())
    assert proc.returncode == 0, proc.stderr
    _fingerprints(proc.stdout, world=2)


def test_two_nodes_on_localhost(tiny_job):
    port = str(free_port())
    env = _env()
    procs = [subprocess.Popen(torchrun_command(["--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
                                                "--master-addr", "127.0.0.1", "--master-port", port],
                                               str(QUICKSTART), *tiny_job), env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    _fingerprints(*(o[0] for o in outs), world=2)


def test_accelerate_launch_two_cpu_processes(tiny_job):
    cmd = python_command(*accelerate_launch(2), str(QUICKSTART), *tiny_job)
    proc = _run(cmd, _env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    _fingerprints(proc.stdout, world=2)


FAILING = """
import sys, torch
sys.path.insert(0, {root!r})
from flodl_hf import DdpConfig, Graph, Trainer
graph = Graph(torch.nn.Linear(4, 2))
Trainer.setup_with(graph, lambda dev: torch.nn.Linear(4, 2), lambda p: torch.optim.SGD(p, lr=0.1),
                   DdpConfig(devices=["cpu", "cpu"], timeout_s=30))
for step in range(50):
    if graph.rank == 1 and step == 5:
        raise RuntimeError("injected failure on rank 1")
    graph.module(torch.randn(8, 4)).sum().backward()
    graph.step()
print("finished", graph.rank)
"""


def test_a_failing_rank_ends_the_job(tmp_path):
    script = tmp_path / "failing.py"
    script.write_text(FAILING.format(root=str(ROOT)))
    start = time.monotonic()
    proc = _run(python_command(str(script)), _env(), timeout=120)
    assert time.monotonic() - start < 90
    assert proc.returncode != 0
    assert "injected failure on rank 1" in proc.stderr
    assert "rank 1 failed" in proc.stderr
    assert "finished 0" not in proc.stdout


ORPHANED = """
import os, signal, sys, time, torch
sys.path.insert(0, {root!r})
from flodl_hf import DdpConfig, Graph, Trainer
graph = Graph(torch.nn.Linear(4, 2))
Trainer.setup_with(graph, lambda dev: torch.nn.Linear(4, 2), lambda p: torch.optim.SGD(p, lr=0.1),
                   DdpConfig(devices=["cpu", "cpu"], timeout_s=120))
print("ready", graph.rank, os.getpid(), os.getppid(), flush=True)
if graph.rank == 0:
    time.sleep(2.5)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(1.5)
print("alive", graph.rank, flush=True)  # rank 0 is still there: rank 1 has not taken itself for orphaned
time.sleep(120)
"""


def test_a_rank_started_through_an_interpreter_that_forks_exits_when_rank_0_is_killed(tmp_path):
    # The warm interpreter's stand-in forks: rank 1 is not rank 0's child, so only watching rank 0's own process
    # (not the parent process id) notices that rank 0 is gone.
    script = tmp_path / "orphaned.py"
    script.write_text(ORPHANED.format(root=str(ROOT)))
    start = time.monotonic()
    proc = _run(python_command(str(script)), _env(), timeout=100)
    assert time.monotonic() - start < 60  # rank 1 would sleep 120 s
    ready = {rank: (pid, parent) for rank, pid, parent in
             (line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("ready "))}
    assert sorted(ready) == ["0", "1"], (proc.stdout, proc.stderr[-2000:])
    assert ready["1"][1] != ready["0"][0]  # rank 1 is not rank 0's child
    assert "alive 1" in proc.stdout, proc.stderr[-2000:]
    assert f"flodl-hf: rank 1: rank 0 (pid {ready['0'][0]}) is gone; exiting" in proc.stderr
