"""Builder mode on 2-3 CPU worker processes: the acceptance tests of the six policy x backend combinations,
the fast rank's share under simulated speeds, the divergence guard, checkpoints, and lost workers.

Each test starts real worker processes (gloo for the collective backend). To keep the suite fast on a 2-core
machine, runs use the ``forkserver`` start method (torch is imported once per test session, then workers fork
in milliseconds); the default ``spawn`` start method has its own test, marked slow (two fresh interpreters
importing torch take 5-30 s depending on the machine's load). The training step sleeps a fixed few ms (modeled
device time) so that the SIMULATED speeds [1.0, 0.4], not the shared CPU, decide who is fast.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import builder_toy as toy
import torch

from flodl_hf import ApplyPolicy, AverageBackend, DistributedError, Trainer
from flodl_hf.builder.checkpoint import read_checkpoint

pytestmark = pytest.mark.timeout(240)

FAST_SHARE = 1.0 / 1.4  # speeds [1.0, 0.4]: the fast rank should run 1 / (1 + 0.4) of the batches


def _builder(
    policy: ApplyPolicy,
    backend: AverageBackend,
    *,
    workers: int = 2,
    ms: float = 8.0,
    epochs: int = 3,
    start: str = "forkserver",
):
    return (
        Trainer.builder(toy.tiny_mlp, toy.sgd, toy.modeled(ms))
        .dataset(toy.ToyPoints(1024))
        .batch_size(16)
        .num_epochs(epochs)
        .policy(policy)
        .backend(backend)
        .devices(["cpu"] * workers)
        .anchor(4)
        .timeout(20)
        .progress(False)
        .start_method(start)
    )


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


COMBOS = [(p, b) for p in ApplyPolicy for b in AverageBackend]


@pytest.mark.parametrize(("policy", "backend"), COMBOS, ids=[f"{p.name}-{b.name}" for p, b in COMBOS])
def test_combination_trains_to_accuracy_with_speed_shares(policy, backend, tmp_path):
    b = _builder(policy, backend)
    b.simulate_speeds([1.0, 0.4])
    guard_case = (policy, backend) == (ApplyPolicy.CADENCE, AverageBackend.CPU)
    ckpt_case = policy is ApplyPolicy.ASYNC  # both backends write the averaged model
    if guard_case:
        b.divergence_threshold(1e-6)  # any divergence is "far above": the guard must shrink the anchor
    if ckpt_case:
        b.checkpoint_fn(lambda epoch: tmp_path / f"epoch{epoch}.json")
    handle = b.run()
    assert handle.world_size == 2 and handle.devices == ["cpu", "cpu"]
    metrics = []
    while (m := handle.next_metrics(timeout=180)) is not None:
        metrics.append(m)
    state = handle.join(timeout=60)
    assert [m.epoch for m in metrics] == [0, 1, 2]
    assert all(_gone(pid) for pid in handle.worker_pids)

    assert toy.accuracy(state.load_into(toy.tiny_mlp(torch.device("cpu")))) >= 0.9
    assert state.world_size == 2 and state.lost_ranks == [] and state.rounds >= 1
    for m in metrics:
        assert m.devices == ["cpu", "cpu"] and m.samples == 64 * 16 and m.epoch_ms > 0
        assert sum(m.per_rank_batches) == 64 and abs(sum(m.per_rank_batch_share) - 1.0) < 1e-9
        assert all(t > 0 for t in m.per_rank_throughput)
        assert 0.0 <= m.scalars["acc"] <= 1.0  # record_scalar, aggregated over ranks ...
        assert len(m.per_rank_scalars) == 2 and all(
            "acc" in s for s in m.per_rank_scalars
        )  # ... and per rank
    assert metrics[-1].avg_loss < 0.35  # batch-weighted training loss of a learnt task

    calibrated = metrics[1:]
    fast = sum(m.per_rank_batch_share[0] for m in calibrated) / len(calibrated)
    if policy is ApplyPolicy.SYNC:
        assert all(m.per_rank_batch_share == [0.5, 0.5] for m in metrics)  # equal split, like plain DDP
        assert state.rounds >= 3 * 32  # averaged after every batch
    else:
        assert abs(fast - FAST_SHARE) <= 0.1 * FAST_SHARE, f"fast-rank share {fast:.3f}"
    if guard_case:
        assert min(m.anchor for m in metrics) < 4, [m.anchor for m in metrics]
    if ckpt_case:
        files = sorted(p.name for p in tmp_path.iterdir())
        assert files == [f"epoch{e}.{x}" for e in range(3) for x in ("0.safetensors", "json")]  # no temporaries
        last = read_checkpoint(tmp_path / "epoch2.json")
        assert last["epoch"] == 2 and last["world_size"] == 2
        for k, v in state.state_dict().items():
            assert torch.equal(last["model"][k], v)


def test_cpu_backend_survives_a_killed_worker():
    handle = (
        _builder(ApplyPolicy.CADENCE, AverageBackend.CPU, workers=3, ms=20.0, epochs=4)
        .round_timeout(2.0)
        .run()
    )
    first = handle.next_metrics(timeout=180)
    assert first is not None and first.epoch == 0
    victim = handle.worker_pids[2]
    os.kill(victim, signal.SIGKILL)
    rest = []
    while (m := handle.next_metrics(timeout=120)) is not None:
        rest.append(m)
    state = handle.join(timeout=60)
    assert [m.epoch for m in rest] == [1, 2, 3]  # every epoch still completes
    assert handle.lost_ranks == [2] and state.lost_ranks == [2] and rest[-1].lost_ranks == [2]
    assert rest[-1].per_rank_batches[2] == 0 and sum(rest[-1].per_rank_batches) == 64
    assert toy.accuracy(state.load_into(toy.tiny_mlp(torch.device("cpu")))) >= 0.9
    assert all(_gone(pid) for pid in handle.worker_pids)


def test_collective_backend_fails_fast_on_a_dead_worker():
    handle = _builder(ApplyPolicy.CADENCE, AverageBackend.NCCL, ms=20.0, epochs=6).timeout(5).run()
    assert handle.next_metrics(timeout=180) is not None
    os.kill(handle.worker_pids[1], signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(DistributedError, match=r"worker 1 .*died.*killed by signal 9"):
        handle.join(timeout=60)
    assert time.monotonic() - killed < 15.0
    assert all(_gone(pid) for pid in handle.worker_pids)


def test_worker_exception_fails_the_run_with_its_traceback():
    handle = (
        Trainer.builder(toy.tiny_mlp, toy.sgd, toy.failing_train_fn)
        .dataset(toy.ToyPoints(64))
        .batch_size(16)
        .num_epochs(1)
        .devices(["cpu", "cpu"])
        .backend(AverageBackend.CPU)
        .progress(False)
        .start_method("forkserver")
        .run()
    )
    assert handle.next_metrics(timeout=180) is None
    with pytest.raises(RuntimeError, match="boom in train_fn"):
        handle.join(timeout=60)
    assert all(_gone(pid) for pid in handle.worker_pids)


def test_default_spawn_start_method():
    handle = (
        Trainer.builder(toy.tiny_mlp, toy.sgd, toy.train_fn)
        .dataset(toy.ToyPoints(512))
        .batch_size(16)
        .num_epochs(2)
        .devices(["cpu", "cpu"])
        .progress(False)
        .run()
    )
    state = handle.join(timeout=200)
    assert [m.epoch for m in handle.metrics] == [0, 1]
    assert toy.accuracy(state.load_into(toy.tiny_mlp(torch.device("cpu")))) >= 0.9
    assert all(_gone(pid) for pid in handle.worker_pids)
