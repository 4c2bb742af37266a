"""The dropout rule of setup mode (loop 6 of the practitioners' loops), as docs/exactness.md states it.

- flodl-hf never seeds and never draws from a rank's torch generator: rank r's dropout masks are exactly what its
  own generator gives in its loop's order of forward passes.
- So an N-rank run equals one process that runs each rank's micro-batches from that rank's generator (the
  differential harness draws this too): shown here against such a replay, written out with plain PyTorch.
- One process on the concatenated window draws one mask over the whole batch instead, so it is not the same
  sample path: identical masks to a plain one-process run are not possible in general.
- ``transformers.set_seed(s)`` on every rank (what a transformers script, and ``flodl-hf train``'s ``--seed``, do)
  gives every rank the same stream: equal-shaped micro-batches get identical masks on every rank. Seeding each rank
  with its own seed (``seed + rank``) gives each its own masks.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from dist_helpers import run_ranks, values
from flodl_hf import DdpConfig, Graph, Trainer

N, SIZES, ANCHOR, SEED, P = 48, [4, 4], 2, 3, 0.3


class _Recording(torch.nn.Module):
    """Dropout that keeps each mask it draws (a zero of its output where the input was not zero)."""

    def __init__(self) -> None:
        super().__init__()
        self.masks: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.dropout(x, P, self.training)
        self.masks.append((y != 0).detach().clone())
        return y


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), _Recording(), torch.nn.Linear(16, 2))


def _data() -> list:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, 4, generator=g)
    return [(i, x[i], int(x[i, 0] > 0)) for i in range(N)]


def _collate(items: list) -> tuple:
    return [i for i, _, _ in items], torch.stack([x for _, x, _ in items]), torch.tensor([y for _, _, y in items])


def _rank(rank: int, world: int, seeding: str) -> dict:
    graph = Graph(_net())
    Trainer.setup_with(graph, lambda dev: _net(), lambda p: torch.optim.SGD(p, lr=0.5),
                       DdpConfig(verbose=False, batch_sizes=SIZES, anchor=ANCHOR, freeze_plan=True, seed=SEED,
                                 timeout_s=60))
    if seeding == "set_seed":
        transformers.set_seed(1234)  # the same on every rank
    else:
        torch.manual_seed(1234 + rank)  # each rank its own stream
    graph.set_data_loader(_data(), batch_size=4, collate_fn=_collate)
    ids = []
    for idx, x, y in graph.epoch(0):
        torch.nn.functional.cross_entropy(graph.module(x), y).backward()
        graph.step()
        ids.append(idx)
    graph.close()
    return {"ids": ids, "masks": graph.module[2].masks,
            "state": {k: v.detach().clone() for k, v in graph.module.state_dict().items()}}


def _replay(results: list[dict], seeds: list[int]) -> dict:
    """One process: each window's micro-batches as one mean loss, each rank's forward passes from its own
    generator state (seeded as that rank seeded it), in that rank's order."""
    data = _data()
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    streams = []
    for s in seeds:
        torch.manual_seed(s)
        streams.append(torch.get_rng_state())
    steps = len(results[0]["ids"])
    for start in range(0, steps, ANCHOR):
        total, pieces = 0.0, []
        for j in range(start, min(start + ANCHOR, steps)):
            for r, result in enumerate(results):
                torch.set_rng_state(streams[r])
                idx = result["ids"][j]
                out = model(torch.stack([data[i][1] for i in idx]))
                streams[r] = torch.get_rng_state()
                pieces.append(torch.nn.functional.cross_entropy(out, torch.tensor([data[i][2] for i in idx]),
                                                                reduction="sum"))
                total += len(idx)
        (sum(pieces) / total).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("seeding", ["set_seed", "per-rank"])
def test_each_rank_draws_dropout_from_its_own_generator_and_nothing_else(seeding):
    results = values(run_ranks(_rank, 2, seeding, timeout=120))
    seeds = [1234, 1234] if seeding == "set_seed" else [1234, 1235]
    want = _replay(results, seeds)
    start = _net().state_dict()
    moved = max(float((want[k] - start[k]).abs().max()) for k in want)
    assert moved > 1e-2
    for r in results:
        for name, value in want.items():
            torch.testing.assert_close(r["state"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    masks = [r["masks"] for r in results]
    assert len(masks[0]) == len(masks[1]) == N // sum(SIZES)
    same = [torch.equal(a, b) for a, b in zip(*masks)]
    if seeding == "set_seed":
        assert all(same), "set_seed on every rank: equal-shaped micro-batches get identical masks on every rank"
    else:
        assert not any(same), "a seed per rank: each rank draws its own masks"


def test_one_process_on_the_concatenated_window_draws_other_masks():
    """Why the rule is stated per rank: one process draws one mask over the window's concatenated batch, which is
    not the ranks' masks side by side (a plain one-process run is another sample path)."""
    torch.manual_seed(1234)
    rank_mask = torch.nn.functional.dropout(torch.ones(4, 16), P)  # what each rank draws after set_seed(1234)
    torch.manual_seed(1234)
    together = torch.nn.functional.dropout(torch.ones(8, 16), P)  # one process, both ranks' rows at once
    assert not torch.equal(together[4:], rank_mask)
