"""The fixed metadata region every window exchange ends with, and what ranks must agree on in it.

Why it exists: each rank writes its own entry of every slot (the others' stay 0 until the SUM all-reduce), so
after the exchange every rank holds every rank's figures, identical everywhere. That one region carries El Che's
inputs and the stop flags, and lets each rank check, before any update, that all ranks are in the same window
of the same plan; a disagreement is a ``DistributedError`` naming the values and the fix, never a drift.
"""

from __future__ import annotations

import torch

from .errors import DistributedError

__all__ = ["agree"]

_STEP, _FINISHED, _FAILED = 0.0, 1.0, 2.0
# Fixed metadata slots, one per rank each. _REDSQ: the previous window's |reduced gradient|^2 (El Che reads rank 0's,
# so a figure each rank computes with its own kernels reaches every El Che identical); _MICRO: this window's
# micro-batches (checked equal: ranks whose El Che decided differently must stop, not drift apart); _BATCH: the
# batch_size, dataset length and plan seed given to set_data_loader (checked equal: each rank's plan would otherwise
# cut the data differently, and ranks would train on overlapping samples); _AHEAD: batches graph.epoch() handed to
# the loop that graph.step() has not finished (checked equal: a rank that skipped graph.step() for a batch with
# `continue` would from then on weight each micro-batch by another batch's plan entry).
(_COMPUTE, _SAMPLES, _SYNC, _INDEX, _FLAG, _DENOM, _REDUCTION, _FRONTIER, _USER, _GRADSQ, _REDSQ, _MICRO,
 _BATCH, _ROWS, _SEED, _AHEAD) = range(16)
_SLOTS = 16


def _slot(m: torch.Tensor, world: int, slot: int) -> list[float]:
    return m[slot * world:(slot + 1) * world].tolist()


def agree(m: torch.Tensor, world: int, rank: int, window_index: int, own_flag: float) -> bool:
    """Raise if ranks disagree; True when every rank is finishing."""
    flags = [int(x) for x in _slot(m, world, _FLAG)]
    failed = [q for q, f in enumerate(flags) if f == _FAILED]
    if failed:
        raise DistributedError(f"rank {failed[0]} failed (see its error above); rank {rank} stops too")
    if all(f == _FINISHED for f in flags) and own_flag == _FINISHED:
        return True
    finished = [q for q, f in enumerate(flags) if f == _FINISHED]
    if finished:
        running = [q for q, f in enumerate(flags) if f == _STEP]
        raise DistributedError(
            f"ranks ran different numbers of steps: rank(s) {finished} finished their loop while rank(s) "
            f"{running} still called graph.step() (window {window_index}); give every rank the same number "
            "of graph.step() calls (graph.epoch(n) does this for you)")
    indices = [int(x) for x in _slot(m, world, _INDEX)]
    if len(set(indices)) != 1:
        raise DistributedError(f"ranks are out of step: window indices {indices}; every rank must call "
                               "graph.step() the same number of times")
    batch = [int(x) for x in _slot(m, world, _BATCH)]
    if len(set(batch)) != 1:
        raise DistributedError(f"ranks gave graph.set_data_loader different batch sizes {batch}: give every rank "
                               "the same batch_size (El Che splits the global batch of world x batch_size by "
                               "speed itself; DdpConfig(batch_sizes=[...]) fixes a split by hand)")
    rows, seeds = [int(x) for x in _slot(m, world, _ROWS)], [int(x) for x in _slot(m, world, _SEED)]
    if len(set(rows)) != 1 or len(set(seeds)) != 1:
        what = (f"datasets of {rows} rows" if len(set(rows)) != 1
                else f"plan seeds or sampler orders {seeds} (mod 2**24)")
        raise DistributedError(f"ranks gave graph.set_data_loader {what}: every rank must pass the same dataset "
                               "(same rows, same order) and the same seed or a sampler seeded alike, and "
                               "graph.epoch() gives each rank its own disjoint share; do not shard or shuffle the "
                               "data per rank yourself")
    ahead = [int(x) for x in _slot(m, world, _AHEAD)]
    if len(set(ahead)) != 1:
        extra = max(range(world), key=lambda q: ahead[q])
        raise DistributedError(
            f"rank {extra} has {ahead[extra] - min(ahead)} more batch(es) of graph.epoch() handed to its loop "
            f"without a graph.step() than rank {ahead.index(min(ahead))} (window {window_index}; batches ahead per "
            f"rank: {ahead}): a loop that skips a batch with `continue` trains the next batch under the skipped one's "
            "weight and plan. Call graph.step() for every batch; to skip one, leave out its backward() (a head's "
            "compute_loss then counts nothing for it) or call graph.loss_items(0) before graph.step()")
    micro = [int(x) for x in _slot(m, world, _MICRO)]
    if len(set(micro)) != 1:
        raise DistributedError(f"ranks closed window {window_index} after different numbers of "
                               f"micro-batches {micro}: their El Che schedulers disagree, so their updates would "
                               "drift apart; this is a flodl-hf bug (please report it), or set "
                               "DdpConfig(fixed_anchor=...)")
    reductions = {int(x) for x in _slot(m, world, _REDUCTION)}
    if len(reductions) != 1:
        raise DistributedError("ranks declared different loss reductions in one window (graph.loss_items with "
                               "reduction='sum' on some ranks, 'mean' on others): use the same loss everywhere")
    return False
