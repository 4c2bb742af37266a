"""Overlap of the window-end all-reduce with backward (``DdpConfig.overlap``): what it refuses, and failures.

(The failure-after-the-exchange, anchor-between-backward-and-step and ``.data`` cases came from a review.)

The exactness of overlapped windows against the one-process reference is in ``test_exactness`` (the harness draws
``overlap`` and tiny buckets per case); here are the loops it must refuse rather than train silently differently,
and a rank failing while its buckets are already on the wire.
"""

from __future__ import annotations

import time

import pytest
import torch

from dist_helpers import run_ranks, values
from flodl_hf import DdpConfig, Graph, Trainer

FEATURES, CLASSES = 6, 3
TINY_BUCKETS = 0.0001  # MiB: about 26 floats, so each layer has its own bucket and starts during backward


def _data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, FEATURES, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 1).long()


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                               torch.nn.Tanh(), torch.nn.Linear(16, CLASSES))


def _config(overlap: bool) -> DdpConfig:
    return DdpConfig(verbose=False, timeout_s=20, overlap=overlap, bucket_mb=TINY_BUCKETS, anchor=1,
                     max_anchor=2, freeze_plan=True)


def _collate(items: list) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])


def _loop(rank: int, world: int, how: str, overlap: bool) -> dict:
    graph = Graph(_mlp())
    Trainer.setup_with(graph, lambda dev: _mlp(), lambda ps: torch.optim.SGD(ps, lr=0.1), _config(overlap))
    x, y = _data(64)
    for i in range(4):
        xb, yb = x[i * 16 + rank * 8: i * 16 + rank * 8 + 8], y[i * 16 + rank * 8: i * 16 + rank * 8 + 8]
        if how == "fail" and rank == 1 and i == 2:
            torch.nn.functional.cross_entropy(graph.module(xb), yb).backward()  # buckets already started
            from flodl_hf.distributed.window import mark_failed

            mark_failed()  # what the excepthook does for an uncaught exception
            raise RuntimeError("boom on rank 1 after its backward")
        if how == "two-backward":
            torch.nn.functional.cross_entropy(graph.module(xb[:4]), yb[:4], reduction="sum").backward()
            torch.nn.functional.cross_entropy(graph.module(xb[4:]), yb[4:], reduction="sum").backward()
            graph.loss_items(8, reduction="sum")
        elif how == "clip":
            torch.nn.functional.cross_entropy(graph.module(xb), yb).backward()
            torch.nn.utils.clip_grad_norm_(graph.module.parameters(), 0.01)
        elif how == "items-after":
            torch.nn.functional.cross_entropy(graph.module(xb), yb).backward()
            graph.loss_items(5)  # not the 8 samples the loss averaged over, and too late for overlap
        else:
            torch.nn.functional.cross_entropy(graph.module(xb), yb).backward()
        graph.step()
    early = graph._runtime.overlap.launched_early if graph._runtime.overlap is not None else 0
    graph.close()
    return {"early": early, "params": [p.detach().clone() for p in graph.module.parameters()]}


@pytest.mark.parametrize("how,expect,fix", [
    ("two-backward", "second backward pass", "DdpConfig(overlap=False)"),
    ("clip", "changed between backward() and graph.step()", "DdpConfig(max_grad_norm=...)"),
    ("items-after", "call graph.loss_items(...) once, before loss.backward()", "DdpConfig(overlap=False)"),
])
def test_overlap_refuses_what_it_cannot_keep_exact(how, expect, fix):
    results = run_ranks(_loop, 2, how, True, timeout=60)
    assert all(status == "error" for status, _ in results), results
    assert any(expect in message and fix in message for _, message in results), results
    assert all("DistributedError" in message for _, message in results), results
    plain = run_ranks(_loop, 2, how, False, timeout=60)
    if how == "clip":  # a clip of each rank's own gradient is never the one-device clip: refused either way
        assert all(status == "error" and expect in message for status, message in plain), plain
    else:  # two losses of one micro-batch add as on one device; the late count is the user's to declare
        assert values(plain)[0]["early"] == 0


def test_overlap_and_no_overlap_give_the_same_model_bit_for_bit():
    on = values(run_ranks(_loop, 2, "plain", True, timeout=60))
    off = values(run_ranks(_loop, 2, "plain", False, timeout=60))
    assert on[0]["early"] > 0 and off[0]["early"] == 0  # 4 windows x (all buckets but the metadata's) started
    for a, b in zip(on[0]["params"], off[0]["params"]):
        assert torch.equal(a, b)
    for a, b in zip(on[0]["params"], on[1]["params"]):
        assert torch.equal(a, b)


def test_a_rank_failing_after_its_buckets_started_stops_the_others():
    start = time.monotonic()
    results = run_ranks(_loop, 2, "fail", True, timeout=60)
    assert time.monotonic() - start < 60
    status, message = results[0]
    assert status == "error" and "rank 1 failed" in message and "DistributedError" in message, results
    assert "boom on rank 1" in results[1][1]


def test_overlap_must_be_a_bool():
    with pytest.raises(ValueError, match=r"DdpConfig.overlap='yes' is invalid"):
        DdpConfig(overlap="yes")


# --- 1. failure after the window's exchange ----------------------------------------------------------------------
def _fail_in_optimizer_step(rank: int, world: int, overlap: bool) -> str:
    def make(ps):
        opt = torch.optim.SGD(ps, lr=0.1)
        if rank == 1:
            def pre(o, args, kwargs):  # e.g. an OOM allocating optimizer state on the smaller device
                from flodl_hf.distributed.window import mark_failed

                mark_failed()  # what the excepthook does for an uncaught exception
                raise RuntimeError("optimizer step failed on rank 1 after the window's exchange")
            opt.register_step_pre_hook(pre)
        return opt

    graph = Graph(_mlp())
    Trainer.setup_with(graph, lambda dev: _mlp(), make, _config(overlap))
    x, y = _data(64)
    for i in range(4):
        xb, yb = x[i * 16 + rank * 8: i * 16 + rank * 8 + 8], y[i * 16 + rank * 8: i * 16 + rank * 8 + 8]
        torch.nn.functional.cross_entropy(graph.module(xb), yb).backward()
        graph.step()
    graph.close()
    return "finished"


@pytest.mark.parametrize("overlap", [True, False])
def test_a_rank_failing_after_the_exchange_is_reported_as_failed(overlap):
    start = time.monotonic()
    results = run_ranks(_fail_in_optimizer_step, 2, overlap, timeout=60)
    assert time.monotonic() - start < 45, "the surviving rank waited for a timeout"
    assert "optimizer step failed on rank 1" in results[1][1], results
    status, message = results[0]
    assert status == "error" and "rank 1 failed" in message and "DistributedError" in message, results


# --- 2. anchor changed between backward() and graph.step() -------------------------------------------------------
def _anchor_after_backward(rank: int, world: int, overlap: bool) -> dict:
    graph = Graph(_mlp())
    Trainer.setup_with(graph, lambda dev: _mlp(), lambda ps: torch.optim.SGD(ps, lr=0.1), _config(overlap))
    x, y = _data(64)
    graph.set_data_loader([(x[i], y[i]) for i in range(64)], batch_size=8, collate_fn=_collate)
    stepped = []
    for step, (xb, yb) in enumerate(graph.epoch(0)):
        torch.nn.functional.cross_entropy(graph.module(xb), yb).backward()
        if step == 0:
            graph.el_che().set_anchor(2)  # on every rank, after the hooks armed with anchor 1
        before = graph.training_step
        graph.step()
        stepped.append(graph.training_step != before)
    graph.close()
    return {"stepped": stepped, "params": [p.detach().clone() for p in graph.module.parameters()]}


def test_anchor_set_between_backward_and_step_applies_from_the_next_window_with_overlap():
    # with overlap the window's anchor is fixed at its first backward (its buckets may already be on the wire), so
    # the new anchor starts with the next window; without overlap it is fixed at the first graph.step()
    on = values(run_ranks(_anchor_after_backward, 2, True, timeout=60))
    off = values(run_ranks(_anchor_after_backward, 2, False, timeout=60))
    assert on[0]["stepped"] == [True, False, True, True]  # the last step of the epoch always ends a window
    assert off[0]["stepped"] == [False, True, False, True]
    for result in (on, off):
        assert result[0]["stepped"] == result[1]["stepped"]
        for a, b in zip(result[0]["params"], result[1]["params"]):
            assert torch.equal(a, b)


# --- 3. p.grad modified through .data ----------------------------------------------------------------------------
def _scale_through_data(rank: int, world: int, overlap: bool) -> list:
    graph = Graph(_mlp())
    Trainer.setup_with(graph, lambda dev: _mlp(), lambda ps: torch.optim.SGD(ps, lr=0.1), _config(overlap))
    x, y = _data(64)
    for i in range(4):
        xb, yb = x[i * 16 + rank * 8: i * 16 + rank * 8 + 8], y[i * 16 + rank * 8: i * 16 + rank * 8 + 8]
        torch.nn.functional.cross_entropy(graph.module(xb), yb).backward()
        for p in graph.module.parameters():
            p.grad.data.mul_(0.5)  # old-style in-place edit: .data has its own version counter
        graph.step()
    graph.close()
    return [p.detach().clone() for p in graph.module.parameters()]


def test_grad_edited_through_data_is_refused():
    values(run_ranks(_scale_through_data, 2, False, timeout=60))  # without overlap the edit applies
    on = run_ranks(_scale_through_data, 2, True, timeout=60)
    assert all(status == "error" for status, _ in on), on
    assert any("changed between backward() and graph.step()" in message for _, message in on), on
    assert all("DdpConfig(max_grad_norm=...)" in message or "failed" in message for _, message in on), on
