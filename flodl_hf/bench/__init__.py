"""``flodl-hf bench``: measure El Che against DDP, Accelerate and builder mode on (modelled) heterogeneous devices.

Why it exists: El Che's claim (fast devices work instead of waiting, with the exact mean gradient) is only
worth what it measures, side by side with what people use today, on one harness. Layout:

- ``settings.py``: BenchSettings (validated) and the list of modes
- ``device_model.py``: the modelled device time every mode pays (``device_ms * b/16 / speed`` per micro-batch)
- ``workloads.py`` / ``text_task.py``: models, data, loss, accuracy (mlp, tiny-bert, minilm, bert-4l)
- ``meter.py``: one rank's clock, timed region, evaluations
- ``ranks.py``: the pool of W rank processes every mode runs on (optionally pinned to cores), a busy-core process
- ``timeline.py``: the setup modes' per-window timeline and where their time goes against the ideal
- ``modes.py`` / ``modes_accelerate.py`` / ``modes_builder.py``: the per-mode training loops
- ``harness.py``: alternating rounds and per-mode figures; ``report.py``: table.md, results.json, plot.png
- ``cli.py``: the command line; ``main(argv)`` is what ``flodl-hf bench`` calls
- ``simulate.py`` / ``simulate_cli.py``: ``flodl-hf bench --simulate``, the scale simulator (the real El Che
  against a device-time and ring all-reduce model, 2-256 ranks, no processes, no torch)

Importing this package does nothing observable (no torch import).
"""

from __future__ import annotations

from typing import Optional, Sequence

__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``flodl-hf bench`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    ``--simulate`` goes to the scale simulator before anything imports torch.
    """
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if "--simulate" in args:
        from .simulate_cli import main as _simulate

        return _simulate(args)
    from .cli import main as _main

    return _main(args)
