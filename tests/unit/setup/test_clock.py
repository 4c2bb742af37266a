"""The El Che compute clock on the CPU: the host clock, started at the later of its marks (tests/distributed/setup/test_gpu.py
covers the CUDA-event path)."""

from __future__ import annotations

import time

import torch

from flodl_hf.distributed.clock import ComputeClock


def test_cpu_clock_measures_from_the_last_mark_and_has_nothing_pending():
    clock = ComputeClock(torch.device("cpu"))
    assert not clock.events
    time.sleep(0.6)  # waiting for input: not compute
    clock.mark()
    time.sleep(0.05)
    elapsed = clock.stop()
    assert elapsed is not None and 0.04 <= elapsed < 0.55  # the wait before the mark is not counted
    assert clock.pending_seconds() == 0.0


def test_events_are_only_for_cuda_devices():
    assert not ComputeClock(torch.device("cpu"), events=True).events
