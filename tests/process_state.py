"""What a test may not leave changed in the process it ran in: one snapshot, compared before and after.

Test helper only. Both places that run test code in a long-lived process use it: the rank pool (``rank_pool``,
a callable on a persistent rank) and ``cli_helpers.run_main`` (a command line in pytest's own process). Each adds
what is its own to the snapshot (the pool: flodl-hf's process context; ``run_main`` runs the command under an
environment of its own and compares that apart)."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

__all__ = ["snapshot", "differences", "restore", "changed_variables"]


def snapshot() -> dict[str, Any]:
    """The parts of a process a test can change and the next one would see."""
    import signal

    import torch
    import torch.nn.modules.module as module

    hooks = {name: len(getattr(module, name)) for name in dir(module)
             if name.startswith("_global_") and name.endswith("_hooks")}
    return {
        "environment": dict(os.environ),
        "working directory": os.getcwd(),
        "torch threads": torch.get_num_threads(),
        "default dtype": torch.get_default_dtype(),
        "grad mode": torch.is_grad_enabled(),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "anomaly detection": torch.is_anomaly_enabled(),
        "cpu autocast": torch.is_autocast_enabled("cpu"),
        "global module hooks": hooks,
        "signal handlers": {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)},
        "sys.excepthook": sys.excepthook,
        "threading.excepthook": threading.excepthook,
    }


def changed_variables(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The environment variables set, changed or removed between two copies of the environment."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What changed between two snapshots, one line each."""
    out = []
    for key, value in before.items():
        if key == "environment":
            changed = changed_variables(value, after[key])
            if changed:
                out.append(f"environment variables {changed}")
        elif after[key] != value:
            out.append(f"{key} ({value!r} -> {after[key]!r})")
    return out


def restore(state: dict[str, Any]) -> None:
    """Put back the torch switches, signal handlers and exception hooks of a snapshot (the environment and the
    working directory are the caller's to put back: it changed them itself)."""
    import signal

    import torch

    torch.set_num_threads(state["torch threads"])
    torch.set_default_dtype(state["default dtype"])
    torch.set_grad_enabled(state["grad mode"])
    torch.use_deterministic_algorithms(state["deterministic algorithms"])
    torch.set_anomaly_enabled(state["anomaly detection"])
    for number, handler in state["signal handlers"].items():
        signal.signal(number, handler)
    sys.excepthook = state["sys.excepthook"]
    threading.excepthook = state["threading.excepthook"]
