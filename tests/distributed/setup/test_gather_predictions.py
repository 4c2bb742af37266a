"""``graph.gather_predictions`` and a loop's own sampler on real gloo ranks, against one process.

Every rank gets every row's prediction in dataset order, equal to the plain evaluation loop of one process, for
row counts that do not divide by the world size, batch sizes larger and smaller than a rank's slice, tensor and
per-row list outputs; each rank evaluates only its slice. Ranks whose samplers disagree are stopped at the first
window end, before any update.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import RandomSampler

from dist_helpers import run_ranks, values
from flodl_hf import DdpConfig, Graph, Trainer


def _net(dev=None) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Dropout(0.5))


def _rows(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return [torch.randn(4, generator=g) for _ in range(n)]


def _predict_rank(rank: int, world: int, cases: list[tuple[int, int]]) -> list:
    graph = Graph(_net())
    Trainer.setup_with(graph, _net, lambda ps: torch.optim.SGD(ps, lr=0.1), DdpConfig(verbose=False, timeout_s=60))
    out = []
    for n, batch in cases:
        seen: list[int] = []

        def predict(rows: torch.Tensor) -> torch.Tensor:
            seen.append(len(rows))
            return graph.module(rows)

        stacked = graph.gather_predictions(_rows(n), predict, batch, collate_fn=torch.stack)
        ragged = graph.gather_predictions(list(range(n)), lambda ids: [list(range(i % 3)) for i in ids], batch)
        out.append((stacked, ragged, sum(seen), graph.module.training))
    graph.close()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_gets_one_process_predictions_in_order(world):
    rng = random.Random(world)
    cases = [(rng.randint(1, 23), rng.randint(1, 9)) for _ in range(6)] + [(world - 1, 2)]
    model = _net().eval()
    results = values(run_ranks(_predict_rank, world, cases))
    for rank, per_rank in enumerate(results):
        for (n, _), (stacked, ragged, evaluated, training) in zip(cases, per_rank):
            with torch.no_grad():
                want = torch.stack([model(r) for r in _rows(n)])
            assert torch.allclose(stacked, want, atol=1e-6), (rank, n)
            assert ragged == [list(range(i % 3)) for i in range(n)]
            assert evaluated <= -(-n // world)  # its own slice only
            assert training  # train mode restored


def _sampler_rank(rank: int, world: int) -> str:
    graph = Graph(_net())
    Trainer.setup_with(graph, _net, lambda ps: torch.optim.SGD(ps, lr=0.1), DdpConfig(verbose=False, timeout_s=30))
    data = _rows(16)
    sampler = RandomSampler(data, generator=torch.Generator().manual_seed(rank))  # seeded differently: wrong
    graph.set_data_loader(data, batch_size=2, collate_fn=torch.stack, sampler=sampler)
    before = [p.detach().clone() for p in graph.module.parameters()]
    try:
        for x in graph.epoch(0):
            graph.module(x).sum().backward()
            graph.step()
    except Exception as exc:  # noqa: BLE001 - the refusal is the result
        unchanged = all(torch.equal(a, b) for a, b in zip(before, graph.module.parameters()))
        return f"{type(exc).__name__}: {exc} | unchanged={unchanged}"
    return "trained"


def test_ranks_whose_samplers_disagree_are_stopped_before_any_update():
    for status, message in run_ranks(_sampler_rank, 2):
        assert "DistributedError" in message and "sampler orders" in message and "unchanged=True" in message, message
