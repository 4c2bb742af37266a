"""The builder's control plane over a real c10d TCPStore (storebus.py) and its message codec (wire.py).

References: the shared-memory :class:`Board` (the transport the store board replaces, same interface) for the
board; Python's ``queue`` semantics (FIFO, whole messages, ``queue.Empty``) for the queues; the original values
for the codec. Every store here is a real ``TCPStore`` on loopback, written by other connections (clients).
"""

from __future__ import annotations

import queue
import random
import threading
import time
import uuid
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from flodl_hf.builder import wire
from flodl_hf.builder.board import Board, Plan, Row
from flodl_hf.builder.ranks import channels, coordinator_channels
from flodl_hf.builder.state import Entry, Layout
from flodl_hf.builder.storebus import CHUNK, Heartbeat, Liveness, StoreBoard, StoreLost, command_queue


@pytest.fixture(scope="module")
def server():
    """One store host and a few client connections for the module; every test writes under a prefix of its own.
    (Each new connection costs a reverse lookup of the loopback address; where the resolver drops one, c10d waits
    out its 5 s timeout, so a connection per call made this file wait 5-10 s per run.)"""
    host = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    clients = [dist.TCPStore("127.0.0.1", host.port, None, False, timeout=timedelta(seconds=10)) for _ in range(4)]
    yield {"host": host, "clients": clients, "used": 0}
    del clients, host


def _client(server, prefix):
    """A prefix store on the next of the module's connections: a test's roles talk over different connections."""
    base = server["clients"][server["used"] % len(server["clients"])]
    server["used"] += 1
    return dist.PrefixStore(prefix, base)


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _random_message(rng: random.Random):
    dtypes = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.uint8, torch.bool]

    def leaf():
        kind = rng.randrange(7)
        if kind == 0:
            shape = tuple(rng.randrange(0, 4) for _ in range(rng.randrange(0, 3)))
            return (torch.randn(shape) * 10).to(rng.choice(dtypes))
        if kind == 1:
            return rng.randbytes(rng.randrange(0, 40))
        if kind == 2:
            return Layout(tuple(Entry(f"w{i}", (rng.randrange(1, 5),), "float32", "param", None)
                                for i in range(rng.randrange(1, 3))))
        return rng.choice([None, rng.randrange(-1000, 1000), rng.random(), "avg", True, False])

    def node(depth):
        if depth > 2 or rng.random() < 0.4:
            return leaf()
        kind = rng.randrange(3)
        items = [node(depth + 1) for _ in range(rng.randrange(0, 4))]
        if kind == 0:
            return tuple(items)
        if kind == 1:
            return items
        return {rng.choice([f"k{i}", i]): v for i, v in enumerate(items)}

    return ("msg", rng.randrange(8), node(0))


@pytest.mark.parametrize("seed", range(40))
def test_wire_round_trips_random_messages(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    msg = _random_message(rng)
    assert _same(wire.decode(wire.encode(msg)), msg)


def test_wire_never_unpickles():
    data = wire.encode(("batch", 0, 1, 2, 0.5, 16, 3.0, {}))
    assert b"\x80\x04" not in data[:16]  # no pickle protocol header: 8-byte length + JSON
    assert data[8:9] in (b"[", b"{")


def test_queue_is_fifo_and_delivers_a_message_larger_than_one_store_value(server):
    prefix = f"t/{uuid.uuid4().hex}/"
    writer, reader = command_queue(_client(server, prefix), 0), command_queue(_client(server, prefix), 0)
    reader.init()
    big = torch.arange((CHUNK * 2 + 12345) // 4, dtype=torch.float32)  # three store values
    msgs = [("avg", i, big if i == 3 else torch.full((2,), float(i))) for i in range(6)]
    with pytest.raises(queue.Empty):
        reader.get_nowait()
    for m in msgs:
        writer.put(m)
    got = [reader.get(timeout=5.0) for _ in msgs]
    assert all(_same(g, m) for g, m in zip(got, msgs))
    with pytest.raises(queue.Empty):
        reader.get(timeout=0.01)


def test_a_message_cut_short_is_never_delivered(server):
    """A writer killed mid-message (chunks pushed, count not bumped) leaves nothing a reader takes as whole."""
    prefix = f"t/{uuid.uuid4().hex}/"
    store = _client(server, prefix)
    reader = command_queue(store, 0)
    reader.init()
    store.queue_push("cmd/0", b"\x01" + b"x" * 100)  # a first chunk, "more to come", then the writer dies
    with pytest.raises(queue.Empty):
        reader.get(timeout=0.05)


def test_a_worker_sees_its_commands_through_its_one_board_read(server):
    """The worker's idle check costs no round trip: a command shows once the pass's board read brings the count."""
    prefix = f"t/{uuid.uuid4().hex}/"
    inbox, cmds, coord_board = coordinator_channels(_client(server, prefix), 2)
    events, mine, board = channels(_client(server, prefix), 1, 2)
    cmds[1].put(("work", [(0, 5)]))
    with pytest.raises(queue.Empty):
        mine.get_nowait()  # not seen yet: no count read since
    plan, rows = board.read()
    assert plan is None and rows == [Row(0, 0, 0.0, False, -1, 0)] * 2
    assert mine.get_nowait() == ("work", [(0, 5)])
    cmds[1].put(("end",))
    assert mine.get(timeout=5.0) == ("end",)  # a blocking get reads the count itself


def test_inbox_reads_every_rank_round_robin(server):
    prefix = f"t/{uuid.uuid4().hex}/"
    inbox, _, _ = coordinator_channels(_client(server, prefix), 3)
    writers = [channels(_client(server, prefix), r, 3)[0] for r in range(3)]

    def write(r):
        for i in range(20):
            writers[r].put(("batch", r, i))

    threads = [threading.Thread(target=write, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = [inbox.get(timeout=5.0) for _ in range(60)]
    assert inbox.get(timeout=0.01) is None
    for r in range(3):
        assert [m[2] for m in got if m[1] == r] == list(range(20))  # each rank's order kept
    assert [m[1] for m in got[:6]] == [0, 1, 2, 0, 1, 2]  # no rank starved while others have messages


@pytest.mark.parametrize("seed", range(20))
def test_store_board_reads_what_the_shared_memory_board_reads(server, seed):
    """Random writes of rows and plans to both boards; every read agrees with the shared-memory reference."""
    rng = random.Random(seed)
    world = rng.randrange(1, 5)
    ref = Board.create(world)
    prefix = f"t/{uuid.uuid4().hex}/"
    _, _, store_board = coordinator_channels(_client(server, prefix), world)
    reader = StoreBoard(world, _client(server, prefix))
    assert reader.read() == ref.read()
    for _ in range(30):
        if rng.random() < 0.7:
            q = rng.randrange(world)
            row = Row(rng.randrange(50), rng.randrange(50), rng.random() * 1e4, rng.random() < 0.3,
                      rng.randrange(-1, 50), rng.randrange(10_000))
            ref.write_row(q, row)
            store_board.write_row(q, row)
        else:
            def opt(make):
                return None if rng.random() < 0.3 else make()
            plan = Plan(round=rng.randrange(100), static=rng.random() < 0.5,
                        threshold_ms=opt(lambda: rng.random() * 500), max_ahead=opt(lambda: rng.randrange(8)),
                        batch_diff=opt(lambda: rng.randrange(8)), hold_rank=opt(lambda: rng.randrange(world)),
                        counts=tuple(rng.randrange(1, 20) for _ in range(world)),
                        mask=tuple(rng.random() < 0.8 for _ in range(world)))
            ref.post_plan(plan)
            store_board.post_plan(plan)
        assert reader.read() == ref.read()
        assert reader.read_plan() == ref.read_plan()
        only = [rng.random() < 0.5 for _ in range(world)]
        assert reader.read_rows(only) == ref.read_rows(only)
        q = rng.randrange(world)
        assert reader.read_row(q) == ref.read_row(q)


def test_liveness_names_a_stopped_heartbeat_and_not_a_running_one(server):
    prefix = f"t/{uuid.uuid4().hex}/"
    store = _client(server, prefix)
    alive, dead = Heartbeat(store, "a", period_s=0.05), Heartbeat(store, "b", period_s=0.05)
    try:
        watch = Liveness(_client(server, prefix), ["a", "b"], timeout_s=0.5)
        dead.stop()
        deadline = time.monotonic() + 5.0
        silent: dict = {}
        while time.monotonic() < deadline and not silent:
            silent = watch.silent()
            time.sleep(0.05)
        assert list(silent) == ["b"] and silent["b"] > 0.5
    finally:
        alive.stop()


def test_a_lost_store_is_one_named_error():
    s = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    client = dist.PrefixStore("t/", dist.TCPStore("127.0.0.1", s.port, None, False, timeout=timedelta(seconds=2)))
    reader = command_queue(client, 0)
    reader.init()
    del s  # the store's host goes away
    with pytest.raises(StoreLost, match="lost contact with the run's store"):
        for _ in range(50):
            reader.get(timeout=0.05)
