"""The builder's control plane over the torch.distributed store: message queues, the status board, heartbeats.

Why it exists: builder mode's workers must be able to live on other machines, so nothing between them and the
coordinator may assume one host (no ``multiprocessing`` queues, no shared memory, no ``os.getppid`` of a common
parent). The c10d store (the ``TCPStore`` that ``torchrun`` or the builder's own launcher already runs for the
process group's rendezvous) reaches every rank, so the control plane lives there, under its own key prefix:

* :class:`StoreQueue`: one queue per direction and rank (``ev/<rank>``: the worker's reports, ``cmd/<rank>``: the
  coordinator's commands), each with a single writer, so a message split into chunks (the store refuses values
  over 8 MiB) arrives whole and in order. Messages are :mod:`~flodl_hf.builder.wire` bytes, never pickles.
* :class:`StoreBoard`: the status board (:mod:`~flodl_hf.builder.board`) with one key per row and one for the
  plan: a key's value is replaced atomically, so the sequence lock of the shared-memory board is not needed, and
  a worker reads every row in one ``multi_get``.
* :class:`Heartbeat`: a thread per process adds to ``hb/<name>`` every second on its own store connection, so a
  rank training a long batch or waiting in a collective still shows it is alive; :class:`Liveness` turns the
  counters into "lost for N seconds" on the reader's clock (no clock is compared across machines).
* ``abort``: the coordinator writes one line there when the run fails; every rank polls it and exits with it.

Any store error means the store's host (rank 0's node) is gone: :class:`StoreLost` names that.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Optional, Sequence

from ..distributed.errors import DistributedError
from . import wire
from .board import _ROW, Board

__all__ = ["StoreLost", "StoreQueue", "StoreInbox", "StoreBoard", "Heartbeat", "Liveness", "post_abort",
           "announce_abort", "abort_line", "read_abort", "event_queue", "command_queue", "CHUNK"]

#: Bytes per store value (the libuv TCPStore refuses payloads over 8 MiB).
CHUNK = 4 * 1024 * 1024
_MORE, _LAST = b"\x01", b"\x00"


class StoreLost(DistributedError):
    """The store stopped answering: its host (the first node, or the launching process) is gone."""


def _store_call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - QueueEmptyError is handled by callers before this
        if type(exc).__name__ == "QueueEmptyError":
            raise
        raise StoreLost(
            f"lost contact with the run's store ({type(exc).__name__}: {str(exc).splitlines()[0][:160]}): the "
            "first node (or the process that launched the workers) is gone"
        ) from None


class StoreQueue:
    """A single-writer message queue in the store, with ``put``, ``get(timeout)`` and ``get_nowait``.

    With ``notify``, the writer sets that counter to its count of messages after each whole one (a ``set`` and a
    ``queue_push`` need no reply, and one connection's requests are applied in order, so a ``put`` costs no round
    trip and a count the reader sees never runs ahead of the chunks), and the reader pops only what the counter
    says is there: ``get_nowait`` trusts the last count it saw (refreshed by :meth:`seen`, which the
    worker's one ``multi_get`` per pass feeds, or by a blocking ``get``), so an idle check costs no round trip."""

    def __init__(self, store: Any, key: str, notify: Optional[str] = None) -> None:
        self.store = store
        self.key = key
        self.notify = notify
        self._parts: list[bytes] = []
        self._consumed = 0  # whole messages popped
        self._known = 0  # the writer's count, as last read
        self._sent = 0  # whole messages put (the writer's side)

    def init(self) -> None:
        """Create the counter (the reader's ``multi_get`` needs the key to exist); idempotent."""
        if self.notify is not None:
            _store_call(self.store.add, self.notify, 0)

    def seen(self, count: int) -> None:
        self._known = max(self._known, int(count))

    def put(self, msg: Any) -> None:
        data = wire.encode(msg)
        for start in range(0, max(1, len(data)), CHUNK):
            part = data[start : start + CHUNK]
            flag = _MORE if start + CHUNK < len(data) else _LAST
            _store_call(self.store.queue_push, self.key, flag + part)
        if self.notify is not None:
            self._sent += 1
            _store_call(self.store.set, self.notify, str(self._sent))

    def pending(self) -> bool:
        """A whole message is waiting, by the last count seen (no round trip)."""
        return self._known > self._consumed

    def _pop(self, fresh: bool = True) -> Optional[Any]:
        if self.notify is not None:
            if fresh and not self.pending():
                self.seen(_store_call(self.store.add, self.notify, 0))
            if not self.pending():
                return None
        elif not _store_call(self.store.queue_len, self.key):
            return None
        while True:
            try:
                frame = _store_call(self.store.queue_pop, self.key, False)
            except Exception:  # noqa: BLE001 - QueueEmptyError: another pass will see it
                return None
            self._parts.append(bytes(frame[1:]))
            if frame[:1] == _LAST:
                data, self._parts = b"".join(self._parts), []
                self._consumed += 1
                return wire.decode(data)
            if self.notify is None and not _store_call(self.store.queue_len, self.key):
                return None  # the rest of the message is not there yet (no counter to wait for)

    def get_nowait(self) -> Any:
        msg = self._pop(fresh=self.notify is None)
        if msg is None:
            raise queue.Empty
        return msg

    def get(self, timeout: float = 0.0) -> Any:
        deadline = time.monotonic() + timeout
        fresh = self.notify is None  # the count seen last pass first, then the store's
        while True:
            msg = self._pop(fresh)
            if msg is not None:
                return msg
            left = deadline - time.monotonic()
            if left <= 0 and fresh:
                raise queue.Empty
            time.sleep(max(0.0, min(0.002, left)))
            fresh = True


class StoreInbox:
    """The coordinator's side of every worker's ``ev/<rank>`` queue, read round robin (the Inbox interface): one
    ``multi_get`` of the writers' counters tells which queues hold whole messages."""

    def __init__(self, store: Any, world: int) -> None:
        self.store = store
        self.queues = [event_queue(store, r) for r in range(world)]
        for q in self.queues:
            q.init()
        self._keys = [q.notify for q in self.queues]
        self._next = 0

    def _ready(self) -> Optional[tuple]:
        for i in range(len(self.queues)):
            r = (self._next + i) % len(self.queues)
            if self.queues[r].pending():
                msg = self.queues[r]._pop(fresh=False)
                if msg is not None:
                    self._next = (r + 1) % len(self.queues)
                    return msg
        return None

    def get(self, timeout: float) -> Optional[tuple]:
        deadline = time.monotonic() + timeout
        while True:
            msg = self._ready()
            if msg is not None:
                return msg
            for q, count in zip(self.queues, _store_call(self.store.multi_get, self._keys)):
                q.seen(int(count))
            msg = self._ready()
            if msg is not None:
                return msg
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(0.002, left))


def event_queue(store: Any, rank: int) -> StoreQueue:
    """Rank ``rank``'s reports to the coordinator."""
    return StoreQueue(store, f"ev/{rank}", notify=f"ev/{rank}/n")


def command_queue(store: Any, rank: int) -> StoreQueue:
    """The coordinator's commands to rank ``rank``."""
    return StoreQueue(store, f"cmd/{rank}", notify=f"cmd/{rank}/n")


class StoreBoard(Board):
    """The status board with a key per record (``board/<base>``): the same rows, plan and predicate. A worker
    reads the plan, every row and (``watch``) its command queue's counter in one ``multi_get`` per pass."""

    def __init__(self, world: int, store: Any) -> None:
        super().__init__(world, None)
        self.store = store
        self._keys = [f"board/{q * _ROW}" for q in range(self.world)]
        self._plan_key = f"board/{self._plan_at}"
        self.watch: Optional[StoreQueue] = None

    def _write(self, base: int, values: Sequence[float]) -> None:
        _store_call(self.store.set, f"board/{base}", ",".join(repr(float(v)) for v in values))

    def init(self) -> None:
        """Create every row (empty) and the plan key (no plan yet), so that one ``multi_get`` reads them all (the
        coordinator, before any worker starts)."""
        for q in range(self.world):
            self._write(q * _ROW, [0.0] * (_ROW - 1))
        _store_call(self.store.set, self._plan_key, b"")

    @staticmethod
    def _row(raw: bytes) -> Any:
        from .board import Row

        r, b, w, d, f, t = (float(v) for v in raw.decode().split(","))
        return Row(int(r), int(b), w, d > 0.5, int(f) - 1, int(t))

    def _plan(self, raw: bytes) -> Any:
        if not raw:
            return None
        from .board import Plan

        v = [float(x) for x in raw.decode().split(",")]
        w = self.world
        return Plan(
            round=int(v[0]), static=v[1] > 0.5, threshold_ms=None if v[2] < 0 else v[2],
            max_ahead=None if v[3] < 0 else int(v[3]), batch_diff=None if v[4] < 0 else int(v[4]),
            hold_rank=None if v[5] < 0 else int(v[5]), counts=tuple(int(c) for c in v[6 : 6 + w]),
            mask=tuple(m > 0.5 for m in v[6 + w : 6 + 2 * w]),
        )

    def read_row(self, rank: int) -> Any:
        return self._row(_store_call(self.store.get, self._keys[rank]))

    def read_rows(self, only: Optional[Sequence[bool]] = None) -> list:
        from .board import Row

        empty = Row(0, 0, 0.0, False, -1, 0)
        values = _store_call(self.store.multi_get, self._keys)
        return [empty if only is not None and not only[q] else self._row(raw) for q, raw in enumerate(values)]

    def read_plan(self) -> Any:
        return self._plan(_store_call(self.store.get, self._plan_key))

    def read(self) -> tuple:
        from .board import Row

        keys = [self._plan_key, *self._keys]
        if self.watch is not None and self.watch.notify is not None:
            keys.append(self.watch.notify)
        values = _store_call(self.store.multi_get, keys)
        plan = self._plan(values[0])
        empty = Row(0, 0, 0.0, False, -1, 0)
        rows = [empty if plan is not None and not plan.mask[q] else self._row(raw)
                for q, raw in enumerate(values[1 : 1 + self.world])]
        if len(values) > 1 + self.world:
            self.watch.seen(int(values[-1]))
        return plan, rows


class Heartbeat:
    """A daemon thread that adds 1 to ``hb/<name>`` every ``period_s`` on its own store connection."""

    def __init__(self, store: Any, name: str, period_s: float = 1.0) -> None:
        self.store = store.clone()
        self.key = f"hb/{name}"
        self.period_s = float(period_s)
        self._stop = threading.Event()
        _store_call(self.store.add, self.key, 1)
        self.thread = threading.Thread(target=self._run, name=f"flodl-hf-heartbeat-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.store.add(self.key, 1)
            except Exception:  # noqa: BLE001 - the store is gone: the main loop finds out and says so
                return

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2.0)


class Liveness:
    """Which of ``names``' heartbeats have not moved for ``timeout_s`` (on this process's clock)."""

    def __init__(self, store: Any, names: Sequence[str], timeout_s: float) -> None:
        self.store = store
        self.names = list(names)
        self.keys = [f"hb/{n}" for n in self.names]
        self.timeout_s = float(timeout_s)
        now = time.monotonic()
        self._last: dict[str, tuple[int, float]] = {n: (-1, now) for n in self.names}

    def silent(self) -> dict[str, float]:
        """``{name: seconds since its heartbeat last moved}`` for those silent longer than the timeout."""
        for key in self.keys:
            _store_call(self.store.add, key, 0)
        values = _store_call(self.store.multi_get, self.keys)
        now = time.monotonic()
        out = {}
        for name, raw in zip(self.names, values):
            count = int(raw)
            seen, since = self._last[name]
            if count != seen:
                self._last[name] = (count, now)
            elif now - since > self.timeout_s:
                out[name] = now - since
        return out


def abort_line(exc: BaseException) -> str:
    """The one line every surviving rank prints for the run's error."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def announce_abort(store: Any, exc: BaseException) -> None:
    """Post ``exc``'s first line as the run's abort line."""
    post_abort(store, abort_line(exc))


def post_abort(store: Any, line: str) -> None:
    """Tell every rank the run failed (best effort: the store may be the thing that is gone)."""
    try:
        store.set("abort", line)
    except Exception:  # noqa: BLE001
        pass


def read_abort(store: Any) -> Optional[str]:
    if _store_call(store.check, ["abort"]):
        return bytes(_store_call(store.get, "abort")).decode("utf-8", "replace")
    return None
