"""Memory-aware El Che: each rank finds the largest micro-batch it can train, before the first step.

Why it exists: El Che splits every global batch by speed, so a fast GPU with little memory would get a
micro-batch that does not fit and the run would die with an out-of-memory error minutes in. With
``DdpConfig(max_micro_batch="auto")`` every rank runs a bounded probe when the data is set: forward and backward
passes on batches built from the longest samples it can find, growing until one does not fit or the global batch
is reached, then a bisection. The caps are gathered from every rank and El Che never gives a rank more
(the memory caps). What the probe runs is a real training pass (``model(**enc)``, a loss on the outputs,
``backward``); its gradients are discarded and the parameters are never stepped.

Out of memory is ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` is the same class), whatever
raised it; the probe frees the cache and tries smaller. Any other error is the user's and propagates.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import torch

__all__ = ["largest_fitting", "longest_item", "probe_micro_batch", "probe_graph_caps", "optimizer_reserve_bytes",
           "OUT_OF_MEMORY", "PROBE_ROWS", "CUDA_MARGIN"]

#: The exception class that means "does not fit" (CUDA allocators raise it; tests raise it to stand in for one).
OUT_OF_MEMORY: type = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)

#: How many of the dataset's first rows are searched for the longest sample (the probe pads to it).
PROBE_ROWS = 512


def largest_fitting(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The largest ``n`` in ``[low, high]`` with ``fits(n)``, assuming fitting is monotone: doubling from ``low``
    then bisection, so at most about ``2 log2(high / low)`` tries. 0 when even ``low`` does not fit."""
    if low < 1 or high < low:
        raise ValueError(f"probe range [{low}, {high}] is invalid: need 1 <= low <= high")
    if not fits(low):
        return 0
    good, n = low, low
    while n < high:
        n = min(high, 2 * n)
        if not fits(n):
            bad = n
            break
        good = n
    else:
        return good
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def _length(item: Any) -> int:
    """How long a sample is, for choosing the one that pads the most (text length, else the tensor size)."""
    if isinstance(item, Mapping):
        for key in ("text", "input_ids", "sentence", "content"):
            if key in item:
                return _length(item[key])
        return max((_length(v) for v in item.values()), default=0)
    if isinstance(item, str):
        return len(item)
    if isinstance(item, torch.Tensor):
        return int(item.numel())
    if isinstance(item, (list, tuple)):
        return sum(_length(v) for v in item) if item and not isinstance(item[0], (int, float)) else len(item)
    return 0


def longest_item(dataset: Sequence[Any]) -> Any:
    """The longest of the dataset's first :data:`PROBE_ROWS` samples: the probe's batches are copies of it."""
    rows = min(len(dataset), PROBE_ROWS)
    return dataset[max(range(rows), key=lambda i: _length(dataset[i]))]


def _outputs_loss(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.float().sum()
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        logits = out[0]
    if logits is None:
        raise ValueError(f"max_micro_batch='auto' cannot probe a model whose output is {type(out).__name__}: "
                         "return a tensor or an object with .logits, or give max_micro_batch as integers")
    return logits.float().sum()


#: On CUDA the cap found is scaled by this: the caching allocator fragments over a run, and a probe that fits to
#: the last sample leaves nothing for it.
CUDA_MARGIN = 0.9


def optimizer_reserve_bytes(module: torch.nn.Module) -> int:
    """Memory training will hold that a forward + backward probe does not: the optimizer's state, created at its
    first step (Adam / AdamW: two tensors per trainable parameter, the largest common case)."""
    return 2 * sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


def probe_micro_batch(module: torch.nn.Module, device: torch.device, dataset: Sequence[Any],
                      collate: Optional[Callable[[list], Any]], low: int, high: int,
                      autocast: Optional[Callable[[], Any]] = None,
                      on_try: Optional[Callable[[int, bool], None]] = None, reserve_bytes: int = 0) -> int:
    """The largest micro-batch in ``[low, high]`` samples this rank can train (0: not even ``low``).

    The collated batch must be ``(enc, labels)`` with ``enc`` a mapping of model inputs (what task heads'
    ``collate`` returns) or a mapping itself; anything else is refused with the fix. ``on_try(n, fits)`` hears of
    every try (for logs and benchmarks). On CUDA, ``reserve_bytes`` (e.g. :func:`optimizer_reserve_bytes`) stay
    allocated during every try, standing for what training adds later, and the cap found is scaled by
    :data:`CUDA_MARGIN` (never below ``low`` when ``low`` fits)."""
    import contextlib

    longest = longest_item(dataset)  # found once, not on every try

    def fits(n: int) -> bool:
        items = [longest] * n
        batch = collate(items) if collate is not None else items
        enc = batch[0] if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], Mapping) else batch
        if not isinstance(enc, Mapping):
            raise ValueError("max_micro_batch='auto' needs batches of model inputs by name (a task head's collate, "
                             f"giving (enc, labels)); this collate gives {type(batch).__name__}: give "
                             "max_micro_batch as integers instead")
        enc = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in enc.items()}
        try:
            with autocast() if autocast is not None else contextlib.nullcontext():
                loss = _outputs_loss(module(**enc))
            loss.backward()
            return True
        except OUT_OF_MEMORY:
            return False
        finally:
            loss = None  # noqa: F841 - release the graph before freeing memory
            module.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()

    # The probe must leave no trace: buffers (e.g. batch-norm statistics) and the random streams (dropout) are
    # restored, so a run with the probe trains exactly like one with the same caps given as integers.
    buffers = [b.detach().clone() for b in module.buffers()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    was_training = module.training
    module.train()
    try:
        def tried(n: int) -> bool:
            ok = fits(n)
            if on_try is not None:
                on_try(n, ok)
            return ok

        reserve = (torch.empty(int(reserve_bytes), dtype=torch.uint8, device=device)
                   if device.type == "cuda" and reserve_bytes > 0 else None)
        try:
            found = largest_fitting(tried, low, high)
        finally:
            del reserve
        return max(low, int(found * CUDA_MARGIN)) if device.type == "cuda" and found > 0 else found
    finally:
        module.train(was_training)
        with torch.no_grad():
            for b, saved in zip(module.buffers(), buffers):
                b.copy_(saved)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)


def probe_graph_caps(graph: Any, dataset: Sequence[Any], batch_size: int,
                     collate: Optional[Callable[[list], Any]]) -> list[int]:
    """``max_micro_batch="auto"`` for a set-up Graph on N ranks: this rank's largest micro-batch (up to the global
    batch), gathered from every rank by its runtime (which keeps them for El Che). Every rank must call it."""
    high = graph.world_size * batch_size
    own, error = 0, None
    try:
        with graph._runtime.paused_overlap():
            own = probe_micro_batch(graph.module, graph.device, dataset, collate, 1, high, graph.autocast,
                                    reserve_bytes=optimizer_reserve_bytes(graph.module))
        if own == 0:
            error = ValueError(f"rank {graph.rank} ({graph.device}) cannot train even one sample of the longest "
                               "kind in its memory (max_micro_batch='auto'): use a smaller max_length or model, "
                               "lower precision, or another device")
    except BaseException as exc:  # noqa: BLE001 - the others must hear of it (gather_caps re-raises)
        error = exc
    caps = graph._runtime.gather_caps(own, error)
    if graph.config.verbose and graph.is_main:
        print(f"flodl-hf: memory probe: largest micro-batch per rank {caps} (of {high} samples per step); "
              "El Che keeps every rank at or below its cap", flush=True)
    return caps
