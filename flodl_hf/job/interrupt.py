"""Graceful Ctrl-C (and SIGTERM) for a training loop: the first signal asks the loop to stop, a second aborts.

It exists because a bare ``KeyboardInterrupt`` can land anywhere (mid-backward, mid-collective, mid-write) and
loses the run. While :class:`GracefulInterrupt` is active, the first SIGINT only sets a flag the loop reads at its
next optimizer-step boundary, where it can write a checkpoint and stop cleanly; a second SIGINT raises
``KeyboardInterrupt`` immediately (the user insists). The previous handler is restored when the block ends, so
the handler is installed only for the duration of the loop. Outside the main thread (where Python cannot install
signal handlers) it does nothing and Ctrl-C keeps its usual meaning. SIGTERM (``kill``, a batch scheduler's
pre-emption notice) is treated exactly like Ctrl-C: finish the step, write a checkpoint, exit.

Once a command's work is written, the ``flodl-hf`` program has only its end left: the ranks' teardown and the
interpreter's own exit (threads, atexit hooks, garbage collection), where a ``KeyboardInterrupt`` prints a traceback
that nothing catches and leaves exit code 0. :func:`work_done` hands SIGINT, from that moment, to a handler that
reaps the ranks this process started and exits 130 in one line; only the program asks for it
(:func:`run_as_program`), so code that calls the job and goes on keeps Ctrl-C as it was.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any, Optional

__all__ = ["GracefulInterrupt", "run_as_program", "work_done"]

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


_AS_PROGRAM = False
_ENDING = False


def run_as_program() -> None:
    """Called by the ``flodl-hf`` program before its command runs: the process ends when the command returns."""
    global _AS_PROGRAM
    _AS_PROGRAM = True


def work_done() -> None:
    """The command's work is written: from now on (in the program only) a Ctrl-C ends the process at once."""
    if _AS_PROGRAM and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _interrupted_while_ending)


def _interrupted_while_ending(signum: int, frame: Optional[FrameType]) -> None:
    """Reap the ranks this process started (bounded; a rank that failed or was interrupted gives its own line and
    exit code), then one line and exit 130; a second Ctrl-C exits at once."""
    global _ENDING
    if not _ENDING:
        _ENDING = True
        launch = sys.modules.get("flodl_hf.distributed.launch")  # loaded only if this process started ranks
        try:
            if launch is not None:
                launch.reap_children()
        except BaseException:  # noqa: BLE001 - a failing or interrupted reap: exit all the same
            pass
        print("flodl-hf: interrupted while shutting down", file=sys.stderr, flush=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe must not stop the exit
            pass
    os._exit(130)
