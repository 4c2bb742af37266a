"""The coordinator's inbox: one message queue per worker, read together.

Why it exists: a ``multiprocessing.Queue`` written by several processes serialises their writes with a lock
shared between them. A worker killed while its queue thread held that lock (SIGKILL, the OOM killer) leaves it
held for good, and every other worker's messages then stop reaching the coordinator: the survivors of a lost
worker went silent and the run hung (seen in the chaos harness, about once in 65 self-kill runs). With one queue
per worker a death can only silence the dead worker's own queue.

The caller never writes to these queues, so it closes its copy of their write ends once the workers have
started: when a worker dies, its queue's last write end closes with it, and a message it was killed in the
middle of writing reads as end-of-file (the queue is then dropped) instead of blocking the reader forever.
"""

from __future__ import annotations

import logging
from multiprocessing.connection import wait
from typing import Any, Optional, Sequence

__all__ = ["Inbox", "release_write_ends"]

log = logging.getLogger("flodl_hf.builder")


def release_write_ends(queues: Sequence[Any]) -> None:
    """Close this process's write ends of ``queues`` (call once every worker has started: they hold their own)."""
    for q in queues:
        writer = getattr(q, "_writer", None)
        if writer is not None and getattr(q, "_thread", None) is None:
            writer.close()


class Inbox:
    """Reads ``queues[r]`` (worker ``r``'s events) as one stream; ``get`` never blocks past its timeout."""

    def __init__(self, queues: Sequence[Any]) -> None:
        self.queues = list(queues)
        self._open = set(range(len(self.queues)))
        self._next = 0  # round robin: a chatty worker cannot starve the others

    def _readers(self) -> dict[Any, int]:
        return {q._reader: r for r, q in enumerate(self.queues) if r in self._open}

    def get(self, timeout: float) -> Optional[tuple]:
        """The next message from any worker, or None after ``timeout`` seconds without one."""
        readers = self._readers()
        if not readers:
            return None
        ready = {readers[c] for c in wait(list(readers), timeout)}
        n = len(self.queues)
        for i in range(n):
            r = (self._next + i) % n
            if r not in ready:
                continue
            self._next = (r + 1) % n
            msg = self._read(r)
            if msg is not None:
                return msg
        return None

    def _read(self, r: int) -> Optional[tuple]:
        try:
            return self.queues[r].get_nowait()
        except EOFError:  # the worker is gone and so is every write end: nothing more will come
            self._open.discard(r)
        except OSError:  # closed under us (the run is ending)
            self._open.discard(r)
        except Exception as exc:  # noqa: BLE001 - e.g. queue.Empty (another reader won), or an unreadable message
            if type(exc).__name__ != "Empty":
                log.warning("flodl-hf builder: dropped an unreadable message from worker %d (%s)", r, exc)
        return None
