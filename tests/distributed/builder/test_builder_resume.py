"""Builder-mode resume (``DdpBuilder.resume_from``) on another number of workers: 2 -> 3 and 2 -> 1 CPU workers.

A run of 2 workers writes a checkpoint per epoch; resuming from epoch 1's continues at epoch 2 (without the batches
of epoch 2 the checkpoint's model already holds, which it lists) with every worker starting from the averaged
model (checked with a zero learning rate: the result is the checkpoint's model), on 3 workers (the coordinator)
and on 1 (the single-device runner), and trains on to the uninterrupted accuracy band.
Real worker processes (``forkserver``, as in ``test_builder_multi``).
"""

from __future__ import annotations

import functools

import pytest
import builder_toy as toy
import torch

from flodl_hf import ApplyPolicy, AverageBackend, Trainer
from flodl_hf.builder.checkpoint import read_checkpoint
from flodl_hf.builder.resume import load_resume_point

pytestmark = pytest.mark.timeout(240)

still = functools.partial(torch.optim.SGD, lr=0.0)


def _builder(workers: int, epochs: int, optim=toy.sgd):
    devices = ["cpu"] * workers
    return (Trainer.builder(toy.tiny_mlp, optim, toy.modeled(2.0)).dataset(toy.ToyPoints(512)).batch_size(16)
            .num_epochs(epochs).policy(ApplyPolicy.CADENCE).backend(AverageBackend.CPU).devices(devices)
            .anchor(4).timeout(20).progress(False).start_method("forkserver"))


def _run(builder) -> tuple:
    handle = builder.run()
    metrics = []
    while (m := handle.next_metrics(timeout=180)) is not None:
        metrics.append(m)
    return handle.join(timeout=60), metrics


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """A 2-worker run that checkpoints every epoch (its epoch-1 file stands for an interrupted run's last)."""
    root = tmp_path_factory.mktemp("builder-resume")
    state, _ = _run(_builder(2, 4).checkpoint_fn(functools.partial(_path, root)))
    return root, state


def _path(root, epoch: int):
    return root / f"epoch{epoch}.json"


@pytest.mark.parametrize("workers", [3, 1])
def test_resume_on_another_worker_count_starts_from_the_averaged_model(first, tmp_path, workers):
    root, _ = first
    saved = read_checkpoint(root / "epoch1.json")
    assert saved["world_size"] == 2 and saved["samples"] == 512 and saved["batch_size"] == 16
    state, metrics = _run(_builder(workers, 4, still).resume_from(root / "epoch1.json")
                          .checkpoint_fn(functools.partial(_path, tmp_path)))
    assert [m.epoch for m in metrics] == [2, 3]  # continues at the next epoch
    # every batch of each remaining epoch, once: the checkpoint's model already holds the batches of epoch 2 that
    # ran before its average (epochs are pipelined), it lists them, and the resumed run skips them
    ahead = saved.get("ahead") or []
    assert all(e == 2 for e, _ in ahead) and len({b for _, b in ahead}) == len(ahead) < 32, ahead
    assert [m.samples for m in metrics] == [(32 - len(ahead)) * 16, 32 * 16]
    for k, v in state.state_dict().items():  # lr 0: every worker started from the checkpoint's model
        assert torch.allclose(v.float(), saved["model"][k].float(), atol=1e-6), k
    record = {"checkpoint": str(root / "epoch1.json"), "epoch": 2, "world_size_before": 2, "world_size_after": workers}
    assert state.resumes == [record] and state.world_size == workers
    assert read_checkpoint(tmp_path / "epoch3.json")["resumes"] == [record]  # kept for the next resume


def test_resumed_run_trains_to_the_uninterrupted_accuracy(first):
    root, full = first
    reference = toy.accuracy(full.load_into(toy.tiny_mlp(torch.device("cpu"))))
    state, metrics = _run(_builder(3, 4).resume_from(root / "epoch1.json"))
    accuracy = toy.accuracy(state.load_into(toy.tiny_mlp(torch.device("cpu"))))
    assert reference >= 0.9 and accuracy >= reference - 0.05, (accuracy, reference)
    assert metrics[-1].avg_loss < 0.35


def test_resume_refuses_what_does_not_fit(tmp_path):
    model = toy.tiny_mlp(torch.device("cpu")).state_dict()
    from flodl_hf.builder.checkpoint import write_checkpoint

    path = write_checkpoint(tmp_path / "e1.json", model, epoch=1, world_size=2, samples=512, batch_size=16)
    point = load_resume_point(path, 512, 16, 4)
    assert (point.first_epoch, point.start_step, point.world_size_before) == (2, 2 * 32, 2)
    with pytest.raises(ValueError, match="epoch 1, and num_epochs=2 ends there: .*raise .num_epochs"):
        load_resume_point(path, 512, 16, 2)
    with pytest.raises(ValueError, match="written with batch_size 16 but this run has 8"):
        load_resume_point(path, 512, 8, 4)
    # the batches of later epochs its model holds: skipped, and the schedule starts after them
    ahead = write_checkpoint(tmp_path / "a1.json", model, epoch=1, world_size=2, samples=512, batch_size=16,
                             ahead=[[2, 0], [2, 5]])
    point = load_resume_point(ahead, 512, 16, 4)
    assert point.ahead == {(2, 0), (2, 5)} and point.start_step == 2 * 32 + 2
    with pytest.raises(ValueError, match=r"lists a batch .*\(\[2, 32\]\)"):
        load_resume_point(write_checkpoint(tmp_path / "b1.json", model, epoch=1, samples=512, batch_size=16,
                                           ahead=[[2, 32]]), 512, 16, 4)
    full = write_checkpoint(tmp_path / "f1.json", model, epoch=1, samples=512, batch_size=16,
                            ahead=[[2, b] for b in range(32)])
    with pytest.raises(ValueError, match="already holds every batch up to num_epochs=3: nothing is left"):
        load_resume_point(full, 512, 16, 3)
    with pytest.raises(ValueError, match="is not a file"):
        load_resume_point(tmp_path / "none.json", 512, 16, 4)
    with pytest.raises(ValueError, match="does not fit the model"):
        _run(Trainer.builder(toy.bn_mlp, toy.sgd, toy.train_fn).dataset(toy.ToyPoints(512)).batch_size(16)
             .num_epochs(3).progress(False).devices(["cpu"]).resume_from(path))
