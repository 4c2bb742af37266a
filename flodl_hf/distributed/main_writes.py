"""One rank writes, the others wait: a directory that every rank's loop asks for is written once, by rank 0.

Why it exists: the user's loop runs unchanged on every rank, so a ``head.save_pretrained(path)`` at its end runs on
every rank too, and N ranks writing one directory race each other. Here rank 0 writes; every other rank waits
(bounded by the run's timeout) until rank 0 has finished, then returns the same path, or raises rank 0's failure
as one line. It goes through the rendezvous store, not a collective, so a loop that already writes on rank 0 only
(``if graph.is_main:``) works as before: rank 0 records the outcome and returns without waiting for anyone.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import timedelta
from pathlib import Path
from typing import Callable, Optional

import torch.distributed as dist

from .errors import DistributedError

__all__ = ["written_by_main"]

_PREFIX = "flodl_hf/written/"
_COUNTS: dict[str, int] = {}
_LOCK = threading.Lock()


def _key(target: Path) -> str:
    """The store key of this process's n-th write of ``target`` (the same n on every rank that writes it)."""
    with _LOCK:
        n = _COUNTS.get(str(target), 0)
        _COUNTS[str(target)] = n + 1
    return f"{_PREFIX}{target}#{n}"


def written_by_main(target: str | os.PathLike, write: Callable[[], Path], timeout_s: Optional[float] = None) -> Path:
    """Run ``write()`` (which writes ``target`` and returns the path it wrote) on rank 0 only; on the other ranks
    wait until rank 0 has finished (up to ``timeout_s``; None: the run's ``DdpConfig.timeout_s``) and return that
    path. Outside a process group ``write()`` simply runs."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return write()
    if timeout_s is None:
        from .context import current_context

        context = current_context()
        timeout_s = context.timeout_s if context is not None else 300.0
    absolute = Path(os.path.expanduser(str(target))).absolute()
    key = _key(absolute)
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 0:
        try:
            written = write()
        except BaseException as exc:
            store.set(key, json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
            raise
        store.set(key, json.dumps({"path": str(written)}))
        return written
    try:
        store.wait([key], timedelta(seconds=timeout_s))
        outcome = json.loads(store.get(key))
    except Exception as exc:  # noqa: BLE001 - a timeout, or the store (on rank 0) gone
        raise DistributedError(
            f"rank {dist.get_rank()}: rank 0 did not report writing {str(absolute)!r} within {timeout_s:.0f} s "
            f"({type(exc).__name__}); see rank 0's error, or raise DdpConfig(timeout_s=...) for a slow disk") from None
    if "error" in outcome:
        raise DistributedError(f"rank {dist.get_rank()}: rank 0 could not write {str(absolute)!r}: "
                               f"{outcome['error']}")
    return Path(outcome["path"])
