"""Graceful Ctrl-C (and SIGTERM) for a training loop: the first signal asks the loop to stop, a second aborts.

It exists because a bare ``KeyboardInterrupt`` can land anywhere (mid-backward, mid-collective, mid-write) and
loses the run. While :class:`GracefulInterrupt` is active, the first SIGINT only sets a flag the loop reads at its
next optimizer-step boundary, where it can write a checkpoint and stop cleanly; a second SIGINT raises
``KeyboardInterrupt`` immediately (the user insists). The previous handler is restored when the block ends, so
the handler is installed only for the duration of the loop. Outside the main thread (where Python cannot install
signal handlers) it does nothing and Ctrl-C keeps its usual meaning. SIGTERM (``kill``, a batch scheduler's
pre-emption notice) is treated exactly like Ctrl-C: finish the step, write a checkpoint, exit.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any, Optional

__all__ = ["GracefulInterrupt"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulInterrupt:
    """Context manager: ``with GracefulInterrupt() as stop: ... if stop.requested: ...``."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> "GracefulInterrupt":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in _SIGNALS}
            self._installed = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._installed:
            for sig, previous in self._previous.items():
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
            self._installed = False
