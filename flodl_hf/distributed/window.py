"""El Che gradient windows: what ``graph.step()`` does on N ranks (setup mode).

The contract: a setup-mode loop on N ranks applies the same optimizer updates as one process that runs the
concatenation of each window's micro-batches (rank 0's, then rank 1's, ... of every micro-step of the window).

Inside a window each rank runs ``anchor`` micro-batches with no communication; after each one ``graph.step()``
moves ``d * grad`` into the window's buckets, ``d`` being what that micro-batch's loss averaged over (see
``flodl_hf.distributed.window_grads``). At the window end one SUM all-reduce of the buckets, divided by the global
``D``, gives the gradient of the loss over every item of the window; then clip, broadcast floating buffers from
rank 0, one optimizer step, the LR scheduler advanced by the window's micro-steps, and an identical El Che update.

Every exchange starts with the same fixed-shape metadata region (timings, sample counts, loss denominators, the
squared norm of the rank's own window gradient for the gradient-noise estimate, window index, a status flag, the
user's stop flags, the data-plan frontier, per-parameter presence and ``requires_grad``):
on CPU ranks it is the head of the first gradient bucket, so it costs no collective of its own; beside NCCL it goes
over a gloo side group, which notices a vanished peer at once. Because a window end, a finished loop and a failed
rank all send the same shape, ranks that disagree are told why (one failed, one finished early, one skipped a step)
instead of meeting a collective mismatch or a hang.

The data plan is indexed by step, not by "the last batch drawn": ``draw`` records each step's real sample count and
window-end flag in a queue that ``graph.step()`` consumes in order, so any read-ahead (``list(...)``, a prefetch
thread, a DataLoader with workers) keeps every step's metadata. A new El Che split takes effect from the first step
no rank has drawn yet (the *frontier*, reduced with the metadata), so read-ahead never splits a step two ways.
Gradient noise, at no extra collective: each rank writes ``|G_r|^2`` (its weighted sum over its denominator
``D_r``, squared) beside ``D_r``; after the reduction ``|G_big|^2`` of the reduced gradient completes what
``flodl_hf.elche.noise_scale`` needs (a ``reduction="sum"`` loss has no item count, so it gives no estimate). The norms
are read, never written: the update is unchanged.
Overlap (``DdpConfig.overlap``): buckets go on the wire in one fixed order, metadata last; hooks start some during
the last backward (``window_overlap``); a finished or failed rank continues the order, so shapes always match.
Design note: El Che is given the previous window's synchronisation time (the minimum over ranks, i.e. without
straggler waiting), since this window's is only known after the collective that carries the figures.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import warnings
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ..config import DdpConfig
from ..elche.scheduler import ElChe
from .clock import ComputeClock
from .collectives import broadcast_tensors
from .context import OPEN_RUNTIMES, DistContext, missing_ranks, side_group
from .errors import DistributedError
from .window_grads import WindowGrads, micro_batch_weight
from .window_meta import (_AHEAD, _BATCH, _COMPUTE, _DENOM, _FAILED, _FINISHED, _FLAG, _FRONTIER, _GRADSQ, _INDEX,
                          _MICRO, _REDSQ, _REDUCTION, _ROWS, _SAMPLES, _SEED, _SLOTS, _STEP, _SYNC, _USER, agree)
from .grad_guard import GradGuard
from .loss_items import Declarations
from ..elche.plan_record import PlanRecord, PlanReplay
from .window_overlap import Arming, OverlapHooks

__all__ = ["WindowRuntime", "mark_failed"]

_OPEN = OPEN_RUNTIMES  # the context's registry of live runtimes, in creation order (shutdown closes them)
_PROCESS_FAILED = False


def mark_failed() -> None:
    """Record that this process is dying of an exception, so peers are told 'failed', not 'finished'."""
    global _PROCESS_FAILED
    _PROCESS_FAILED = True


def _install_excepthook() -> None:
    previous = sys.excepthook
    if getattr(previous, "_flodl_hf", False):
        return

    def hook(exc_type, exc, tb):  # type: ignore[no-untyped-def]
        mark_failed()
        previous(exc_type, exc, tb)

    hook._flodl_hf = True  # type: ignore[attr-defined]
    hook._flodl_hf_previous = previous  # type: ignore[attr-defined]
    sys.excepthook = hook


def _release_process_hooks() -> None:
    """Once the last runtime is closed, leave the process as it was before the first: the previous excepthook back
    (unless another hook was installed over ours) and no failure mark for a runtime the process opens later."""
    global _PROCESS_FAILED
    hook = sys.excepthook
    if getattr(hook, "_flodl_hf", False):
        sys.excepthook = hook._flodl_hf_previous  # type: ignore[attr-defined]
    _PROCESS_FAILED = False


class WindowRuntime:
    """Per-rank state of the El Che gradient windows. Created by ``Trainer.setup*`` on N ranks."""

    def __init__(self, ctx: DistContext, config: DdpConfig, module: torch.nn.Module) -> None:
        self.ctx = ctx
        self.config = config
        self.world = ctx.world_size
        self.rank = ctx.rank
        self.device = ctx.device
        if config.simulate_speeds is not None and len(config.simulate_speeds) != self.world:
            raise ValueError(f"DdpConfig.simulate_speeds has {len(config.simulate_speeds)} entries for "
                             f"{self.world} ranks: give one simulated speed per rank")
        self.side = side_group()
        self.params = list(module.parameters())
        layout = self._agreed_layout()
        self.grads = WindowGrads(self.params, ctx.device, bucket_mb=config.bucket_mb, meta_fixed=_SLOTS * self.world,
                                 meta_in_first_bucket=self.side is None, layout=layout)
        self.float_buffers = [b for b in module.buffers() if b.is_floating_point()]
        self.el_che: Optional[ElChe] = None
        self.batch_size: Optional[int] = None
        self.plan_data = (0, 0)  # (dataset rows, plan seed mod 2**24) of graph.set_data_loader, checked equal
        self.probed_caps: Optional[list[int]] = None  # DdpConfig(max_micro_batch="auto"), once probed
        self.speed = 1.0 if config.simulate_speeds is None else float(config.simulate_speeds[self.rank])
        self.window_index = 0
        self._closed = False
        self._lock = threading.RLock()
        self._drawn = 0  # steps drawn from the plan so far (all epochs)
        self._versions: list[tuple[int, list[int]]] = []  # (first draw number, per-rank sizes)
        # CUDA events time a GPU rank's micro-batches without a synchronise per micro-batch; a simulated slower
        # device needs each one's time at once (host clock)
        self.clock = ComputeClock(ctx.device, events=self.speed >= 1.0)
        self._last_sync_ms = 0.0
        self.grad_norm: Any = None  # the reduced gradient's total norm before clipping, last window
        self._reduced_sq: Optional[float] = None  # the last window's |reduced gradient|^2 (sent in the next one)
        self._noise_prev: Optional[tuple[list[float], list[float], int]] = None  # its agreed norms, items, micro
        self._user_flags = 0
        self.agreed_flags = 0
        self._declared = Declarations()  # this micro-batch's graph.loss_items, bound to their backward passes
        self._window_lrs: list[float] = []  # the LRs in force at the window's first micro-batch
        self.lr_exponent = 1.0  # DdpConfig(lr_scaling="adascale"): the LR is multiplied by gain ** lr_exponent
        self.record = PlanRecord(self.world)  # what El Che decided (metrics.json's el_che.plan)
        self.replay: Optional[PlanReplay] = None  # DdpConfig(replay_plan=...): a recorded plan played back
        self._ahead = 0  # graph.handed_ahead() at the last graph.step(): compared across ranks at the window end
        self._peek: Optional[Callable[[], Optional[tuple[int, bool]]]] = None  # the plan step being computed
        self._presleep = (0.0, 0.0)  # simulated speed: (host seconds, sleep) already stretched mid-backward
        self.overlap: Optional[OverlapHooks] = OverlapHooks(self.grads, self._arm) if config.overlap else None
        self.guard = GradGuard(self.params)  # edits of p.grad and loop-made accumulation: refused, never averaged
        self._reset_window()
        _OPEN.append(self)
        _install_excepthook()

    def bind_plan(self, peek: Callable[[], Optional[tuple[int, bool]]]) -> None:
        """Give the runtime a look at the plan step being computed: (real samples, window end), or None for a
        batch not drawn from the plan. The overlap hooks use it to know, mid-backward, that a window ends."""
        self._peek = peek

    def paused_overlap(self) -> Any:
        """A context in which backward passes are not training micro-batches (the memory probe)."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.guard.paused())
        if self.overlap is not None:
            stack.enter_context(self.overlap.paused())
        return stack

    def _agreed_layout(self) -> list[bool]:
        """Parameters trainable on some rank at setup (one-off all-reduce, so every rank builds the same buckets)."""
        flags = torch.tensor([1.0 if p.requires_grad else 0.0 for p in self.params], dtype=torch.float32)
        self._setup_sum(flags)
        return [f > 0.5 for f in flags.tolist()]

    def _setup_sum(self, t: torch.Tensor) -> None:
        """A one-off SUM all-reduce of a small CPU tensor at setup (over the gloo side group where there is one)."""
        if self.side is not None:
            dist.all_reduce(t, group=self.side)
        else:
            dist.all_reduce(t)

    def gather_caps(self, own: int, error: Optional[BaseException] = None) -> list[int]:
        """Every rank's probed micro-batch cap (a one-off all-reduce at setup). A rank whose probe failed takes
        part with -1, so the others fail with its name instead of waiting for it."""
        caps = torch.zeros(self.world, dtype=torch.float64)
        caps[self.rank] = -1.0 if error is not None else float(own)
        self._setup_sum(caps)
        got = [int(c) for c in caps.tolist()]
        if error is not None:
            raise error
        failed = [q for q, c in enumerate(got) if c < 0]
        if failed:
            raise DistributedError(f"rank(s) {failed} failed in the memory probe (see their error); rank "
                                   f"{self.rank} stops too")
        self.probed_caps = got
        return got

    # --- plan -----------------------------------------------------------------------------------------------
    def set_batch_size(self, batch_size: int) -> None:
        """(Re)build the El Che scheduler for a per-rank batch size; called by ``graph.set_data_loader``."""
        if self.el_che is not None and self.batch_size == batch_size:
            return
        cfg = self.config
        if cfg.batch_sizes is not None and len(cfg.batch_sizes) != self.world:
            raise ValueError(f"DdpConfig.batch_sizes={list(cfg.batch_sizes)} has {len(cfg.batch_sizes)} entries for "
                             f"{self.world} ranks: give one micro-batch size per rank")
        if cfg.batch_sizes is not None and sum(cfg.batch_sizes) != self.world * batch_size:
            raise ValueError(f"DdpConfig.batch_sizes={list(cfg.batch_sizes)} sums to {sum(cfg.batch_sizes)}, but "
                             f"{self.world} ranks x batch_size {batch_size} = {self.world * batch_size}: make them agree")
        kwargs = cfg.el_che_kwargs(self.world, batch_size, probed=self.probed_caps)
        replay = None
        if cfg.replay_plan is not None:
            replay = PlanReplay(cfg.replay_plan, self.world, batch_size)
            if kwargs.get("max_anchor") != 0:  # El Che reports the replayed anchors (its own bounds do not apply)
                kwargs.update(anchor=replay.anchor(0), min_anchor=1,
                              max_anchor=max([kwargs["max_anchor"]] + replay.anchors))
            kwargs["batch_sizes"] = None
        el_che = ElChe(self.world, mode="setup", batch_size=batch_size, **kwargs)
        if cfg.speed_hint is not None:
            slow, ratio = cfg.speed_hint
            if slow >= self.world:
                raise ValueError(f"DdpConfig.speed_hint slow_rank={slow} does not exist in a world of {self.world}")
            el_che.speed_hint(slow, ratio)
        if cfg.freeze_plan or cfg.batch_sizes is not None or replay is not None:
            el_che.freeze()
        self.grads.measure = el_che.enabled  # only an enabled El Che reads the local gradient norm
        with self._lock:
            self.el_che, self.batch_size, self.replay = el_che, batch_size, replay
            self.record.restart(batch_size)
            self._versions = [(self._drawn, list(el_che.batch_sizes()))] if replay is None else list(replay.splits)
            for start, sizes in self._versions:
                self.record.split(start, sizes)

    def reset_plan(self) -> None:
        """Start the plan afresh from El Che's current split (after a checkpoint restored El Che)."""
        with self._lock:
            self.record.resumed = True  # a resumed run's plan does not start at its first window: not replayable
            if self.el_che is not None and self.replay is None:
                self._versions = [(self._drawn, list(self.el_che.batch_sizes()))]

    def _sizes_at(self, g: int) -> list[int]:
        if not self._versions:
            raise RuntimeError("no batch size known: call graph.set_data_loader(...) before graph.epoch(n)")
        sizes = self._versions[0][1]
        for start, version in self._versions:
            if start <= g:
                sizes = version
        return sizes

    def draw(self, slicer: Callable[[list[int]], tuple[list[int], int]]) -> tuple[list[int], int]:
        """Take the next step of the plan: ``slicer(sizes)`` gives (indices, padding) with the split in force for
        that step. Safe to call from a prefetch thread."""
        with self._lock:
            out = slicer(self._sizes_at(self._drawn))
            self._drawn += 1
            return out

    def undraw(self, count: int) -> None:
        """``count`` drawn steps will never be stepped (an abandoned iterator): the next draw reuses their numbers,
        as the other ranks' do."""
        with self._lock:
            self._drawn = max(0, self._drawn - int(count))

    def note_yield(self) -> None:
        """The user's loop received a batch now: time before this was spent waiting for input, not computing."""
        self.clock.mark()

    def _anchor(self) -> int:
        if self.replay is not None:
            return self.replay.anchor(self.window_index)
        if self.el_che is not None:
            return int(self.el_che.anchor)
        return int(self.config.anchor or 1)

    def pending_micro_batches(self) -> int:
        """Micro-batches accumulated in the current, not yet reduced, window."""
        return self._micro_batches

    # --- per micro-batch ----------------------------------------------------------------------------------
    def _reset_window(self, keep_launches: bool = False) -> None:
        self._micro_batches = 0
        self._samples = 0
        self._denominator = 0.0
        self._reduction: Optional[str] = None
        self._compute_s = 0.0
        self._grad_sq = 0.0  # this rank's |G_r|^2, written at the window end
        self._window_anchor: Optional[int] = None
        self.grads.reset(keep_launches)
        if self.overlap is not None:
            self.overlap.reset()

    def set_loss_items(self, items: float, reduction: str, loss: Optional[torch.Tensor] = None) -> None:
        self._declared.declare(items, reduction, loss)

    def set_user_flags(self, bits: int) -> None:
        self._user_flags |= int(bits)

    def _arm(self) -> Arming:
        """Called by the overlap hooks at a micro-batch's first gradient: its weight when it closes the window."""
        if self._closed:
            return None
        planned = self._peek() if self._peek is not None else None
        if self._window_anchor is None:  # fixed at the window's first backward, as step() will then use it
            self._window_anchor = self._anchor()
        anchor = self._window_anchor
        if self._micro_batches + 1 < anchor and not (planned is not None and planned[1]):
            return None
        items = self._declared.current()
        weight, counts = micro_batch_weight(items, planned[0] if planned is not None else None)
        if self.speed < 1.0 and not self.clock.events:  # SIMULATION: the slower device reaches here later too
            pre = self.clock.elapsed()
            extra = pre * (1.0 / self.speed - 1.0)
            time.sleep(extra)
            self._presleep = (pre, extra)
        return weight, counts, items is not None

    def micro_batch_done(self, graph: Any, planned: Optional[tuple[int, bool]]) -> bool:
        """Account for one finished micro-batch; close the window when full. True when an optimizer step ran.

        ``planned``: (real samples, window end) of the plan step this micro-batch came from, None when the batch
        did not come from the graph's plan (then it weighs 1 and never forces a window end)."""
        if self._closed:
            raise DistributedError("graph.step() after graph.close(): this rank already told the others it finished")
        self.guard.check(graph.drawn_ahead())
        elapsed = self.clock.stop()  # None with CUDA events: added at the window end
        if elapsed is not None:
            if self.speed < 1.0:  # SIMULATION: wait as a slower device would
                pre, slept = self._presleep  # the part before the first gradient, stretched by the hooks
                self._presleep = (0.0, 0.0)
                rest = max(0.0, elapsed - pre - slept)
                time.sleep(rest * (1.0 / self.speed - 1.0))
                elapsed = (pre + rest) / self.speed
            self._compute_s += max(0.0, elapsed)
        if self._window_anchor is None:
            self._window_anchor = self._anchor()
        if self._micro_batches == 0:  # a window's update uses the LRs in force at its first micro-batch
            self._window_lrs = [float(group["lr"]) for group in graph.optimizer.param_groups]
        self._micro_batches += 1
        self._ahead = graph.handed_ahead()
        samples = planned[0] if planned is not None else None
        items = self._declared.current()
        reduction = items[1] if items is not None else self._declared.reduction()
        if self._reduction is None:
            self._reduction = reduction
        elif self._reduction != reduction:
            raise ValueError(f"graph.loss_items(reduction={reduction!r}) after reduction={self._reduction!r} in the "
                             "same El Che window: use one loss reduction for the whole run")
        if self._declared.abandoned() and not self.guard.seen:
            weight, counts = 0.0, False  # its declared loss was never backpropagated: a batch the loop skipped
        else:
            weight, counts = micro_batch_weight(items, samples)
        self._declared.reset()
        skip = frozenset()
        armed = self.overlap is not None and bool(self.overlap.armed)
        if armed:
            skip = self.overlap.settle(items, weight)
        if counts:
            self._denominator += weight
        self.grads.accumulate(weight, counts=counts, skip=skip)
        self.guard.reset()
        self.guard.install()
        self._samples += samples if samples is not None else 1
        force = planned[1] if planned is not None else False
        if self._micro_batches < self._window_anchor and not force:
            if armed:
                raise DistributedError("internal error: the overlap hooks armed a micro-batch that does not close "
                                       "its El Che window; set DdpConfig(overlap=False) and report this")
            if self.overlap is not None:
                self.overlap.reset()
                self.overlap.install()
            self.clock.mark()
            return False
        self._close_window(graph)
        if self.overlap is not None:
            self.overlap.install()
        self.clock.mark()
        return True

    # --- window end ---------------------------------------------------------------------------------------
    def _fixed_meta(self, flag: float) -> list[float]:
        """This rank's entries of the fixed slots (the other ranks' entries are 0 until the SUM all-reduce)."""
        w, r = self.world, self.rank
        meta = [0.0] * (_SLOTS * w)
        for slot, value in ((_COMPUTE, self._compute_s * 1000.0), (_SAMPLES, float(self._samples)),
                            (_SYNC, self._last_sync_ms), (_INDEX, float(self.window_index)), (_FLAG, flag),
                            (_DENOM, float(self._denominator)),
                            (_REDUCTION, 1.0 if self._reduction == "sum" else 0.0),
                            (_FRONTIER, float(self._drawn)), (_USER, float(self._user_flags)),
                            (_GRADSQ, self._grad_sq),
                            (_REDSQ, -1.0 if self._reduced_sq is None else self._reduced_sq),
                            (_MICRO, float(self._micro_batches)),
                            (_BATCH, float(self.batch_size or 0)),
                            (_ROWS, float(self.plan_data[0])), (_SEED, float(self.plan_data[1])),
                            (_AHEAD, float(self._ahead))):
            meta[slot * w + r] = value
        return meta

    def _lost(self, what: str, exc: BaseException) -> DistributedError:
        self._abandon()
        gone = missing_ranks(min(5.0, self.ctx.timeout_s / 4))
        who = (f"rank(s) {gone} vanished" if gone else "another rank probably failed; see its error")
        return DistributedError(f"rank {self.rank}: lost contact with the other ranks {what} at window "
                                f"{self.window_index} ({who}): {exc}")

    def _launch_rest(self) -> None:
        """Start the buckets of the launch order not started yet (a no-op once they all are)."""
        try:
            self.grads.launch_rest()
        except Exception as exc:
            raise self._lost("starting the gradient all-reduce", exc) from exc

    def _exchange(self, flag: float) -> tuple[torch.Tensor, list[float], list[float]]:
        """The rest of the launch order (buckets not started yet), then the metadata collective (blocking)."""
        self._launch_rest()
        self.grads.write_meta(self._fixed_meta(flag))
        try:
            dist.all_reduce(self.grads.first_collective(), op=dist.ReduceOp.SUM, group=self.side)
        except Exception as exc:
            raise self._lost("exchanging the window's figures", exc) from exc
        return self.grads.read_meta()

    def _abandon(self) -> None:
        """After a detected disagreement or lost peer no further collective may be attempted by this runtime."""
        self._closed = True
        if self in _OPEN:
            _OPEN.remove(self)
        if not _OPEN:
            _release_process_hooks()

    def _check(self, m: torch.Tensor, own_flag: float) -> bool:
        """Raise if ranks disagree; True when every rank is finishing."""
        try:
            return self._agree(m, own_flag)
        except DistributedError:
            self._abandon()
            raise

    def _slot(self, m: torch.Tensor, slot: int) -> list[float]:
        w = self.world
        return m[slot * w:(slot + 1) * w].tolist()

    def _agree(self, m: torch.Tensor, own_flag: float) -> bool:
        return agree(m, self.world, self.rank, self.window_index, own_flag)

    def _close_window(self, graph: Any) -> None:
        # The lock keeps a prefetch thread from drawing between the frontier exchange and the new plan's install.
        with self._lock:
            # The buckets not started yet go first (before the local norm: it is measured bucket by bucket as they
            # start), then the wait for the GPU's last micro-batch: on CUDA that wait would otherwise hold them back.
            self._launch_rest()
            self._compute_s += self.clock.pending_seconds()
            t0 = time.perf_counter()
            noise = self.el_che is not None and self.el_che.enabled and self._reduction != "sum"
            if noise and self._denominator > 0:
                self._grad_sq = self.grads.local_sq_norm() / (self._denominator * self._denominator)
            m, presence, trainable = self._exchange(_STEP)
            self._check(m, _STEP)
            try:
                self.grads.finish_launches()
                extra = [i for i in range(self.grads.n) if presence[i] > 0.5 and i not in self.grads.where]
                side = self.grads.reduce_side(extra) if extra else {}
                if self._reduction == "sum":
                    divisor = 1.0
                else:
                    total = float(sum(self._slot(m, _DENOM)))
                    divisor = total if total > 0 else 1.0
                self.grads.unpack(divisor, presence, side)
                reduced_sq = self.grads.sq_norm(side) / (divisor * divisor) if noise else None
                if self.float_buffers:
                    broadcast_tensors(self.float_buffers, src=0)
            except Exception as exc:
                raise self._lost("in the gradient all-reduce", exc) from exc
            layout = [c > 0.5 for c in trainable]
            if layout != self.grads.mask:
                self.grads.build(layout)  # identical on every rank: it comes from the reduced flags
            user = 0
            for bits in self._slot(m, _USER):
                user |= int(bits)
            self.agreed_flags, self._user_flags = user, 0
            if self.config.max_grad_norm is not None:
                self.grad_norm = torch.nn.utils.clip_grad_norm_([p for p in self.params if p.grad is not None],
                                                                self.config.max_grad_norm)
            if self.config.simulate_sync is not None and self._micro_batches:  # SIMULATION: a slow interconnect
                time.sleep(self.config.simulate_sync * self._compute_s / self._micro_batches)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            sync_ms = (time.perf_counter() - t0) * 1000.0
            micro = int(self._micro_batches)
            gain, schedule_steps = self.el_che.window_lr(micro) if self.el_che is not None else (1.0, micro)
            graph.apply_optimizer_step(micro_steps=schedule_steps, window_lrs=self._window_lrs,
                                       lr_factor=gain ** self.lr_exponent)
            if self.el_che is not None:
                self._report(m, micro, noise)
            self._reduced_sq = reduced_sq
            self._last_sync_ms = sync_ms
            self.record.window(self.window_index, int(self._window_anchor or micro))
            self.window_index += 1
            self._reset_window()

    def _report(self, m: torch.Tensor, micro: int, noise_on: bool) -> None:
        """Feed El Che the window's figures; install its next split from the first step no rank has drawn.

        Every figure comes from the metadata, identical on every rank. The gradient-noise figures lag one window:
        the reduced gradient's norm is computed by each rank with its own kernels (GPUs of different models need
        not agree to the last bit), so rank 0's value travels in the next window's metadata, and the previous
        window's per-rank norms wait for it here."""
        el_che = self.el_che
        anchor_before = el_che.anchor
        noise: dict[str, Any] = {}
        reduced = self._slot(m, _REDSQ)[0]
        if self._noise_prev is not None and reduced >= 0:
            grad_sq, items, prev_micro = self._noise_prev
            noise = {"grad_sq": grad_sq, "grad_items": items, "reduced_grad_sq": reduced,
                     "noise_micro_batches": prev_micro}
        self._noise_prev = (self._slot(m, _GRADSQ), self._slot(m, _DENOM), micro) if noise_on else None
        if self.replay is not None and el_che.enabled:  # the history shows the replayed anchor of the next window
            el_che.set_anchor(self.replay.anchor(self.window_index + 1))
            anchor_before = el_che.anchor
        el_che.report(self._slot(m, _COMPUTE), self._slot(m, _SAMPLES), min(self._slot(m, _SYNC)),
                      micro_batches=micro, **noise)
        frontiers = [int(f) for f in self._slot(m, _FRONTIER)]
        start, oldest = max(frontiers), min(frontiers)
        sizes = list(el_che.batch_sizes())
        if self.replay is None and sizes != self._versions[-1][1]:
            keep = [v for v in self._versions if v[0] < start]
            first_needed = max((i for i, v in enumerate(keep) if v[0] <= oldest), default=0)
            self._versions = keep[first_needed:] + [(start, sizes)]
            self.record.split(start, sizes)
        if el_che.anchor != anchor_before and self.config.verbose and self.rank == 0:
            a = el_che.anchor
            print(f"flodl-hf: El Che anchor {anchor_before} -> {a}: each optimizer step now averages {a} "
                  f"micro-step(s) x {self.world} rank(s) x batch {self.batch_size} = "
                  f"{a * self.world * (self.batch_size or 0)} samples (keep it constant with "
                  "DdpConfig(fixed_anchor=N))", file=sys.stderr)

    def close(self, graph: Any) -> None:
        """Tell the other ranks this rank is done (or failed); raise if they are not all done too. Idempotent."""
        if self._closed:
            return
        flag = _FAILED if _PROCESS_FAILED else _FINISHED
        pending = self._micro_batches
        if pending and flag == _FINISHED:
            message = (f"graph.close() on rank {self.rank} discards an unfinished El Che window: {pending} "
                       f"micro-batch(es), {self._samples} sample(s) whose gradients were never applied (the loop "
                       "stopped between two window ends; stop right after a graph.step() that changed "
                       "graph.training_step to keep every sample's update)")
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        self._closed = True
        if self in _OPEN:
            _OPEN.remove(self)
        try:
            self._close(flag)
        finally:
            if not _OPEN:
                _release_process_hooks()

    def _close(self, flag: int) -> None:
        self.guard.remove()
        if self.overlap is not None:
            self.overlap.remove()
        self._reset_window(keep_launches=True)  # the peers expect the launch order to go on from here
        try:
            m, _, _ = self._exchange(flag)
        except DistributedError:
            if flag == _FAILED:
                return  # the peers already know; nothing to add
            raise
        self.grads.wait_launched(quiet=True)
        if flag == _FAILED:
            return
        self._check(m, flag)

