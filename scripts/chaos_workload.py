"""The worker-side half of the builder chaos harness: a bag-of-tokens classifier, three dataset shapes whose
items carry their own index, and a ``train_fn`` that logs every batch it trains on (and can kill its process).

Why it exists apart from ``builder_chaos.py``: builder workers unpickle ``model_factory``, ``optim_factory``
and ``train_fn`` by module name, so they must live in a small module that imports only torch (and
transformers for the scheduler), never the harness. Coverage is judged against these logs, not against the
engine's own metrics: every ``train_fn`` call appends the batch's dataset indices to ``<log_dir>/w<pid>.log``
(open, append, flush, close per batch), so a batch is on disk before its loss is even computed.

The model is an ``EmbeddingBag(vocab, dim)`` (mean of a row's token embeddings) and a ``Linear(dim,
classes)``: 250k x 128 gives 32M parameters while a batch costs one gather, so a 30M-parameter run stays cheap
on a 2-core CPU except for the dense gradient and optimizer step, which is what a big model costs the builder
(averaging, snapshots, memory) anyway.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from typing import Any, Optional

import torch
import torch.nn.functional as F

__all__ = [
    "BagClassifier",
    "TensorRows",
    "DATASET_SHAPES",
    "build_dataset",
    "make_model",
    "make_optimizer",
    "linear_warmup",
    "unpack",
    "train_step",
    "param_count",
]

DATASET_SHAPES = ("tensor", "items", "dicts")
"""``tensor``: one object holding three big tensors; ``items``: a list of ``(ids tensor, label, index)`` (one
tensor per item: the caller must not hold one file descriptor per item); ``dicts``: a list of plain dicts of
Python ints (no tensors at all)."""

_BATCHES_SEEN = 0  # per worker process: how many train_fn calls this process made
_LAST_START: Optional[float] = None  # perf_counter at the start of the current train_fn call


class BagClassifier(torch.nn.Module):
    """Mean of the tokens' embeddings, then a linear layer (``vocab * dim + dim * classes + classes``)."""

    def __init__(self, vocab: int, dim: int, classes: int) -> None:
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(vocab, dim, mode="mean")
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(ids))


def param_count(vocab: int, dim: int, classes: int) -> int:
    return vocab * dim + dim * classes + classes


def make_model(device: torch.device, vocab: int, dim: int, classes: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return BagClassifier(vocab, dim, classes).to(device)


class TensorRows(torch.utils.data.Dataset):
    """One big tensor per field (the cheap-to-pickle shape): items are ``(ids[L], label, index)`` tensors."""

    def __init__(self, ids: torch.Tensor, labels: torch.Tensor) -> None:
        self.ids = ids
        self.labels = labels
        self.index = torch.arange(len(ids))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.ids[i], self.labels[i], self.index[i]


def build_dataset(shape: str, rows: int, vocab: int, seq_len: int, classes: int, seed: int = 0) -> Any:
    """``rows`` samples of ``seq_len`` random token ids; the label is a function of the tokens (learnable)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, seq_len), generator=g)
    labels = (ids[:, 0] % classes).long()
    if shape == "tensor":
        return TensorRows(ids, labels)
    if shape == "items":
        return [(ids[i].clone(), int(labels[i]), i) for i in range(rows)]
    if shape == "dicts":
        rows_l = ids.tolist()
        return [{"input_ids": rows_l[i], "label": int(labels[i]), "idx": i} for i in range(rows)]
    raise ValueError(f"dataset shape {shape!r} is unknown: use one of {DATASET_SHAPES}")


def unpack(batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids[B, L], labels[B], indices[B])`` from a collated batch of any of the three shapes."""
    if isinstance(batch, dict):
        cols = batch["input_ids"]  # default_collate turns a list of L ints per item into L tensors of [B]
        ids = torch.stack(list(cols), dim=1) if isinstance(cols, (list, tuple)) else cols
        return ids, torch.as_tensor(batch["label"]), torch.as_tensor(batch["idx"])
    ids, labels, index = batch
    return ids, torch.as_tensor(labels), torch.as_tensor(index)


def _claim(token: str) -> bool:
    """True for exactly one process: the first to create ``token``."""
    try:
        fd = os.open(token, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.write(fd, f"{os.getpid()} {time.time():.6f}\n".encode())
    os.close(fd)
    return True


def train_step(
    model: torch.nn.Module,
    batch: Any,
    log_dir: Optional[str] = None,
    kill_at: Optional[int] = None,
    kill_token: Optional[str] = None,
    sleep_ms: float = 0.0,
) -> torch.Tensor:
    """Cross-entropy of the bag classifier. Logs the batch's indices first; at this process's ``kill_at``-th
    batch, the first worker to claim ``kill_token`` SIGKILLs itself (after logging: an unfinished batch)."""
    global _BATCHES_SEEN, _LAST_START
    _LAST_START = time.perf_counter()
    _BATCHES_SEEN += 1
    ids, labels, index = unpack(batch)
    if log_dir is not None:
        with open(os.path.join(log_dir, f"w{os.getpid()}.log"), "a") as fh:
            fh.write(" ".join(map(str, index.tolist())) + "\n")
            fh.flush()
    if kill_at is not None and kill_token is not None and _BATCHES_SEEN == kill_at and _claim(kill_token):
        os.kill(os.getpid(), signal.SIGKILL)
    if sleep_ms:
        time.sleep(sleep_ms / 1000.0)  # modeled device time
    return F.cross_entropy(model(ids), labels)


def _log_step_end(timing_dir: str, optimizer: Any, args: Any, kwargs: Any) -> None:
    """Optimizer step post-hook: a ``start end`` line (perf_counter s) per batch: train_fn start, step end."""
    if _LAST_START is None:
        return
    with open(os.path.join(timing_dir, f"t{os.getpid()}.log"), "a") as fh:
        fh.write(f"{_LAST_START:.6f} {time.perf_counter():.6f}\n")


def make_optimizer(
    params: Any, kind: str = "sgd", lr: float = 0.05, timing_dir: Optional[str] = None
) -> torch.optim.Optimizer:
    """SGD (momentum 0.9) or AdamW; with ``timing_dir``, each step's end is logged for idle-time figures."""
    if kind == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9)
    elif kind == "adamw":
        opt = torch.optim.AdamW(params, lr=lr)
    else:
        raise ValueError(f"optimizer {kind!r} is unknown: use 'sgd' or 'adamw'")
    if timing_dir is not None:
        opt.register_step_post_hook(functools.partial(_log_step_end, timing_dir))
    return opt


def linear_warmup(optimizer: torch.optim.Optimizer, warmup: int, total: int) -> Any:
    """``transformers.get_linear_schedule_with_warmup`` (picklable as a factory via functools.partial)."""
    from transformers import get_linear_schedule_with_warmup

    return get_linear_schedule_with_warmup(optimizer, num_warmup_steps=warmup, num_training_steps=total)
