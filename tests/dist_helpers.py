"""Run a function on N real gloo ranks on loopback and collect what each returns.

Test helper only: every multi-rank test in this suite goes through a real ``torch.distributed`` process group,
the way torchrun would start it (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the environment).
``run_ranks`` runs the function on the session's persistent ranks (``rank_pool``); ``spawn_ranks`` spawns fresh
interpreters, for the tests that need one (a rank that exits or is killed, interpreter teardown, an environment
variable read at import), each of which says why.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from flodl_hf.distributed.launch import free_port
from rank_pool import pool_for


def _entry(fn: Callable[..., Any], rank: int, world: int, port: int, out: str, args: tuple,
           env: dict) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "OMP_NUM_THREADS": "1"})
    os.environ.update(env)
    import torch

    torch.set_num_threads(1)
    try:
        result = ("ok", fn(rank, world, *args))
    except BaseException as exc:  # noqa: BLE001 - shipped back to the test
        result = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    with open(os.path.join(out, f"rank{rank}.pkl"), "wb") as fh:
        pickle.dump(result, fh)
    # Leave the group so atexit teardown has nothing to wait for.
    from flodl_hf.distributed.context import shutdown

    try:
        shutdown()
    except BaseException:  # noqa: BLE001 - already reported through the result file
        pass


ROOT = Path(__file__).resolve().parents[1]
#: What a launcher sets in its ranks' environment: a command under test must not inherit the test session's.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "FLODL_HF_DEVICES")


def launch_env(*paths: str, **extra: str) -> dict:
    """The environment of a script a test launches as a user would: this checkout (then ``paths``) first on
    ``PYTHONPATH``, offline, one thread per process (what the launchers give two ranks on 2 cores), no launcher
    variables inherited; ``extra`` on top."""
    env = dict(os.environ)
    for key in LAUNCHER_VARIABLES:
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *paths, env.get("PYTHONPATH", "")])
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def accelerate_launch(world: int) -> list[str]:
    """The arguments after ``python`` that ``accelerate launch`` ``world`` CPU processes on this machine: accelerate's
    ``--cpu`` runs several processes only through mpirun; ``--multi_gpu`` goes through torchrun, which on a machine
    without CUDA gives CPU ranks (flodl-hf then picks gloo)."""
    return ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(world), "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 120.0,
              env: Optional[dict] = None) -> list[tuple[str, Any]]:
    """Run ``fn(rank, world, *args)`` on the session's ``world`` persistent ranks; ``[(status, value), ...]`` by
    rank, exactly as :func:`spawn_ranks` returns them. A rank that hangs fails the test; one that leaves state
    behind fails it too (``rank_pool``)."""
    return pool_for(world).run(fn, *args, timeout=timeout, env=env)


def spawn_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 120.0,
                env: Optional[dict] = None) -> list[tuple[str, Any]]:
    """Run ``fn(rank, world, *args)`` on ``world`` freshly spawned ranks; return ``[(status, value), ...]`` by rank.

    status is ``"ok"`` (value = what fn returned, pickled) or ``"error"`` (value = the message and traceback),
    or ``"missing"`` when the rank died without writing a result.
    """
    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory() as out:
        procs = [ctx.Process(target=_entry, args=(fn, r, world, port, out, args, env or {})) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout)
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        if hung:
            raise AssertionError(f"ranks {hung} did not finish within {timeout} s (hang)")
        results = []
        for r in range(world):
            path = Path(out) / f"rank{r}.pkl"
            results.append(pickle.loads(path.read_bytes()) if path.exists() else ("missing", procs[r].exitcode))
        # A rank that wrote its result must also exit cleanly: an abort at interpreter teardown (e.g. "terminate
        # called without an active exception", exit code -6) would make torchrun report a finished job as failed.
        aborted = [(r, p.exitcode) for r, p in enumerate(procs) if results[r][0] != "missing" and p.exitcode != 0]
        if aborted:
            raise AssertionError(f"ranks wrote their results but exited with codes {aborted} (an abort at exit)")
        return results


def values(results: list[tuple[str, Any]]) -> list[Any]:
    """The returned values, failing the test with every rank's error if any rank failed."""
    bad = [(r, v) for r, (s, v) in enumerate(results) if s != "ok"]
    if bad:
        raise AssertionError("\n".join(f"rank {r}: {v}" for r, v in bad))
    return [v for _, v in results]
