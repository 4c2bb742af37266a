"""The one check of El Che's settings that users give on several surfaces: a speed hint, a pinned split, the
window's anchor and bound, and the overhead target.

Why it exists: ``DdpConfig`` (setup mode), ``ElCheArguments`` (the Trainer path), the builder's settings and the
command line (through ``DdpConfig``) take the same El Che settings, and each checked them with rules and words of
its own, so one surface accepted what another refused (a boolean rank, a boolean batch size, a string anchor that
ended in a ``TypeError``). Each setting now has one function that decides and words the refusal; a surface passes
only the name the user gave it under (``DdpConfig.speed_hint``, ``ElCheArguments.speed_hint``, the builder's
``overhead_target``; the command line respells the field as its option). Pure Python.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["anchor_over_bound", "anchor_problem", "check_batch_sizes", "check_speed_hint", "max_anchor_problem",
           "overhead_problem"]


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_speed_hint(hint: Any, name: str) -> tuple[int, float]:
    """``hint`` as ``(slow_rank, ratio)``: an integer rank >= 0 and a finite ratio >= 1 (the other ranks are
    ``ratio`` times faster than ``slow_rank``); refused in one line naming ``name`` otherwise."""
    usage = "give (slow_rank, ratio), a rank index >= 0 and a finite ratio >= 1, e.g. speed_hint=(1, 2.5)"
    if not isinstance(hint, (tuple, list)) or len(hint) != 2:
        raise ValueError(f"{name}={hint!r} is invalid: {usage}")
    slow, ratio = hint
    if not _integer(slow) or slow < 0:
        raise ValueError(f"{name}={hint!r} is invalid: its slow rank {slow!r} is not a rank index: {usage}")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio):
        raise ValueError(f"{name}={hint!r} is invalid: its ratio {ratio!r} is not a finite number: {usage}")
    if ratio < 1:
        raise ValueError(f"{name}={hint!r} is invalid: its ratio {ratio!r} is below 1 (it says how many times faster "
                         "the other ranks are than the slow rank): to say a rank is faster, name the slower rank "
                         "instead")
    return int(slow), float(ratio)


def check_batch_sizes(sizes: Any, name: str) -> list[int]:
    """``sizes`` as a list of one integer >= 1 per rank; refused in one line naming ``name`` otherwise (the world
    size and the batch they must sum to are checked where those are known)."""
    if (not isinstance(sizes, (tuple, list)) or not sizes
            or any(not _integer(b) or b < 1 for b in sizes)):
        raise ValueError(f"{name}={sizes!r} is invalid: give one integer >= 1 per rank, e.g. batch_sizes=[12, 4]")
    return list(sizes)


def overhead_problem(value: Any) -> str | None:
    """What is wrong with an overhead target (the fraction of compute time El Che may spend synchronising), with
    the fix; None when it is a finite number in [0.01, 0.5]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.01 <= value <= 0.5:
        return "give a fraction of compute time in [0.01, 0.5], e.g. 0.10"
    return None


def anchor_problem(value: Any) -> str | None:
    """What is wrong with an anchor (micro-batches per synchronisation window), with the fix; None for an int >= 1."""
    if not _integer(value) or value < 1:
        return "give an integer >= 1 (micro-batches per synchronisation window)"
    return None


def max_anchor_problem(value: Any) -> str | None:
    """What is wrong with the window's bound, with the fix; None for an integer >= 0 (0: El Che off)."""
    if not _integer(value) or value < 0:
        return "give an integer >= 1 (the longest window, in micro-batches), or 0 to disable El Che"
    return None


def anchor_over_bound(anchor: Any, max_anchor: Any) -> str | None:
    """What is wrong with a valid anchor above a valid, non-zero bound, with the fix; None otherwise (either unset
    or invalid included: each has its own check)."""
    if anchor_problem(anchor) or max_anchor_problem(max_anchor) or max_anchor == 0 or anchor <= max_anchor:
        return None
    return f"it exceeds max_anchor={max_anchor}: lower the anchor or raise max_anchor"
