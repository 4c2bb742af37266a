"""WindowGrads: one rank's weighted gradient accumulation over an El Che window, with a trainable set that moves.

It exists because a window's update must equal one process's update on the concatenation of the window's
micro-batches, whatever the user's loop does:

- **Loss denominators.** Each micro-batch's loss is a mean over its own ``d_i`` items (samples, or tokens whose
  label is not -100, or a sum of sample weights). Its gradient is added here as ``d_i * grad`` the moment the
  micro-batch ends, and the window divides the all-reduced sum by the global ``D = sum d_i``: exactly the gradient
  of ``sum(losses over every item) / D``, the way transformers' ``num_items_in_batch`` fixes gradient accumulation.
  A summed loss (``reduction="sum"``) is added with weight 1 and divided by 1.
- **Which parameters get a gradient.** ``p.grad`` is moved out after every micro-batch (as one device's
  ``zero_grad(set_to_none=True)`` would), and a per-parameter *presence* flag records that some micro-batch gave
  ``p`` a gradient. After the window a parameter no rank gave a gradient keeps ``grad is None``, so Adam-type
  optimizers and weight decay leave it alone exactly as on one device.
- **Freezing and unfreezing at any step.** Buckets hold the parameters that are trainable on some rank (the
  *layout*). The layout is recomputed at every window end from the reduced ``requires_grad`` flags, identically on
  every rank. A parameter unfrozen in the middle of a window accumulates in a side buffer and is reduced by one extra
  collective in that window only.

The presence and ``requires_grad`` flags travel in the window's metadata region (see ``flodl_hf.distributed.window``),
so tracking the trainable set costs no collective of its own.

**One launch order.** The gradient buckets are always all-reduced in one fixed order, the last bucket first (the
order in which backward makes them ready), and the collective that carries the metadata comes last. A window end,
a finished loop and a failed rank all run the whole sequence from where this window's launches stopped, so the
ranks' collectives always match in number and shape; the overlap hooks (``window_overlap``) launch some buckets
early, during the last micro-batch's backward, and the window end launches the rest.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from .collectives import bucket_layout

__all__ = ["WindowGrads", "micro_batch_weight"]


def micro_batch_weight(items: "tuple[float, str] | None", samples: "int | None") -> tuple[float, bool]:
    """(weight of a micro-batch's gradient, whether it counts at all): what its loss averaged over (declared
    ``items``; weight 1 for a summed loss), else its real sample count from the plan, else 1. A padding
    micro-batch (``samples == 0``, ``drop_last=False``) carries no weight at all."""
    if samples == 0:
        return 0.0, False
    if items is not None:
        return (1.0 if items[1] == "sum" else items[0]), True
    return (float(samples) if samples is not None else 1.0), True


class WindowGrads:
    """Flat float32 buckets for the layout's gradients, plus presence bookkeeping for every parameter."""

    def __init__(self, params: Sequence[torch.nn.Parameter], device: torch.device, *, bucket_mb: float,
                 meta_fixed: int, meta_in_first_bucket: bool, layout: Sequence[bool]) -> None:
        self.params = list(params)
        self.n = len(self.params)
        self.device = device
        self.bucket_mb = float(bucket_mb)
        self.meta_fixed = int(meta_fixed)
        self.meta_len = self.meta_fixed + 2 * self.n  # fixed slots, presence[n], requires_grad[n]
        self.meta_in_first_bucket = bool(meta_in_first_bucket)
        self._meta_cpu = None if self.meta_in_first_bucket else torch.zeros(self.meta_len, dtype=torch.float32)
        self.presence = [False] * self.n
        self.side: dict[int, torch.Tensor] = {}  # accumulators of parameters outside the layout
        self.measure = False  # measure each bucket's squared norm as it starts (the gradient-noise estimate)
        self.build(layout)

    # --- layout -----------------------------------------------------------------------------------------------
    def build(self, layout: Sequence[bool]) -> None:
        """Allocate buckets for the parameters flagged in ``layout`` (same order on every rank)."""
        self.mask = [bool(x) for x in layout]
        chosen = [i for i in range(self.n) if self.mask[i]]
        where, sizes = bucket_layout([self.params[i].numel() for i in chosen], self.bucket_mb,
                                     prefix=self.meta_len if self.meta_in_first_bucket else 0)
        # param index -> (bucket, start, numel)
        self.where = {i: (b, start, self.params[i].numel()) for i, (b, start) in zip(chosen, where)}
        self.buffers = [torch.zeros(max(1, s), dtype=torch.float32, device=self.device) for s in sizes]
        self.members: list[list[int]] = [[] for _ in sizes]  # bucket -> its parameter indices
        for i, (b, _, _) in self.where.items():
            self.members[b].append(i)
        # launch order: last bucket first; on CPU ranks bucket 0 carries the metadata and goes with the exchange
        self.order = [b for b in reversed(range(len(sizes))) if not (b == 0 and self.meta_in_first_bucket)]
        self._launched = 0
        self._works: list = []
        self._local_sq = torch.zeros((), dtype=torch.float64, device=self.device)

    # --- metadata ---------------------------------------------------------------------------------------------
    @property
    def meta(self) -> torch.Tensor:
        return self.buffers[0][: self.meta_len] if self.meta_in_first_bucket else self._meta_cpu

    def first_collective(self) -> torch.Tensor:
        """What every exchange all-reduces first: the whole first bucket (metadata + gradients) on CPU ranks, the
        metadata alone beside NCCL. Its shape is the same for a window end, a finished loop and a failed rank."""
        return self.buffers[0] if self.meta_in_first_bucket else self._meta_cpu

    def write_meta(self, fixed: list[float]) -> None:
        """Fill the metadata region: the fixed per-rank slots, then presence and requires_grad flags."""
        values = (list(fixed) + [1.0 if present else 0.0 for present in self.presence]
                  + [1.0 if p.requires_grad else 0.0 for p in self.params])
        self.meta.copy_(torch.tensor(values, dtype=torch.float32).to(self.meta.device))

    def read_meta(self) -> tuple[torch.Tensor, list[float], list[float]]:
        """(fixed slots as float64 on CPU, presence counts, requires_grad counts) after the all-reduce."""
        m = self.meta.detach().to("cpu", torch.float64)
        fixed = m[: self.meta_fixed]
        presence = m[self.meta_fixed: self.meta_fixed + self.n].tolist()
        trainable = m[self.meta_fixed + self.n:].tolist()
        return fixed, presence, trainable

    # --- per micro-batch --------------------------------------------------------------------------------------
    def reset(self, keep_launches: bool = False) -> None:
        """Empty the window. ``keep_launches`` (closing mid-window): the buckets this window already launched stay
        counted, so the closing exchange continues the launch order where it stopped, as the other ranks expect."""
        self.wait_launched(quiet=keep_launches)
        for buf in self.buffers:
            buf.zero_()
        self.presence = [False] * self.n
        self.side.clear()
        if not keep_launches:
            self._launched = 0
        self._local_sq.zero_()

    def accumulate(self, weight: float, counts: bool = True, skip: frozenset = frozenset()) -> None:
        """Add ``weight * p.grad`` of every parameter that has a gradient, then clear ``p.grad``.

        ``counts=False`` (a padding micro-batch) drops the gradients without marking them present. ``skip``:
        parameters whose gradient the overlap hooks already added (their ``p.grad`` is only cleared).
        """
        for i, p in enumerate(self.params):
            grad = p.grad
            if grad is None:
                continue
            p.grad = None
            if not counts or i in skip:
                continue
            self.add(i, grad, weight)

    def add(self, i: int, grad: torch.Tensor, weight: float) -> None:
        """Add ``weight * grad`` to parameter ``i``'s accumulator and mark it present."""
        self.presence[i] = True
        flat = grad.detach().reshape(-1)
        if i in self.where:
            b, start, n = self.where[i]
            view = self.buffers[b][start: start + n]
        else:
            view = self.side.get(i)
            if view is None:
                view = torch.zeros(self.params[i].numel(), dtype=torch.float32, device=self.device)
                self.side[i] = view
        if weight == 1.0:
            view.add_(flat)
        elif weight != 0.0:
            view.add_(flat, alpha=float(weight))

    def _grad_region(self, b: int) -> torch.Tensor:
        return self.buffers[b][self.meta_len:] if (b == 0 and self.meta_in_first_bucket) else self.buffers[b]

    @staticmethod
    def _sq(t: torch.Tensor) -> torch.Tensor:
        return torch.dot(t, t).to(torch.float64)

    def sq_norm(self, side: dict[int, torch.Tensor]) -> float:
        """Squared norm of what the buckets (metadata excluded) and ``side`` accumulators hold: the global weighted
        gradient sum after the reduction (the gradient-noise estimate's big-batch input)."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for t in [self._grad_region(b) for b in range(len(self.buffers))] + list(side.values()):
            if t.numel():
                total += self._sq(t)
        return float(total)

    def local_sq_norm(self) -> float:
        """This rank's own weighted gradient sum, squared, before the reduction: measured bucket by bucket just
        before each launch (``measure`` on), plus what is never launched early (the metadata bucket's gradients,
        ``side``). Call after :meth:`launch_rest`, before the metadata exchange."""
        total = self._local_sq.clone()
        if self.meta_in_first_bucket and self._grad_region(0).numel():
            total += self._sq(self._grad_region(0))
        for t in self.side.values():
            total += self._sq(t)
        return float(total)

    # --- launches (the fixed order) ---------------------------------------------------------------------------
    def next_bucket(self) -> "int | None":
        """The bucket the launch order reaches next (None: every gradient bucket of the order is launched)."""
        return self.order[self._launched] if self._launched < len(self.order) else None

    def launch_next(self) -> None:
        """Start the SUM all-reduce of the next bucket of the order (asynchronously), measuring its squared norm
        first for the gradient-noise estimate when ``measure`` is on."""
        b = self.order[self._launched]
        buf = self.buffers[b]
        if self.measure:
            self._local_sq += self._sq(buf)
        self._launched += 1
        self._works.append(dist.all_reduce(buf, op=dist.ReduceOp.SUM, async_op=True))

    def launch_rest(self) -> None:
        """Launch every bucket of the order not launched yet in this window."""
        while self.next_bucket() is not None:
            self.launch_next()

    def finish_launches(self) -> None:
        """The window's sequence is complete (exchanged and awaited): a failure from here on starts a new one, as
        the other ranks' next window does."""
        self.wait_launched()
        self._launched = 0

    def wait_launched(self, quiet: bool = False) -> None:
        """Wait for every launched all-reduce (``quiet``: on a closing path, ignore their failures)."""
        works, self._works = self._works, []
        for work in works:
            try:
                work.wait()
            except Exception:
                if not quiet:
                    raise

    def reduce_side(self, extra: Sequence[int]) -> dict[int, torch.Tensor]:
        """The one extra collective of a window in which parameters outside the layout got gradients."""
        parts = [self.side[i] if i in self.side else torch.zeros(self.params[i].numel(), dtype=torch.float32,
                                                                     device=self.device) for i in extra]
        flat = torch.cat(parts)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        out, offset = {}, 0
        for i in extra:
            n = self.params[i].numel()
            out[i] = flat[offset: offset + n]
            offset += n
        return out

    def unpack(self, divisor: float, presence: Sequence[float], side: dict[int, torch.Tensor]) -> None:
        """Set ``p.grad = reduced / divisor`` where some rank gave ``p`` a gradient, ``None`` elsewhere."""
        inv = 1.0 / divisor
        for i, p in enumerate(self.params):
            if presence[i] < 0.5:
                p.grad = None
                continue
            if i in self.where:
                b, start, n = self.where[i]
                flat = self.buffers[b][start: start + n]
            else:
                flat = side[i]
            value = flat.view(p.shape)
            grad = value * inv if inv != 1.0 else value.clone()
            p.grad = grad.to(p.dtype)
