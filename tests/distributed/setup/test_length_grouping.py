"""Length grouping (``Graph.set_data_loader(lengths=...)``, ``flodl-hf train``'s default): batches of similar
length. Tested as a property of the order (a permutation, sorted runs, independent of the world size) and against
a one-process reference: two ranks with lengths train exactly like one process stepping through the same grouped
order on the concatenated batches."""

from __future__ import annotations

import random

import pytest
import torch

from dist_helpers import run_ranks, values
from flodl_hf import DdpConfig, Graph, Trainer
from flodl_hf.elche.partition import LENGTH_GROUP, epoch_permutation, length_grouped
from test_setup_distributed import _collate, _data, _mlp, _sgd


@pytest.mark.parametrize("seed", range(25))
def test_grouped_order_is_a_permutation_with_sorted_runs(seed):
    rng = random.Random(seed)
    n, group = rng.randint(1, 400), rng.randint(1, 60)
    lengths = [rng.randint(0, 30) for _ in range(n)]
    perm = epoch_permutation(n, seed)
    out = length_grouped(perm, lengths, group)
    assert sorted(out.tolist()) == list(range(n))
    for start in range(0, n, group):
        run = out[start:start + group].tolist()
        assert sorted(run) == sorted(perm[start:start + group].tolist())  # a run keeps its own samples
        assert [lengths[i] for i in run] == sorted((lengths[i] for i in run), reverse=True)
    assert torch.equal(out, length_grouped(perm, lengths, group))


def test_grouping_cuts_padding_and_refuses_bad_lengths():
    rng = random.Random(0)
    lengths = [rng.randint(5, 64) for _ in range(3200)]
    perm = epoch_permutation(3200, 0)

    def padded(order):
        return sum(max(lengths[i] for i in order[k:k + 32]) * 32 for k in range(0, 3200, 32))

    assert padded(length_grouped(perm, lengths, 1600).tolist()) < 0.7 * padded(perm.tolist())
    with pytest.raises(ValueError, match="one length per sample"):
        length_grouped(perm, lengths[:-1], 10)
    graph = Graph(_mlp())
    with pytest.raises(ValueError, match="one integer >= 0 per sample"):
        graph.set_data_loader(list(range(4)), batch_size=2, lengths=[1, 2, -1, 3])


WINDOWS, SIZES = 6, [5, 3]


def _lengths(n: int) -> list[int]:
    g = torch.Generator().manual_seed(5)
    return torch.randint(0, 100, (n,), generator=g).tolist()


def _grouped_rank(rank: int, world: int):
    torch.manual_seed(100 + rank)
    graph = Graph(_mlp())
    Trainer.setup_with(graph, lambda dev: _mlp(), _sgd, DdpConfig(batch_sizes=SIZES, anchor=2, freeze_plan=True,
                                                                   seed=7, verbose=False, timeout_s=60))
    n = WINDOWS * 2 * sum(SIZES)
    x, y = _data(n)
    graph.set_data_loader(list(zip(x, y)), batch_size=sum(SIZES) // world, collate_fn=_collate, lengths=_lengths(n))
    for xb, yb in graph.epoch(0):
        torch.nn.functional.cross_entropy(graph.module(xb), yb).backward()
        graph.step()
    return [p.detach().clone() for p in graph.module.parameters()]


def test_two_ranks_with_length_grouping_equal_one_process_on_the_grouped_order():
    got = values(run_ranks(_grouped_rank, 2, timeout=120))
    torch.manual_seed(100)
    model, n = _mlp(), WINDOWS * 2 * sum(SIZES)
    opt = _sgd(model.parameters())
    x, y = _data(n)
    order = length_grouped(epoch_permutation(n, 7), _lengths(n), LENGTH_GROUP * (sum(SIZES) // 2))
    step = 2 * sum(SIZES)
    for w in range(WINDOWS):
        idx = order[w * step:(w + 1) * step]
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        opt.zero_grad()
    for r in range(2):
        for a, b in zip(got[r], model.parameters()):
            torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)
