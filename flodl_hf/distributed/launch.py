"""The script launcher: plain ``python train.py`` with several devices starts the other ranks itself.

The calling process becomes rank 0; ranks 1..N-1 are the same command line re-run with the launcher environment
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) set, the way torchrun would set it. Children watch their
parent and exit if it disappears; the parent reaps them at exit and reports any that failed. Nothing can be
re-run from an interactive session or ``python -c``: that is an error telling the user to use torchrun or the
builder mode instead.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Optional, Sequence

__all__ = ["LAUNCHED_ENV", "start_other_ranks", "watch_parent", "reap_children", "free_port"]

#: Set in every rank started by this launcher (its value is rank 0's pid).
LAUNCHED_ENV = "FLODL_HF_LAUNCHED"

_CHILDREN: list[subprocess.Popen] = []
_REAP_TIMEOUT_S: float = 60.0


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _command_line() -> list[str]:
    argv: Optional[Sequence[str]] = getattr(sys, "orig_argv", None)
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if not argv or len(argv) < 2 or script is None or argv[1] == "-c" or "ipykernel" in " ".join(argv):
        raise RuntimeError(
            "cannot start the other ranks from an interactive session or `python -c`: run a script "
            "(`python train.py`), launch with `torchrun --nproc-per-node N train.py`, or use Trainer.builder(...) "
            "which spawns its workers itself")
    return [sys.executable, *argv[1:]]


def start_other_ranks(devices: Sequence[str], timeout_s: float) -> None:
    """Start ranks 1..N-1 as copies of this command and make this process rank 0 (sets os.environ)."""
    global _REAP_TIMEOUT_S
    world = len(devices)
    command = _command_line()
    port = free_port()
    cores = os.cpu_count() or 1
    base = dict(os.environ)
    base.update({
        "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), "GROUP_RANK": "0", "NODE_RANK": "0",
        "FLODL_HF_DEVICES": ",".join(devices), LAUNCHED_ENV: str(os.getpid()),
    })
    child_base = dict(base)
    if all(d == "cpu" for d in devices) and "OMP_NUM_THREADS" not in base:
        child_base["OMP_NUM_THREADS"] = str(max(1, cores // world))  # rank 0 sets its own threads at join
    for rank in range(1, world):
        env = dict(child_base, RANK=str(rank), LOCAL_RANK=str(rank))
        _CHILDREN.append(subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL))
    os.environ.update(dict(base, RANK="0", LOCAL_RANK="0"))
    _REAP_TIMEOUT_S = float(timeout_s)


def _parent_gone(parent: int) -> Callable[[], bool]:
    """A check that waits up to half a second and says whether rank 0 is gone. Rank 0's own process is watched (a
    pidfd, readable once it exits), so a rank started through an interpreter wrapper that forks, and so is not rank
    0's child, is watched too; without pidfds, the parent process id changes when rank 0, the parent, exits."""
    try:
        fd = os.pidfd_open(parent)
    except ProcessLookupError:
        return lambda: True
    except (AttributeError, OSError):  # no pidfds here (not Linux, or an old kernel)
        def reparented() -> bool:
            time.sleep(0.5)
            return os.getppid() != parent
        return reparented
    return lambda: bool(select.select([fd], [], [], 0.5)[0])


def watch_parent() -> None:
    """In a launched child: exit if rank 0 (our parent) goes away, so no rank is ever left orphaned."""
    parent = int(os.environ.get(LAUNCHED_ENV, "0") or 0)

    def _watch(gone: Callable[[], bool]) -> None:
        while True:
            if gone():
                print(f"flodl-hf: rank {os.environ.get('RANK')}: rank 0 (pid {parent}) is gone; exiting",
                      file=sys.stderr, flush=True)
                os._exit(1)

    if parent:
        threading.Thread(target=_watch, args=(_parent_gone(parent),), name="flodl-hf-parent-watch",
                         daemon=True).start()


#: How a rank ends when a Ctrl-C or SIGTERM reached it: killed by the signal (the interpreter's last moments restore
#: the default action) or exiting 130 / 143 on its own. A Ctrl-C at a terminal reaches every rank of the group.
_INTERRUPTED = {-signal.SIGINT, 128 + signal.SIGINT, -signal.SIGTERM, 128 + signal.SIGTERM}


def reap_children() -> None:
    """Wait (bounded) for the ranks this process started; kill stragglers; exit non-zero if any failed: 130 with one
    line when every rank that failed was interrupted (a Ctrl-C reaches them all), 1 naming them otherwise."""
    if not _CHILDREN:
        return
    deadline = time.monotonic() + _REAP_TIMEOUT_S
    failed: list[tuple[int, int]] = []
    for rank, child in enumerate(list(_CHILDREN), start=1):
        remaining = max(0.1, deadline - time.monotonic())
        try:
            code = child.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
            code = child.wait()
            print(f"flodl-hf: rank {rank} did not finish within {_REAP_TIMEOUT_S:.0f} s after rank 0; killed it",
                  file=sys.stderr, flush=True)
        if code != 0:
            failed.append((rank, code))
    _CHILDREN.clear()
    if failed and all(code in _INTERRUPTED for _, code in failed):
        print("flodl-hf: interrupted while shutting down", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(130)
    if failed:
        listing = ", ".join(f"rank {r} exited with code {c}" for r, c in failed)
        print(f"flodl-hf: error: {listing}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
