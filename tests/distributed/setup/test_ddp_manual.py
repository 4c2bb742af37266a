"""Manual Ddp collectives on real gloo ranks: parameter sync, plain and weighted gradient averaging, buffers."""

from __future__ import annotations

import pytest
import torch

from dist_helpers import run_ranks, values
from flodl_hf import Ddp, DdpConfig, Graph, Trainer


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))


def _manual_rank(rank: int, world: int):
    from flodl_hf.distributed.context import init_context

    init_context(DdpConfig(verbose=False, timeout_s=60))  # joins the group the launcher environment describes
    torch.manual_seed(rank)  # deliberately different replicas
    net = _net()
    ddp = Ddp(net)
    out = {"world": ddp.world_size, "rank": ddp.rank}
    ddp.sync_params()
    out["params"] = [p.detach().clone() for p in net.parameters()]
    x = torch.full((rank + 2, 3), float(rank + 1))
    net(x).sum().backward()  # running stats now differ per rank too
    out["own_grads"] = [p.grad.detach().clone() for p in net.parameters()]
    ddp.weighted_all_reduce_gradients([2.0, 1.0])
    out["weighted"] = [p.grad.detach().clone() for p in net.parameters()]
    for p, g in zip(net.parameters(), out["own_grads"]):
        p.grad = g.clone()
    ddp.all_reduce_gradients()
    out["mean"] = [p.grad.detach().clone() for p in net.parameters()]
    ddp.sync_buffers()
    out["buffers"] = [b.detach().clone() for b in net.buffers()]
    with pytest.raises(ValueError, match="2 entries for a world of 2|3 entries for a world of 2"):
        ddp.weighted_all_reduce_gradients([1.0, 1.0, 1.0])
    return out


def test_manual_collectives():
    r0, r1 = values(run_ranks(_manual_rank, 2))
    assert r0["world"] == r1["world"] == 2 and (r0["rank"], r1["rank"]) == (0, 1)
    for a, b in zip(r0["params"], r1["params"]):
        assert torch.equal(a, b)
    for g0, g1, w0, w1, m0, m1 in zip(r0["own_grads"], r1["own_grads"], r0["weighted"], r1["weighted"],
                                      r0["mean"], r1["mean"]):
        torch.testing.assert_close(w0, (2 * g0 + g1) / 3)
        assert torch.equal(w0, w1)
        torch.testing.assert_close(m0, (g0 + g1) / 2)
        assert torch.equal(m0, m1)
    for b0, b1 in zip(r0["buffers"], r1["buffers"]):
        assert torch.equal(b0, b1)


def test_single_process_is_a_no_op():
    torch.manual_seed(0)
    graph = Graph(_net())
    Trainer.setup_with(graph, lambda dev: _net(), lambda p: torch.optim.SGD(p, lr=0.1), DdpConfig(verbose=False))
    ddp = Ddp(graph)
    graph.module(torch.randn(4, 3)).sum().backward()
    before = [p.grad.clone() for p in graph.module.parameters()]
    ddp.all_reduce_gradients()
    ddp.weighted_all_reduce_gradients([3.0])
    ddp.sync_params()
    assert all(torch.equal(a, p.grad) for a, p in zip(before, graph.module.parameters()))
    with pytest.raises(TypeError, match="Ddp needs a torch.nn.Module"):
        Ddp(object())
