"""A loop's own sampler in ``graph.set_data_loader(..., sampler=...)``: on one device each epoch's batches are the
ones a ``DataLoader`` over that sampler gives (differential, seeded random cases); a sampler that does not yield
every row once is refused; and ``graph.gather_predictions`` on one device is the plain evaluation loop."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

from flodl_hf import Graph
from flodl_hf.distributed.predictions import shard_bounds


def _sampler(data: list, seed: int) -> RandomSampler:
    return RandomSampler(data, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seed", range(8))
def test_one_device_takes_the_batches_a_dataloader_over_the_sampler_gives(seed):
    rng = random.Random(seed)
    batch = rng.randint(1, 8)
    data = list(range(rng.randint(batch, 60)))
    epochs = rng.randint(1, 3)
    loader = DataLoader(data, batch_size=batch, sampler=_sampler(data, seed), drop_last=True)
    want = [[[int(i) for i in b] for b in loader] for _ in range(epochs)]
    graph = Graph(torch.nn.Linear(1, 1))
    graph.set_data_loader(data, batch_size=batch, sampler=_sampler(data, seed))
    got = [[list(b) for b in graph.plan(e)] for e in range(epochs)]
    assert got == want
    assert [list(b) for b in graph.plan(0)] == want[0]  # an epoch planned again keeps its order
    default = Graph(torch.nn.Linear(1, 1))
    default.set_data_loader(data, batch_size=batch)
    if len(data) > 3:  # the check can fail: the seeded permutation is another order
        assert [list(b) for e in range(epochs) for b in default.plan(e)] != [b for e in want for b in e]


def test_a_sequential_sampler_keeps_the_dataset_order():
    data = list(range(10))
    graph = Graph(torch.nn.Linear(1, 1))
    graph.set_data_loader(data, batch_size=3, sampler=SequentialSampler(data))
    assert [list(b) for b in graph.plan(0)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


@pytest.mark.parametrize("sampler, needle", [
    (lambda data: list(range(5)), "yields 5 indices (5 distinct), not each of the dataset's 10 rows once"),
    (lambda data: torch.utils.data.WeightedRandomSampler([1.0] * 10, 10, replacement=True,
                                                         generator=torch.Generator().manual_seed(0)),
     "not each of the dataset's 10 rows once"),
    (lambda data: 7, "sampler of type int is not iterable"),
])
def test_a_sampler_that_does_not_yield_every_row_once_is_refused(sampler, needle):
    data = list(range(10))
    graph = Graph(torch.nn.Linear(1, 1))
    with pytest.raises((ValueError, TypeError)) as info:
        graph.set_data_loader(data, batch_size=2, sampler=sampler(data))
        list(graph.plan(0))
    assert needle in str(info.value)
    if isinstance(info.value, ValueError):
        assert "no DistributedSampler" in str(info.value)


def test_gather_predictions_on_one_device_is_the_plain_loop():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Dropout(0.5))
    graph = Graph(model)
    rows = [torch.randn(4) for _ in range(11)]
    model.eval()
    with torch.no_grad():
        want = torch.stack([model(r) for r in rows])
    model.train()
    got = graph.gather_predictions(rows, lambda batch: graph.module(batch), batch_size=4, collate_fn=torch.stack)
    assert torch.allclose(got, want) and model.training  # eval mode inside (no dropout), train mode restored
    ragged = graph.gather_predictions(rows, lambda batch: [r[: i % 3 + 1] for i, r in enumerate(batch)], 5)
    assert isinstance(ragged, list) and len(ragged) == 11  # one entry per row, in order, when shapes differ
    with pytest.raises(ValueError, match=r"predict returned a tensor of shape \(3,\) for a batch of 4 rows"):
        graph.gather_predictions(rows, lambda batch: torch.zeros(3), 4, collate_fn=torch.stack)
    with pytest.raises(ValueError, match="batch_size=0 is invalid"):
        graph.gather_predictions(rows, lambda batch: batch, 0)


@pytest.mark.parametrize("rows, world", [(0, 1), (7, 3), (10, 4), (3, 5), (64, 2)])
def test_shards_cover_the_rows_once_with_sizes_one_apart(rows, world):
    bounds = [shard_bounds(rows, world, r) for r in range(world)]
    assert bounds[0][0] == 0 and bounds[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [e - s for s, e in bounds]
    assert max(sizes) - min(sizes) <= 1
