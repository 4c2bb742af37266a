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
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import torch

from .board import Board, Row, must_wait, round_ready
from .state import ModelState, relative_distance
from .step import Recipe, build_replica

__all__ = ["WorkerSpec", "worker_main"]

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
    port: int
    timeout_s: float
    startup_timeout_s: float
    threads: int
    parent_pid: int

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
    def __init__(self, rank: int, spec: WorkerSpec, events: Any, cmds: Any, board_array: Any) -> None:
        self.rank = rank
        self.spec = spec
        self.events = events
        self.cmds = cmds
        self.board = Board(spec.world, board_array)
        self.sync = spec.policy == "sync"
        self.collective = spec.backend == "nccl"
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
        self.batches = 0
        self.wall_ms = 0.0
        self.done = False
        self.ended = False
        self.work: deque[tuple[int, int]] = deque()
        self.snaps: dict[int, torch.Tensor] = {}
        self.pending: set[int] = set()
        self.apply_ms = 0.0
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
                    f"flodl-hf builder: worker {self.rank}: the caller's process is gone; exiting",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(1)

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
            self.apply_average(msg[1], msg[2], msg[3])
        elif kind == "want_state":
            self.want_state = True
        elif kind == "stop":
            raise _Stop()

    def publish(self) -> None:
        self.board.write_row(self.rank, Row(self.k, self.batches, self.wall_ms, self.done))

    # -- start -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        layout = self.state.layout
        init = None
        if not self.collective and self.rank == 0:
            init = (self.state.flat_params(), self.state.flat_buffers())
        desc = str(self.device) + (
            f" ({torch.cuda.get_device_name(self.device)})" if self.device.type == "cuda" else ""
        )
        self.events.put(("ready", self.rank, layout, desc, init))
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
        if payload is not None:
            self.state.load_params(payload[0])
            self.state.load_buffers(payload[1])
        if self.collective:
            self._init_group()
        torch.manual_seed(self.spec.recipe.seed + 1000 + self.rank)  # per-rank randomness (dropout, ...)
        self.publish()

    def _comm_device(self) -> torch.device:
        return self.device if all(d.startswith("cuda") for d in self.spec.devices) else torch.device("cpu")

    def _init_group(self) -> None:
        import torch.distributed as dist

        backend = "nccl" if self._comm_device().type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{self.spec.port}",
            rank=self.rank,
            world_size=self.spec.world,
            timeout=timedelta(seconds=self.spec.timeout_s),
        )
        self.pg_ready = True
        dev = self._comm_device()
        flat = torch.cat([self.state.flat_params_on(dev), self.state.flat_buffers_on(dev)])
        dist.broadcast(flat, src=0)  # every replica starts from rank 0's weights
        n = self.state.layout.param_numel
        self.state.load_params(flat[:n])
        self.state.load_buffers(flat[n:])

    # -- loop ------------------------------------------------------------------------------------------------
    def run(self) -> None:
        while not self.finished:
            self.poll()
            if not self.done and not self.work and self.ended:
                self.done = True
                self.publish()
            if self.try_average():
                continue
            plan = self.board.read_plan()
            row = Row(self.k, self.batches, self.wall_ms, self.done)
            blocked = must_wait(plan, row, self.rank, self.sync) or (self.sync and bool(self.pending))
            if self.work and not blocked:
                self.train_one()
            else:
                self.poll(_POLL_S)
        while True:  # finished: wait for the coordinator to release us (it may still read our last message)
            self.poll(0.05)

    def train_one(self) -> None:
        epoch, b = self.work.popleft()
        loss, samples, wall_ms, scalars = self.rep.run(epoch, b)
        self.batches += 1
        self.wall_ms += wall_ms
        self.publish()
        self.events.put(("batch", self.rank, epoch, b, loss, samples, wall_ms, scalars))

    def try_average(self) -> bool:
        plan = self.board.read_plan()
        if plan is None or not plan.applies_to(self.k) or not plan.mask[self.rank]:
            return False
        if not round_ready(plan, self.board.read_rows(only=plan.mask), self.k):
            return False
        if self.collective:
            self.all_reduce_round()
        else:
            self.send_snapshot()
        return True

    def _next_round(self) -> None:
        self.k += 1
        self.batches = 0
        self.wall_ms = 0.0
        self.publish()

    def all_reduce_round(self) -> None:
        import torch.distributed as dist

        start = time.perf_counter()
        dev = self._comm_device()
        world = self.spec.world
        weight = float(max(1, self.batches))
        params = self.state.flat_params_on(dev)
        buffers = self.state.flat_buffers_on(dev)
        tail = torch.tensor([weight, 0.0 if self.done else 1.0], dtype=torch.float32, device=dev)
        payload = torch.cat([params * weight, buffers / world, tail])
        dist.all_reduce(payload)
        n_p, n_b = params.numel(), buffers.numel()
        values = payload[n_p + n_b :].tolist()
        avg = payload[:n_p] / values[0]
        divergence = relative_distance(params, avg)
        self.state.load_params(avg)
        self.state.load_buffers(payload[n_p : n_p + n_b])
        sync_ms = (time.perf_counter() - start) * 1000.0
        final = values[1] < 0.5
        self.events.put(("round", self.rank, self.k, self.batches, self.wall_ms, sync_ms, divergence, final))
        if self.rank == 0 and (self.want_state or final):
            self.want_state = False
            self.events.put(("state", self.rank, self.k, self.state.state_dict_cpu(), final))
        self._next_round()
        if final:
            self.finished = True

    def send_snapshot(self) -> None:
        start = time.perf_counter()
        params = self.state.flat_params()
        buffers = self.state.flat_buffers()
        others = self.state.other_values()
        self.snaps[self.k] = params  # read-only from here on: it is shared with the coordinator
        self.pending.add(self.k)
        sync_ms = (time.perf_counter() - start) * 1000.0 + self.apply_ms
        self.apply_ms = 0.0
        self.events.put(
            (
                "snap",
                self.rank,
                self.k,
                self.batches,
                self.wall_ms,
                sync_ms,
                self.done,
                params,
                buffers,
                others,
            )
        )
        self._next_round()

    def apply_average(self, k: int, avg_params: torch.Tensor, avg_buffers: torch.Tensor) -> None:
        """Apply round ``k``'s average: keep the local progress made since the snapshot (``p += avg - snap``);
        a worker that was left out of the round takes the average as is."""
        start = time.perf_counter()
        snap = self.snaps.pop(k, None)
        if snap is not None:
            self.state.add_to_params(avg_params - snap)
        else:
            self.state.load_params(avg_params)
        self.state.load_buffers(avg_buffers)
        for old in [r for r in self.snaps if r < k]:
            del self.snaps[old]
        self.pending = {r for r in self.pending if r > k}
        if self.k <= k:  # left out of round k: catch up with the others
            self.k = k
            self._next_round()
        self.apply_ms += (time.perf_counter() - start) * 1000.0


def worker_main(rank: int, spec: WorkerSpec, events: Any, cmds: Any, board_array: Any) -> None:
    """Entry point of a spawned worker process."""
    code = 0
    worker: Optional[_Worker] = None
    try:
        worker = _Worker(rank, spec, events, cmds, board_array)
        worker.start()
        worker.run()
    except _Stop:
        code = 0
    except BaseException:  # noqa: BLE001 - report anything to the coordinator, then exit non-zero
        code = 1
        try:
            events.put(("error", rank, traceback.format_exc()))
        except Exception:  # noqa: BLE001
            pass
    finally:
        if worker is not None and worker.pg_ready:
            try:
                import torch.distributed as dist

                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
