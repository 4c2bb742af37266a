"""flodl-hf: fine-tune Hugging Face text classifiers on one device or many, including devices of different speeds.

The public API is small and explicit (``__all__``); importing the package does nothing observable. Names are
resolved lazily so that ``import flodl_hf`` stays cheap and the pure-Python scheduler imports without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Graph": "flodl_hf.graph",
    "HasGraph": "flodl_hf.graph",
    "DdpConfig": "flodl_hf.config",
    "Trainer": "flodl_hf.trainer",
    "ElChe": "flodl_hf.elche.scheduler",
    "Ddp": "flodl_hf.distributed.ddp",
    "DistributedError": "flodl_hf.distributed.context",
    "DdpBuilder": "flodl_hf.builder",
    "DdpHandle": "flodl_hf.builder",
    "TrainedState": "flodl_hf.builder",
    "EpochMetrics": "flodl_hf.builder",
    "ApplyPolicy": "flodl_hf.builder",
    "AverageBackend": "flodl_hf.builder",
    "record_scalar": "flodl_hf.builder",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flodl_hf' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
