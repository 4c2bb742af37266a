"""What a loop does to gradients between backward() and graph.step() on N gloo ranks: exact, or refused.

A user-trial found two loops that trained a different model from one process with no sign of it: clipping
``p.grad`` before ``graph.step()`` (a model in one bucket, or ``overlap=False``: nothing checked) and gradient
accumulation done by the loop (``graph.step()`` every K batches). Both are now refused on every rank; two losses
of one batch, each with its own backward, still train exactly like one process.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dist_helpers import run_ranks, values
from flodl_hf import DdpConfig, Graph, Trainer

W, B, N, LR = 2, 4, 48, 0.5


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _data() -> list:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(N, 4, generator=g), torch.randint(0, 3, (N,), generator=g)
    return [(x[i], y[i]) for i in range(N)]


def _collate(items):
    return torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])


def _rank(rank: int, world: int, how: str, overlap: bool):
    graph = Graph(_mlp())
    Trainer.setup_with(graph, lambda dev: _mlp(), lambda ps: torch.optim.SGD(ps, lr=LR),
                       DdpConfig(verbose=False, max_anchor=0, seed=0, timeout_s=60, overlap=overlap))
    graph.set_data_loader(_data(), batch_size=B, collate_fn=_collate)
    for i, (x, y) in enumerate(graph.epoch(0)):
        if how == "clip":
            F.cross_entropy(graph.module(x), y).backward()
            torch.nn.utils.clip_grad_norm_(graph.module.parameters(), 0.05)
        elif how == "scale":
            F.cross_entropy(graph.module(x), y).backward()
            for p in graph.module.parameters():
                p.grad = p.grad * 2.0  # another tensor, not an in-place edit
        elif how == "accumulate":  # the loop's own accumulation over 2 batches
            (F.cross_entropy(graph.module(x), y) / 2).backward()
            if i % 2 == 0:
                continue
        elif how == "two-losses":  # two losses of one batch, two backward passes: they add, as on one device
            F.cross_entropy(graph.module(x), y).backward()
            (0.5 * graph.module(x).pow(2).mean()).backward()
        graph.step()
    graph.close()
    return [p.detach().clone() for p in graph.module.parameters()]


def _one_process_two_losses() -> list:
    from flodl_hf.elche.partition import epoch_permutation

    data, model = _data(), _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    perm, g = epoch_permutation(N, 0), W * B
    for k in range(N // g):
        x, y = _collate([data[int(i)] for i in perm[k * g:(k + 1) * g]])
        F.cross_entropy(model(x), y).backward()
        (0.5 * model(x).pow(2).mean()).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("how,expect", [
    ("clip", "its gradient was changed between backward() and graph.step()"),
    ("scale", "its gradient was changed between backward() and graph.step()"),
    ("accumulate", "graph.step() came after 2 backward passes while 1 more batch(es)"),
])
def test_gradient_edits_and_loop_accumulation_are_refused_on_every_rank(how, expect, overlap):
    results = run_ranks(_rank, W, how, overlap, timeout=90)
    assert all(status == "error" for status, _ in results), results
    for _, message in results:
        assert "DistributedError" in message and expect in message, message
        assert ("DdpConfig(max_grad_norm=...)" in message) == (how != "accumulate"), message


def test_two_losses_of_one_batch_still_equal_one_process():
    reference = _one_process_two_losses()
    for params in values(run_ranks(_rank, W, "two-losses", False, timeout=90)):
        for p, q in zip(params, reference):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
