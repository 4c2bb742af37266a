"""The command line's optimizer: torch's AdamW, fused where torch has a fused kernel for the parameters, with
transformers' ``Trainer`` parameter groups.

Why it exists: torch's AdamW without ``fused`` or ``foreach`` runs a Python loop over every parameter on the CPU;
for the packaged 22.7M-parameter MiniLM that took 200-650 ms per step on this project's machine against 50-60 ms
fused, a quarter of a whole fine-tuning step. transformers' ``Trainer`` defaults to the fused kernel
(``optim="adamw_torch_fused"``), so a job that compares itself with it must too. The update is AdamW's: the same
formula, the same hyper-parameters (learning rate, betas, eps), computed by one kernel instead of many; results
agree to float rounding, not bit for bit, with the unfused loop.

Weight decay follows Trainer too: ``weight_decay`` (default 0.0, Trainer's) goes to every parameter but biases and
normalisation weights, which get 0 (:func:`no_decay_names`: parameters inside a ``torch.nn.LayerNorm`` and names
holding ``bias``, ``layernorm``, ``rmsnorm`` or a ``norm`` / ``*_norm`` component, as
``Trainer.get_decay_parameter_names`` decides; tested against it).
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

import torch

__all__ = ["adamw", "no_decay_names"]

_FUSED_DEVICES = ("cpu", "cuda")
# A parameter name (lower-cased) naming a bias or a normalisation layer: "bias" or "layernorm" / "rmsnorm"
# anywhere, or a dotted component that is "norm" or ends in "_norm".
_NO_DECAY = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)(?:[^.]*_)?norm(?:\.|$)")


def no_decay_names(module: torch.nn.Module) -> set[str]:
    """Names of ``module``'s parameters that weight decay leaves alone: biases and normalisation weights."""
    inside_norm = {f"{prefix}.{name}" if prefix else name
                   for prefix, sub in module.named_modules() if isinstance(sub, torch.nn.LayerNorm)
                   for name, _ in sub.named_parameters()}
    return {name for name, _ in module.named_parameters()
            if name in inside_norm or _NO_DECAY.search(name.lower())}


def adamw(params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float = 0.0,
          module: Optional[torch.nn.Module] = None) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over ``params`` with ``lr``, fused when every parameter is a floating tensor on a CPU
    or CUDA device (torch's fused kernel covers them); otherwise torch's default implementation.

    Two param groups, as Trainer makes them: the parameters weight decay applies to, with ``weight_decay``, then
    the rest (:func:`no_decay_names` of ``module``, the module ``params`` belong to) with 0. Without ``module``
    every parameter is in the first group."""
    params = list(params)
    exempt: set[int] = set()
    if module is not None:
        if {id(p) for p in params} != {id(p) for p in module.parameters()}:
            raise ValueError("adamw(params, module=...): the parameters are not the module's; pass the module they "
                             "belong to (its names decide which get weight decay)")
        exempt = {id(p) for name, p in module.named_parameters() if name in no_decay_names(module)}
    groups = [{"params": [p for p in params if id(p) not in exempt], "weight_decay": float(weight_decay)},
              {"params": [p for p in params if id(p) in exempt], "weight_decay": 0.0}]
    groups = [group for group in groups if group["params"]] or [{"params": params}]
    fused = bool(params) and all(p.is_floating_point() and p.device.type in _FUSED_DEVICES for p in params)
    if fused:
        return torch.optim.AdamW(groups, lr=lr, weight_decay=float(weight_decay), fused=True)
    return torch.optim.AdamW(groups, lr=lr, weight_decay=float(weight_decay))
