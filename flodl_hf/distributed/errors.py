"""The exception a surviving rank raises when another rank failed, vanished or disagreed.

It sits in a module of its own so that every part of the distributed runtime (the context, the window and its
guards) can raise it without importing the context, which would close an import circle.
"""

from __future__ import annotations

__all__ = ["DistributedError"]


class DistributedError(RuntimeError):
    """A rank failed, vanished or disagreed with the others; raised on the surviving ranks."""
