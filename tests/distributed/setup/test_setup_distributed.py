"""Setup mode on real gloo ranks: exactness of El Che windows, convergence, anchor tuning, failures."""

from __future__ import annotations

import os
import time

import pytest
import torch

from dist_helpers import run_ranks, spawn_ranks, values
from flodl_hf import DdpConfig, Graph, Trainer
from flodl_hf.elche.partition import epoch_permutation

FEATURES, CLASSES = 6, 3


def _data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, FEATURES, generator=g)
    y = (x[:, 0] * 2 + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    return x, y


def _mlp(width: int = 16) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, width), torch.nn.LayerNorm(width), torch.nn.Tanh(),
                               torch.nn.Linear(width, CLASSES))


def _collate(items):
    return torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])


def _sgd(params):
    return torch.optim.SGD(params, lr=0.2, momentum=0.9)


# --- exactness ------------------------------------------------------------------------------------------------
def _exact_rank(rank: int, world: int, sizes: list[int], anchor: int, windows: int, clip):
    torch.manual_seed(100 + rank)  # every rank starts different: setup must broadcast rank 0's weights
    graph = Graph(_mlp())
    cfg = DdpConfig(batch_sizes=sizes, anchor=anchor, freeze_plan=True, seed=7, verbose=False, timeout_s=60,
                    max_grad_norm=clip)
    Trainer.setup_with(graph, lambda dev: _mlp(), _sgd, cfg)
    x, y = _data(windows * anchor * sum(sizes))
    graph.set_data_loader(list(zip(x, y)), batch_size=sum(sizes) // world, collate_fn=_collate)
    seen = []
    for xb, yb in graph.epoch(0):
        seen.append(len(xb))
        loss = torch.nn.functional.cross_entropy(graph.module(xb), yb)
        loss.backward()
        graph.step()
    return [p.detach().clone() for p in graph.module.parameters()], seen, graph.training_step


def _reference(sizes: list[int], anchor: int, windows: int, clip) -> list[torch.Tensor]:
    torch.manual_seed(100)
    model = _mlp()
    opt = _sgd(model.parameters())
    total = windows * anchor * sum(sizes)
    x, y = _data(total)
    perm = epoch_permutation(total, 7)
    step = anchor * sum(sizes)
    for w in range(windows):
        idx = perm[w * step: (w + 1) * step]
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("world,sizes,anchor,clip", [
    (2, [11, 5], 3, None),
    (3, [9, 2, 1], 2, None),
    (2, [3, 13], 1, 0.05),
])
def test_windows_equal_one_big_batch(world, sizes, anchor, clip):
    windows = 4
    results = values(run_ranks(_exact_rank, world, sizes, anchor, windows, clip))
    reference = _reference(sizes, anchor, windows, clip)
    for rank, (params, seen, steps) in enumerate(results):
        assert seen == [sizes[rank]] * (windows * anchor)
        assert steps == windows
        for p, q in zip(params, reference):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    for params, _, _ in results[1:]:  # replicas stay bit-identical
        for p, q in zip(params, results[0][0]):
            assert torch.equal(p, q)


# --- El Che on simulated heterogeneous ranks ------------------------------------------------------------------
def _hetero_rank(rank: int, world: int, ms_per_sample: float, windows: int):
    torch.manual_seed(0)
    graph = Graph(_mlp())
    cfg = DdpConfig(simulate_speeds=[1.0, 0.4], seed=1, verbose=False, timeout_s=60)
    Trainer.setup_with(graph, lambda dev: _mlp(), _sgd, cfg)
    x, y = _data(16 * 2 * windows)
    graph.set_data_loader(list(zip(x, y)), batch_size=16, collate_fn=_collate)
    for xb, yb in graph.epoch(0):
        time.sleep(ms_per_sample * len(xb) / 1000.0)  # modelled device time, proportional to the micro-batch
        torch.nn.functional.cross_entropy(graph.module(xb), yb).backward()
        graph.step()
    return graph.el_che().history


def test_shares_converge_to_speed_ratio():
    history = values(run_ranks(_hetero_rank, 2, 2.0, 8))[0]
    target = 1.0 / 1.4
    within = [abs(h["shares"][0] - target) / target <= 0.10 for h in history]
    assert any(within[:5]), history[:5]
    first = within.index(True)
    assert all(within[first:]), [h["shares"] for h in history]
    assert all(sum(h["batch_sizes"]) == 32 for h in history)


def _anchor_rank(rank: int, world: int):
    torch.manual_seed(0)

    def build(dev=None):
        return torch.nn.Sequential(torch.nn.Linear(FEATURES, 1024), torch.nn.Linear(1024, 1024),
                                   torch.nn.Linear(1024, CLASSES))

    graph = Graph(build())
    # The target's margin: measured here, the slow phase runs at overhead 0.03-0.05 at anchor 1 and the fast phase at
    # 1.3-4.4. Against a 0.1 target one noisy window end in a full-suite run reached it and sent the anchor back to
    # 2; 0.3 sits 6x above the slow phase and 4x below the fast one.
    cfg = DdpConfig(seed=1, verbose=False, timeout_s=60, overhead_target=0.3, max_anchor=8)
    Trainer.setup_with(graph, build, lambda p: torch.optim.SGD(p, lr=1e-3), cfg)
    x, y = _data(2 * 2 * 200)
    graph.set_data_loader(list(zip(x, y)), batch_size=2, collate_fn=_collate)
    fast, slow = [], []
    for xb, yb in graph.epoch(0):
        if len(fast) >= 5:
            time.sleep(0.2)  # compute now dwarfs the all-reduce
        torch.nn.functional.cross_entropy(graph.module(xb), yb).backward()
        before = graph.training_step
        graph.step()
        if graph.training_step != before:
            (fast if len(fast) < 5 else slow).append(graph.el_che().anchor)
            if len(slow) >= 6:
                break
    return fast, slow


def test_anchor_rises_with_overhead_then_decays():
    fast, slow = values(run_ranks(_anchor_rank, 2))[0]
    # 1M parameters and a near-empty forward: sync time >> 10 % of compute, so the anchor jumps up
    assert fast[-1] > 1 and fast == sorted(fast), (fast, slow)
    # then 200 ms of compute per micro-batch: anchor 1 meets the target, and once the median of the recent
    # per-micro-batch overheads says so the anchor goes straight down to it (no overshoot, no slow decay)
    assert slow[-1] == 1 and slow == sorted(slow, reverse=True), (fast, slow)


# --- failures -------------------------------------------------------------------------------------------------
def _failing_rank(rank: int, world: int, mode: str):
    from flodl_hf.distributed.window import mark_failed

    torch.manual_seed(0)
    graph = Graph(_mlp())
    # "anchors": two El Che schedulers that decided differently (here forced): windows close at different counts
    anchor = {"anchor": 2 + rank} if mode == "anchors" else {}
    Trainer.setup_with(graph, lambda dev: _mlp(), _sgd, DdpConfig(verbose=False, timeout_s=20, **anchor))
    x, y = _data(64)
    steps = 6 if (mode == "uneven" and rank == 0) else 5
    for i in range(steps):
        if mode == "raise" and rank == 1 and i == 3:
            mark_failed()  # what the excepthook does for an uncaught exception
            raise RuntimeError("boom on rank 1")
        if mode == "exit" and rank == 1 and i == 3:
            os._exit(3)
        torch.nn.functional.cross_entropy(graph.module(x[i * 8:(i + 1) * 8]), y[i * 8:(i + 1) * 8]).backward()
        graph.step()
    graph.close()
    return steps


@pytest.mark.parametrize("mode,expect", [
    ("raise", "rank 1 failed"),
    ("exit", "rank(s) [1] vanished"),
    ("uneven", "different numbers of steps"),
    ("anchors", "after different numbers of micro-batches [2, 3]"),
])
def test_rank_failure_stops_the_others(mode, expect):
    start = time.monotonic()
    launch = spawn_ranks if mode == "exit" else run_ranks  # a rank that exits its process needs fresh interpreters
    results = launch(_failing_rank, 2, mode, timeout=60)
    assert time.monotonic() - start < 60
    status, message = results[0]
    assert status == "error", results
    assert expect in message
    assert "DistributedError" in message
    if mode == "anchors":  # both ranks see it: neither goes on with a diverged update
        assert results[1][0] == "error" and expect in results[1][1], results


def test_single_device_has_no_runtime():
    torch.manual_seed(0)
    graph = Graph(_mlp())
    Trainer.setup_with(graph, lambda dev: _mlp(), _sgd, DdpConfig(verbose=False))
    assert graph.world_size == 1 and not graph.is_distributed and graph.el_che() is None
    x, y = _data(32)
    before = [p.detach().clone() for p in graph.module.parameters()]
    torch.nn.functional.cross_entropy(graph.module(x), y).backward()
    graph.step()
    assert graph.training_step == 1
    assert all(p.grad is None for p in graph.module.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, graph.module.parameters()))


# --- epoch coverage -------------------------------------------------------------------------------------------
def _coverage_rank(rank: int, world: int, max_anchor):
    torch.manual_seed(0)
    graph = Graph(torch.nn.Linear(1, 1))
    speeds = [1.0, 0.5, 0.25][:world]
    cfg = DdpConfig(simulate_speeds=speeds, seed=11, verbose=False, timeout_s=60, max_anchor=max_anchor)
    Trainer.setup_with(graph, lambda dev: torch.nn.Linear(1, 1), _sgd, cfg)
    graph.set_data_loader(list(range(203)), batch_size=8, collate_fn=lambda items: torch.tensor(items))
    epochs, sizes = [], []
    for epoch in range(2):
        seen = []
        for batch in graph.epoch(epoch):
            time.sleep(0.0005 * len(batch))
            seen.extend(batch.tolist())
            sizes.append(len(batch))
            graph.module(batch.float().unsqueeze(1)).sum().backward()
            graph.step()
        epochs.append(seen)
    return epochs, sizes, graph.el_che().anchor


@pytest.mark.parametrize("max_anchor", [None, 0])
def test_epochs_are_disjoint_and_complete(max_anchor):
    world = 3
    results = values(run_ranks(_coverage_rank, world, max_anchor))
    steps = 203 // (world * 8)
    for epoch in range(2):
        per_rank = [r[0][epoch] for r in results]
        union = [i for seen in per_rank for i in seen]
        assert len(union) == len(set(union)) == steps * world * 8  # disjoint, drop_last
        perm = epoch_permutation(203, 11 + epoch)[: steps * world * 8].tolist()
        assert sorted(union) == sorted(perm)  # complete: exactly the epoch's first S*W*B positions
    sizes = [r[1] for r in results]
    if max_anchor == 0:
        assert all(s == 8 for rank_sizes in sizes for s in rank_sizes)  # El Che off: equal split, plain DDP
        assert all(r[2] == 1 for r in results)
    else:
        assert sizes[0][-1] > sizes[2][-1]  # the fastest rank ends with the largest micro-batches


# --- drop_last=False: a padded final step keeps the update exact -----------------------------------------------
def _partial_rank(rank: int, world: int, n: int):
    torch.manual_seed(100 + rank)
    graph = Graph(_mlp())
    cfg = DdpConfig(batch_sizes=[11, 5], anchor=2, freeze_plan=True, seed=7, verbose=False, timeout_s=60,
                    drop_last=False)
    Trainer.setup_with(graph, lambda dev: _mlp(), _sgd, cfg)
    x, y = _data(n)
    graph.set_data_loader(list(zip(x, y)), batch_size=8, collate_fn=_collate)
    for xb, yb in graph.epoch(0):
        torch.nn.functional.cross_entropy(graph.module(xb), yb).backward()
        graph.step()
    return [p.detach().clone() for p in graph.module.parameters()], graph.training_step


def test_padded_final_step_is_exact():
    n = 81  # 5 full steps of 16, then one sample: rank 1's share is zero, it runs on one padding sample
    results = values(run_ranks(_partial_rank, 2, n))
    torch.manual_seed(100)
    model = _mlp()
    opt = _sgd(model.parameters())
    x, y = _data(n)
    perm = epoch_permutation(n, 7)
    for lo, hi in [(0, 32), (32, 64), (64, 80), (80, 81)]:  # anchor 2; the step before the partial one closes early
        idx = perm[lo:hi]
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        opt.zero_grad()
    for params, steps in results:
        assert steps == 4
        for p, q in zip(params, model.parameters()):
            torch.testing.assert_close(p, q.detach(), rtol=1e-5, atol=1e-6)


def test_an_optimizer_over_other_parameters_than_the_replicas_is_refused():
    """A factory that groups the user's own model's parameters by name would step tensors nothing trains (the
    replica is a new module): the run would finish without learning. Refused, on one device as on N."""
    torch.manual_seed(0)
    model = _mlp()
    graph = Graph(model)
    names = [n for n, _ in model.named_parameters()]

    def by_name_from_the_wrong_module(ps):
        return torch.optim.AdamW([{"params": [p for n, p in model.named_parameters() if "bias" not in n]},
                                  {"params": [p for n, p in model.named_parameters() if "bias" in n],
                                   "weight_decay": 0.0}])

    with pytest.raises(ValueError, match=r"over 6 parameter\(s\) that are not those it was given"):
        Trainer.setup_with(graph, lambda dev: _mlp(), by_name_from_the_wrong_module, DdpConfig(verbose=False))

    def by_name_from_the_given(ps):  # the fix the message gives: the names zipped with what the factory receives
        ps = list(ps)
        return torch.optim.AdamW([{"params": [p for n, p in zip(names, ps) if "bias" not in n]},
                                  {"params": [p for n, p in zip(names, ps) if "bias" in n], "weight_decay": 0.0}])

    graph = Graph(_mlp())
    Trainer.setup_with(graph, lambda dev: _mlp(), by_name_from_the_given, DdpConfig(verbose=False))
    x, y = _data(8)
    before = [p.detach().clone() for p in graph.module.parameters()]
    torch.nn.functional.cross_entropy(graph.module(x), y).backward()
    graph.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, graph.module.parameters()))


def _plan_rank(rank: int, world: int, what: str):
    torch.manual_seed(0)
    graph = Graph(_mlp())
    Trainer.setup_with(graph, lambda dev: _mlp(), _sgd, DdpConfig(verbose=False, timeout_s=20))
    x, y = _data(48)
    before = [p.detach().clone() for p in graph.module.parameters()]

    def collate(items):
        return torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])

    rows = list(zip(x, y))[:40] if (what == "rows" and rank == 1) else list(zip(x, y))
    graph.set_data_loader(rows, batch_size=2 if (what == "batch" and rank == 1) else 4, collate_fn=collate,
                          seed=rank if what == "seed" else None)
    try:
        for xb, yb in graph.epoch(0):
            torch.nn.functional.cross_entropy(graph.module(xb), yb).backward()
            graph.step()
    except Exception as exc:  # noqa: BLE001 - returned to the test with the parameters it left
        unchanged = all(torch.equal(a, b) for a, b in zip(before, graph.module.parameters()))
        return f"{type(exc).__name__}: {exc}", unchanged
    return "no error", False


@pytest.mark.parametrize("what,expect", [
    ("batch", "different batch sizes [4, 2]"),
    ("rows", "datasets of [48, 40] rows"),
    ("seed", "plan seeds or sampler orders [0, 1]"),
])
def test_ranks_with_different_data_plans_stop_before_any_update(what, expect):
    """A natural reflex on mixed devices (a smaller batch on the slower one), a rank-local shard or seed would make
    each rank's plan cut the data differently; the first window end refuses it, naming the values, before any
    optimizer step."""
    for message, unchanged in values(run_ranks(_plan_rank, 2, what, timeout=60)):
        assert "DistributedError" in message and expect in message, message
        assert unchanged
