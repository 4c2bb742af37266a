"""Elastic resume in setup mode: a checkpoint written on N ranks continues on M ranks (2 -> 1, 1 -> 2, 3 -> 2).

What is checked: the interrupted epoch's samples are each trained on exactly once across the two runs (every
rank records the dataset indices of its real samples), the epochs after it are whole permutations on the new
ranks, and the resumed run reaches the uninterrupted run's accuracy band on an easy separable task. Real gloo
ranks on CPU (``dist_helpers``), no mocks.
"""

from __future__ import annotations


import pytest
import torch

from dist_helpers import run_ranks, values
from flodl_hf import DdpConfig, Graph, Trainer
from flodl_hf.checkpoint.graph_state import ResumeError
from flodl_hf.checkpoint.elastic import saved_position
from flodl_hf.job.schedule import LinearSchedule
from flodl_hf.elche.partition import epoch_permutation
from flodl_hf.checkpoint.position import EpochPosition, segment, steps_left

N, BATCH, EPOCHS, SEED = 48, 4, 3, 3


def _data() -> list:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 4, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return [(i, x[i], y[i]) for i in range(N)]  # the dataset returns its index: coverage is recorded


def _collate(items: list) -> tuple:
    return (torch.tensor([i for i, _, _ in items]), torch.stack([x for _, x, _ in items]),
            torch.stack([y for _, _, y in items]))


def _build(dev=None):
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def _train(rank: int, world: int, ckpt: str, stop_after: int | None, resume: bool) -> dict:
    """Train EPOCHS epochs (or stop after ``stop_after`` micro-steps and checkpoint); record what was seen."""
    torch.manual_seed(100 + rank)
    graph = Graph(_build())
    Trainer.setup_with(graph, _build, lambda p: torch.optim.AdamW(p, lr=0.05),
                       DdpConfig(verbose=False, seed=SEED, fixed_anchor=1, timeout_s=60))
    data = _data()
    graph.set_data_loader(data, batch_size=BATCH, collate_fn=_collate)
    if resume:
        graph.load_checkpoint(ckpt)
    start = graph.epoch_position()
    seen: dict[int, list[int]] = {}
    micro = 0
    for epoch in range(EPOCHS):
        for idx, xb, yb in graph.epoch(epoch):
            real = graph._pending[-1][2]  # padding (zero weight) is appended after the real samples
            torch.nn.functional.cross_entropy(graph.module(xb), yb).backward()
            before = graph.training_step
            graph.step()
            seen.setdefault(epoch, []).extend(idx[:real].tolist())
            micro += 1
            if stop_after is not None and micro >= stop_after and graph.training_step != before:
                graph.save_checkpoint(ckpt)
                graph.close()
                return {"seen": seen, "at": graph.epoch_position()}
    graph.close()
    with torch.no_grad():
        x = torch.stack([d[1] for d in data])
        y = torch.stack([d[2] for d in data])
        out = graph.module(x)
        loss = float(torch.nn.functional.cross_entropy(out, y))
        acc = float((out.argmax(1) == y).float().mean())
    return {"seen": seen, "start": start, "acc": acc, "loss": loss,
            "params": [p.detach().clone() for p in graph.module.parameters()]}


def _on(world: int, *args) -> list[dict]:
    return [_train(0, 1, *args)] if world == 1 else values(run_ranks(_train, world, *args, timeout=180))


@pytest.mark.parametrize("before,after,stop_after", [(2, 1, 9), (1, 2, 15), (3, 2, 5)])
def test_setup_mode_resume_on_another_device_count(tmp_path, before, after, stop_after):
    ckpt = str(tmp_path / "ckpt")
    first = _on(before, ckpt, stop_after, False)
    at = first[0]["at"]
    assert at.epoch == 1 and 0 < at.samples < at.end == N  # interrupted mid-epoch 1
    rest = _on(after, ckpt, None, True)
    assert rest[0]["start"] == at
    for epoch in range(EPOCHS):
        seen = [i for run in (first, rest) for r in run for i in r["seen"].get(epoch, [])]
        assert sorted(seen) == sorted(epoch_permutation(N, SEED + epoch).tolist()), epoch  # exactly once each
    # the resumed epoch starts at the recorded sample: the first run saw exactly the permutation's first positions
    done = [i for r in first for i in r["seen"][1]]
    assert sorted(done) == sorted(epoch_permutation(N, SEED + 1)[:at.samples].tolist())
    for r in rest[1:]:  # identical replicas after the resume
        assert all(torch.equal(a, b) for a, b in zip(rest[0]["params"], r["params"]))
    full = _train(0, 1, ckpt + "-unused", None, False)  # the uninterrupted run (one device)
    assert full["acc"] >= 0.9 and rest[0]["acc"] >= full["acc"] - 0.06, (full["acc"], rest[0]["acc"])
    assert rest[0]["loss"] < 0.35, rest[0]["loss"]


def test_segment_continues_at_the_recorded_sample():
    # 1 -> 2 ranks: 12 of 48 samples done with a global batch of 4; the rest in steps of 8, the last one partial
    at = EpochPosition(epoch=1, steps=3, samples=12, end=48)
    seg = segment(1, at, 48, 8, drop_last=True)
    assert (seg.start, seg.end, seg.steps, seg.partial_last) == (12, 48, 5, True)
    assert [seg.window_end(j) for j in range(5)] == [False, False, False, True, True]  # partial: its own window
    assert seg.position(5) == EpochPosition(1, 8, 48, 48) and seg.position(5).finished
    assert segment(0, at, 48, 8, True) is None and segment(2, at, 48, 8, True).start == 0
    assert steps_left(at, 3, 48, 8, True) == 5 + 6
    # a fresh epoch is the usual plan: drop_last fixes its end at the last whole global batch
    assert segment(0, None, 50, 8, True).end == 48 and segment(0, None, 50, 8, False).steps == 7
    assert steps_left(None, 2, 50, 8, False) == 14


def test_older_step_positions_are_read_with_the_batch_they_were_written_with():
    state = {"position": (1, 3), "plan": {"world_size": 2, "batch_size": 4, "seed": 0}}
    assert saved_position(state, 48, True) == EpochPosition(1, 3, 24, 48)
    assert saved_position(dict(state, epoch_position={"epoch": 1, "steps": 3, "samples": 20, "end": 48}), 48,
                          True).samples == 20
    with pytest.raises(ValueError, match="samples=50 past its end=48"):
        EpochPosition.from_state({"epoch": 1, "steps": 3, "samples": 50, "end": 48})


def test_one_device_resume_keeps_the_position_in_samples(tmp_path):
    out = _train(0, 1, str(tmp_path / "c"), 15, False)
    assert out["at"] == EpochPosition(1, 3, 12, 48)
    graph = Graph(_build())
    Trainer.setup_with(graph, _build, lambda p: torch.optim.AdamW(p, lr=0.05), DdpConfig(verbose=False, seed=SEED))
    graph.set_data_loader(_data(), batch_size=BATCH, collate_fn=_collate)
    graph.load_checkpoint(tmp_path / "c")
    assert graph.position() == (1, 3) and graph.steps_remaining(EPOCHS) == 9 + 12
    assert len(graph.plan(0)) == 0 and len(graph.plan(1)) == 9
    graph.set_data_loader(_data()[:40], batch_size=BATCH, collate_fn=_collate)
    with pytest.raises(ResumeError, match="covers 48 samples but this dataset has 40"):
        graph.load_checkpoint(tmp_path / "c")


def test_linear_schedule_continues_over_another_number_of_steps():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = LinearSchedule(optimizer, total=100, warmup_ratio=0.1)
    for _ in range(40):
        schedule.step()
    lr = optimizer.param_groups[0]["lr"]
    schedule.continue_over(120)  # 60 steps were left; twice as many on half the devices
    assert optimizer.param_groups[0]["lr"] == pytest.approx(lr)
    for _ in range(119):
        schedule.step()
    assert optimizer.param_groups[0]["lr"] > 0
    schedule.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-9)  # ends on the last micro-step
    same = LinearSchedule(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), 10, 0.0)
    same.done = 4
    same.continue_over(6)
    assert same.state_dict() == {"total": 10, "warmup": 0, "done": 4, "base_lrs": [1.0]}  # nothing to rescale
