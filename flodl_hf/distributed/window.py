"""El Che gradient windows: what ``graph.step()`` does on N ranks (setup mode).

Inside a window each rank accumulates gradients over ``anchor`` micro-batches with no communication. At the
window end rank r contributes ``b_r * (its accumulated gradient)`` (``b_r`` = its mean micro-batch size) to one
bucketed SUM all-reduce, and every rank divides by the total number of samples: the result is exactly the mean
gradient over every sample every rank processed, whatever the split. Then: clip the reduced gradient, broadcast
floating buffers from rank 0, optimizer step (+ LR scheduler), and an identical El Che update on every rank.

The window's per-rank timings, sample counts, window index and a status flag travel in a metadata prefix of the
first gradient bucket, so the all-gather El Che needs costs no extra collective, and ranks that disagree (one
finished its loop, one failed, one skipped a step) are detected at the next window end instead of hanging.
Design note: El Che is given the previous window's synchronisation time (the minimum over ranks, i.e. without
straggler waiting), since this window's is only known after the collective that carries the figures.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

import torch

from ..config import DdpConfig
from ..el_che import ElChe
from .collectives import GradBuckets, broadcast_tensors
from .context import DistContext, DistributedError

__all__ = ["WindowRuntime", "close_all", "mark_failed"]

_STEP, _FINISHED, _FAILED = 0.0, 1.0, 2.0
# Strong references: a runtime must still be able to tell its peers "failed" after the user's objects are gone.
_OPEN: list["WindowRuntime"] = []
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
    sys.excepthook = hook


def close_all() -> None:
    """Close every live window runtime of this process, in creation order (the same on every rank)."""
    for runtime in list(_OPEN):
        runtime.close(None)
    _OPEN.clear()


class WindowRuntime:
    """Per-rank state of the El Che gradient windows. Created by ``Trainer.setup*`` on N ranks."""

    def __init__(self, ctx: DistContext, config: DdpConfig, module: torch.nn.Module) -> None:
        self.ctx = ctx
        self.config = config
        self.world = ctx.world_size
        self.rank = ctx.rank
        self.device = ctx.device
        self.buckets = GradBuckets(module.parameters(), ctx.device, bucket_mb=config.bucket_mb,
                                   meta_len=5 * self.world)
        self.float_buffers = [b for b in module.buffers() if b.is_floating_point()]
        self.params = self.buckets.params
        self.el_che: Optional[ElChe] = None
        self.batch_size: Optional[int] = None
        self.speed = 1.0 if config.simulate_speeds is None else float(config.simulate_speeds[self.rank])
        if config.simulate_speeds is not None and len(config.simulate_speeds) != self.world:
            raise ValueError(f"DdpConfig.simulate_speeds has {len(config.simulate_speeds)} entries for "
                             f"{self.world} ranks: give one simulated speed per rank")
        self.window_index = 0
        self._closed = False
        self._reset_window()
        self._mb_start = time.perf_counter()
        self._pending_samples: Optional[int] = None
        self._force_sync = False
        self._last_sync_ms = 0.0
        _OPEN.append(self)
        _install_excepthook()

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
        el_che = ElChe(self.world, mode="setup", batch_size=batch_size, anchor=cfg.anchor,
                       max_anchor=cfg.max_anchor, overhead_target=cfg.overhead_target,
                       batch_sizes=list(cfg.batch_sizes) if cfg.batch_sizes is not None else None)
        if cfg.speed_hint is not None:
            slow, ratio = cfg.speed_hint
            if slow >= self.world:
                raise ValueError(f"DdpConfig.speed_hint slow_rank={slow} does not exist in a world of {self.world}")
            el_che.speed_hint(slow, ratio)
        if cfg.freeze_plan or cfg.batch_sizes is not None:
            el_che.freeze()
        self.el_che, self.batch_size = el_che, batch_size

    def plan_sizes(self) -> list[int]:
        if self.el_che is None:
            raise RuntimeError("no batch size known: call graph.set_data_loader(...) before graph.epoch(n)")
        return list(self.el_che.batch_sizes())

    def _anchor(self) -> int:
        if self.el_che is not None:
            return int(self.el_che.anchor)
        return int(self.config.anchor or 1)

    def pending_micro_batches(self) -> int:
        """Micro-batches accumulated in the current, not yet reduced, window."""
        return self._micro_batches

    # --- per micro-batch ----------------------------------------------------------------------------------
    def _reset_window(self) -> None:
        self._micro_batches = 0
        self._samples = 0
        self._samples_known = True
        self._compute_s = 0.0
        self._window_anchor: Optional[int] = None

    def begin_micro_batch(self, samples: int, window_end: bool) -> None:
        """Called by ``graph.epoch`` before yielding a micro-batch: its real sample count, and whether its
        ``step()`` must close the window early (end of epoch, or just before a partial final step)."""
        self._mb_start = time.perf_counter()
        self._pending_samples = int(samples)
        self._force_sync = bool(window_end)

    def micro_batch_done(self, graph: Any) -> bool:
        """Account for one finished micro-batch; close the window when full. True when an optimizer step ran."""
        if self._closed:
            raise DistributedError("graph.step() after graph.close(): this rank already told the others it finished")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - self._mb_start
        if self.speed < 1.0:  # SIMULATION: wait as a slower device would
            time.sleep(elapsed * (1.0 / self.speed - 1.0))
            elapsed /= self.speed
        if self._window_anchor is None:
            self._window_anchor = self._anchor()
        self._compute_s += elapsed
        self._micro_batches += 1
        if self._pending_samples is None:
            self._samples_known = False
            self._samples += 1
        else:
            self._samples += self._pending_samples
        self._pending_samples = None
        force, self._force_sync = self._force_sync, False
        if self._micro_batches < self._window_anchor and not force:
            self._mb_start = time.perf_counter()
            return False
        self._close_window(graph)
        self._mb_start = time.perf_counter()
        return True

    # --- window end ---------------------------------------------------------------------------------------
    def _exchange_meta(self, flag: float, work: float) -> torch.Tensor:
        w, r = self.world, self.rank
        meta = torch.zeros(5 * w, dtype=torch.float32)
        meta[0 * w + r] = self._compute_s * 1000.0
        meta[1 * w + r] = work
        meta[2 * w + r] = self._last_sync_ms
        meta[3 * w + r] = float(self.window_index)
        meta[4 * w + r] = flag
        self.buckets.meta.copy_(meta.to(self.device))
        try:
            self.buckets.all_reduce(first_only=True)
        except Exception as exc:
            self._abandon()
            raise DistributedError(f"rank {r}: lost contact with the other ranks at window {self.window_index} "
                                   f"(another rank probably failed; see its error): {exc}") from exc
        return self.buckets.meta.detach().to("cpu", torch.float64)

    def _abandon(self) -> None:
        """After a detected disagreement or lost peer no further collective may be attempted by this runtime."""
        self._closed = True
        if self in _OPEN:
            _OPEN.remove(self)

    def _check_flags(self, m: torch.Tensor, own_flag: float) -> bool:
        """Raise if ranks disagree; True when every rank is finishing."""
        try:
            return self._flags_agree(m, own_flag)
        except DistributedError:
            self._abandon()
            raise

    def _flags_agree(self, m: torch.Tensor, own_flag: float) -> bool:
        w = self.world
        flags = [int(x) for x in m[4 * w: 5 * w].tolist()]
        if all(f == _FINISHED for f in flags) and own_flag == _FINISHED:
            return True
        failed = [q for q, f in enumerate(flags) if f == _FAILED]
        if failed:
            raise DistributedError(f"rank {failed[0]} failed (see its error above); rank {self.rank} stops too")
        finished = [q for q, f in enumerate(flags) if f == _FINISHED]
        if finished:
            running = [q for q, f in enumerate(flags) if f == _STEP]
            raise DistributedError(
                f"ranks ran different numbers of steps: rank(s) {finished} finished their loop while rank(s) "
                f"{running} still called graph.step() (window {self.window_index}); give every rank the same number "
                "of graph.step() calls (graph.epoch(n) does this for you)")
        indices = [int(x) for x in m[3 * w: 4 * w].tolist()]
        if len(set(indices)) != 1:
            raise DistributedError(f"ranks are out of step: window indices {indices}; every rank must call "
                                   "graph.step() the same number of times")
        return False

    def _close_window(self, graph: Any) -> None:
        w = self.world
        weight = (self._samples / self._micro_batches) if self._samples_known else 1.0
        t0 = time.perf_counter()
        self.buckets.pack(weight)
        m = self._exchange_meta(_STEP, float(self._samples))
        self._check_flags(m, _STEP)
        try:
            self.buckets.all_reduce(skip_first=True)
            total = float(m[w: 2 * w].sum())
            self.buckets.unpack(total)
            if self.float_buffers:
                broadcast_tensors(self.float_buffers, src=0)
        except Exception as exc:
            self._abandon()
            raise DistributedError(f"rank {self.rank}: gradient all-reduce failed at window {self.window_index} "
                                   f"(another rank probably failed): {exc}") from exc
        if self.config.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.config.max_grad_norm)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        sync_ms = (time.perf_counter() - t0) * 1000.0
        graph.apply_optimizer_step()
        if self.el_che is not None:
            walls = m[0:w].tolist()
            work = m[w: 2 * w].tolist()
            previous_sync = min(m[2 * w: 3 * w].tolist())
            self.el_che.report(walls, work, previous_sync)
        self._last_sync_ms = sync_ms
        self.window_index += 1
        self._reset_window()

    def close(self, graph: Any) -> None:
        """Tell the other ranks this rank is done (or failed); raise if they are not all done too. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self in _OPEN:
            _OPEN.remove(self)
        flag = _FAILED if _PROCESS_FAILED else _FINISHED
        self._reset_window()
        try:
            m = self._exchange_meta(flag, 0.0)
        except DistributedError:
            if flag == _FAILED:
                return  # the peers already know; nothing to add
            raise
        if flag == _FAILED:
            return
        self._check_flags(m, flag)
