"""Builder mode without worker processes: settings validation, the round trigger, dispatch, the divergence
guard, CPU-backend averaging, flat model state, checkpoints, epoch metrics, and the single-device run
(in-process)."""

from __future__ import annotations

import functools
import threading

import pytest
import builder_toy as toy
import torch

import flodl_hf
import flodl_hf.builder as fb
from flodl_hf import Trainer
from flodl_hf.builder.board import _ROW, Board, Plan, Row, must_wait, round_ready
from flodl_hf.builder.checkpoint import read_checkpoint, write_checkpoint
from flodl_hf.checkpoint.errors import CheckpointError
from flodl_hf.builder.epochs import EpochBook
from flodl_hf.builder.guard import HOLD, OK, SHRINK, AnchorControl, DivergenceGuard
from flodl_hf.builder.rounds import CpuRounds, Snapshot
from flodl_hf.builder.state import ModelState, state_from_flat
from flodl_hf.builder.step import Recipe, build_replica, to_device
from flodl_hf.builder.workpool import WorkPool


# ------------------------------------------------------------------------------------------------ public API
def test_public_names_are_pinned():
    assert fb.__all__ == [
        "DdpBuilder",
        "DdpHandle",
        "TrainedState",
        "EpochMetrics",
        "ApplyPolicy",
        "AverageBackend",
        "record_scalar",
    ]
    for name in fb.__all__:
        assert getattr(flodl_hf, name) is getattr(fb, name)
    assert isinstance(Trainer.builder(toy.tiny_mlp, toy.sgd, toy.train_fn), fb.DdpBuilder)


def _ok():
    return (
        Trainer.builder(toy.tiny_mlp, toy.sgd, toy.train_fn)
        .dataset(toy.ToyPoints(64))
        .batch_size(16)
        .num_epochs(1)
        .devices(["cpu"])
        .progress(False)
    )


def test_missing_required_settings_are_named_together():
    with pytest.raises(ValueError) as info:
        Trainer.builder(toy.tiny_mlp, toy.sgd, toy.train_fn).run()
    text = str(info.value)
    for name in ("dataset is missing", "batch_size is missing", "num_epochs is missing"):
        assert name in text


@pytest.mark.parametrize(
    ("setter", "args", "words"),
    [
        ("batch_size", (0,), ["batch_size=0", "integer >= 1"]),
        ("num_epochs", (1.5,), ["num_epochs=1.5"]),
        ("policy", ("fast",), ["policy='fast'", "ApplyPolicy.SYNC"]),
        ("backend", ("mpi",), ["backend='mpi'", "AverageBackend.CPU"]),
        ("overhead_target", (0.9,), ["overhead_target=0.9", "[0.01, 0.5]"]),
        ("anchor", (500,), ["anchor=500", "max_anchor=200"]),
        ("max_batch_diff", (0,), ["max_batch_diff=0"]),
        ("max_grad_norm", (-1.0,), ["max_grad_norm=-1.0", "positive"]),
        ("divergence_threshold", (0.0,), ["divergence_threshold=0.0", "no_divergence_guard"]),
        ("lr_scale_ratio", (2.0,), ["lr_scale_ratio=2.0", "1 + (world_size - 1) * f"]),
        ("checkpoint_every", (2,), ["checkpoint_every=2", ".checkpoint_fn(fn)"]),
        ("devices", (["tpu"],), ["devices=['tpu']", "'cuda:N'"]),
        ("simulate_speeds", ([1.0, 0.5],), ["simulate_speeds=[1.0, 0.5]", "SIMULATION"]),
        ("timeout", (0,), ["timeout_s=0", ".timeout(s)"]),
        ("start_method", ("fork",), ["start_method='fork'", "forkserver"]),
        ("dataset", (toy.ToyPoints(8),), ["fewer samples than batch_size=16"]),
    ],
)
def test_invalid_settings_raise_at_run_naming_setting_value_and_fix(setter, args, words):
    b = getattr(_ok(), setter)(*args)  # setters never raise: validation happens at run()
    with pytest.raises(ValueError) as info:
        b.run()
    for w in words:
        assert w in str(info.value)


def test_unpicklable_factory_is_a_clear_error_before_any_process_starts():
    b = (
        Trainer.builder(lambda dev: toy.tiny_mlp(dev), toy.sgd, toy.train_fn)
        .dataset(toy.ToyPoints(64))
        .batch_size(16)
        .num_epochs(1)
        .devices(["cpu", "cpu"])
        .progress(False)
    )
    with pytest.raises(
        ValueError,
        match=r"model_factory=.*cannot be pickled.*module-level function or "
        r"functools.partial",
    ):
        b.run()
    before = threading.active_count()
    # one device runs in-process: a lambda is fine there
    handle = b.devices(["cpu"]).run()
    handle.join(timeout=60)
    assert threading.active_count() <= before


# ----------------------------------------------------------------------------------------- board / trigger
def _rows(*specs):
    return [Row(*s) for s in specs]


def test_round_trigger_counts_threshold_and_hold_back():
    counts = Plan(round=3, counts=(5, 2), mask=(True, True))
    assert not round_ready(None, _rows((3, 9, 1, False), (3, 9, 1, False)), 3)  # no plan: previous round runs
    assert not round_ready(counts, _rows((3, 9, 1, False), (3, 9, 1, False)), 4)  # plan is for round 3 only
    assert not round_ready(counts, _rows((3, 4, 1, False), (3, 2, 1, False)), 3)  # rank 0 below its count
    assert round_ready(counts, _rows((3, 7, 1, False), (3, 2, 1, False)), 3)  # overshoot is fine
    assert round_ready(counts, _rows((3, 7, 1, False), (4, 0, 0, False)), 3)  # rank 1 already past round 3
    assert not round_ready(counts, _rows((3, 7, 1, False), (2, 9, 1, False)), 3)  # rank 1 still in round 2
    assert round_ready(counts, _rows((3, 7, 1, False), (3, 0, 0, True)), 3)  # done ranks do not hold back
    assert not round_ready(
        Plan(3, (1, 1), (True, True)), _rows((3, 1, 1, False), (3, 0, 0, False)), 3
    )  # zero
    assert round_ready(Plan(3, (5, 2), (True, False)), _rows((3, 5, 1, False), (3, 0, 0, False)), 3)  # masked
    cadence = Plan(round=0, counts=(5, 2), mask=(True, True), threshold_ms=100.0)
    assert not round_ready(cadence, _rows((0, 9, 99.0, False), (0, 1, 150.0, False)), 0)
    assert round_ready(cadence, _rows((0, 3, 100.0, False), (0, 1, 150.0, False)), 0)  # time, not counts
    sync = Plan(round=0, counts=(1, 1), mask=(True, True), static=True)
    assert round_ready(
        sync, _rows((7, 1, 1, False), (7, 1, 1, False)), 7
    )  # a static plan holds for every round


def test_must_wait_sync_max_overshoot_and_max_batch_diff():
    plan = Plan(round=2, counts=(5, 2), mask=(True, True), max_ahead=3)
    idle = Row(2, 0, 0.0, False)
    assert must_wait(plan, [Row(0, 1, 1.0, False), idle], 0, sync=True)
    assert not must_wait(plan, [Row(0, 0, 0.0, False), idle], 0, sync=True)
    assert not must_wait(plan, [Row(2, 7, 1.0, False), idle], 0, sync=False)
    assert must_wait(plan, [Row(2, 8, 1.0, False), idle], 0, sync=False)  # 8 >= count 5 + max_overshoot 3
    assert not must_wait(Plan(2, (5, 2), (True, True)), [Row(2, 80, 1.0, False), idle], 0, sync=False)
    diff = Plan(round=2, counts=(5, 2), mask=(True, True), batch_diff=2)
    assert must_wait(diff, [Row(2, 4, 1.0, False), Row(2, 2, 1.0, False)], 0, sync=False)  # 2 ahead of the slowest
    assert not must_wait(diff, [Row(2, 3, 1.0, False), Row(2, 2, 1.0, False)], 0, sync=False)
    assert not must_wait(diff, [Row(2, 4, 1.0, False), Row(2, 2, 1.0, False)], 1, sync=False)  # the slowest runs
    assert not must_wait(diff, [Row(2, 9, 1.0, False), Row(2, 0, 0.0, True)], 0, sync=False)  # done ranks don't count
    hold = Plan(round=2, counts=(5, 2), mask=(True, True), hold_rank=1)  # ASYNC: the slowest stops at its count
    assert must_wait(hold, [idle, Row(2, 2, 1.0, False)], 1, sync=False)
    assert not must_wait(hold, [Row(2, 9, 1.0, False), idle], 0, sync=False)  # faster ranks may run ahead
    assert round_ready(hold, [Row(2, 5, 1.0, False), Row(2, 2, 1.0, False)], 2)


def test_a_held_back_rank_counts_as_ready_so_no_setting_deadlocks():
    """CADENCE + max_batch_diff used to deadlock: a rank that ran faster than estimated parked at its batch limit
    below a time threshold it could never reach. Every combination of hold-back rules must still let the round
    fire once the ranks that may run have reached the trigger."""
    import itertools
    import random

    rng = random.Random(0)
    for _ in range(3000):
        world = rng.randint(2, 4)
        counts = tuple(rng.randint(1, 8) for _ in range(world))
        plan = Plan(round=0, counts=counts, mask=(True,) * world,
                    threshold_ms=rng.choice([None, rng.uniform(1, 100)]),
                    max_ahead=rng.choice([None, rng.randint(1, 4)]), batch_diff=rng.choice([None, rng.randint(1, 4)]),
                    hold_rank=rng.choice([None, rng.randrange(world)]))
        speeds = [rng.uniform(1, 30) for _ in range(world)]  # ms per batch, unknown to the plan
        rows = [Row(0, 0, 0.0, False) for _ in range(world)]
        for _step in itertools.count():
            if round_ready(plan, rows, 0):
                break
            movable = [q for q in range(world) if not must_wait(plan, rows, q, sync=False)]
            assert movable, f"deadlock: {plan} {rows}"
            q = min(movable, key=lambda r: rows[r].wall_ms + speeds[r])  # the next rank to finish a batch
            rows[q] = Row(0, rows[q].batches + 1, rows[q].wall_ms + speeds[q], False)
            assert _step < 10_000


def test_board_round_trips_rows_and_plans():
    board = Board.create(3)
    assert board.read_plan() is None
    board.write_row(1, Row(4, 7, 123.5, True))
    assert board.read_row(1) == Row(4, 7, 123.5, True) and board.read_row(0) == Row(0, 0, 0.0, False)
    board.write_row(2, Row(3, 1, 2.0, False, fired=3))
    assert board.read_row(2).fired == 3 and board.read_row(0).fired == -1
    plan = Plan(round=5, counts=(3, 2, 1), mask=(True, False, True), threshold_ms=80.0, max_ahead=2, batch_diff=3,
                hold_rank=2)
    board.post_plan(plan)
    assert board.read_plan() == plan
    board.post_plan(Plan(round=0, counts=(1, 1, 1), mask=(True,) * 3, static=True))
    assert board.read_plan().static and board.read_plan().threshold_ms is None


def test_board_survives_a_writer_killed_mid_write():
    board = Board.create(2)
    board.write_row(1, Row(2, 3, 4.0, False))
    board.array[_ROW] += 1.0  # rank 1's sequence left odd, as if it died between the two writes
    assert board.read_rows(only=(True, False)) == [Row(0, 0, 0.0, False), Row(0, 0, 0.0, False)]
    assert board.read_row(1) == Row(2, 3, 4.0, False)  # bounded wait, then the stale values


# ------------------------------------------------------------------------------------------------ dispatch
def test_shared_cursor_hands_out_every_batch_once_and_pipelines_epochs():
    pool = WorkPool(100, 10, 2, 2, equal_split=False)
    seen = []
    while True:
        a, b = pool.take(0, 3), pool.take(1, 1)  # rank 0 pulls three times as much
        if not a and not b:
            break
        for r, items in ((0, a), (1, b)):
            for it in items:
                assert pool.complete(r, it)
        seen += a + b
    assert sorted(seen) == [(e, i) for e in range(2) for i in range(10)]
    assert pool.all_complete() and not pool.complete(0, (0, 0))  # a second report is ignored


def test_equal_split_is_round_robin_and_a_lost_rank_goes_to_survivors():
    pool = WorkPool(60, 10, 1, 3, equal_split=True)
    assert pool.take(0, 10) == [(0, 0), (0, 3)] and pool.take(1, 1) == [(0, 1)]
    assert pool.drop(1) == 2  # held (0, 1) and not yet taken (0, 4)
    got = pool.take(2, 10)
    assert got[:2] == [(0, 1), (0, 4)] and set(got[2:]) == {(0, 2), (0, 5)}
    assert pool.exhausted() and not pool.all_complete()


# --------------------------------------------------------------------------------------- divergence guard
def test_guard_verdicts():
    g = DivergenceGuard(0.1)
    assert [g.observe(v) for v in (0.05, 0.12, 0.15, 0.13, 0.5)] == [OK, HOLD, HOLD, OK, SHRINK]


def _control(guard):
    return AnchorControl(2, anchor=10, max_anchor=200, overhead_target=0.1, max_batch_diff=None, guard=guard)


def test_guard_stops_anchor_growth_and_shrinks_it():
    free, held = _control(None), _control(DivergenceGuard(0.1))
    for c in (free, held):  # overhead 0.4 > tau 0.1: El Che alone would jump to 40
        c.report([500, 1000], [10, 10], 400, divergence=0.2)
    assert free.anchor == 40 and held.anchor == 10 and held.counts() == [20, 10]
    shrink = _control(DivergenceGuard(0.1))
    shrink.report([500, 1000], [10, 10], 10, divergence=0.9)  # far above the threshold
    assert shrink.anchor == 5 and shrink.counts() == [10, 5]  # below the initial anchor: the floor moved
    shrink.report([500, 1000], [10, 10], 10, divergence=0.9)
    assert shrink.anchor == 2 and shrink.threshold_ms([0, 1]) == pytest.approx(2 * 100.0)


# ----------------------------------------------------------------------------------------- CPU averaging
def _snap(rank, k, batches, done=False):
    return Snapshot(rank=rank, round=k, batches=batches, samples=4 * batches, wall_ms=1.0, sync_ms=0.1, done=done,
                    others={})


def test_cpu_rounds_close_when_every_rank_answered_or_after_the_timeout():
    rounds = CpuRounds(round_timeout_s=5.0)
    rounds.add(_snap(0, 0, 3), now=0.0)
    assert not rounds.ready({0, 1}, now=1.0)
    rounds.add(_snap(1, 0, 0), now=1.0)
    assert rounds.ready({0, 1}, now=1.0)
    res = rounds.close({0, 1})
    assert res.participants == [0, 1] and res.left_out == [] and res.batches == 3
    assert not rounds.add(_snap(0, 0, 1))  # late for a closed round: dropped
    rounds.add(_snap(0, 1, 2), now=10.0)
    assert not rounds.ready({0, 1}, now=14.9) and rounds.ready({0, 1}, now=15.0)
    assert not rounds.ready({0, 1}, now=15.0, timeout_s=30.0)  # the coordinator may stretch the timeout
    res = rounds.close({0, 1})
    assert res.left_out == [1] and rounds.current == 2


def _coordinator(world: int = 3):
    """A real Coordinator over a plain-memory board and in-process queues (no worker processes)."""
    import queue

    from flodl_hf.builder.coordinator import Coordinator
    from flodl_hf.builder.lifecycle import Workers
    from flodl_hf.builder.settings import BuilderSettings
    from flodl_hf.builder.types import ApplyPolicy, AverageBackend

    s = BuilderSettings(toy.tiny_mlp, functools.partial(torch.optim.SGD, lr=0.1), toy.train_fn,
                        dataset=list(range(40)), batch_size=2, num_epochs=1, policy=ApplyPolicy.ASYNC,
                        backend=AverageBackend.CPU, progress=False, devices=["cpu"] * world)
    s.validate()
    workers = Workers(procs=[None] * world, events=[queue.Queue() for _ in range(world)],
                      cmds=[queue.Queue() for _ in range(world)], board=Board.create(world), devices=["cpu"] * world, speeds=[1.0] * world,
                      startup_timeout_s=5.0)
    return Coordinator(s, workers)


@pytest.mark.parametrize("ran_orphans", [True, False])
def test_a_round_closed_all_done_while_a_rank_ran_a_lost_workers_batches_posts_the_next_plan(ran_orphans):
    """Regression (chaos seed 103, ~1 run in 65): worker 0 died and was noticed only once the others were
    done; its batches went to rank 1 after rank 1's round-0 snapshot said "done", and rank 1 ran them while
    round 0 was being averaged. Applying that all-done round deferred the next plan until "news" (a batch
    report) that had already arrived, so round 1 never fired and the run hung. Deferring stays right when
    nobody ran anything since the snapshots (an idle board must not spin empty rounds)."""
    from flodl_hf.builder.rounds import AverageJob, RoundResult

    co = _coordinator()
    co._post_plan(0)
    co.live.discard(0)
    co.pool.drop(0)
    items = co.pool.take(1, 3)  # the lost worker's batches, handed to rank 1 after its snapshot
    res = RoundResult(0, [1, 2], [], {1: _snap(1, 0, 9, done=True), 2: _snap(2, 0, 8, done=True)})
    co.averaging = True  # round 0 closed; its average is in flight
    if ran_orphans:
        for epoch, b in items:
            co._handle(("batch", 1, epoch, b, 0.5, 2, 3.0, {}))
    co.averaging = False
    job = AverageJob(result=res, sync=False, n_weighted=1, global_step=17, final=False, recipients=[1, 2],
                     want_state=False)
    co._apply_cpu_round(job, 0.0, None)
    plan = co.board.read_plan()
    if ran_orphans:
        assert not co.plan_deferred and plan.round == 1 and plan.mask == (False, True, True)
    else:
        assert co.plan_deferred and plan.round == 0


def test_average_into_weights_by_batches_gives_idle_ranks_weight_zero_and_averages_buffers_plainly():
    from flodl_hf.builder.slots import average_into

    a, b = torch.tensor([1.0, 1.0, 2.0]), torch.tensor([5.0, 1.0, 4.0])  # [2 params | 1 buffer]
    out = torch.empty(3)
    div = average_into(out, [a, b], [3.0, 0.0], n_weighted=2)
    assert out.tolist() == [1.0, 1.0, 3.0]  # rank 1 ran no batch: its stale parameters do not count
    assert div == 0.0  # only ranks with weight are measured
    div = average_into(out, [a, b], [1.0, 1.0], n_weighted=2)
    assert out.tolist() == [3.0, 1.0, 3.0] and div == pytest.approx(2 / 10**0.5)
    average_into(out, [a, b], [0.0, 0.0], n_weighted=2)  # nothing trained anywhere: the plain mean
    assert out.tolist() == [3.0, 1.0, 3.0]
    rng = torch.Generator().manual_seed(0)
    xs = [torch.randn(1000, generator=rng) for _ in range(3)]
    w = [2.0, 5.0, 1.0]
    small, big = torch.empty(1000), torch.empty(1000)
    average_into(small, xs, w, n_weighted=700, bucket=64)  # buckets straddling the param/buffer boundary
    average_into(big, xs, w, n_weighted=700)
    ref = torch.cat([(2 * xs[0][:700] + 5 * xs[1][:700] + xs[2][:700]) / 8, sum(x[700:] for x in xs) / 3])
    torch.testing.assert_close(small, ref)
    torch.testing.assert_close(big, ref)


# ------------------------------------------------------------------------------------- state / checkpoints
class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(5, 3)
        self.out = torch.nn.Linear(3, 5, bias=False)
        self.out.weight = self.emb.weight
        self.bn = torch.nn.BatchNorm1d(3)


def test_model_state_flattens_and_rebuilds_the_state_dict():
    model = _Tied()
    ms = ModelState(model)
    assert ms.layout.param_numel == 15 + 6 and ms.layout.buffer_numel == 6  # tied weight once; bn mean/var
    flat = ms.flat_state()
    rebuilt = state_from_flat(ms.layout, flat[:21], flat[21:], ms.other_values())
    assert list(rebuilt) == list(model.state_dict())
    for k, v in model.state_dict().items():
        assert torch.equal(rebuilt[k], v) and rebuilt[k].dtype == v.dtype
    ms.load_flat(torch.zeros(27))
    assert float(model.emb.weight.detach().abs().sum()) == 0.0 and model.out.weight is model.emb.weight
    ms.apply_delta(torch.ones(27), torch.zeros(27))  # parameters += avg - snap; buffers = avg
    assert float(model.bn.weight.detach().sum()) == 3.0 and float(model.emb.weight.detach().sum()) == 15.0
    assert float(model.bn.running_mean.sum()) == 3.0


def test_checkpoint_is_written_atomically(tmp_path):
    path = tmp_path / "sub" / "ckpt.json"
    write_checkpoint(path, {"w": torch.ones(2)}, epoch=0)
    with pytest.raises(CheckpointError, match="cannot store a value of type lock at 'bad'"):
        write_checkpoint(path, {"w": torch.zeros(2)}, epoch=1, bad=threading.Lock())  # refused before writing
    ckpt = read_checkpoint(path)
    assert ckpt["epoch"] == 0 and torch.equal(ckpt["model"]["w"], torch.ones(2))  # the old file survived
    assert sorted(p.name for p in path.parent.iterdir()) == ["ckpt.0.safetensors", "ckpt.json"]  # no temporaries
    with pytest.raises(ValueError, match="returned None"):
        write_checkpoint(None, {}, epoch=0)


def test_epoch_book_arithmetic():
    book = EpochBook(2, 4, 2, ["cpu", "cpu"], start=0.0)
    for r, loss in ((0, 1.0), (0, 2.0), (0, 3.0), (1, 6.0)):
        book.record(r, 0, loss, 8, {"acc": [0.5]} if r == 0 else {"acc": [1.0, 1.0]})
    book.record(1, 1, 1.0, 8)
    (m,) = book.completed(now=2.0, anchor=3)
    assert m.epoch == 0 and m.avg_loss == 3.0 and m.epoch_ms == 2000.0 and m.anchor == 3
    assert m.per_rank_batch_share == [0.75, 0.25] and m.per_rank_throughput == [12.0, 4.0]
    assert m.scalars == {"acc": pytest.approx(0.7)} and m.per_rank_scalars == [{"acc": 0.5}, {"acc": 1.0}]
    assert book.completed(now=3.0) == []


# ---------------------------------------------------------------------------------------- single device
def _epoch_hook(seen, epoch, model):
    seen.append(epoch)


def test_single_device_run_in_process(tmp_path):
    seen_metrics, seen_epochs = [], []
    handle = (
        Trainer.builder(toy.bn_mlp, toy.sgd, toy.train_fn)
        .dataset(toy.ToyPoints(512))
        .batch_size(16)
        .num_epochs(3)
        .devices(["cpu"])
        .scheduler(functools.partial(torch.optim.lr_scheduler.StepLR, step_size=40, gamma=0.5))
        .max_grad_norm(5.0)
        .checkpoint_every(2)
        .checkpoint_fn(lambda e: tmp_path / f"e{e}.json")
        .metrics_fn(seen_metrics.append)
        .epoch_fn(functools.partial(_epoch_hook, seen_epochs))
        .simulate_speeds([0.5])
        .progress(True)
        .run()
    )
    assert handle.world_size == 1 and handle.worker_pids == []
    first = handle.next_metrics(timeout=60)
    state = handle.join(timeout=120)
    rest = handle.poll_metrics()
    assert handle.next_metrics() is None and handle.poll_metrics() == []
    metrics = [first] + rest
    assert [m.epoch for m in metrics] == [0, 1, 2] and seen_metrics == metrics and seen_epochs == [0, 1, 2]
    m = metrics[-1]
    assert m.per_rank_batch_share == [1.0] and m.devices == ["cpu"] and m.samples == 512
    # one replica is its own average after every batch (a bug kept both at 0 after training)
    assert [x.rounds for x in metrics] == [32, 64, 96] and state.rounds == 96 and state.global_step == 96
    assert set(m.scalars) == {"acc"} and m.per_rank_scalars[0]["acc"] == m.scalars["acc"]
    model = state.load_into(toy.bn_mlp(torch.device("cpu")))
    assert toy.accuracy(model) >= 0.9
    assert int(state.state_dict()["1.num_batches_tracked"]) == 3 * 32
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".json") == ["e1.json", "e2.json"]  # every 2, last
    assert torch.equal(
        read_checkpoint(tmp_path / "e2.json")["model"]["0.weight"], state.state_dict()["0.weight"]
    )
    with pytest.raises(ValueError, match="does not fit this model"):
        state.load_into(toy.tiny_mlp(torch.device("cpu")))


def test_single_device_errors_surface_in_join():
    handle = _ok().progress(False)
    handle._s.train_fn = toy.failing_train_fn
    h = handle.run()
    assert h.next_metrics(timeout=60) is None
    with pytest.raises(RuntimeError, match="boom in train_fn"):
        h.join(timeout=60)


def test_replica_scales_the_learning_rate_and_moves_batches():
    recipe = Recipe(toy.tiny_mlp, toy.sgd, toy.train_fn, toy.ToyPoints(64), 16, lr_scale=1.5)
    rep = build_replica(recipe, torch.device("cpu"))
    assert rep.optimizer.param_groups[0]["lr"] == pytest.approx(0.3)
    assert rep.indices(0, 1) == rep.indices(0, 1) and rep.indices(0, 0) != rep.indices(1, 0)  # seed + epoch
    loss, samples, wall_ms, scalars = rep.run(0, 0)
    assert samples == 16 and wall_ms > 0 and len(scalars["acc"]) == 1 and loss > 0
    nested = to_device({"a": [torch.ones(1), (torch.zeros(1), 3)]}, torch.device("cpu"))
    assert torch.equal(nested["a"][1][0], torch.zeros(1)) and nested["a"][1][1] == 3


def test_record_scalar_outside_a_run_is_a_no_op():
    fb.record_scalar("x", 1.0)
    with pytest.raises(ValueError, match="non-empty string"):
        fb.record_scalar("", 1.0)


def test_progressive_dispatch_off_cuts_each_epoch_into_one_slice_per_rank_by_weight():
    weights = [3.0, 1.0]
    pool = WorkPool(80, 2, 2, 2, equal_split=False, slice_weights=lambda: weights)  # 40 batches per epoch
    first = pool.take(0, 100)
    assert [b for e, b in first if e == 0] == list(range(30))  # rank 0's contiguous slice of epoch 0: 3/4
    assert pool.take(1, 100)[:10] == [(0, i) for i in range(30, 40)]
    seen = [item for r in (0, 1) for item in pool._held[r]]
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 80  # every batch of both epochs once


@pytest.mark.parametrize("seed", range(6))
def test_average_into_measures_the_noise_norms_in_the_same_pass(seed):
    """SYNC's CPU backend: each source's squared norm over the weighted part and the average's, against torch."""
    from flodl_hf.builder.slots import average_into

    gen = torch.Generator().manual_seed(seed)
    n, n_weighted = 37, 29
    sources = [torch.randn(n, generator=gen) for _ in range(3)]
    weights = [float(w) for w in torch.randint(0, 9, (3,), generator=gen)]
    out, norms = torch.empty(n), {}
    average_into(out, sources, weights, n_weighted, bucket=5, divergence=False, norms=norms)
    assert norms["sources"] == pytest.approx([float(x[:n_weighted].double().square().sum()) for x in sources])
    assert norms["average"] == pytest.approx(float(out[:n_weighted].double().square().sum()))
