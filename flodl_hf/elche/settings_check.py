"""The one check of El Che's settings that users give on every surface: a speed hint and a pinned split.

Why it exists: ``DdpConfig`` (setup mode), ``ElCheArguments`` (the Trainer path) and the command line (through
``DdpConfig``) take the same two El Che settings, and each checked them with rules and words of its own, so one
surface accepted what another refused (a boolean rank, a boolean batch size). Each setting now has one function that
decides and words the refusal; a surface passes only the name the user gave it under (``DdpConfig.speed_hint``,
``ElCheArguments.speed_hint``; the command line respells the field as its option). Pure Python.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_batch_sizes", "check_speed_hint"]


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
