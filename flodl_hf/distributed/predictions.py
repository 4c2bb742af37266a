"""Predictions over a whole evaluation set on N ranks, gathered in dataset order.

It exists because an unchanged evaluation loop on N ranks evaluates the whole set on every rank: N times the
work, and nothing tells the user that. ``graph.gather_predictions`` gives each rank a contiguous slice of the rows
(sizes differing by at most one, no row twice, unlike a sampler that pads), runs the user's ``predict`` on it in
eval mode without gradients, and gathers the slices over the CPU side of the process group, so every rank gets
every row's prediction in dataset order, exactly what one process computes.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

__all__ = ["shard_bounds", "gather_predictions"]


def shard_bounds(rows: int, world: int, rank: int) -> tuple[int, int]:
    """``[start, end)`` of ``rank``'s contiguous slice of ``rows`` rows (the first ``rows % world`` get one more)."""
    base, extra = divmod(rows, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def _rows_of(output: Any, count: int, what: str) -> list:
    if isinstance(output, torch.Tensor):
        if output.dim() == 0 or output.shape[0] != count:
            raise ValueError(f"predict returned a tensor of shape {tuple(output.shape)} for a batch of {count} "
                             f"rows ({what}): return one entry per row along the first dimension")
        return list(output.detach().cpu().unbind(0))
    if isinstance(output, (list, tuple)):
        if len(output) != count:
            raise ValueError(f"predict returned {len(output)} entries for a batch of {count} rows ({what}): "
                             "return one entry per row")
        return [o.detach().cpu() if isinstance(o, torch.Tensor) else o for o in output]
    raise TypeError(f"predict returned {type(output).__name__}: return a tensor whose first dimension is the "
                    "batch's rows, or a list with one entry per row")


def _joined(rows: list) -> Any:
    """A tensor when every row is a tensor of one shape (``torch.stack``), else the list itself."""
    if rows and all(isinstance(r, torch.Tensor) for r in rows) and len({tuple(r.shape) for r in rows}) == 1:
        return torch.stack(rows)
    return rows


def gather_predictions(module: torch.nn.Module, dataset: Sequence[Any], predict: Callable[[Any], Any],
                       batch_size: int, collate_fn: Optional[Callable[[list], Any]], rank: int, world: int,
                       group: Any = None) -> Any:
    """Every row's ``predict`` output, in dataset order, on every rank (see ``Graph.gather_predictions``)."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is invalid: use an integer >= 1 (rows per prediction batch)")
    try:
        total = len(dataset)
    except TypeError as exc:
        raise TypeError(f"dataset of type {type(dataset).__name__} has no len(): pass a sized, indexable "
                        "evaluation set") from exc
    start, end = shard_bounds(total, world, rank)
    mine: list = []
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            for at in range(start, end, batch_size):
                items = [dataset[i] for i in range(at, min(at + batch_size, end))]
                batch = collate_fn(items) if collate_fn is not None else items
                mine += _rows_of(predict(batch), len(items), f"rows {at}-{at + len(items) - 1}")
    finally:
        module.train(was_training)
    if world == 1:
        return _joined(mine)
    import torch.distributed as dist

    parts: list[Optional[list]] = [None] * world
    dist.all_gather_object(parts, mine, group=group)
    rows = [row for part in parts for row in (part or [])]
    if len(rows) != total:
        raise RuntimeError(f"gathered {len(rows)} predictions for {total} rows: every rank must call "
                           "graph.gather_predictions with the same dataset")
    return _joined(rows)
