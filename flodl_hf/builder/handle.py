"""``DdpHandle``: what ``DdpBuilder.run()`` returns at once, to watch a run and collect its result.

It exists to keep the caller's side of a run small and uniform: the same handle drives a single-device run (a
thread) and a multi-device run (a coordinator thread and worker processes). Metrics stream through a queue as
each epoch completes; ``join()`` waits for the end and returns the averaged ``TrainedState`` or raises the
run's error (a worker's traceback, or ``DistributedError`` when a worker was lost with the collective
backend).
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Optional

from .types import EpochMetrics, TrainedState

__all__ = ["DdpHandle"]


class DdpHandle:
    """A running (or finished) builder job."""

    def __init__(self, runner: Any, thread: threading.Thread, devices: list[str]) -> None:
        self._runner = runner
        self._thread = thread
        self._devices = list(devices)
        self._stream_done = False

    @property
    def world_size(self) -> int:
        """Number of devices (one worker each; 1 means the in-process single-device run)."""
        return len(self._devices)

    @property
    def devices(self) -> list[str]:
        return list(self._devices)

    @property
    def lost_ranks(self) -> list[int]:
        """Workers dropped so far (CPU backend: dead workers)."""
        return list(self._runner.lost)

    @property
    def metrics(self) -> list[EpochMetrics]:
        """Every ``EpochMetrics`` emitted so far, whether or not it was read with ``next_metrics``."""
        return list(self._runner.history)

    def timeline(self) -> list[dict]:
        """Per-rank events (``.timeline(True)``): ``{"kind", "rank", "start", "end", ...}`` in seconds since
        training started; kinds ``batch`` (with epoch, batch, lr, step), ``sync``, ``apply``, ``wait`` (a
        throttle), and the coordinator's ``close`` / ``average`` (rank None). Plot with
        ``flodl_hf.builder.timeline.plot_timeline``."""
        return list(getattr(self._runner, "timeline", []))

    @property
    def worker_pids(self) -> list[Optional[int]]:
        """Process ids of the workers (empty for a single-device run)."""
        workers = getattr(self._runner, "workers", None)
        if workers is not None and workers.pids is not None:
            return list(workers.pids)
        return [p.pid for p in self._runner.procs]

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def next_metrics(self, timeout: Optional[float] = None) -> Optional[EpochMetrics]:
        """The next epoch's metrics, blocking until they exist; None once the run is over (then call
        ``join``).

        With ``timeout`` (seconds), raises ``TimeoutError`` if nothing arrives in time.
        """
        if self._stream_done:
            return None
        try:
            item = self._runner.metrics.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no epoch finished within {timeout} s") from None
        if item is None:
            self._stream_done = True
        return item

    def poll_metrics(self) -> list[EpochMetrics]:
        """Every epoch's metrics available now, without blocking (possibly an empty list)."""
        out: list[EpochMetrics] = []
        while not self._stream_done:
            try:
                item = self._runner.metrics.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._stream_done = True
            else:
                out.append(item)
        return out

    def join(self, timeout: Optional[float] = None) -> TrainedState:
        """Wait for the run to end; return the averaged trained state, or raise the run's error."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the builder run did not finish within {timeout} s (it is still running)")
        if self._runner.error is not None:
            raise self._runner.error
        if self._runner.result is None:  # pragma: no cover - defensive
            raise RuntimeError("the builder run ended without a result")
        return self._runner.result

    def cancel(self) -> None:
        """Ask the run to stop; ``join()`` then raises. Workers are stopped and reaped."""
        self._runner.cancelled = True

    def __repr__(self) -> str:
        state = "done" if self.done else "running"
        return f"DdpHandle({self.world_size} device(s) {self._devices}, {state})"
