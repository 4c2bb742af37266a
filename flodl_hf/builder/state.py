"""A model's state as flat float32 vectors: what an average moves, and how it goes back into the model.

Why it exists: an average should cost one all-reduce (collective backend) or one message (CPU backend), not
one per tensor, and the coordinator must rebuild a ``state_dict`` it can hand to the user without ever
building the model. :class:`ModelState` binds to a live model (worker side) and reads and writes its floating
parameters, then its floating buffers, as one vector ``[params | buffers]`` in place (parameters are averaged
weighted by batches, buffers plainly);
:class:`Layout` is the picklable description of ``model.state_dict()`` that the coordinator uses to unflatten.
Tied weights appear once. Non-floating buffers (counters, position ids) are not averaged: they travel as-is.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

__all__ = ["Layout", "Entry", "ModelState", "cpu_clone", "pack_tree", "unpack_tree", "state_from_flat"]


@dataclass(frozen=True)
class Entry:
    key: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "param", "buffer" (floating) or "other"
    alias_of: Optional[str] = None


@dataclass(frozen=True)
class Layout:
    """Picklable description of a model's ``state_dict`` (no tensors)."""

    entries: tuple[Entry, ...]

    @property
    def param_numel(self) -> int:
        return sum(_numel(e.shape) for e in self.entries if e.kind == "param" and e.alias_of is None)

    @property
    def buffer_numel(self) -> int:
        return sum(_numel(e.shape) for e in self.entries if e.kind == "buffer" and e.alias_of is None)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


class ModelState:
    """Flat views of one live model (worker side)."""

    def __init__(self, model: torch.nn.Module) -> None:
        state = model.state_dict(keep_vars=True)
        param_ids = {id(p) for p in model.parameters()}
        first_key: dict[int, str] = {}
        entries: list[Entry] = []
        self.params: list[torch.Tensor] = []
        self.buffers: list[torch.Tensor] = []
        self.others: dict[str, torch.Tensor] = {}
        for key, t in state.items():
            shape, dtype = tuple(t.shape), str(t.dtype).replace("torch.", "")
            if id(t) in first_key:
                kind = next(e.kind for e in entries if e.key == first_key[id(t)])
                entries.append(Entry(key, shape, dtype, kind, alias_of=first_key[id(t)]))
                continue
            first_key[id(t)] = key
            if id(t) in param_ids and t.is_floating_point():
                kind = "param"
                self.params.append(t)
            elif t.is_floating_point():
                kind = "buffer"
                self.buffers.append(t)
            else:
                kind = "other"
                self.others[key] = t
            entries.append(Entry(key, shape, dtype, kind))
        self.layout = Layout(tuple(entries))

    # -- in place, against flat float32 vectors laid out [params | buffers] (no full-model temporaries) --------
    @property
    def numel(self) -> int:
        return self.layout.param_numel + self.layout.buffer_numel

    @torch.no_grad()
    def write_flat(self, dst: torch.Tensor) -> None:
        """Copy every parameter, then every floating buffer, into ``dst`` (in place)."""
        offset = 0
        for t in [*self.params, *self.buffers]:
            n = t.numel()
            dst[offset : offset + n].copy_(t.detach().reshape(-1))
            offset += n

    @torch.no_grad()
    def load_flat(self, src: torch.Tensor) -> None:
        """Parameters and buffers from ``src`` ([params | buffers])."""
        offset = 0
        for t in [*self.params, *self.buffers]:
            n = t.numel()
            t.copy_(src[offset : offset + n].view(t.shape))
            offset += n

    @torch.no_grad()
    def apply_delta(self, avg: torch.Tensor, snap: torch.Tensor) -> None:
        """``p += avg - snap`` for every parameter (keeps the local progress made since the snapshot); buffers
        take the average as is. Two in-place passes per tensor: no temporary the size of the model."""
        offset = 0
        for t in self.params:
            n = t.numel()
            t.add_(avg[offset : offset + n].view(t.shape).to(t.device))
            t.sub_(snap[offset : offset + n].view(t.shape).to(t.device))
            offset += n
        for t in self.buffers:
            n = t.numel()
            t.copy_(avg[offset : offset + n].view(t.shape))
            offset += n

    @torch.no_grad()
    def write_grads(self, dst: torch.Tensor) -> list[bool]:
        """The gradient of every parameter (zeros where it has none), then the buffers, into ``dst``; returns
        which parameters had a gradient."""
        offset, present = 0, []
        for t in self.params:
            n = t.numel()
            view = dst[offset : offset + n]
            if t.grad is None:
                view.zero_()
                present.append(False)
            else:
                view.copy_(t.grad.detach().reshape(-1))
                present.append(True)
            offset += n
        for t in self.buffers:
            n = t.numel()
            dst[offset : offset + n].copy_(t.detach().reshape(-1))
            offset += n
        return present

    @torch.no_grad()
    def load_grads(self, src: torch.Tensor, present: Sequence[bool]) -> None:
        """Gradients from ``src`` (None where no rank had one, as on one device), buffers as is."""
        offset = 0
        for t, has in zip(self.params, present, strict=True):
            n = t.numel()
            if has:
                value = src[offset : offset + n].view(t.shape)
                if t.grad is None:
                    t.grad = value.to(device=t.device, dtype=t.dtype).clone()
                else:
                    t.grad.copy_(value)
            else:
                t.grad = None
            offset += n
        for t in self.buffers:
            n = t.numel()
            t.copy_(src[offset : offset + n].view(t.shape))
            offset += n

    def other_values(self) -> dict[str, torch.Tensor]:
        """Non-floating buffers, as CPU copies."""
        return {k: v.detach().to("cpu").clone() for k, v in self.others.items()}

    def flat_state(self) -> torch.Tensor:
        """A new CPU float32 vector [params | buffers]: one tensor to send, whatever the number of tensors."""
        out = torch.empty(self.numel, dtype=torch.float32)
        self.write_flat(out)
        return out


def cpu_clone(obj: Any) -> Any:
    """``obj`` with every tensor replaced by a CPU clone (dicts, lists and tuples walked): an optimizer state that
    shares no storage with the one it came from (a queue or a spawn pickle moves a tensor into shared memory in
    place, and ``Optimizer.load_state_dict`` keeps a tensor that already fits)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu").clone()
    if isinstance(obj, dict):
        return {k: cpu_clone(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_clone(v) for v in obj)
    return obj


def pack_tree(obj: Any) -> tuple[Any, bytes]:
    """``obj`` (e.g. an optimizer ``state_dict``) as plain values: its JSON-able tree and its tensors as safetensors
    bytes (the checkpoint format's encoding; :func:`unpack_tree` reverses it). What a worker sends through a queue
    without tensors, and without anything the receiver would have to unpickle."""
    from safetensors.torch import save

    from ..checkpoint.tree import encode

    tree, tensors = encode(cpu_clone(obj))
    return tree, save(tensors)


def unpack_tree(packed: tuple[Any, bytes]) -> Any:
    """The object :func:`pack_tree` packed (CPU tensors)."""
    from safetensors.torch import load

    from ..checkpoint.tree import decode

    tree, blob = packed
    return decode(tree, load(blob), "a worker's optimizer state")


def state_from_flat(
    layout: Layout, params: torch.Tensor, buffers: torch.Tensor, others: dict[str, torch.Tensor]
) -> "OrderedDict[str, torch.Tensor]":
    """Rebuild a ``state_dict`` (CPU tensors of the original dtypes) from flat vectors."""
    out: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    offsets = {"param": 0, "buffer": 0}
    flats = {"param": params, "buffer": buffers}
    for e in layout.entries:
        if e.alias_of is not None:
            out[e.key] = out[e.alias_of]
        elif e.kind == "other":
            out[e.key] = others[e.key]
        else:
            n = _numel(e.shape)
            start = offsets[e.kind]
            offsets[e.kind] = start + n
            out[e.key] = flats[e.kind][start : start + n].view(e.shape).to(getattr(torch, e.dtype)).clone()
    return out
