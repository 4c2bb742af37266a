"""The worker process: one per device, it trains its replica and takes part in the averages.

Why it exists as its own module: it is the only code that runs in the spawned processes, so it stays small and
imports only what a worker needs. A worker builds its model and optimizer from the picklable factories, waits
for the coordinator's start signal, then loops: run the batches it was handed, publish its progress on the
status board, and when the board says the round fires (same predicate on every worker) either all-reduce with
the others (collective backend) or send a snapshot to the coordinator and keep training (CPU backend),
applying ``average - snapshot`` when the average comes back. It never blocks without a timeout, and exits if
the caller's process disappears.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Optional

import torch

from . import allreduce
from .board import Board, Plan, Row, must_wait, round_ready
from .slots import Slots
from .state import ModelState, pack_tree
from .step import Recipe, build_replica

__all__ = ["WorkerSpec", "serve", "worker_main"]

_POLL_S = 0.0005
_PARENT_CHECK_S = 1.0


@dataclass
class WorkerSpec:
    """What every worker is given at spawn (picklable)."""

    recipe: Recipe
    devices: list[str]
    speeds: list[float]
    policy: str  # "sync" | "cadence" | "async"
    backend: str  # "nccl" | "cpu"
    timeout_s: float
    startup_timeout_s: float
    threads: int
    parent_pid: int
    timeline: bool = False

    @property
    def world(self) -> int:
        return len(self.devices)


def _alive(pid: int) -> bool:
    """Is the caller's process still there? (Our parent under spawn; the forkserver's parent otherwise.)"""
    if os.getppid() == pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Stop(Exception):
    """The coordinator asked this worker to stop (normal end or abort)."""


class _Worker:
    def __init__(self, rank: int, spec: WorkerSpec, events: Any, cmds: Any, board: Board,
                 check: Optional[Callable[[], None]] = None, store: Any = None) -> None:
        self.rank = rank
        self.spec = spec
        self.events = events
        self.cmds = cmds
        self.board = board
        self.check = check  # the store transport's liveness checks (the run's abort line, the coordinator's heartbeat)
        self.store = store  # the store transport: the process group's rendezvous is this store
        self.sync = spec.policy == "sync"
        self.collective = spec.backend == "nccl"
        self.slots: Optional[Slots] = None  # CPU backend: given with the start signal
        self._last_parent_check = time.monotonic()
        self.device = torch.device(spec.devices[rank])
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        else:
            torch.set_num_threads(max(1, spec.threads))
        self.rep = build_replica(spec.recipe, self.device, speed=spec.speeds[rank])
        self.state = ModelState(self.rep.model)
        # progress in the current round, and what is pending
        self.k = 0
        self.fired = -1
        self.batches = 0
        self.samples = 0
        self.wall_ms = 0.0
        self.done = False
        self.ended = False
        self.work: deque[tuple[int, int]] = deque()
        self.snap_round: Optional[int] = None  # CPU backend: round whose snapshot is in our slot, not yet answered
        self.present: list[bool] = []  # SYNC + CPU backend: which parameters had a gradient in our snapshot
        self.applied = -1  # last round whose average was applied
        self.reload = False  # an average slot was overwritten under us: take the next average as is
        self.global_step = spec.recipe.start_step  # batches run by every device, counted at the last average
        self.total = 0  # batches this worker ran in this run (published: the others' LR schedules count them)
        self.totals = [0] * spec.world  # the highest total read of each rank (a dropped rank's row reads as empty)
        self.sync_ms = 0.0
        self.want_state = False
        self.finished = False
        self.pg_ready = False

    # -- messaging -------------------------------------------------------------------------------------------
    def _check_parent(self) -> None:
        now = time.monotonic()
        if now - self._last_parent_check >= _PARENT_CHECK_S:
            self._last_parent_check = now
            if not _alive(self.spec.parent_pid):
                print(
                    f"flodl-hf builder: worker {self.rank}: the process that started it (the caller, or its torchrun "
                    "agent) is gone; exiting",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(1)
            if self.check is not None:
                self.check()

    def poll(self, timeout: float = 0.0) -> None:
        """Handle every waiting command; wait up to ``timeout`` s for the first one."""
        self._check_parent()
        try:
            msg = self.cmds.get(timeout=timeout) if timeout > 0 else self.cmds.get_nowait()
        except queue.Empty:
            return
        self.handle(msg)
        while True:
            try:
                msg = self.cmds.get_nowait()
            except queue.Empty:
                return
            self.handle(msg)

    def handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "work":
            self.work.extend(msg[1])
            self.ended = False
            if self.done:  # orphaned batches of a lost worker (CPU backend)
                self.done = False
                self.publish()
        elif kind == "end":
            self.ended = True
        elif kind == "avg":
            self.apply_average(*msg[1:])
        elif kind == "want_state":
            self.want_state = True
            self._maybe_send_state()
        elif kind == "stop":
            raise _Stop()

    def _maybe_send_state(self) -> None:
        """CPU backend under SYNC: the replicas are identical between steps, so the coordinator asks one worker
        for the model (for a checkpoint or the result) instead of averaging gradients into one."""
        if self.want_state and not self.collective and self.snap_round is None and not self.reload:
            self.want_state = False  # the model holds the averages of rounds up to self.applied, nothing since
            self.events.put(("state", self.rank, self.applied, self.state.flat_state(), self.state.other_values(),
                             False, self._optimizer_state()))

    def _optimizer_state(self) -> Optional[tuple]:
        """SYNC: the optimizer's state (every replica's is the same; a checkpoint carries it) in the checkpoint
        format's encoding, its tensors as safetensors bytes: a tensor put on a queue is moved into shared memory in
        place (under the optimizer still using it) and arrives holding one file descriptor per tensor for as long
        as the caller keeps it, and nothing here is ever unpickled."""
        return pack_tree(self.rep.optimizer.state_dict()) if self.sync else None

    def publish(self) -> None:
        self.board.write_row(self.rank, self._row())

    def _row(self) -> Row:
        return Row(self.k, self.batches, self.wall_ms, self.done, self.fired, self.total)

    def timeline(self, kind: str, t0: float, t1: float, **extra: Any) -> None:
        if self.spec.timeline:
            self.events.put(("tl", self.rank, kind, t0, t1, extra))

    # -- start -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        layout = self.state.layout
        init = None
        if not self.collective and self.rank == 0:
            init = self.state.flat_state()
        desc = str(self.device) + (
            f" ({torch.cuda.get_device_name(self.device)})" if self.device.type == "cuda" else ""
        )
        self.events.put(("ready", self.rank, layout, desc, init, socket.gethostname(), os.getpid()))
        deadline = time.monotonic() + self.spec.startup_timeout_s
        while True:
            self._check_parent()
            try:
                msg = self.cmds.get(timeout=0.1)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"worker {self.rank}: no start signal within {self.spec.startup_timeout_s:.0f} s"
                    ) from None
                continue
            if msg[0] == "start":
                break
            if msg[0] == "stop":
                raise _Stop()
        payload = msg[1]
        self.slots = msg[2]
        if payload is not None:
            self.state.load_flat(payload)
        if self.collective:
            self._init_group()
        torch.manual_seed(self.spec.recipe.seed + 1000 + self.rank)  # per-rank randomness (dropout, ...)
        self.publish()

    def _comm_device(self) -> torch.device:
        return self.device if all(d.startswith("cuda") for d in self.spec.devices) else torch.device("cpu")

    def _init_group(self) -> None:
        """The process group's rendezvous is the control plane's store (under ``pg/``): the one the builder
        hosts on a free port on one machine, or torchrun's, so two runs never race for a port."""
        import torch.distributed as dist

        if self.store is None:
            raise ValueError(f"worker {self.rank}: the collective backend needs the run's store (spawned by "
                             "start_store_workers or under torchrun)")
        timeout = timedelta(seconds=self.spec.timeout_s)
        world = self.spec.world
        backend = "nccl" if self._comm_device().type == "cuda" else "gloo"
        store = dist.PrefixStore("pg/", self.store)
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=world, timeout=timeout)
        self.pg_ready = True
        dev = self._comm_device()
        for t in [*self.state.params, *self.state.buffers]:  # every replica starts from rank 0's weights
            if t.device == dev:
                dist.broadcast(t.data, src=0)
            else:
                tmp = t.detach().to(dev)
                dist.broadcast(tmp, src=0)
                with torch.no_grad():
                    t.copy_(tmp)

    # -- loop ------------------------------------------------------------------------------------------------
    def run(self) -> None:
        waiting_since: Optional[float] = None
        while not self.finished:
            self.poll()
            if not self.done and not self.work and self.ended:
                self.done = True
                self.publish()
            plan, rows = self.board.read()  # one read of the board per pass, for both decisions
            rows[self.rank] = self._row()
            if self.try_average(plan, rows):
                continue
            blocked = (must_wait(plan, rows, self.rank, self.sync) or self.reload
                       or (self.sync and self.snap_round is not None))
            if self.work and not blocked:
                if waiting_since is not None:
                    self.timeline("wait", waiting_since, time.time())
                    waiting_since = None
                self.train_one(rows)
            else:
                if self.work and waiting_since is None:
                    waiting_since = time.time()
                self.poll(_POLL_S)
        while True:  # finished: wait for the coordinator to release us (it may still read our last message)
            self.poll(0.05)

    def train_one(self, rows: list[Row]) -> None:
        epoch, b = self.work.popleft()
        t0 = time.time()
        if not self.sync:
            # local SGD: the LR is the schedule at the global step, every batch any rank has finished so far (the
            # board's running totals), not this replica's own count since the last average, which lagged by up
            # to (world - 1) x anchor batches and never reached the schedule's end (SYNC steps at the averages)
            for q, row in enumerate(rows):
                self.totals[q] = max(self.totals[q], row.total)
            self.rep.schedule.advance_to(self.spec.recipe.start_step + sum(self.totals))
        lr, step = self.rep.lr(), self.rep.schedule.at
        if self.sync:
            start = time.perf_counter()
            loss, samples, _, scalars = self.rep.backward(epoch, b)
            wall_ms = self.rep.stretch((time.perf_counter() - start) * 1000.0)
        else:
            loss, samples, wall_ms, scalars = self.rep.run(epoch, b)
        self.batches += 1
        self.total += 1
        self.samples += samples
        self.wall_ms += wall_ms
        self.publish()
        self.events.put(("batch", self.rank, epoch, b, loss, samples, wall_ms, scalars))
        self.timeline("batch", t0, time.time(), epoch=epoch, batch=b, lr=lr, step=step)

    def try_average(self, plan: Optional[Plan], rows: list[Row]) -> bool:
        if plan is None or not plan.applies_to(self.k) or not plan.mask[self.rank]:
            return False
        if not round_ready(plan, rows, self.k, self.sync):
            return False
        self.fired = self.k
        self.publish()  # before acting: a rank held back by us may be released by our next batch, never now
        if self.collective:
            self.all_reduce_round()
        else:
            self.send_snapshot()
        return True

    def _next_round(self) -> None:
        self.k += 1
        self.batches = 0
        self.samples = 0
        self.wall_ms = 0.0
        self.publish()

    # -- collective backend ----------------------------------------------------------------------------------
    def all_reduce_round(self) -> None:
        t0 = time.time()
        start = time.perf_counter()
        dev = self._comm_device()
        params, buffers = self.state.params, self.state.buffers
        if self.sync:
            _, final, round_batches, noise = allreduce.average_gradients(
                params, buffers, self.samples, self.done, dev, self.spec.world)
            divergence = 0.0
            if not final:
                self.rep.apply_step(advance=False)
        else:
            noise = None
            divergence, round_batches, final = allreduce.average_parameters(
                params, buffers, self.batches, self.done, dev, self.spec.world)
        self.global_step += round_batches
        self.rep.schedule.advance_to(self.global_step)
        sync_ms = (time.perf_counter() - start) * 1000.0
        self.events.put(("round", self.rank, self.k, self.batches, self.wall_ms, sync_ms, divergence, final,
                         noise if self.rank == 0 else None))  # every rank computed the same noise inputs
        self.timeline("sync", t0, time.time(), round=self.k)
        if self.rank == 0 and (self.want_state or final):
            self.want_state = False
            self.events.put(("state", self.rank, self.k, self.state.flat_state(), self.state.other_values(), final,
                             self._optimizer_state()))
        self._next_round()
        if final:
            self.finished = True

    # -- CPU backend -----------------------------------------------------------------------------------------
    def _await_average(self) -> None:
        """Our previous snapshot's average must be applied before we take the next snapshot (bounded)."""
        deadline = time.monotonic() + self.spec.timeout_s
        t0 = time.time()
        while self.snap_round is not None or self.reload:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"worker {self.rank}: the coordinator sent no average for round {self.snap_round} within "
                    f"{self.spec.timeout_s:.0f} s (the builder's timeout)"
                )
            self.poll(0.005)
        if time.time() - t0 > 0.001:
            self.timeline("wait", t0, time.time(), cause="average")

    def send_snapshot(self) -> None:
        assert self.slots is not None  # noqa: S101 - the CPU backend always has slots
        self._await_average()
        t0 = time.time()
        start = time.perf_counter()
        slot = self.slots.snap[self.rank]
        if self.sync:
            self.present = self.state.write_grads(slot)
        else:
            self.state.write_flat(slot)
        self.snap_round = self.k
        sync_ms = (time.perf_counter() - start) * 1000.0 + self.sync_ms
        self.sync_ms = 0.0
        self.events.put((
            "snap", self.rank, self.k, self.batches, self.samples, self.wall_ms, sync_ms, self.done,
            self.state.other_values(), self.present if self.sync else None,
        ))
        self.timeline("sync", t0, time.time(), round=self.k)
        self._next_round()

    def apply_average(self, k: int, participants: list[int], global_step: int, present: Optional[list[bool]],
                      final: bool) -> None:
        """Apply round ``k``'s average from average slot ``k % 2``. A participant keeps the local progress made
        since its snapshot (``p += avg - snapshot``); a worker left out of the round takes the average as is.
        Under SYNC the average is the gradient: every replica takes the same optimizer step."""
        assert self.slots is not None  # noqa: S101
        if k <= self.applied:
            return
        start = time.perf_counter()
        t0 = time.time()
        avg = self.slots.avg[k % 2]
        mine = self.snap_round == k and self.rank in participants and not self.reload
        if not self.slots.holds(k):
            # overwritten by a later round before we got here (we lag two rounds): take that one instead
            self.reload = True
            self.snap_round = None
            return
        if self.sync:
            if not final:
                self.state.load_grads(avg, present or [])
                self.rep.apply_step(advance=False)
        elif mine:
            self.state.apply_delta(avg, self.slots.snap[self.rank])
        else:
            self.state.load_flat(avg)
        if not self.slots.holds(k):  # torn: the slot changed while we read it; the next average repairs us
            self.reload = True
            self.snap_round = None
            return
        self.reload = False
        self.applied = k
        if self.snap_round is not None and self.snap_round <= k:
            self.snap_round = None
        if self.k <= k:  # left out of round k: catch up with the others
            self.k = k
            self._next_round()
        self.global_step = int(global_step)
        self.rep.schedule.advance_to(self.global_step + (0 if self.sync else self.batches))
        self.sync_ms += (time.perf_counter() - start) * 1000.0
        self.timeline("apply", t0, time.time(), round=k)
        self._maybe_send_state()


def serve(rank: int, spec: WorkerSpec, events: Any, cmds: Any, board: Board,
          check: Optional[Callable[[], None]] = None, store: Any = None) -> _Worker:
    """Build one worker and run it until the coordinator stops it; return it (its model holds the result).

    Any other exception propagates, after it was reported to the coordinator with its traceback, except a
    ``DistributedError`` raised by ``check`` (the run's one-line verdict, or a lost store: nothing to report)."""
    from ..distributed.errors import DistributedError

    worker: Optional[_Worker] = None
    try:
        worker = _Worker(rank, spec, events, cmds, board, check=check, store=store)
        worker.start()
        worker.run()
    except _Stop:
        pass
    except DistributedError:
        raise
    except BaseException:
        try:
            events.put(("error", rank, traceback.format_exc()))
        except Exception:  # noqa: BLE001
            pass
        raise
    finally:
        if worker is not None and worker.pg_ready:
            try:
                import torch.distributed as dist

                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
    assert worker is not None  # noqa: S101 - _Stop comes only from a built worker
    return worker


def worker_main(rank: int, spec: WorkerSpec, events: Any, cmds: Any, board_array: Any) -> None:
    """Entry point of a spawned worker process (the CPU backend's queue transport)."""
    code = 0
    try:
        serve(rank, spec, events, cmds, Board(spec.world, board_array))
    except BaseException:  # noqa: BLE001 - serve() reported it to the coordinator; exit non-zero
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
