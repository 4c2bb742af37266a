"""Checkpoint / resume: exact continuation on CPU, survival of SIGKILL mid-write, clear errors on misfits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import tiny_models
from dist_helpers import run_ranks, values
from flodl_hf import DdpConfig, Graph, Trainer
from flodl_hf.checkpoint.graph_state import ResumeError
from heads import AutoHeadForSequenceClassification

ROOT = Path(__file__).resolve().parents[3]


def _head(num_labels: int = 2):
    torch.manual_seed(0)
    config = tiny_models.tiny_config("bert", num_labels=num_labels)  # dropout stays on: RNG must be restored
    head = AutoHeadForSequenceClassification.from_config(config, tokenizer=tiny_models.tiny_tokenizer("bert"))
    Trainer.setup_head_with(head, lambda dev: AutoHeadForSequenceClassification.on_device(config, num_labels, dev),
                            lambda p: torch.optim.AdamW(p, lr=1e-3), DdpConfig(verbose=False, seed=3))
    graph = head.graph()
    graph.set_scheduler(torch.optim.lr_scheduler.LambdaLR(graph.optimizer, lambda s: 1.0 / (1 + 0.1 * s)))
    graph.set_data_loader(tiny_models.toy_task(64, seed=1), batch_size=8, collate_fn=head.collate)
    return head, graph


def _train(head, graph, epochs: int, stop_after: int | None = None, ckpt: Path | None = None) -> list[float]:
    losses = []
    for epoch in range(epochs):
        for enc, labels in graph.epoch(epoch):
            loss = head.compute_loss(enc, labels)
            loss.backward()
            graph.step()
            losses.append(loss.item())
            if stop_after is not None and graph.training_step == stop_after:
                graph.save_checkpoint(ckpt)
                return losses
    return losses


def test_resume_reproduces_the_uninterrupted_losses(tmp_path):
    full = _train(*_head(), epochs=3)
    first = _train(*_head(), epochs=3, stop_after=11, ckpt=tmp_path)  # mid-epoch 1 (8 steps per epoch)
    torch.manual_seed(12345)  # a resumed process starts with other RNG state
    head, graph = _head()
    graph.load_checkpoint(tmp_path)
    assert graph.training_step == 11 and graph.position() == (1, 3)
    rest = _train(head, graph, epochs=3)
    assert first + rest == full  # exactly, float for float


def test_incompatible_checkpoints_are_refused(tmp_path):
    head, graph = _head()
    _train(head, graph, epochs=1, stop_after=2, ckpt=tmp_path)
    _, other = _head(num_labels=3)
    with pytest.raises(ResumeError, match="does not fit this model.*classifier"):
        other.load_checkpoint(tmp_path)
    _, graph2 = _head()
    graph2.set_data_loader(tiny_models.toy_task(64, seed=1), batch_size=4, collate_fn=head.collate)
    with pytest.raises(ResumeError, match="batch_size 8 but this run uses 4"):
        graph2.load_checkpoint(tmp_path)
    with pytest.raises(ResumeError, match="no checkpoint at"):
        graph2.load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ResumeError, match="unreadable"):
        graph2.load_checkpoint(tmp_path / "junk")


WRITER = """
import sys, torch
sys.path.insert(0, {root!r})
from flodl_hf import DdpConfig, Graph, Trainer
build = lambda dev=None: torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 512))
graph = Graph(build())
Trainer.setup_with(graph, build, lambda p: torch.optim.Adam(p, lr=1e-3), DdpConfig(verbose=False))
step = 0
while True:
    graph.module(torch.randn(4, 512)).sum().backward()
    graph.step()
    graph.save_checkpoint({out!r})
    print(graph.training_step, flush=True)
"""


@pytest.mark.parametrize("delay", [0.7, 1.3, 2.1])
def test_sigkill_during_a_write_leaves_a_loadable_checkpoint(tmp_path, delay):
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=str(ROOT), out=str(tmp_path / "ckpt")))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # one checkpoint is complete
    assert first.strip() == "1"
    time.sleep(delay)  # ~6 MB of weights + Adam state per write: the kill lands at a random point of one
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    written = [int(x) for x in [first] + proc.stdout.read().split()]
    build = lambda dev=None: torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 512))  # noqa
    graph = Graph(build())
    Trainer.setup_with(graph, build, lambda p: torch.optim.Adam(p, lr=1e-3), DdpConfig(verbose=False))
    graph.load_checkpoint(tmp_path / "ckpt")
    assert graph.training_step in (written[-1], written[-1] + 1)  # the last reported one, or one just finished
    own = {"checkpoint.json", "checkpoint.0.safetensors", "checkpoint.1.safetensors"}
    leftovers = [p.name for p in (tmp_path / "ckpt").iterdir() if p.name not in own]
    assert all(name.endswith(".tmp") for name in leftovers)  # at most a temp file, never a torn checkpoint


def _ranked_resume(rank: int, world: int, ckpt: str, phase: str):
    torch.manual_seed(rank)

    def build(dev=None):
        torch.manual_seed(5)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 2))

    graph = Graph(build())
    Trainer.setup_with(graph, build, lambda p: torch.optim.AdamW(p, lr=1e-2),
                       DdpConfig(verbose=False, batch_sizes=[5, 3], anchor=2, freeze_plan=True, timeout_s=60))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 4, generator=g)
    y = (x[:, 0] > 0).long()
    graph.set_data_loader(list(zip(x, y)), batch_size=4,
                          collate_fn=lambda it: (torch.stack([a for a, _ in it]), torch.stack([b for _, b in it])))
    if phase == "resume":
        graph.load_checkpoint(ckpt)
    for epoch in range(2):
        for xb, yb in graph.epoch(epoch):
            torch.nn.functional.cross_entropy(graph.module(xb), yb).backward()
            graph.step()
            if phase == "first" and graph.training_step == 3 and graph._runtime.pending_micro_batches() == 0:
                graph.save_checkpoint(ckpt)
    return [p.detach() for p in graph.module.parameters()]


def test_two_rank_resume_matches_the_uninterrupted_run(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    full = values(run_ranks(_ranked_resume, 2, ckpt, "first"))
    resumed = values(run_ranks(_ranked_resume, 2, ckpt, "resume"))
    for a, b in zip(full[0], resumed[0]):
        assert torch.equal(a, b)
    for a, b in zip(resumed[0], resumed[1]):
        assert torch.equal(a, b)
