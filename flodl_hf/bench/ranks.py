"""A pool of W rank processes that runs every bench mode in the same process layout.

Why it exists: every mode must run in the same layout (one process per rank, one torch thread each, the
launcher environment torchrun would set: RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT), and
starting fresh Python+torch processes for every run of every mode costs more than the runs themselves on a
small machine. So the pool starts W processes once; each run sends every rank a function to call with a fresh
rendezvous port, and the function leaves the process clean (process group destroyed, El Che windows closed,
Accelerate's singletons reset). Solo runs use the same processes without the launcher environment.

A run whose rank raises, dies or hangs fails with :class:`BenchRunError` (every rank's error in the message);
the pool is then torn down (killing any rank still blocked in a collective) and restarted for the next run.
Nothing is left running after :meth:`RankPool.close`.

Real heterogeneity on CPU cores: ``RankPool(world, cores=...)`` pins rank r's process, every thread of
it, to ``cores[r]`` as it starts (before torch creates its thread pool; threads created later inherit it), and
:class:`BusyCore` runs a competing busy process pinned to one core for the duration of a ``with`` block (killed
on exit, errors included; it also exits by itself when its parent dies).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Optional

__all__ = ["BenchRunError", "BusyCore", "RankPool", "pin_process", "process_cores"]

_LAUNCH_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: After one rank fails, how long the others get to fail too (their peers' errors are more telling) before
#: they are killed.
_GRACE_S = 10.0


class BenchRunError(RuntimeError):
    """A rank of a bench run failed, died or hung; the message carries every rank's error."""


def _clean_process() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort between runs
            pass


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # not Linux: the calling thread only (pid 0)
        return [0]


def pin_process(core: int) -> None:
    """Pin every thread of this process (and so every thread it starts later) to ``core``."""
    for tid in _threads() + [0]:
        try:
            os.sched_setaffinity(tid, {core})
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def process_cores() -> list[int]:
    """The cores any thread of this process may run on (sorted; empty where affinity is unknown)."""
    if not hasattr(os, "sched_getaffinity"):
        return []
    cores: set[int] = set()
    for tid in _threads():
        try:
            cores |= os.sched_getaffinity(tid)
        except ProcessLookupError:
            pass
    return sorted(cores)


_BUSY = """import os
os.sched_setaffinity(0, {%d})
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(100000):
        pass
"""


class BusyCore:
    """A busy process (``while True: pass``) pinned to ``core`` inside a ``with`` block; always killed on exit."""

    def __init__(self, core: int) -> None:
        self.core = int(core)
        self.proc: Optional[subprocess.Popen] = None

    @property
    def pid(self) -> Optional[int]:
        return None if self.proc is None else self.proc.pid

    def __enter__(self) -> "BusyCore":
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", _BUSY % self.core], stdin=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        """Kill the busy process and reap it (idempotent)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()


def _worker(rank: int, world: int, conn: Connection, core: Optional[int] = None) -> None:
    if core is not None:
        pin_process(core)
    os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                       "FLODL_HF_NO_LAUNCH": "1"})
    import torch

    torch.set_num_threads(1)
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        fn, port, args = task
        for key in _LAUNCH_KEYS:
            os.environ.pop(key, None)
        if port is not None:
            os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                               "MASTER_PORT": str(port)})
        try:
            result: tuple[str, Any] = ("ok", fn(rank, world, *args))
        except BaseException as exc:  # noqa: BLE001 - shipped back to the harness
            result = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            _clean_process()
        conn.send(result)


class RankPool:
    """``world`` long-lived rank processes. Use as a context manager, or call :meth:`close`."""

    def __init__(self, world: int, cores: Optional[tuple[int, ...]] = None) -> None:
        if world < 1:
            raise ValueError(f"world={world!r} is invalid: a pool needs at least one rank")
        if cores is not None and len(cores) != world:
            raise ValueError(f"cores={cores!r} is invalid: give one core per rank ({world})")
        self.world = world
        self.cores = None if cores is None else tuple(int(c) for c in cores)
        self._procs: list[Any] = []
        self._conns: list[Connection] = []

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        for rank in range(self.world):
            parent, child = ctx.Pipe()
            core = None if self.cores is None else self.cores[rank]
            proc = ctx.Process(target=_worker, args=(rank, self.world, child, core), name=f"flodl-bench-rank{rank}")
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float = 600.0,
            distributed: bool = True) -> list[Any]:
        """Call ``fn(rank, world, *args)`` on every rank; return the values by rank (raises BenchRunError)."""
        from ..distributed.launch import free_port

        if not self._procs:
            self._start()
        port = free_port() if distributed else None
        for conn in self._conns:
            conn.send((fn, port, args))
        results: dict[int, tuple[str, Any]] = {}
        deadline = time.monotonic() + timeout_s
        while len(results) < self.world:
            pending = {self._conns[r]: r for r in range(self.world) if r not in results}
            ready = wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for conn in ready:
                rank = pending[conn]  # type: ignore[index]
                try:
                    results[rank] = conn.recv()  # type: ignore[union-attr]
                except EOFError:
                    results[rank] = ("died", f"process died (exit code {self._procs[rank].exitcode})")
                if results[rank][0] != "ok":
                    deadline = min(deadline, time.monotonic() + _GRACE_S)
        bad = [(r, v) for r, (s, v) in sorted(results.items()) if s != "ok"]
        missing = [r for r in range(self.world) if r not in results]
        if missing:
            bad.append((missing[0], f"ranks {missing} did not finish (hang, or blocked on a failed peer); killed"))
        if bad:
            self.close(kill=True)
            raise BenchRunError("\n".join(f"rank {r}: {v}" for r, v in bad))
        return [results[r][1] for r in range(self.world)]

    def close(self, kill: bool = False) -> None:
        """Stop every rank process (politely, then by force); idempotent."""
        for conn in self._conns:
            if not kill:
                try:
                    conn.send(None)
                except (OSError, BrokenPipeError):
                    pass
        for proc in self._procs:
            if not kill:
                proc.join(10.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
