"""Builder mode across machines: two real ``torchrun`` agents (``--nnodes 2``, one process each, gloo on CPU) on
localhost run ``tests/builder_torchrun_job.py``, judged from outside.

Each policy trains every batch of every epoch exactly once (from the workers' own logs); SYNC with AdamW and weight
decay equals the one-process reference to 1e-5. Killing one node's agent mid-epoch makes the other node exit with
one line naming the lost rank within 30 s, the killed node's worker does not outlive its agent, and a re-launch on
one node resumes from the last builder checkpoint with every remaining batch exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import builder_exact_helpers as ex
import pytest
import torch

from flodl_hf.elche.partition import epoch_permutation

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[3]
JOB = REPO / "tests" / "builder_torchrun_job.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agent(node: int, nnodes: int, nproc: int, port: int, out: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node-rank", str(node),
           "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port),
           str(JOB), str(out), *args]
    log = open(out.parent / f"{out.name}.agent{node}.log", "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)


def _logged(out: Path) -> list[tuple[int, ...]]:
    batches = []
    for f in sorted(out.glob("rank*.jsonl")):
        batches += [tuple(json.loads(line)) for line in f.read_text().splitlines() if line.strip()]
    return batches


def _which(batches: list[tuple[int, ...]], n: int, batch: int, epochs: range) -> Counter:
    """Each logged batch as its (epoch, index in epoch), by its samples (the epoch's permutation, seed 0)."""
    where = {}
    for e in epochs:
        perm = epoch_permutation(n, e).tolist()
        for b in range(n // batch):
            where[tuple(sorted(perm[b * batch:(b + 1) * batch]))] = (e, b)
    got = Counter()
    for ids in batches:
        got[where.get(ids, ("unknown", ids))] += 1
    return got


@pytest.mark.parametrize("policy", ["SYNC", "CADENCE", "ASYNC"])
def test_two_torchrun_nodes_train_every_batch_once_and_sync_equals_one_process(tmp_path, policy):
    n, batch, epochs = 96, 8, 2
    out = tmp_path / "run"
    port = _port()
    agents = [_agent(node, 2, 1, port, out, "--policy", policy, "--epochs", str(epochs), "--samples", str(n))
              for node in (0, 1)]
    codes = [a.wait(timeout=240) for a in agents]
    logs = [(tmp_path / f"run.agent{i}.log").read_text() for i in (0, 1)]
    assert codes == [0, 0], logs
    got = _which(_logged(out), n, batch, range(epochs))
    want = Counter({(e, b): 1 for e in range(epochs) for b in range(n // batch)})
    assert got == want, (got - want, want - got)
    meta = json.loads((out / "metrics.json").read_text())
    assert meta["world"] == 2 and meta["devices"] == ["cpu", "cpu"]
    assert meta["global_step"] == epochs * n // batch
    from safetensors.torch import load_file

    state = load_file(str(out / "state.safetensors"))
    if policy == "SYNC":
        reference = ex.reference_sync(n, batch, epochs, 2, None)["state"]
        assert sorted(state) == sorted(reference)
        for key in reference:
            torch.testing.assert_close(state[key], reference[key], rtol=1e-5, atol=1e-6, msg=key)
    else:
        model = ex.make_model(torch.device("cpu"))
        model.load_state_dict(state)
        data = ex.Indexed(512, seed=7)
        accuracy = float((model(data.x).argmax(1) == data.y).float().mean())
        assert accuracy > 0.8, accuracy  # an easy linear rule: one process reaches about 0.95 in 2 epochs


def test_a_lost_node_stops_the_other_with_one_line_and_a_relaunch_resumes(tmp_path):
    n, batch, epochs = 96, 8, 3
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    port = _port()
    common = ["--policy", "SYNC", "--epochs", str(epochs), "--samples", str(n), "--ckpt", str(ckpt), "--slow-ms", "150"]
    agents = [_agent(node, 2, 1, port, out, *common, "--mark-after", "9") for node in (0, 1)]
    marker = out / "started1.json"
    deadline = time.monotonic() + 180
    while not marker.exists() or not marker.read_text().strip():
        assert time.monotonic() < deadline and agents[0].poll() is None, "the run never reached epoch 1"
        time.sleep(0.1)
    worker = json.loads(marker.read_text())
    assert (ckpt / "epoch0.json").exists()  # rank 1's 9th batch is in epoch 1 (6 batches each per epoch)
    killed = time.monotonic()
    os.kill(agents[1].pid, signal.SIGKILL)  # the node's agent, not its worker: the worker must notice
    code = agents[0].wait(timeout=60)
    latency = time.monotonic() - killed
    agents[1].wait(timeout=10)
    log0 = (tmp_path / "run.agent0.log").read_text()
    lines = [line for line in log0.splitlines() if line.startswith("flodl-hf builder:")]
    assert code != 0 and latency <= 30.0, (code, latency, log0[-3000:])
    assert len(lines) == 1 and "lost rank 1" in lines[0], log0[-3000:]
    time.sleep(2.0)
    try:  # the killed agent's worker exits on its own (its parent is gone): no orphan keeps training
        os.kill(worker["pid"], 0)
        orphan = True
    except ProcessLookupError:
        orphan = False
    assert not orphan, f"worker pid {worker['pid']} outlived its agent"

    done = set(_logged(out))
    resumed = tmp_path / "resumed"
    relaunch = _agent(0, 1, 2, _port(), resumed, "--policy", "SYNC", "--epochs", str(epochs), "--samples", str(n),
                      "--resume", str(ckpt / "epoch0.json"))
    assert relaunch.wait(timeout=240) == 0, (tmp_path / "resumed.agent0.log").read_text()[-3000:]
    from flodl_hf.builder.checkpoint import read_checkpoint

    ahead = {tuple(x) for x in read_checkpoint(str(ckpt / "epoch0.json")).get("ahead") or []}
    got = _which(_logged(resumed), n, batch, range(1, epochs))
    for e, b in ahead:
        got[(e, b)] += 1
    want = Counter({(e, b): 1 for e in range(1, epochs) for b in range(n // batch)})
    assert got == want, (got - want, want - got)
    assert done  # the first run did train before it was stopped
