"""The one-line hardware diagnostic printed at setup, so a user sees at once what the run is using.

Examples: ``flodl-hf: cpu | 2 threads | single-device mode`` and
``flodl-hf: 2 GPUs (heterogeneous) | NVIDIA A10 (24.0 GB) | NVIDIA T4 (15.0 GB) | El Che setup mode``.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

import torch

__all__ = ["describe_device", "diagnostic_line", "print_diagnostic"]


def describe_device(device: torch.device) -> str:
    """One device as text: the GPU name and memory, or ``cpu``."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"{props.name} ({props.total_memory / 1e9:.1f} GB)"
    return device.type


def diagnostic_line(devices: Sequence[torch.device], descriptions: Sequence[str], *, threads: int,
                    simulate_speeds: Optional[Sequence[float]] = None, el_che: bool = True) -> str:
    world = len(devices)
    if world == 1:
        if devices[0].type == "cuda":
            return f"flodl-hf: 1 GPU | {descriptions[0]} | single-device mode"
        return f"flodl-hf: {descriptions[0]} | {threads} threads | single-device mode"
    heterogeneous = len(set(descriptions)) > 1 or (simulate_speeds is not None and len(set(simulate_speeds)) > 1)
    kind = "heterogeneous" if heterogeneous else "homogeneous"
    if all(d.type == "cuda" for d in devices):
        head = f"flodl-hf: {world} GPUs ({kind})"
        body = " | ".join(descriptions)
    else:
        head = f"flodl-hf: {world} ranks ({kind}, gloo)" if all(d.type == "cpu" for d in devices) \
            else f"flodl-hf: {world} ranks ({kind})"
        body = " | ".join(descriptions) + f" | {threads} threads each"
    parts = [head, body, "El Che setup mode" if el_che else "synchronous (El Che off)"]
    if simulate_speeds is not None:
        parts.append(f"SIMULATED speeds {list(simulate_speeds)}")
    return " | ".join(parts)


def print_diagnostic(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
