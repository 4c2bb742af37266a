"""A pool of gloo ranks that stays alive across tests: one spawn per world size and pytest session, not per test.

Why it exists: a fresh interpreter that imports torch and transformers costs 3-6 s on the project's 2-core machine,
and spawning one per rank of every multi-rank test was most of the suite's time. Here each rank is a long-lived
process (spawned once, torch, transformers and flodl-hf imported once) that runs one test callable after another,
the way PyTorch's ``MultiProcContinuousTest`` feeds tests to persistent ranks.

What a test sees is what a torchrun rank sees: RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / a fresh MASTER_PORT in
the environment, one torch thread, and no process group yet. The callable joins the group the way the product does
(``Trainer.setup_*`` -> ``init_context``, with the ``DdpConfig``'s timeout and backend, which are part of what the
tests check), so the pool does not join it ahead of the callable; one rendezvous on loopback costs milliseconds.

Between tests every rank is left as a fresh interpreter would be: flodl-hf's ``shutdown`` closes the windows and
leaves the group, then the rank compares itself with the state it had after its imports (environment, working
directory, torch's global switches and module hooks, signal and exception hooks, flodl-hf's process context, live
Python threads) and seeds torch's default generator anew, as a fresh interpreter does. A callable that left anything
behind fails its own test, naming what it left, and the pool is rebuilt. The parent collects every rank's result
before the next test (the barrier), so no test starts while a rank of the previous one still runs. A callable's
exception comes back as its traceback; a rank that dies or hangs fails its own test within the timeout, and the pool
is rebuilt for the next.

Tests whose callables must run in a fresh interpreter (a rank that kills itself, a signal, interpreter teardown, an
environment variable read at import) use ``dist_helpers.spawn_ranks`` and say why.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import sys
import tempfile
import threading
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Optional

from process_state import differences, snapshot

__all__ = ["RankPool", "pool_for", "close_pools"]

#: How long a fresh rank may take to import torch, transformers and flodl-hf and say it is ready.
START_TIMEOUT_S = 180.0
#: Environment variables a launched rank gets from its launcher; the pool sets them for each test and removes them.
LAUNCH_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


# --- inside a rank ---------------------------------------------------------------------------------------------

def _state() -> dict[str, Any]:
    """What a test must leave as it found it: ``process_state``'s snapshot and flodl-hf's process context."""
    from flodl_hf.distributed import context, window

    return {**snapshot(),
            "flodl-hf context": context.current_context(),
            "flodl-hf open windows": len(context.OPEN_RUNTIMES),
            "flodl-hf failure mark": window._PROCESS_FAILED,
            "process group": _group_initialized()}


def _group_initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.ident is not None}


def _teardown(clean: dict[str, Any], threads_before: set[int]) -> list[str]:
    """Leave the group and the test's process state; return what the test left behind (empty when clean)."""
    import atexit

    from flodl_hf.distributed import context

    problems = []
    try:
        context.shutdown()
    except BaseException as exc:  # noqa: BLE001 - a teardown failure is the test's, reported with its result
        problems.append(f"flodl-hf's shutdown raised {type(exc).__name__}: {exc}")
    atexit.unregister(context.shutdown_at_exit)  # one process, many contexts: the exit hook is the test's
    for key in LAUNCH_KEYS:
        os.environ.pop(key, None)
    if getattr(sys.excepthook, "__name__", "") == "_distributed_excepthook":
        # torch's init_process_group wraps the excepthook on every join and never unwraps it: torch's, not the test's
        sys.excepthook = clean["sys.excepthook"]
    deadline = time.monotonic() + 2.0
    while True:
        alive = [t for t in threading.enumerate() if t.ident not in threads_before and t.is_alive()]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    if alive:
        problems.append(f"threads still running {sorted(t.name for t in alive)}")
    problems += differences(clean, _state())
    return problems


def _worker(rank: int, world: int, conn: Connection) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import transformers  # noqa: F401 - imported once here, not once per test

    import flodl_hf  # noqa: F401

    torch.set_num_threads(1)
    clean = _state()
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if not message:
            return
        fn, args, port, env, path = pickle.loads(message)
        for entry in path:
            if entry not in sys.path:
                sys.path.append(entry)
        threads_before = _threads()
        torch.seed()  # a fresh interpreter seeds the default generator anew: no test draws what the last one left
        os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                           "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        os.environ.update(env)
        with tempfile.TemporaryFile() as out:
            saved = [os.dup(1), os.dup(2)]
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            try:
                try:
                    result: tuple[str, Any] = ("ok", fn(rank, world, *args))
                except BaseException as exc:  # noqa: BLE001 - shipped back to the test
                    result = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
                for key in env:
                    os.environ.pop(key, None)
                left = _teardown(clean, threads_before)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in saved:
                    os.close(fd)
            out.seek(0)
            output = out.read().decode("utf-8", "replace")
        try:
            payload = pickle.dumps((result, left, output))
        except Exception as exc:  # noqa: BLE001 - an unpicklable return value is the test's error
            payload = pickle.dumps((("error", f"the callable's return value cannot be pickled: {exc}"), left,
                                    output))
        conn.send_bytes(payload)
        if left:
            return  # the parent rebuilds the pool: a rank that leaked is not trusted with the next test


# --- in the test process ---------------------------------------------------------------------------------------

class RankPool:
    """``world`` persistent gloo ranks; ``run(fn, *args)`` runs ``fn(rank, world, *args)`` on each of them."""

    def __init__(self, world: int) -> None:
        self.world = world
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self.starts = 0  # how many times the ranks were (re)started: the pool's tests read it

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        procs, conns = [], []
        for rank in range(self.world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(rank, self.world, child), daemon=False,
                               name=f"rank-pool-{self.world}-{rank}")
            proc.start()
            child.close()
            procs.append(proc)
            conns.append(parent)
        self._procs, self._conns = procs, conns
        self.starts += 1
        deadline = time.monotonic() + START_TIMEOUT_S
        for rank, conn in enumerate(conns):
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                self.close()
                raise AssertionError(f"the rank pool's rank {rank} of {self.world} did not start within "
                                     f"{START_TIMEOUT_S:.0f} s")
            try:
                conn.recv()
            except EOFError:
                self.close()
                raise AssertionError(f"the rank pool's rank {rank} of {self.world} died while starting") from None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def close(self, wait: float = 5.0) -> None:
        """Stop the ranks (politely, waiting up to ``wait`` s each, then by force); the next ``run`` starts new
        ones."""
        for conn in self._conns:
            try:
                conn.send_bytes(b"")
            except OSError:
                pass
        for proc in self._procs:
            proc.join(wait)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 120.0,
            env: Optional[dict] = None) -> list[tuple[str, Any]]:
        """Run ``fn(rank, world, *args)`` on every rank; ``[(status, value), ...]`` by rank, as ``run_ranks``."""
        from flodl_hf.distributed.launch import free_port

        if not self._procs or any(not p.is_alive() for p in self._procs):
            self.close()
            self._start()
        task = pickle.dumps((fn, args, free_port(), dict(env or {}), list(sys.path)))
        replies: dict[int, Any] = {}
        try:
            for conn in self._conns:
                conn.send_bytes(task)
            deadline = time.monotonic() + timeout
            waiting = {conn: rank for rank, conn in enumerate(self._conns)}
            while waiting:  # a rank that dies closes its end of the pipe: its connection reads EOF
                ready = wait(list(waiting), max(0.0, deadline - time.monotonic()))
                if not ready:
                    break
                for conn in ready:
                    rank = waiting.pop(conn)  # type: ignore[call-overload]
                    try:
                        replies[rank] = pickle.loads(conn.recv_bytes())  # type: ignore[union-attr]
                    except (EOFError, OSError):
                        replies[rank] = None  # died before or while answering
        except BaseException:
            self.close()  # an interrupted test (pytest-timeout, Ctrl-C) leaves the ranks mid-test
            raise
        hung = [rank for rank in range(self.world) if rank not in replies]
        dead = [rank for rank in range(self.world) if replies.get(rank, 0) is None]
        leaked = {rank: reply[1] for rank, reply in replies.items() if reply is not None and reply[1]}
        for rank in range(self.world):
            reply = replies.get(rank)
            if reply is not None and reply[2]:
                sys.stderr.write(f"--- rank {rank} output ---\n{reply[2]}")
        for rank in dead:
            self._procs[rank].join(5)
        exitcodes = [None if rank >= len(self._procs) else self._procs[rank].exitcode for rank in range(self.world)]
        if hung or dead or leaked:
            self.close(wait=0.0 if hung else 5.0)  # a hung rank never reads the stop message
        if hung:
            raise AssertionError(f"ranks {hung} did not finish within {timeout} s (hang)")
        results: list[tuple[str, Any]] = []
        for rank in range(self.world):
            reply = replies[rank]
            if reply is None:
                results.append(("missing", exitcodes[rank]))
            elif leaked.get(rank):
                results.append(("error", f"rank {rank} left state behind for the next test: "
                                         f"{'; '.join(leaked[rank])}"))
            else:
                results.append(reply[0])
        if leaked:
            raise AssertionError("\n".join(f"rank {r}: the test left state behind: {'; '.join(v)}"
                                           for r, v in leaked.items()))
        return results


_POOLS: dict[int, RankPool] = {}


def pool_for(world: int) -> RankPool:
    """The session's pool of ``world`` ranks (started on first use)."""
    if world not in _POOLS:
        _POOLS[world] = RankPool(world)
    return _POOLS[world]


def close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()
