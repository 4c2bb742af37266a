"""What ``Trainer.setup*`` carries from the user's model to the replica it trains, and the loop that trains the
wrong one.

Why it exists: setup mode trains a *replica* that the user's factory builds on each rank's device, not the model
object the user wrapped. Everything the user set on that model before setup must therefore reach the replica, or
the run differs from one process's with no sign of it: which parameters train (``requires_grad``), which
submodules are in eval mode (a frozen encoder kept in ``eval()`` for linear probing: its dropout must stay off),
and gradient (activation) checkpointing (lost, it costs memory on a GPU). And a loop that keeps calling the model
object it wrapped (``graph = Graph(model)`` ... ``model(x)``) trains nothing at all: :class:`SourceWatch` notices
that the wrapped model got gradients and refuses at the first ``graph.step()``, before any update.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Optional

import torch

__all__ = ["carry_module_state", "SourceWatch", "watch_source"]

#: Per-module attributes of transformers' gradient checkpointing (``gradient_checkpointing_enable`` /
#: ``activation_checkpointing_enable`` set them on every module that supports it).
_CHECKPOINTING_ATTRS = ("gradient_checkpointing", "_gradient_checkpointing_func")


def carry_module_state(source: torch.nn.Module, replica: torch.nn.Module, *, warn: bool = True) -> None:
    """Give ``replica`` the source's ``requires_grad`` per parameter, ``training`` per submodule and gradient
    checkpointing, matched by name (the factory builds the same architecture).

    A source entirely in eval mode (as ``from_pretrained`` leaves a model) trains in eval mode, as it would in one
    process; ``warn`` then says so once, when dropout would have been active, since transformers' Trainer calls
    ``model.train()`` for you and a user coming from it may expect that."""
    flags = {name: p.requires_grad for name, p in source.named_parameters(remove_duplicate=False)}
    for name, p in replica.named_parameters(remove_duplicate=False):
        if name in flags:
            p.requires_grad_(flags[name])
    modules = dict(replica.named_modules(remove_duplicate=False))
    for name, module in source.named_modules(remove_duplicate=False):
        twin = modules.get(name)
        if twin is None:
            continue
        twin.training = module.training
        for attr in _CHECKPOINTING_ATTRS:
            if attr in vars(module) or (hasattr(module, attr) and hasattr(twin, attr)):
                setattr(twin, attr, getattr(module, attr))
    # checkpointing with frozen embeddings needs the embeddings' output to require grad (a forward hook that
    # transformers installs with the checkpointing); the replica gets its own
    if getattr(source, "_require_grads_hook", None) is not None and hasattr(replica, "enable_input_require_grads"):
        replica.enable_input_require_grads()
    if warn and not any(m.training for m in source.modules()) and _has_dropout(source):
        warnings.warn("the model given to Trainer.setup is in eval mode (dropout off), as from_pretrained leaves a "
                      "model, so it trains without dropout, as it would in one process; call model.train() before "
                      "setup to train with dropout (transformers' Trainer does that for you)", UserWarning,
                      stacklevel=3)


def _has_dropout(module: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules())


class SourceWatch:
    """Watches the model object the user wrapped until the first optimizer step: gradients on it mean the loop
    calls it instead of ``graph.module`` (the replica), and nothing would train."""

    def __init__(self, source: torch.nn.Module, shared: frozenset = frozenset()) -> None:
        self._source = weakref.ref(source)
        # gradients the source already held at setup (a sanity-check backward before it) are not the loop's, nor
        # are those of parameters the replica shares with it (a factory that wrapped the same module)
        self._shared = shared
        self._before = {i: self._mark(p) for i, p in enumerate(source.parameters())}

    @staticmethod
    def _mark(p: torch.Tensor) -> Optional[tuple[int, int]]:
        return None if p.grad is None else (id(p.grad), p.grad._version)

    def check(self) -> None:
        """Raise ValueError if a backward pass reached the wrapped model since setup."""
        source = self._source()
        if source is None:
            return
        for i, p in enumerate(source.parameters()):
            if p.grad is not None and id(p) not in self._shared and self._mark(p) != self._before.get(i):
                raise ValueError(
                    f"the loop trained the model object given to Graph(...) (its parameter #{i} "
                    f"{tuple(p.shape)} got a gradient), but Trainer.setup* trains the replica its factory built on "
                    "this rank's device, so nothing would train: call graph.module(...) in the loop (e.g. "
                    "model = graph.module right after setup), or the task head, whose forward already uses it")


def watch_source(source: Any, replica: torch.nn.Module) -> Optional[SourceWatch]:
    """A :class:`SourceWatch` for ``source`` when it is a module other than the replica, else None."""
    if isinstance(source, torch.nn.Module) and source is not replica:
        own = {id(p) for p in replica.parameters()}
        return SourceWatch(source, frozenset(id(p) for p in source.parameters() if id(p) in own))
    return None
