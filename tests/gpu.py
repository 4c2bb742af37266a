"""The suite's one GPU gate: ``@requires_gpus(n)`` marks a test ``gpu`` and skips it, saying why, where fewer
than ``n`` CUDA devices exist. CI has no GPU, so these run only on machines that have them
(``bash scripts/test.sh -m gpu``)."""

from __future__ import annotations

from typing import Callable

import pytest
import torch


def cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def requires_gpus(n: int = 1) -> Callable:
    reason = (f"needs {n} CUDA device(s) to exercise the CUDA/NCCL path; this machine has {cuda_count()} "
              "(CI has none: the same code paths run there with gloo on CPU ranks)")

    def decorate(fn: Callable) -> Callable:
        return pytest.mark.gpu(pytest.mark.skipif(cuda_count() < n, reason=reason)(fn))

    return decorate
