"""``record_scalar``: let a user's ``train_fn`` report extra numbers without knowing where it runs.

The builder calls ``train_fn`` in a worker process (or a thread, on one device); whatever it records with
``record_scalar(name, value)`` during that call is collected by the framework, sent with the batch's report
and averaged per epoch, over all ranks and per rank (``EpochMetrics.scalars`` / ``per_rank_scalars``). Outside
a builder run the call does nothing, so the same ``train_fn`` works in a plain loop.
"""

from __future__ import annotations

import math
import numbers
import threading
from typing import Any, Optional

__all__ = ["record_scalar", "ScalarSink"]

_LOCAL = threading.local()


class ScalarSink:
    """Collects ``record_scalar`` calls made on this thread while it is active (a context manager)."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}
        self._previous: Optional[ScalarSink] = None

    def __enter__(self) -> "ScalarSink":
        self._previous = getattr(_LOCAL, "sink", None)
        _LOCAL.sink = self
        return self

    def __exit__(self, *exc: Any) -> None:
        _LOCAL.sink = self._previous

    def take(self) -> dict[str, list[float]]:
        """The values recorded since the last ``take`` (and forget them)."""
        out, self.values = self.values, {}
        return out


def record_scalar(name: str, value: Any) -> None:
    """Record ``value`` under ``name`` for the current batch (inside ``train_fn``); a no-op elsewhere.

    ``value`` may be a Python number or a one-element tensor. Values arrive in ``EpochMetrics`` as per-epoch
    means.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"record_scalar name={name!r} is invalid: use a non-empty string, e.g. 'accuracy'")
    sink: Optional[ScalarSink] = getattr(_LOCAL, "sink", None)
    if sink is None:
        return
    if hasattr(value, "item"):
        value = value.detach().item() if hasattr(value, "detach") else value.item()
    if not isinstance(value, numbers.Real):
        raise ValueError(
            f"record_scalar({name!r}, {value!r}): the value must be a number or a one-element tensor"
        )
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"record_scalar({name!r}, {value!r}): the value must be finite")
    sink.values.setdefault(name, []).append(value)
