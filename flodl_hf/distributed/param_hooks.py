"""One post-accumulate-grad hook per trainable parameter, installed, paused and removed the same way.

Why it exists: two parts of a window watch every backward pass (``window_overlap`` starts buckets early,
``grad_guard`` records what each pass left), and both need the same handling of parameters unfrozen mid-run
(hooked at the next step), of passes that are not training (the memory probe: paused) and of clean-up.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import torch

__all__ = ["ParamHooks"]


class ParamHooks:
    """Base: subclasses define ``_on_grad(i, param)`` and ``reset()``."""

    def __init__(self, params: Sequence[torch.nn.Parameter]) -> None:
        self.params = params
        self._handles: dict[int, Any] = {}
        self._paused = 0
        self.install()
        self.reset()

    def reset(self) -> None:  # pragma: no cover - always overridden
        raise NotImplementedError

    def _on_grad(self, i: int, param: torch.Tensor) -> None:  # pragma: no cover - always overridden
        raise NotImplementedError

    def install(self) -> None:
        """Hook every parameter that requires grad and has no hook yet (unfrozen ones join at the next step)."""
        for i, p in enumerate(self.params):
            if i not in self._handles and p.requires_grad:
                self._handles[i] = p.register_post_accumulate_grad_hook(self._hook(i))

    def remove(self) -> None:
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Backward passes inside are not training micro-batches (a memory probe's): nothing is decided or kept."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1
            self.reset()

    def _hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def fired(param: torch.Tensor) -> None:
            self._on_grad(i, param)
        return fired
