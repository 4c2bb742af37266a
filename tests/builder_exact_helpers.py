"""Picklable pieces of the builder's differential tests (no tests here): spawned workers import this module.

A model with an unused layer (its gradient is None on every rank, so the optimizer must skip it as one process
would), a dataset whose items carry their index, AdamW and a transformers warmup-and-decay schedule built by
module-level functions, and a task head factory.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


class Indexed(torch.utils.data.Dataset):
    """``n`` points in 4-D with a label; items are ``(x[4], label)``."""

    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=g)
        self.y = (self.x[:, 0] - self.x[:, 2] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class WithUnused(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
        self.unused = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def make_model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return WithUnused().to(device)


def loss_fn(model: torch.nn.Module, batch: tuple) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


adamw = functools.partial(torch.optim.AdamW, lr=0.05, weight_decay=0.1)


def linear_schedule(optimizer: torch.optim.Optimizer, warmup: int, total: int):
    from transformers import get_linear_schedule_with_warmup

    return get_linear_schedule_with_warmup(optimizer, warmup, total)


def head_factory(device: torch.device):
    import tiny_models
    from heads import BertForSequenceClassification

    config = tiny_models.tiny_config("bert", num_labels=2)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    return BertForSequenceClassification.on_device(config, 2, device)


def head_loss(head, batch: dict) -> torch.Tensor:
    enc = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    return head.compute_loss(enc, batch["labels"])


def reference_sync(n: int, batch: int, epochs: int, world: int, clip: float | None) -> dict:
    """The reference of SYNC: one process where round j trains on the concatenation of every rank's j-th batch
    (each epoch is dealt round robin, epochs back to back, as the builder's SYNC split does)."""
    from flodl_hf.elche.noise_scale import NoiseScale
    from flodl_hf.elche.partition import epoch_permutation

    data = Indexed(n)
    per_epoch = n // batch
    own: list[list[list[int]]] = [[] for _ in range(world)]
    for e in range(epochs):
        perm = epoch_permutation(n, e).tolist()
        for i in range(per_epoch):
            own[i % world].append(perm[i * batch:(i + 1) * batch])
    model = make_model(torch.device("cpu"))
    opt = adamw(model.parameters())
    noise, noise_after = NoiseScale(), []
    for j in range(max(len(o) for o in own)):
        small, items = [], []
        for r in range(world):  # each rank's own gradient at this round's parameters, for the noise estimate
            if j < len(own[r]):
                loss_fn(model, (data.x[own[r][j]], data.y[own[r][j]])).backward()
                small.append(sum(float(p.grad.double().square().sum()) for p in model.parameters()
                                 if p.grad is not None))
                items.append(float(len(own[r][j])))
                opt.zero_grad(set_to_none=True)
        idx = [i for r in range(world) if j < len(own[r]) for i in own[r][j]]
        loss = loss_fn(model, (data.x[idx], data.y[idx]))
        loss.backward()
        big = sum(float(p.grad.double().square().sum()) for p in model.parameters() if p.grad is not None)
        if noise.update(small, items, big):
            noise_after.append(noise.noise_scale)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"state": model.state_dict(), "noise_after": noise_after}
