"""The coordinator: a thread in the caller's process that runs a multi-device builder job.

Why it exists: somebody must own what no single worker can decide alone: the epoch cursor (who trains on which
batch), El Che (how long a window is and how much each rank runs in it), the divergence guard, the plan each
round fires on, the CPU backend's averages, the per-epoch metrics, the checkpoints, and the failure policy. It
never trains and never blocks a worker: every get has a timeout, worker liveness is checked every few tens of
milliseconds, and whatever happens the workers are stopped (then terminated, then killed) before it returns.

Failure policy: an exception in a worker (user code) fails the run with the worker's traceback. A worker that
dies (killed, crashed) is dropped for good with the CPU backend, its unfinished batches going to the
survivors; with the collective backend the others cannot continue, so the run fails with ``DistributedError``
naming it.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import Any, Optional

from ..distributed.context import DistributedError
from .board import Plan
from .checkpoint import write_checkpoint
from .epochs import EpochBook
from .guard import AnchorControl, DivergenceGuard
from .lifecycle import Workers, stop_workers, wait_ready
from .progress import ProgressBar
from .rounds import CpuRounds, RoundResult, Snapshot
from .settings import BuilderSettings
from .state import Layout, state_from_flat
from .types import ApplyPolicy, AverageBackend, EpochMetrics, TrainedState
from .workpool import WorkPool

__all__ = ["Coordinator"]

log = logging.getLogger("flodl_hf.builder")
_GET_S = 0.02
_MAX_CHUNK = 4


class Coordinator:
    """Runs the job on started worker processes; ``run()`` is the thread's target."""

    def __init__(self, s: BuilderSettings, workers: Workers) -> None:
        self.s = s
        self.workers = workers
        self.devices = workers.devices
        self.world = len(workers.devices)
        self.procs = workers.procs
        self.events = workers.events
        self.cmds = workers.cmds
        self.board = workers.board
        self.collective = s.backend is AverageBackend.NCCL
        self.sync = s.policy is ApplyPolicy.SYNC
        self.metrics: "queue.Queue[Optional[EpochMetrics]]" = queue.Queue()
        self.history: list[EpochMetrics] = []
        self.result: Optional[TrainedState] = None
        self.error: Optional[BaseException] = None
        self.lost: list[int] = []
        self.live = set(range(self.world))
        self.cancelled = False
        guard = DivergenceGuard(float(s.divergence_threshold)) if s.divergence_guard else None
        self.anchor = AnchorControl(
            self.world,
            anchor=int(s.anchor),
            max_anchor=0 if self.sync else int(s.max_anchor),
            overhead_target=float(s.overhead_target),
            max_batch_diff=s.max_batch_diff,
            guard=guard,
        )
        self.pool = WorkPool(
            len(s.dataset), int(s.batch_size), int(s.num_epochs), self.world, equal_split=self.sync
        )
        self.book = EpochBook(int(s.num_epochs), self.pool.batches_per_epoch, self.world, self.devices)
        self.cpu_rounds = CpuRounds(float(s.round_timeout_s))
        self.collective_rounds: dict[int, dict[int, tuple]] = {}
        self.layout: Optional[Layout] = None
        self.plan: Optional[Plan] = None
        self.plan_deferred = False
        self.rounds = 0
        self.divergence: Optional[float] = None
        self.latest: Optional[tuple] = None  # (params, buffers, others) of the last CPU average
        self.ended: set[int] = set()
        self.pending_ckpt: list[int] = []
        self.state_requested = False
        self.final_round_done = False
        self.final_state: Any = None
        self.stopping = False
        self.bar = ProgressBar(int(s.num_epochs), enabled=bool(s.progress))
        stall = max(4.0 * float(s.timeout_s), 120.0)
        self.stall_s = stall

    # -- thread body -----------------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._startup()
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - handed to join()
            self.error = exc
        finally:
            self._shutdown()
            self.bar.close()
            self.metrics.put(None)

    def _get(self, timeout: float) -> Optional[tuple]:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None
        except Exception as exc:  # noqa: BLE001 - e.g. a tensor whose sender died before we mapped it
            log.warning("flodl-hf builder: dropped an unreadable worker message (%s)", exc)
            return None

    def _startup(self) -> None:
        ready = wait_ready(self.workers, self._get, lambda: self.cancelled)
        self.layout = ready[0][2]
        for r, msg in ready.items():
            if msg[2] != self.layout:
                raise ValueError(
                    f"model_factory built different models on rank 0 and rank {r} "
                    f"({self.devices[0]} vs {self.devices[r]}): it must build the same architecture "
                    "on every device"
                )
        init = ready[0][4]
        if init is not None:
            self.latest = (init[0], init[1], {})
        for r in range(self.world):
            self.cmds[r].put(("start", init if r != 0 else None))
        self.book.restart_clock()
        self._post_plan(0)
        for r in range(self.world):
            self._top_up(r)
        log.info("flodl-hf builder: %d workers started (%s)", self.world, self.anchor.el.describe())

    # -- plans and dispatch ----------------------------------------------------------------------------------
    def _post_plan(self, k: int) -> None:
        mask = tuple(r in self.live for r in range(self.world))
        if self.sync:
            plan = Plan(round=0, counts=(1,) * self.world, mask=mask, static=True)
        else:
            threshold = (
                self.anchor.threshold_ms(sorted(self.live)) if self.s.policy is ApplyPolicy.CADENCE else None
            )
            plan = Plan(
                round=k,
                counts=tuple(self.anchor.counts()),
                mask=mask,
                threshold_ms=threshold,
                max_ahead=self.s.max_batch_diff,
            )
        self.plan = plan
        self.plan_deferred = False
        self.board.post_plan(plan)

    def _chunk(self, rank: int) -> int:
        if self.sync:
            return 1
        counts = self.anchor.counts()
        slowest = min(counts[r] for r in self.live)
        return max(1, min(_MAX_CHUNK, counts[rank] // max(1, slowest)))

    def _top_up(self, rank: int) -> None:
        """Keep a rank supplied: it holds its current batch plus at least one more (progressive dispatch)."""
        if rank not in self.live:
            return
        while self.pool.held(rank) <= 1:
            items = self.pool.take(rank, self._chunk(rank))
            if not items:
                if rank not in self.ended:
                    self.ended.add(rank)
                    self.cmds[rank].put(("end",))
                return
            self.ended.discard(rank)
            self.cmds[rank].put(("work", items))

    # -- main loop -------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        last_event = last_check = time.monotonic()
        while not self.stopping:
            if self.cancelled:
                raise RuntimeError("the builder run was cancelled")
            msg = self._get(_GET_S)
            now = time.monotonic()
            if msg is not None:
                last_event = now
                self._handle(msg)
            if now - last_check >= 0.05 or msg is None:
                last_check = now
                self._check_workers()
                if not self.collective:
                    self._maybe_close_cpu_round()
            if now - last_event > self.stall_s:
                raise DistributedError(
                    f"no worker reported anything for {self.stall_s:.0f} s: stopping the run"
                )

    def _handle(self, msg: tuple) -> None:
        kind, rank = msg[0], msg[1]
        if kind == "batch":
            _, _, epoch, b, loss, samples, _wall, scalars = msg
            if self.pool.complete(rank, (epoch, b)):
                self.book.record(rank, epoch, loss, samples, scalars)
                self._top_up(rank)
                self._emit_epochs()
                if self.plan_deferred:
                    self._post_plan(self.cpu_rounds.current)
        elif kind == "snap":
            _, r, k, batches, wall, sync_ms, done, params, buffers, others = msg
            self.cpu_rounds.add(Snapshot(r, k, batches, wall, sync_ms, done, params, buffers, others))
            self._maybe_close_cpu_round()
        elif kind == "round":
            self._collective_round(msg)
        elif kind == "state":
            self._collective_state(msg[3], msg[4])
        elif kind == "error":
            dead = self._dead_peer(rank) if self.collective else None
            if dead is not None:  # the collective failed *because* a peer died: name the dead one
                raise self._death_error(dead)
            raise RuntimeError(f"worker {rank} ({self.devices[rank]}) failed:\n{msg[2]}")

    def _emit_epochs(self) -> None:
        for m in self.book.completed(
            anchor=self.anchor.anchor,
            rounds=self.rounds,
            divergence=self.divergence,
            lost_ranks=list(self.lost),
        ):
            self.history.append(m)
            every = self.s.checkpoint_every
            if every and ((m.epoch + 1) % every == 0 or m.epoch + 1 == self.s.num_epochs):
                self.pending_ckpt.append(m.epoch)
                if self.collective and not self.state_requested and m.epoch + 1 < self.s.num_epochs:
                    self.state_requested = True
                    self.cmds[0].put(("want_state",))
            self.bar.update(m)
            if self.s.metrics_fn is not None:
                self.s.metrics_fn(m)
            self.metrics.put(m)

    # -- collective backend ----------------------------------------------------------------------------------
    def _collective_round(self, msg: tuple) -> None:
        _, r, k, batches, wall, sync_ms, divergence, final = msg
        got = self.collective_rounds.setdefault(k, {})
        got[r] = (batches, wall, sync_ms, divergence, final)
        if len(got) < self.world:
            return
        del self.collective_rounds[k]
        self.rounds += 1
        self.divergence = max(v[3] for v in got.values())
        wall_ms = [got[q][1] for q in range(self.world)]
        work = [got[q][0] for q in range(self.world)]
        sync = sum(v[2] for v in got.values()) / self.world
        self.anchor.report(wall_ms, work, sync, self.divergence)
        if any(v[4] for v in got.values()):
            self.final_round_done = True
            self._try_finish()
        else:
            self._post_plan(k + 1)

    def _collective_state(self, state: Any, final: bool) -> None:
        """Rank 0's averaged state after a round: for pending checkpoints, and the result after the final
        round."""
        self.state_requested = False
        self._write_checkpoints(state)
        if final:
            self.final_state = state
            self._try_finish()

    def _try_finish(self) -> None:
        # Rank 0's final state may overtake another worker's last batch reports (each worker's queue feeder
        # flushes on its own); every worker's "round" message follows its batch reports, so once the final
        # round is complete every epoch has been reported.
        if self.final_round_done and self.final_state is not None:
            self._finish(self.final_state)

    # -- CPU backend -----------------------------------------------------------------------------------------
    def _expected(self) -> set[int]:
        mask = self.plan.mask if self.plan is not None else (True,) * self.world
        return {r for r in self.live if mask[r]}

    def _maybe_close_cpu_round(self) -> None:
        if self.collective or self.stopping:
            return
        expected = self._expected()
        if not self.cpu_rounds.ready(expected):
            return
        result = self.cpu_rounds.close(expected)
        self._apply_cpu_round(result)

    def _apply_cpu_round(self, res: RoundResult) -> None:
        if res.left_out:
            log.warning(
                "flodl-hf builder: workers %s did not answer round %d within %.1f s: left out of it",
                res.left_out,
                res.round,
                self.s.round_timeout_s,
            )
        for r in sorted(self.live):
            self.cmds[r].put(("avg", res.round, res.params, res.buffers))
        self.rounds += 1
        self.divergence = res.divergence
        self.latest = (res.params, res.buffers, res.others)
        wall = [res.snapshots[r].wall_ms if r in res.snapshots else 0.0 for r in range(self.world)]
        work = [res.snapshots[r].batches if r in res.snapshots else 0 for r in range(self.world)]
        sync = sum(s.sync_ms for s in res.snapshots.values()) / len(res.snapshots)
        self.anchor.report(wall, work, sync, res.divergence)
        final = res.all_done and self.pool.all_complete()
        if self.pending_ckpt or final:  # rebuilding the state dict copies the model: only when needed
            state = self._cpu_state()
            self._write_checkpoints(state)
            if final:
                self._finish(state)
                return
        if res.all_done:  # everyone idle but work is still out (a silent worker holds it): wait for news
            self.plan_deferred = True
            return
        self._post_plan(res.round + 1)

    def _cpu_state(self) -> Any:
        if self.latest is None or self.layout is None:  # pragma: no cover - a round always precedes this
            raise RuntimeError("no average exists yet")
        params, buffers, others = self.latest
        return state_from_flat(self.layout, params, buffers, others)

    # -- failures --------------------------------------------------------------------------------------------
    @staticmethod
    def _how(code: Optional[int]) -> str:
        return f"exit code {code}" + (" (killed by signal %d)" % -code if code is not None and code < 0 else "")

    def _death_error(self, r: int) -> DistributedError:
        proc = self.procs[r]
        return DistributedError(
            f"worker {r} ({self.devices[r]}, pid {proc.pid}) died ({self._how(proc.exitcode)}); with "
            "AverageBackend.NCCL every worker takes part in every average, so the run cannot continue: all workers "
            "were stopped. Use .backend(AverageBackend.CPU) to let the survivors finish without it")

    def _dead_peer(self, reporter: int, wait_s: float = 3.0) -> Optional[int]:
        """A worker other than ``reporter`` that has exited (waiting briefly: a peer's death can reach the
        survivors' collectives before its process is reaped)."""
        deadline = time.monotonic() + wait_s
        while True:
            for r in sorted(self.live):
                if r != reporter and not self.procs[r].is_alive():
                    return r
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def _check_workers(self) -> None:
        for r in sorted(self.live):
            proc = self.procs[r]
            if proc.is_alive():
                continue
            while True:  # whatever it sent before dying comes first (an error message explains the death)
                msg = self._get(0.01)
                if msg is None:
                    break
                self._handle(msg)
                if self.stopping:
                    return
            code = proc.exitcode
            how = self._how(code)
            if self.collective:
                raise self._death_error(r)
            self._drop(r, how)

    def _drop(self, rank: int, how: str) -> None:
        self.live.discard(rank)
        self.lost.append(rank)
        moved = self.pool.drop(rank)
        log.warning(
            "flodl-hf builder: worker %d (%s) died (%s): dropped for good; %d unfinished batches go to the "
            "survivors %s",
            rank,
            self.devices[rank],
            how,
            moved,
            sorted(self.live),
        )
        if not self.live:
            raise DistributedError(
                f"every worker died (the last: worker {rank}, {how}): nothing left to train"
            )
        self._post_plan(self.cpu_rounds.current)  # the same round, without the lost rank
        for r in sorted(self.live):
            self._top_up(r)
        self._maybe_close_cpu_round()

    # -- results ---------------------------------------------------------------------------------------------
    def _write_checkpoints(self, state: Any) -> None:
        """Write the checkpoints of every epoch reported since the last average (with that average)."""
        for epoch in self.pending_ckpt:
            path = self.s.checkpoint_fn(epoch)
            write_checkpoint(
                path,
                state,
                epoch=epoch,
                world_size=self.world,
                devices=self.devices,
                rounds=self.rounds,
                el_che=self.anchor.el.state_dict(),
                lost_ranks=self.lost,
            )
        self.pending_ckpt = []

    def _finish(self, state: Any) -> None:
        self._emit_epochs()
        self._write_checkpoints(state)
        self.result = TrainedState(
            state,
            world_size=self.world,
            devices=self.devices,
            lost_ranks=self.lost,
            rounds=self.rounds,
            epochs=self.book.epochs_done,
            el_che=self.anchor.el.state_dict(),
        )
        self.stopping = True

    def _shutdown(self) -> None:
        stop_workers(self.workers)
