"""The coordinator: a thread in the caller's process that runs a multi-device builder job.

Why it exists: somebody must own what no single worker can decide alone: the epoch cursor (who trains on which
batch), El Che (how long a window is and how much each rank runs in it), the divergence guard, the plan each
round fires on, the CPU backend's averages, the per-epoch metrics, the checkpoints, and the failure policy. It
never trains and never blocks a worker: every get has a timeout, worker liveness is checked every few tens of
milliseconds, and whatever happens the workers are stopped (then terminated, then killed) before it returns.

Failure policy: an exception in a worker (user code) fails the run with the worker's traceback. A worker that
dies (killed, crashed) is dropped for good with the CPU backend, its unfinished batches going to the
survivors and the batches it ran since its last snapshot reported as lost (``TrainedState.lost_batches``);
with the collective backend the others cannot continue, so the run fails with ``DistributedError`` naming it.

The CPU backend's averages run on a separate thread (``rounds.Averager``) on shared-memory slots nobody else
writes at that moment (``slots``), so handing out batches never waits for an average, and rounds close one at a
time: the plan of round k+1 is posted only once round k's average exists.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import Any, Optional

from ..distributed.errors import DistributedError
from ..elche.noise_scale import NoiseScale
from .board import Plan
from .checkpoint import write_checkpoint
from .resume import first_epoch as _first_epoch, resume_meta, skipped as _skipped
from .epochs import EpochBook
from .guard import AnchorControl, DivergenceGuard
from .inbox import Inbox
from .ledger import Ledger
from .lifecycle import Workers, stop_workers, wait_ready
from .progress import ProgressBar
from .rounds import AverageJob, Averager, CpuRounds, Snapshot
from .settings import BuilderSettings
from .slots import Slots
from .state import Layout, state_from_flat, unpack_tree
from .storebus import announce_abort
from .types import ApplyPolicy, AverageBackend, EpochMetrics, TrainedState
from .workpool import WorkPool

__all__ = ["Coordinator"]

log = logging.getLogger("flodl_hf.builder")
_GET_S = 0.02
_MAX_CHUNK = 4


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


class Coordinator:
    """Runs the job on started worker processes; ``run()`` is the thread's target."""

    def __init__(self, s: BuilderSettings, workers: Workers) -> None:
        self.s = s
        self.workers = workers
        self.devices = workers.devices
        self.world = len(workers.devices)
        self.procs = workers.procs
        self.inbox = workers.inbox if workers.inbox is not None else Inbox(workers.events)
        self.cmds = workers.cmds
        self.board = workers.board
        self.slots: Optional[Slots] = None
        self.collective = s.backend is AverageBackend.NCCL
        self.sync = s.policy is ApplyPolicy.SYNC
        self.metrics: "queue.Queue[Optional[EpochMetrics]]" = queue.Queue()
        self.history: list[EpochMetrics] = []
        self.result: Optional[TrainedState] = None
        self.error: Optional[BaseException] = None
        self.lost: list[int] = []
        self.lost_batches: dict[int, int] = {}
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
        self.progressive = s.resolved_progressive()
        self.pool = WorkPool(
            len(s.dataset), int(s.batch_size), int(s.num_epochs), self.world, equal_split=self.sync,
            slice_weights=None if (self.sync or self.progressive) else self._slice_weights,
            first_epoch=_first_epoch(s), skip=_skipped(s),
        )
        self.overshoot: Optional[int] = s.resolved_max_overshoot()
        self.overshoot_auto = s.max_overshoot is None
        self.overshoot_ceiling = s.max_overshoot_ceiling()
        self.book = EpochBook(int(s.num_epochs), self.pool.batches_per_epoch, self.world, self.devices,
                              first_epoch=_first_epoch(s), skipped=_skipped(s))
        self.cpu_rounds = CpuRounds(float(s.round_timeout_s))
        self.averager: Optional[Averager] = None
        self.averaging = False  # a closed CPU round is being averaged (the next plan waits for it)
        self.collective_rounds: dict[int, dict[int, tuple]] = {}
        self.layout: Optional[Layout] = None
        self.plan: Optional[Plan] = None
        self.plan_deferred = False
        self.rounds = 0
        self.global_step = 0 if s.resume_point is None else int(s.resume_point.start_step)
        self.divergence: Optional[float] = None
        self.noise = NoiseScale()  # SYNC only: the gradient noise scale of the averaged rounds
        self.ended: set[int] = set()
        self.unsent = [0] * self.world  # batches run since the rank's last snapshot (CPU backend)
        self.batch_ms = [0.0] * self.world
        self.pending_ckpt: list[int] = []
        self.ledger = Ledger(self.world)  # which batches the averages hold (exact epoch-end checkpoints)
        self.deferred_state: Optional[tuple] = None  # collective: a state of a round not yet closed here
        self.state_requested = False
        self.final_round_done = False
        self.final_state: Any = None
        self.final_optim: Optional[tuple] = None  # SYNC: the replicas' optimizer state (state.pack_tree)
        self.stopping = False
        self.timeline_on = bool(s.timeline)
        self.timeline: list[dict[str, Any]] = []
        self.t0 = time.time()
        self.bar = ProgressBar(int(s.num_epochs), enabled=bool(s.progress))
        self.stall_s = max(4.0 * float(s.timeout_s), 120.0)

    # -- thread body -----------------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._startup()
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - handed to join()
            self.error = exc
            if self.workers.store is not None:  # every rank, wherever it runs, stops with this one line
                announce_abort(self.workers.store, exc)
        finally:
            if self.averager is not None:
                self.averager.close()
            self._shutdown()
            self.averager = None  # break the averager <-> coordinator cycle and free the shared slots now:
            self.slots = None  # a handle the user keeps must not pin the run's memory and descriptors
            self.deferred_state = self.final_optim = None
            self.board = self.workers.board = None  # type: ignore[assignment]
            self.inbox = self.workers.inbox = self.workers.store = None  # the store transport's connections
            self.cmds = self.workers.cmds = []
            self.bar.close()
            self.metrics.put(None)

    def _get(self, timeout: float) -> Optional[tuple]:
        return self.inbox.get(timeout)

    def _send(self, rank: int, msg: tuple) -> None:
        try:
            self.cmds[rank].put(msg)
        except Exception:  # noqa: BLE001 - a closed queue: that worker is gone, the liveness check drops it
            pass

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
        for r, msg in ready.items():
            proc = self.procs[r]
            if hasattr(proc, "describe") and len(msg) > 6:  # a rank on any node: where to look if it is lost
                proc.host, proc.pid = msg[5], msg[6]
        init = ready[0][4]
        if not self.collective:  # allocated once; from here on averages move no tensor through a queue
            self.slots = Slots(self.world, self.layout.param_numel + self.layout.buffer_numel)
            self.averager = Averager(self.slots, self._send, self._state_from_vector)
        for r in range(self.world):
            self._send(r, ("start", init if r != 0 else None, self.slots))
        self.t0 = time.time()
        self.book.restart_clock()
        self._post_plan(0)
        for r in range(self.world):
            self._top_up(r)
        log.info("flodl-hf builder: %d workers started (%s)", self.world, self.anchor.el.describe())

    # -- plans and dispatch ----------------------------------------------------------------------------------
    def _slice_weights(self) -> list[float]:
        counts = self.anchor.counts()
        return [float(counts[r]) if r in self.live else 0.0 for r in range(self.world)]

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
                # before El Che has timed the ranks its counts are a guess (equal): holding a fast rank to one
                # would make the first window run at the slowest rank's pace
                max_ahead=self.overshoot if self.anchor.el.calibrated else None,
                batch_diff=self.s.max_batch_diff,
                # collective ASYNC: the others would wait in the all-reduce for the slowest rank's extra batch (the
                # CPU backend never waits for a snapshot, so an extra batch there costs nobody anything)
                hold_rank=self._slowest() if self.s.policy is ApplyPolicy.ASYNC and self.collective else None,
            )
        self.plan = plan
        self.plan_deferred = False
        self.board.post_plan(plan)

    def _slowest(self) -> Optional[int]:
        """The live rank with the longest batch, once El Che has timed them (None before)."""
        if not self.anchor.el.calibrated:
            return None
        ms = self.anchor.el.ms_per_unit
        timed = [(ms[r], r) for r in self.live if ms[r] is not None]
        return max(timed)[1] if len(timed) > 1 else None

    def _chunk(self, rank: int) -> int:
        if self.sync:
            return 1
        counts = self.anchor.counts()
        slowest = min(counts[r] for r in self.live)
        return max(1, min(_MAX_CHUNK, counts[rank] // max(1, slowest)))

    def _top_up(self, rank: int) -> None:
        """Keep a rank supplied: it holds two chunks beyond its current batch, so it never waits for the
        dispatch thread (progressive dispatch; a slice-per-epoch pool hands out its slice the same way)."""
        if rank not in self.live:
            return
        chunk = self._chunk(rank)
        while self.pool.held(rank) <= 2 * chunk:
            items = self.pool.take(rank, chunk)
            if not items:
                if rank not in self.ended:
                    self.ended.add(rank)
                    self._send(rank, ("end",))
                return
            self.ended.discard(rank)
            self._send(rank, ("work", items))

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
            if self.averager is not None:
                self._collect_averages()
            if now - last_check >= 0.05 or msg is None:
                last_check = now
                self._check_workers()
                if not self.collective:
                    self._maybe_close_cpu_round()
            if now - last_event > self.stall_s:
                raise DistributedError(
                    f"no worker reported anything for {self.stall_s:.0f} s: stopping the run"
                )

    def _event(self, kind: str, rank: Optional[int], t0: float, t1: float, **extra: Any) -> None:
        if self.timeline_on:
            self.timeline.append({"kind": kind, "rank": rank, "start": t0 - self.t0, "end": t1 - self.t0, **extra})

    def _handle(self, msg: tuple) -> None:
        kind, rank = msg[0], msg[1]
        if kind == "batch":
            _, _, epoch, b, loss, samples, wall, scalars = msg
            self.batch_ms[rank] = float(wall)
            if self.pool.complete(rank, (epoch, b)):
                self.unsent[rank] += 1
                self.ledger.reported(rank, (epoch, b))
                self.book.record(rank, epoch, loss, samples, scalars)
                self._top_up(rank)
                self._emit_epochs()
                if self.plan_deferred and not self.averaging:
                    self._post_plan(self.cpu_rounds.current)
        elif kind == "snap":
            _, r, k, batches, samples, wall, sync_ms, done, others, present = msg
            self.unsent[r] = 0
            self.ledger.snapshot(r, k)
            snap = Snapshot(r, k, batches, samples, wall, sync_ms, done, others, present)
            if not self.cpu_rounds.add(snap):
                self.global_step += batches  # a late snapshot: its batches ran, its round closed without it
            self._maybe_close_cpu_round()
        elif kind == "round":
            self._collective_round(msg)
        elif kind == "state":
            _, r, k, flat, others, final, optim = msg
            if self.collective and k > self.ledger.closed:  # another rank's round message is still on its way
                self.deferred_state = (k, flat, others, final, optim)
            else:
                self._state_arrived(self._state_from_vector(flat, others), final, k, optim)
        elif kind == "tl":
            _, r, what, t0, t1, extra = msg
            self._event(what, r, t0, t1, **extra)
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
            noise_scale=self.noise.noise_scale,
            lost_ranks=list(self.lost),
        ):
            self.history.append(m)
            every = self.s.checkpoint_every
            if every and ((m.epoch + 1) % every == 0 or m.epoch + 1 == self.s.num_epochs):
                self.pending_ckpt.append(m.epoch)
                if m.epoch + 1 < self.s.num_epochs:
                    self._request_state()
            self.bar.update(m)
            if self.s.metrics_fn is not None:
                self.s.metrics_fn(m)
            self.metrics.put(m)

    def _request_state(self) -> None:
        """A checkpoint needs the model: the collective backend and SYNC ask a worker (replicas are averaged
        or identical there); the CPU backend's next average builds it."""
        if (self.collective or self.sync) and not self.state_requested:
            self.state_requested = True
            self._send(min(self.live), ("want_state",))

    def _state_from_vector(self, flat: Any, others: dict) -> Any:
        if self.layout is None:  # pragma: no cover - a worker is ready before any state exists
            raise RuntimeError("no layout yet")
        n = self.layout.param_numel
        return state_from_flat(self.layout, flat[:n], flat[n:], others)

    def _state_arrived(self, state: Any, final: bool, k: int, optim: Optional[tuple]) -> None:
        """A worker's model after round ``k``: for pending checkpoints, and the result after the final round."""
        self.state_requested = False
        self._write_checkpoints(state, k, optim)
        if final or (self.final_round_done and not self.collective):
            self.final_state = state
            self.final_optim = optim
            self._try_finish()
        elif self._checkpoint_due() and self.collective:
            # the model did not hold all of the epoch yet: rank 0 answers again after its next round (the CPU
            # backend asks again after each average it applies, _apply_cpu_round)
            self._request_state()

    # -- collective backend ----------------------------------------------------------------------------------
    def _collective_round(self, msg: tuple) -> None:
        _, r, k, batches, wall, sync_ms, divergence, final, noise = msg
        if noise is not None:
            self.noise.update_pooled(*noise)
        got = self.collective_rounds.setdefault(k, {})
        got[r] = (batches, wall, sync_ms, divergence, final)
        self.ledger.round_message(r, k)
        if len(got) < self.world:
            return
        del self.collective_rounds[k]
        self.ledger.close_collective(k)
        self.rounds += 1
        if self.deferred_state is not None and self.deferred_state[0] <= k:
            dk, flat, others, dfinal, optim = self.deferred_state
            self.deferred_state = None
            self._state_arrived(self._state_from_vector(flat, others), dfinal, dk, optim)
        self.global_step += sum(v[0] for v in got.values())
        self.divergence = max(v[3] for v in got.values())
        now = time.time()
        self._event("average", None, now, now, round=k, ranks=sorted(got), global_step=self.global_step)
        wall_ms = [got[q][1] for q in range(self.world)]
        work = [got[q][0] for q in range(self.world)]
        sync = sum(v[2] for v in got.values()) / self.world
        self._report(wall_ms, work, sync, self.divergence)
        if any(v[4] for v in got.values()):
            self.final_round_done = True
            self._try_finish()
        else:
            self._post_plan(k + 1)

    def _report(self, wall_ms: list, work: list, sync: float, divergence: Optional[float]) -> None:
        verdict = self.anchor.report(wall_ms, work, sync, divergence)
        if (self.s.policy is ApplyPolicy.ASYNC and self.overshoot is not None and self.overshoot_auto
                and verdict == "ok" and divergence is not None):
            self.overshoot = min(self.overshoot_ceiling, self.overshoot + 1)

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

    def _round_timeout(self) -> float:
        """The setting, but never less than three of the slowest rank's batches: a worker answers between
        batches, so one long batch must not get it left out."""
        slowest = max((self.batch_ms[r] for r in self.live), default=0.0) / 1000.0
        return max(float(self.s.round_timeout_s), 3.0 * slowest + 1.0)

    def _maybe_close_cpu_round(self) -> None:
        if self.collective or self.stopping or self.averaging or self.averager is None:
            return
        expected = self._expected()
        if not self.cpu_rounds.ready(expected, timeout_s=self._round_timeout()):
            return
        res = self.cpu_rounds.close(expected)
        self.ledger.close_snapshots(res.round, res.participants)
        if res.left_out:
            log.warning(
                "flodl-hf builder: workers %s did not answer round %d within %.1f s: left out of it (their "
                "window's batches are not in this average)",
                res.left_out, res.round, self._round_timeout(),
            )
        self.global_step += res.batches
        final = res.all_done and self.pool.all_complete() and not (self.sync and res.batches)
        want_state = (self._checkpoint_due() or final) and not self.sync
        self.averaging = True
        assert self.averager is not None and self.layout is not None  # noqa: S101
        self.averager.submit(AverageJob(
            result=res, sync=self.sync, n_weighted=self.layout.param_numel, global_step=self.global_step,
            final=final, recipients=sorted(self.live), want_state=want_state,
        ))
        self._event("close", None, time.time(), time.time(), round=res.round, ranks=res.participants)

    def _collect_averages(self) -> None:
        assert self.averager is not None  # noqa: S101
        while True:
            try:
                job, divergence, state = self.averager.done.get_nowait()
            except queue.Empty:
                return
            if isinstance(divergence, BaseException):
                raise RuntimeError(f"averaging round {job.result.round} failed: {divergence}") from divergence
            self.averaging = False
            self._apply_cpu_round(job, float(divergence), state)
            if self.stopping:
                return

    def _apply_cpu_round(self, job: AverageJob, divergence: float, state: Any) -> None:
        res = job.result
        self.rounds += 1
        now = time.time()
        self._event("average", None, now, now, round=res.round, ranks=res.participants,
                    global_step=job.global_step)
        if not self.sync:
            self.divergence = divergence
        elif job.noise is not None:
            self.noise.update(*job.noise)
        wall = [res.snapshots[r].wall_ms if r in res.snapshots else 0.0 for r in range(self.world)]
        work = [res.snapshots[r].batches if r in res.snapshots else 0 for r in range(self.world)]
        sync = sum(s.sync_ms for s in res.snapshots.values()) / len(res.snapshots)
        self._report(wall, work, sync, None if self.sync else divergence)
        if state is not None:
            self._write_checkpoints(state, res.round)
        if job.final:
            self.final_round_done = True
            if state is not None:
                self.final_state = state
                self._try_finish()
            else:  # SYNC: the replicas are identical; ask one for the model
                self._request_state()
            return
        if self._checkpoint_due() and self.sync:
            self._request_state()
        if res.all_done and not any(self.unsent[r] for r in self.live):
            # everyone idle but work is still out (a silent worker holds it): wait for news. Batches reported
            # while this round was being averaged (a rank given a lost worker's batches after its snapshot said
            # done) ARE that news, and no later report will come: post the next plan now.
            self.plan_deferred = True
            return
        self._post_plan(res.round + 1)

    # -- failures --------------------------------------------------------------------------------------------
    @staticmethod
    def _how(code: Optional[int]) -> str:
        return f"exit code {code}" + (" (killed by signal %d)" % -code if code is not None and code < 0 else "")

    def _death_error(self, r: int) -> DistributedError:
        proc = self.procs[r]
        describe = getattr(proc, "describe", None)
        if describe is not None:  # a rank on another node (torchrun): known by its heartbeat
            return DistributedError(
                f"lost {describe()}; every rank takes part in every average, so the run cannot continue: every "
                "rank was stopped. Re-launch to resume from the last builder checkpoint (.resume_from)")
        return DistributedError(
            f"worker {r} ({self.devices[r]}, pid {proc.pid}) died ({self._how(proc.exitcode)}); with "
            "AverageBackend.NCCL every worker takes part in every average, so the run cannot continue: all workers "
            "were stopped. Use .backend(AverageBackend.CPU) to let the survivors finish without it")

    def _dead_peer(self, reporter: int) -> Optional[int]:
        """A worker other than ``reporter`` that has exited (waiting briefly: a peer's death can reach the
        survivors' collectives before its process is reaped, or before its heartbeat is missed)."""
        deadline = time.monotonic() + self.workers.peer_grace_s
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
        lost = self.unsent[rank]
        self.lost_batches[rank] = lost
        self.ledger.drop(rank)
        moved = self.pool.drop(rank)
        log.warning(
            "flodl-hf builder: worker %d (%s) died (%s): dropped for good; the %d batches it ran since its last "
            "snapshot are lost; %d unfinished batches go to the survivors %s",
            rank, self.devices[rank], how, lost, moved, sorted(self.live),
        )
        if not self.live:
            raise DistributedError(
                f"every worker died (the last: worker {rank}, {how}): nothing left to train"
            )
        if self.state_requested and (self.sync or self.collective):
            self.state_requested = False
            self._request_state()
        if not self.averaging:
            self._post_plan(self.cpu_rounds.current)  # the same round, without the lost rank
        for r in sorted(self.live):
            self._top_up(r)
        self._maybe_close_cpu_round()

    # -- results ---------------------------------------------------------------------------------------------
    def _checkpoint_due(self) -> bool:
        """An epoch other than the last (written with the final state) waits for a checkpoint."""
        return any(e != int(self.s.num_epochs) - 1 for e in self.pending_ckpt)

    def _write_checkpoints(self, state: Any, k: float, optim: Optional[tuple] = None, final: bool = False) -> None:
        """Write the checkpoints of the completed epochs whose every batch the average of round ``k`` holds (an
        average that closed while an epoch's last batches were being reported need not hold them: epochs are
        pipelined, and that epoch's checkpoint then waits for a later average). The last epoch's waits for the
        final state: the last checkpoint must be the trained model. Each lists the later epochs' batches it holds
        (``ahead``), and under SYNC the optimizer state (``optim``)."""
        last = int(self.s.num_epochs) - 1
        keep = [e for e in self.pending_ckpt if not final and (e == last or not self.ledger.holds_epoch(e, k))]
        for epoch in self.pending_ckpt:
            if epoch in keep:
                continue
            extra = {} if optim is None else {"optimizer": unpack_tree(optim)}
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
                ahead=self.ledger.ahead(epoch, k),
                **extra,
                **resume_meta(self.s, self.world),
            )
        self.pending_ckpt = keep

    def _finish(self, state: Any) -> None:
        self._emit_epochs()
        self._write_checkpoints(state, float("inf"), self.final_optim, final=True)
        self.final_optim = None
        self.result = TrainedState(
            state,
            world_size=self.world,
            devices=self.devices,
            lost_ranks=self.lost,
            rounds=self.rounds,
            epochs=self.book.epochs_done,
            el_che=self.anchor.el.state_dict(),
            lost_batches=dict(self.lost_batches),
            global_step=self.global_step,
            resumes=resume_meta(self.s, self.world)["resumes"],
        )
        self.stopping = True

    def _shutdown(self) -> None:
        stop_workers(self.workers)
