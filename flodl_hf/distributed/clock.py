"""How long a rank computed in an El Che window, without waiting for the GPU after every micro-batch.

Why it exists: El Che needs each rank's compute time per window. On the CPU the host clock is the compute
clock. On a GPU the host runs ahead of the device, so host timing needs ``torch.cuda.synchronize()`` after
every micro-batch, which stalls the launch queue and cost measurable throughput. Here a CUDA event pair
brackets each micro-batch on the stream and the pairs are read once, at the window end, where the reduction
waits anyway.

A micro-batch's compute starts at the later of two marks: the end of the previous ``graph.step()`` and the
moment the loop received its batch (time spent waiting for input is not compute). Each :meth:`mark` replaces
the previous start, which gives exactly that "later of" rule.

A simulated slower device (``DdpConfig.simulate_speeds``) needs each micro-batch's time at once, to sleep in
proportion: that path keeps the host clock with a synchronise, as before.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch

__all__ = ["ComputeClock"]


class ComputeClock:
    """Per-window compute time of one rank: host clock on CPU, CUDA events on a GPU."""

    def __init__(self, device: torch.device, events: bool = True) -> None:
        self.device = device
        self.events = bool(events) and device.type == "cuda"
        self._start_host = time.perf_counter()
        self._start_event: Optional[Any] = None
        self._pairs: list[tuple[Any, Any]] = []
        if self.events:
            self.mark()

    def mark(self) -> None:
        """A micro-batch's compute may start from now."""
        self._start_host = time.perf_counter()
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            self._start_event = event

    def elapsed(self) -> float:
        """Host seconds since the start mark, without stopping (the simulated-speed path's mid-backward look)."""
        return time.perf_counter() - self._start_host

    def stop(self) -> Optional[float]:
        """The micro-batch ended (its work is queued). Seconds since the start mark now, with the host
        clock; None with events (their time is added by :meth:`pending_seconds` at the window end)."""
        if not self.events:
            if self.device.type == "cuda":  # this stream only: not the collectives' (overlap) waiting for peers
                torch.cuda.current_stream(self.device).synchronize()
            return time.perf_counter() - self._start_host
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream(self.device))
        if self._start_event is not None:
            self._pairs.append((self._start_event, end))
        return None

    def pending_seconds(self) -> float:
        """GPU time of the micro-batches stopped since the last call (waits for the last one to finish)."""
        if not self._pairs:
            return 0.0
        self._pairs[-1][1].synchronize()
        total_ms = sum(start.elapsed_time(end) for start, end in self._pairs)
        self._pairs.clear()
        return total_ms / 1000.0
