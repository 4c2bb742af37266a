"""Toy task and picklable training functions shared by the builder tests (no tests in this module).

Spawned builder workers import this module to unpickle the factories, so it imports only torch and the
builder's ``record_scalar``: a learnable 2-D task (points on either side of a line), a tiny MLP, and a
``train_fn`` that can add modeled device time (a fixed sleep per batch) so that simulated speeds dominate the
2-core CPU's noise.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F

from flodl_hf.builder import record_scalar


class ToyPoints(torch.utils.data.Dataset):
    """``n`` points of N(0, I) in 2-D; label 1 when ``x0 + 0.5 * x1 > 0``. Items: ``(x[2], label)``."""

    def __init__(self, n: int = 512, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 2, generator=g)
        self.y = (self.x[:, 0] + 0.5 * self.x[:, 1] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def tiny_mlp(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to(device)


def bn_mlp(device: torch.device) -> torch.nn.Module:
    """With a BatchNorm: floating buffers (averaged plainly) and an integer one (num_batches_tracked)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(2, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(), torch.nn.Linear(16, 2)
    ).to(device)


sgd = functools.partial(torch.optim.SGD, lr=0.2, momentum=0.9)


def train_fn(model: torch.nn.Module, batch: tuple, sleep_ms: float = 0.0) -> torch.Tensor:
    """Cross-entropy; records the batch accuracy; optionally sleeps ``sleep_ms`` (modeled device time)."""
    if sleep_ms:
        time.sleep(sleep_ms / 1000.0)
    x, y = batch
    logits = model(x)
    record_scalar("acc", (logits.argmax(dim=1) == y).float().mean())
    return F.cross_entropy(logits, y)


def modeled(ms: float) -> functools.partial:
    return functools.partial(train_fn, sleep_ms=ms)


def failing_train_fn(model: torch.nn.Module, batch: tuple) -> torch.Tensor:
    raise RuntimeError("boom in train_fn")


def accuracy(model: torch.nn.Module, n: int = 1000, seed: int = 99) -> float:
    data = ToyPoints(n, seed)
    model.eval()
    with torch.no_grad():
        return float((model(data.x).argmax(dim=1) == data.y).float().mean())
