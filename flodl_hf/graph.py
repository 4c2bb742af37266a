"""Graph: one rank's module, optimizer, LR scheduler, data plan and the ``step()`` cycle.

It exists so that the user's loop (``loss.backward(); graph.step()``) is the same on one device and on many:
on one device ``step()`` is exactly ``optimizer.step(); optimizer.zero_grad()`` plus the scheduler; on N ranks the
same call closes an El Che gradient window (see ``flodl_hf.distributed.window``). A ``Graph`` knows its rank,
world size and device; it never knows about task heads.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol, Sequence, runtime_checkable

import torch

from .config import DdpConfig
from .elche.partition import LENGTH_GROUP, epoch_permutation, length_grouped, rank_slice, steps_per_epoch
from .checkpoint.position import EpochPosition, segment, steps_left
from .epoch_order import SamplerOrders

__all__ = ["Graph", "HasGraph", "EpochPlan", "LOSS_REDUCTIONS"]

LOSS_REDUCTIONS = ("mean", "sum")


@runtime_checkable
class HasGraph(Protocol):
    """Anything that trains through a :class:`Graph` (every task head; a Graph returns itself)."""

    def graph(self) -> "Graph": ...


_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _set_lr(group: dict, lr: float) -> None:
    """Set a param group's LR in place when it is a tensor (capturable / fused optimizers), else replace it."""
    if isinstance(group["lr"], torch.Tensor):
        group["lr"].fill_(lr)
    else:
        group["lr"] = lr


class Graph:
    """One rank's training state: module, optimizer, optional LR scheduler, data loader plan.

    Build one around a module (``Graph(model)``), then hand it to ``Trainer.setup*`` which places it on its
    device, creates the optimizer and, on N ranks, connects it to the process group.
    """

    def __init__(self, module: torch.nn.Module, device: Optional[torch.device | str] = None) -> None:
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"Graph needs a torch.nn.Module, got {type(module).__name__}")
        self.module: torch.nn.Module = module
        if device is None:
            try:
                device = next(module.parameters()).device
            except StopIteration:
                device = torch.device("cpu")
        self.device: torch.device = torch.device(device)
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.scheduler: Any = None
        self.config: DdpConfig = DdpConfig(verbose=False)
        self.rank: int = 0
        self.world_size: int = 1
        self.training_step: int = 0
        self.lr_scale: float = 1.0
        self._runtime: Any = None  # flodl_hf.distributed.window.WindowRuntime on N ranks
        self._dataset: Any = None
        self._batch_size: int = 0
        self._collate: Optional[Callable[[list], Any]] = None
        self._lengths: Optional[list[int]] = None  # per-sample lengths: batches grouped by length
        self._orders: Any = None  # flodl_hf.epoch_order.SamplerOrders when the loop brought its own sampler
        self._seed: int = 0
        self._at: Optional[EpochPosition] = None  # how far graph.epoch()'s plan went, updated by step()
        self._resume: Optional[EpochPosition] = None  # where a loaded checkpoint continues
        self._resume_steps: Optional[tuple[int, int]] = None  # (epoch, steps) loaded before the data loader was set
        self._scaler: Any = None  # torch.amp.GradScaler for fp16 on CUDA
        self._grad_norm: Any = None  # clip_grad_norm_'s total norm at the last optimizer step
        self._scaled_backward = False  # graph.backward ran since the last step (checked under fp16 loss scaling)
        # Drawn but not yet stepped plan steps, oldest first:
        # (epoch, step k, real samples, window end, the epoch's position once it is stepped).
        self._pending: deque[tuple[int, int, int, bool, EpochPosition]] = deque()
        self._raised_flags = 0
        self._agreed_flags = 0
        self._handed = 0  # batches graph.epoch() handed to the loop ...
        self._stepped = 0  # ... and plan steps graph.step() finished: a rank whose difference differs skipped one
        self._source_watch: Any = None  # flodl_hf.replica.SourceWatch until the first optimizer step

    # --- protocol -------------------------------------------------------------------------------------------
    def graph(self) -> "Graph":
        return self

    # --- wiring (called by Trainer) -----------------------------------------------------------------------
    def attach(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
               config: DdpConfig, *, rank: int = 0, world_size: int = 1, runtime: Any = None,
               source_watch: Any = None) -> None:
        """Install the replica, its optimizer and (on N ranks) the window runtime. Used by ``Trainer``.
        ``source_watch``: a ``flodl_hf.replica.SourceWatch`` on the module the replica replaced."""
        self._source_watch = source_watch
        self.module = module
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.config = config
        self.rank, self.world_size = rank, world_size
        self._runtime = runtime
        self._seed = config.seed
        if runtime is not None:
            runtime.bind_plan(self._peek_planned)
        if config.precision == "fp16" and self.device.type == "cuda":
            if world_size > 1:
                raise ValueError("DdpConfig.precision='fp16' with several ranks is not supported: use 'bf16' "
                                 "(no loss scaling needed) or train on one device")
            self._scaler = torch.amp.GradScaler("cuda")

    @property
    def is_distributed(self) -> bool:
        return self._runtime is not None

    @property
    def is_main(self) -> bool:
        """True on rank 0: the rank that logs, shows progress bars and writes files."""
        return self.rank == 0

    def write_once(self, target: Any, write: Callable[[], Any]) -> Any:
        """Run ``write()``, which writes ``target`` and returns its path, once for all ranks: on N ranks rank 0
        writes and every other rank waits (up to ``DdpConfig.timeout_s``) until it has, then gets the same path; a
        failure on rank 0 is raised there and named on the others. On one device: ``write()``."""
        if self._runtime is None or self.world_size == 1:
            return write()
        from .distributed.main_writes import written_by_main

        return written_by_main(target, write, float(self.config.timeout_s))

    @property
    def grad_norm(self) -> Optional[float]:
        """The total norm of the (on N ranks: reduced) gradient before clipping, at the last optimizer step; None
        without ``DdpConfig.max_grad_norm`` (the norm is what clipping computes anyway)."""
        norm = self._runtime.grad_norm if self._runtime is not None else self._grad_norm
        return None if norm is None else float(norm)

    def el_che(self) -> Any:
        """The El Che scheduler of this rank (None on one device)."""
        return None if self._runtime is None else self._runtime.el_che

    def el_che_plan(self) -> Optional[dict]:
        """The plan El Che followed so far (each window's anchor and each split, as changes), JSON-ready: pass it
        as ``DdpConfig(replay_plan=...)`` to repeat this run exactly (None on one device, or before a window)."""
        return None if self._runtime is None else self._runtime.record.to_dict()

    # --- optimisation -------------------------------------------------------------------------------------
    def set_scheduler(self, scheduler: Any) -> None:
        """Attach an LR scheduler. It is stepped once per micro-step: after an optimizer step that closed a window
        of A micro-batches, ``scheduler.step()`` runs A times (once on one device). Size a transformers schedule
        with ``num_training_steps=graph.total_steps(epochs)`` and it ends exactly at its last step."""
        self.scheduler = scheduler

    def set_lr_scale(self, scale: float) -> None:
        """Multiply every param group's learning rate by ``scale`` at each step (the stored LR is untouched)."""
        if not scale > 0:
            raise ValueError(f"lr scale={scale!r} is invalid: use a positive factor, e.g. 1.0")
        self.lr_scale = float(scale)

    def _require_optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise RuntimeError("this Graph has no optimizer: call Trainer.setup(...) or Trainer.setup_head(...) "
                               "before graph.step()")
        return self.optimizer

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled when fp16 loss scaling is active (use it instead of loss.backward() with
        ``precision='fp16'`` on CUDA; identical to loss.backward() otherwise)."""
        (self._scaler.scale(loss) if self._scaler is not None else loss).backward()
        self._scaled_backward = True

    def drawn_ahead(self) -> int:
        """Batches of ``graph.epoch()`` drawn but not yet finished by ``graph.step()`` (read-ahead)."""
        return len(self._pending)

    def handed_ahead(self) -> int:
        """Batches ``graph.epoch()`` handed to the loop that ``graph.step()`` has not finished: the loop's own
        read-ahead, the same on every rank running the same loop (a prefetch thread's draws do not count). A rank
        that skipped ``graph.step()`` for a batch (``continue``) has one more; the window end compares them."""
        return self._handed - self._stepped

    def _peek_planned(self) -> Optional[tuple[int, bool]]:
        """(real samples, window end) of the plan step the loop is computing now (what ``step`` will take)."""
        entry = self._pending[0] if self._pending else None
        return None if entry is None else (entry[2], entry[3])

    def step(self) -> None:
        """Finish one micro-batch: on one device, optimizer step + zero_grad + scheduler; on N ranks, close the
        El Che window when it is full (reduce, clip, step) and otherwise just accumulate."""
        optimizer = self._require_optimizer()
        if self._source_watch is not None:
            self._source_watch.check()
        entry = self._pending.popleft() if self._pending else None
        if entry is not None:
            self._at = entry[4]
            self._stepped += 1
        elif self._at is not None:  # a batch not drawn from the plan: it stands for the next plan step
            at, g = self._at, self.world_size * self._batch_size
            self._at = EpochPosition(at.epoch, at.steps + 1, min(at.end, at.samples + g), at.end)
        if self._scaler is not None:
            # GradScaler.step would divide unscaled gradients by the scale (no real update): drop the micro-batch.
            if not self._scaled_backward:
                optimizer.zero_grad(set_to_none=True)
                raise ValueError("precision='fp16' on CUDA scales the loss, but this micro-batch's gradients came "
                                 "from loss.backward(): call graph.backward(loss) instead (it scales the loss), or "
                                 "use DdpConfig(precision='bf16'), which needs no loss scaling")
            self._scaled_backward = False
        if self._runtime is not None:
            self._runtime.set_user_flags(self._raised_flags)
            self._raised_flags = 0
            planned = None if entry is None else (entry[2], entry[3])
            if self._runtime.micro_batch_done(self, planned):
                self._agreed_flags = self._runtime.agreed_flags
                self.training_step += 1
                self._source_watch = None
            return
        if self.config.max_grad_norm is not None:
            if self._scaler is not None:
                self._scaler.unscale_(optimizer)
            self._grad_norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.config.max_grad_norm)
        self.apply_optimizer_step(optimizer)
        self._agreed_flags, self._raised_flags = self._raised_flags, 0
        self.training_step += 1
        self._source_watch = None

    def loss_items(self, items: float, *, reduction: str = "mean", loss: Optional[torch.Tensor] = None) -> None:
        """Declare what this micro-batch's loss averaged over, before ``graph.step()``.

        ``items``: how many things the loss is a mean over -- samples, tokens whose label is not -100, or the sum
        of the sample weights of a weighted loss. On N ranks each micro-batch's gradient is weighted by it and the
        window divides by the total over every rank, so the update equals one process's on the concatenated
        micro-batches (what transformers does with ``num_items_in_batch``). ``reduction="sum"`` declares a summed
        loss (weight 1, no division; ``items`` is then informational). Every task head's ``compute_loss`` calls
        this for you; a loop that never calls it is weighted by each micro-batch's sample count. On one device it
        changes nothing.

        ``loss``: the loss tensor the declaration is about. It binds the declaration to that loss's backward pass:
        it counts only if the backward pass runs through ``loss`` (a loss computed for a mid-training evaluation,
        for a batch the loop then skips without ``backward()``, or with nothing trainable on its path, declares
        nothing), and a micro-batch whose only declarations were never backpropagated, with no backward pass at
        all, weighs 0 (one process would leave that batch out). Every head's ``compute_loss`` binds its
        declaration. Without ``loss``, the last declaration before ``graph.step()`` counts.
        """
        if reduction not in LOSS_REDUCTIONS:
            raise ValueError(f"reduction={reduction!r} is unknown: use 'mean' (the loss is a mean over `items`) "
                             "or 'sum' (the loss is a sum)")
        try:
            value = float(items)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"items={items!r} is not a number: pass how many items the loss averaged over") from exc
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"items={items!r} is invalid: pass a finite count >= 0 (0 when every label was "
                             "ignored)")
        if loss is not None and not isinstance(loss, torch.Tensor):
            raise ValueError(f"loss={type(loss).__name__} is not a tensor: pass the loss tensor the items belong to "
                             "(or no loss= at all)")
        if self._runtime is not None:
            self._runtime.set_loss_items(value, reduction, loss)

    def raise_flag(self, index: int) -> None:
        """Raise stop flag ``index`` (0..7) on this rank. After the next optimizer step every rank sees it in
        :meth:`agreed_flags` (an OR over ranks that rides in the window's metadata: no collective of its own)."""
        if not isinstance(index, int) or not 0 <= index < 8:
            raise ValueError(f"flag index={index!r} is invalid: use an integer in 0..7")
        self._raised_flags |= 1 << index

    def agreed_flags(self) -> int:
        """The flags raised on any rank before the last optimizer step, as a bit mask (bit i = flag i)."""
        return self._agreed_flags

    def _optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._scaler is not None:
            self._scaler.step(optimizer)
            self._scaler.update()
        else:
            optimizer.step()

    def apply_optimizer_step(self, optimizer: Optional[torch.optim.Optimizer] = None, micro_steps: int = 1,
                             window_lrs: Optional[Sequence[float]] = None, lr_factor: float = 1.0) -> None:
        """optimizer.step() with the LR scale applied, zero_grad, then the LR scheduler advanced by
        ``micro_steps``: an LR schedule counts micro-steps (batches of ``graph.epoch``), not optimizer steps, so a
        schedule sized by ``graph.total_steps(epochs)`` ends exactly at its last step whatever El Che's anchor does.

        ``window_lrs``: the LRs in force at the window's first micro-batch (N ranks). The step uses them, and the
        param groups get back the LRs they hold now: a scheduler the loop steps itself after each ``graph.step()``
        (the habit of every transformers script) moves the LR in the middle of a window, and the window must not
        take the LR of its last micro-step (the first warmup window would run at peak LR). So a user-stepped
        schedule trains exactly as one attached with :meth:`set_scheduler`.

        ``lr_factor``: this step's extra LR factor (``DdpConfig(lr_scaling="adascale")``'s gain, or its square root),
        on top of :meth:`set_lr_scale`; the stored LR is untouched.
        """
        optimizer = optimizer or self._require_optimizer()
        groups = optimizer.param_groups
        saved = [float(group["lr"]) for group in groups]
        use = list(saved)
        if window_lrs is not None:  # groups added since the window began keep their own LR
            use[:len(window_lrs)] = [float(lr) for lr in window_lrs][:len(groups)]
        use = [lr * self.lr_scale * float(lr_factor) for lr in use]
        if use != saved:
            for group, lr in zip(groups, use):
                _set_lr(group, lr)
            self._optimizer_step(optimizer)
            for group, lr in zip(groups, saved):
                _set_lr(group, lr)
        else:
            self._optimizer_step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            for _ in range(max(1, int(micro_steps))):
                self.scheduler.step()

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward-pass precision context of ``DdpConfig.precision`` (a no-op in fp32)."""
        dtype = _AUTOCAST_DTYPES.get(self.config.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    # --- data ---------------------------------------------------------------------------------------------
    def set_data_loader(self, dataset: Sequence[Any], batch_size: int,
                        collate_fn: Optional[Callable[[list], Any]] = None, seed: Optional[int] = None,
                        lengths: Optional[Sequence[int]] = None, sampler: Optional[Iterable[Any]] = None) -> None:
        """Plan epochs over ``dataset`` (anything with ``len`` and ``[i]``).

        ``batch_size`` is per rank (the global batch is ``world_size * batch_size``; El Che may give faster ranks
        more of it). Each epoch is a permutation seeded by ``seed + epoch`` that is identical on every rank.
        ``sampler``: the loop's own order instead, e.g. the ``RandomSampler(dataset, generator=g)`` its
        ``DataLoader`` used: epoch ``n`` takes the sampler's ``n``-th pass, so one device trains exactly as that
        ``DataLoader`` did (``flodl_hf.epoch_order``). Give every rank the same sampler, seeded alike; each pass
        must yield every row once.
        ``lengths`` (one number per sample, e.g. text lengths): group batches by length (``partition.length_grouped``
        over runs of 50 batches), so little compute goes to padding; the same on every rank.
        """
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} is invalid: use an integer >= 1 (samples per rank per step)")
        try:
            n = len(dataset)
        except TypeError as exc:
            raise TypeError(f"dataset of type {type(dataset).__name__} has no len(): pass a sized, indexable "
                            "dataset (a list, a torch Dataset, a datasets.Dataset)") from exc
        if n == 0:
            raise ValueError("dataset is empty: give at least one sample to set_data_loader")
        if lengths is not None:
            lengths = list(lengths)
            if len(lengths) != n or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in lengths):
                raise ValueError(f"lengths must hold one integer >= 0 per sample ({n}); got {len(lengths)} values: "
                                 "pass e.g. [len(text) for text in texts], or None for no length grouping")
        self._lengths = lengths
        self._orders = None if sampler is None else SamplerOrders(sampler, n)
        if self._runtime is None and self.config.max_micro_batch is not None:
            self.config.el_che_kwargs(self.world_size, batch_size)  # one device: refuses a cap below batch_size
        self._dataset = dataset
        self._batch_size = batch_size
        self._collate = collate_fn
        if seed is not None:
            self._seed = int(seed)
        if self._runtime is not None:
            if self.config.max_micro_batch == "auto" and self._runtime.probed_caps is None:
                from .elche.memory_probe import probe_graph_caps

                probe_graph_caps(self, dataset, batch_size, collate_fn)
            order_key = self._orders.digest() if self._orders is not None else int(self._seed or 0) % (1 << 24)
            self._runtime.plan_data = (len(dataset), order_key)
            self._runtime.set_batch_size(batch_size)
        if self._resume_steps is not None:
            self.resume_from(self._resume_steps)

    def steps_per_epoch(self) -> int:
        """Optimizer-independent count of micro-batches every rank runs per epoch."""
        self._require_data()
        return steps_per_epoch(len(self._dataset), self.world_size * self._batch_size, self.config.drop_last)

    def total_steps(self, epochs: int) -> int:
        """Micro-steps in ``epochs`` epochs: the ``num_training_steps`` of an LR schedule (see set_scheduler)."""
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise ValueError(f"epochs={epochs!r} is invalid: use an integer >= 1")
        return self.steps_per_epoch() * epochs

    def steps_remaining(self, epochs: int) -> int:
        """Micro-steps still to run, from the current position (e.g. a loaded checkpoint's) to the end of
        ``epochs`` epochs, on this world size: after a resume on another device count, the remaining length of an
        LR schedule (``flodl_hf.checkpoint.position``)."""
        self.total_steps(epochs)  # validates epochs and data
        return steps_left(self._resume or self._at, epochs, len(self._dataset), self.world_size * self._batch_size,
                          self.config.drop_last)

    def _require_data(self) -> None:
        if self._dataset is None:
            raise RuntimeError("no data: call graph.set_data_loader(dataset, batch_size, collate_fn) before "
                               "graph.epoch(n)")

    def gather_predictions(self, dataset: Sequence[Any], predict: Callable[[Any], Any], batch_size: int,
                           collate_fn: Optional[Callable[[list], Any]] = None) -> Any:
        """Evaluate ``dataset`` once over all ranks: every rank gets every row's prediction, in dataset order.

        Each rank runs ``predict(batch)`` on a contiguous slice of the rows (batches of ``batch_size``, collated by
        ``collate_fn``), with the module in eval mode and no gradients (its mode is restored after), and the
        slices are gathered. ``predict`` returns a tensor whose first dimension is the batch's rows, or a list
        with one entry per row. The result is a tensor when every row's entry is a tensor of one shape, else a
        list. On one device it is the plain loop. Call it on every rank with the same dataset."""
        from .distributed.predictions import gather_predictions

        group = None
        if self._runtime is not None:
            from .distributed.context import side_group

            group = side_group()
        return gather_predictions(self.module, dataset, predict, batch_size, collate_fn, self.rank, self.world_size,
                                  group)

    def plan(self, n: int) -> "EpochPlan":
        """This rank's index lists for epoch ``n``, as a batch sampler:
        ``DataLoader(dataset, batch_sampler=graph.plan(n), collate_fn=..., num_workers=2)`` loads and collates
        ahead of compute in worker processes. Each step's split and metadata are fixed when it is drawn, so any
        read-ahead depth trains the same model."""
        self._require_data()
        return EpochPlan(self, int(n))

    def epoch(self, n: int, prefetch: int = 0) -> Iterator[Any]:
        """Yield this rank's micro-batches of epoch ``n``: a seeded, disjoint, complete partition on N ranks.

        ``prefetch=k`` collates (tokenises) up to ``k`` batches ahead on a background thread, overlapping input
        with compute; the result is identical to ``prefetch=0``.
        """
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise ValueError(f"prefetch={prefetch!r} is invalid: use an integer >= 0 (batches collated ahead)")
        plan = self.plan(n)
        if prefetch == 0:
            return self._collated(iter(plan))
        return self._prefetched(iter(plan), prefetch)

    def _collate_indices(self, indices: list[int]) -> Any:
        items = [self._dataset[int(i)] for i in indices]
        return self._collate(items) if self._collate is not None else items

    def _handed_over(self) -> None:
        self._handed += 1
        if self._runtime is not None:
            self._runtime.note_yield()

    def _collated(self, indices_iter: Iterator[list[int]]) -> Iterator[Any]:
        try:
            for indices in indices_iter:
                batch = self._collate_indices(indices)
                self._handed_over()
                yield batch
        finally:
            indices_iter.close()  # type: ignore[attr-defined]  # a plan generator: forgets unstepped draws

    def _prefetched(self, indices_iter: Iterator[list[int]], depth: int) -> Iterator[Any]:
        buffer: queue.Queue = queue.Queue(maxsize=depth)
        stop = threading.Event()

        def put(item: tuple[str, Any]) -> bool:
            while not stop.is_set():
                try:
                    buffer.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def work() -> None:
            try:
                for indices in indices_iter:
                    if not put(("batch", self._collate_indices(indices))):
                        return
                put(("done", None))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the training thread
                put(("error", exc))
            finally:
                indices_iter.close()  # type: ignore[attr-defined]

        thread = threading.Thread(target=work, name="flodl-hf-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                kind, value = buffer.get()
                if kind == "done":
                    return
                if kind == "error":
                    raise value
                self._handed_over()
                yield value
        finally:
            stop.set()
            thread.join()

    def _plan_indices(self, n: int) -> Iterator[list[int]]:
        """The index lists of epoch ``n`` (what :class:`EpochPlan` iterates); queues each step's metadata."""
        self._require_data()
        total = len(self._dataset)
        global_batch = self.world_size * self._batch_size
        steps = steps_per_epoch(total, global_batch, self.config.drop_last)
        if steps == 0:
            raise ValueError(f"dataset of {total} samples is smaller than one global batch of {global_batch} "
                             f"({self.world_size} rank(s) x batch_size {self._batch_size}): lower batch_size or "
                             "pass drop_last=False in DdpConfig")
        seg = segment(n, self._resume, total, global_batch, self.config.drop_last)
        if seg is None:
            return  # finished before the checkpoint
        self._resume = None
        perm = self._orders.order(n) if self._orders is not None else epoch_permutation(total, self._seed + n)
        if self._lengths is not None:
            perm = length_grouped(perm, self._lengths, LENGTH_GROUP * self._batch_size)
        runtime = self._runtime
        if not self._pending:
            self._at = seg.position(0)
        drawn: list[int] = []
        finished = False
        try:
            for j in range(seg.steps):
                # Positions [seg.start, seg.end) in steps of the global batch (flodl_hf.checkpoint.position); the last step
                # closes a window, and a partial last step is a window of its own (exact weighting).
                cut = dict(start=seg.start, end=seg.end)
                if runtime is not None:
                    indices, padding = runtime.draw(
                        lambda sizes, j=j: rank_slice(perm, j, global_batch, sizes, self.rank, **cut))
                else:
                    indices, padding = rank_slice(perm, j, global_batch, [self._batch_size], 0, **cut)
                k = seg.first_step + j
                self._pending.append((n, k, len(indices) - padding, seg.window_end(j), seg.position(j + 1)))
                drawn.append(k)
                yield indices
            finished = True
        finally:
            if not finished:
                self._forget_unstepped(n, set(drawn))

    def _steps_left_in(self, n: int) -> int:
        """Steps of epoch ``n`` still to run (0: the epoch was already done before a loaded checkpoint)."""
        self._require_data()
        seg = segment(n, self._resume, len(self._dataset), self.world_size * self._batch_size, self.config.drop_last)
        return 0 if seg is None else seg.steps

    def _forget_unstepped(self, n: int, drawn: set) -> None:
        """An iterator abandoned mid-epoch: its drawn steps that were never stepped will never be."""
        kept = [e for e in self._pending if not (e[0] == n and e[1] in drawn)]
        dropped = len(self._pending) - len(kept)
        if dropped:
            self._pending = deque(kept)
            # batches handed to the loop are the oldest drawn: those that were dropped are no longer ahead
            self._handed = min(self._handed, self._stepped + len(self._pending))
            if self._runtime is not None:
                self._runtime.undraw(dropped)

    # --- checkpoints --------------------------------------------------------------------------------------
    def position(self) -> tuple[int, int]:
        """(epoch, micro-batches of it finished) — where a checkpoint taken now would resume."""
        at = self.epoch_position()
        return (at.epoch, at.steps)

    def epoch_position(self) -> EpochPosition:
        """Where a checkpoint taken now would resume, in samples of the epoch's permutation (``flodl_hf.checkpoint.position``):
        what lets a run continue the epoch on another number of devices."""
        if self._at is not None:
            return self._at
        if self._dataset is None:
            epoch, steps = self._resume_steps or (0, 0)
            return EpochPosition(epoch, steps, 0, 0)
        return segment(0, None, len(self._dataset), self.world_size * self._batch_size,
                       self.config.drop_last).position(0)  # type: ignore[union-attr]

    def resume_from(self, position: "Sequence[int] | EpochPosition") -> None:
        """Make the next ``graph.epoch(n)`` calls skip what was done before ``position`` (used by checkpoints): an
        :class:`~flodl_hf.checkpoint.position.EpochPosition`, or ``(epoch, steps done)`` on this graph's world size."""
        self._pending.clear()
        if not isinstance(position, EpochPosition):
            if self._dataset is None:  # read once set_data_loader knows the epoch's length
                self._resume_steps = (int(position[0]), int(position[1]))
                self._resume = self._at = None
                if self._runtime is not None:
                    self._runtime.reset_plan()
                return
            position = EpochPosition.from_steps(position, len(self._dataset), self.world_size * self._batch_size,
                                                self.config.drop_last)
        self._resume_steps = None
        self._resume = self._at = position
        if self._runtime is not None:
            self._runtime.reset_plan()

    def save_checkpoint(self, directory: Any, extra: Optional[dict] = None) -> Any:
        """Write a resumable checkpoint (atomically; rank 0 writes). See ``flodl_hf.checkpoint.graph_state``."""
        from .checkpoint.graph_state import save_checkpoint

        return save_checkpoint(self, directory, extra)

    def load_checkpoint(self, directory: Any) -> dict:
        """Restore model, optimizer, scheduler, El Che, RNG and epoch position; returns the saved ``extra``."""
        from .checkpoint.graph_state import load_checkpoint

        return load_checkpoint(self, directory)

    # --- end of training ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Tell the other ranks this rank's loop is over (detects uneven step counts); idempotent."""
        if self._runtime is not None:
            self._runtime.close(self)


class EpochPlan:
    """One epoch of one rank's plan as a batch sampler: iterate it for index lists (``len()`` = steps left).

    Made by :meth:`Graph.plan`; hand it to ``torch.utils.data.DataLoader(batch_sampler=...)``.
    """

    def __init__(self, graph: Graph, epoch: int) -> None:
        self._graph = graph
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        return self._graph._plan_indices(self.epoch)

    def __len__(self) -> int:
        return self._graph._steps_left_in(self.epoch)
