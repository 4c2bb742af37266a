"""Worker process lifecycle: start one process per device, wait until each is ready, and stop them all.

Why it exists: starting and reaping processes is where a multi-process run hangs or leaks if done carelessly,
so it is kept in one small place with one rule: every wait is bounded. Starting packs the dataset once into
plain bytes (``data.pack_dataset``: no shared memory, so no file descriptor per tensor in the caller), pickles
everything a worker needs, and turns a failure into a ValueError that names the real cause (the
file-descriptor limit, or the object that cannot be pickled) and what to change; waiting for "ready" watches
each process and the clock; stopping asks politely ("stop" command), then terminates, then kills, always
reaping.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import pickle
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..distributed.errors import DistributedError
from .board import Board
from .data import pack_dataset
from .inbox import release_write_ends
from .settings import BuilderSettings
from .step import Recipe

__all__ = ["Workers", "start_workers", "wait_ready", "stop_workers"]

# torch._dynamo is what makes building the first optimizer slow (seconds): import it once, in the server.
_FORKSERVER_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "flodl_hf.builder.worker"]


@dataclass
class Workers:
    """The started worker processes and what connects them to the coordinator."""

    procs: list[Any]
    events: list[Any]
    """One queue per worker (``inbox``): a worker killed mid-write can silence only its own."""
    cmds: list[Any]
    board: Board
    devices: list[str]
    speeds: list[float]
    startup_timeout_s: float
    pids: Optional[list[Optional[int]]] = None  # kept once the processes are closed
    inbox: Any = None
    """The store transport (``ranks``): the coordinator's side of the workers' store queues (``events`` is empty)."""
    store: Any = None
    """The store transport: the control plane's store (its abort line is written there when the run fails)."""
    closers: list[Any] = dataclasses.field(default_factory=list)
    """Called once the workers are stopped (the heartbeat thread, the store server)."""
    peer_grace_s: float = 3.0
    """How long a collective's failure may precede the news of the peer's death that caused it."""


def start_workers(s: BuilderSettings, recipe: Recipe, devices: list[str]) -> Workers:
    """Start one worker process per device (``s.start_method``); ValueError if they cannot be started.

    The dataset is packed once here (plain pickle, one bytes blob) and every worker receives that blob; the
    caller's ``recipe`` is not modified."""
    from .worker import worker_main

    world = len(devices)
    ctx = context(s)
    spec = make_spec(s, dataclasses.replace(recipe, dataset=pack_dataset(recipe.dataset)), devices)
    speeds = spec.speeds
    board = Board.create(world, ctx)
    events = [ctx.Queue() for _ in range(world)]
    cmds = [ctx.Queue() for _ in range(world)]
    procs = [
        ctx.Process(
            target=worker_main,
            args=(r, spec, events[r], cmds[r], board.array),
            daemon=True,
            name=f"flodl-hf-worker-{r}",
        )
        for r in range(world)
    ]
    start_all(procs, recipe)
    release_write_ends(events)
    return Workers(procs, events, cmds, board, devices, speeds, spec.startup_timeout_s)


def start_all(procs: list[Any], recipe: Recipe, on_failure: Any = None) -> None:
    """Start every worker process; if one cannot start, kill those already started, call ``on_failure`` and
    raise the one-line ValueError of :func:`start_error`."""
    started = []
    try:
        for p in procs:
            p.start()
            started.append(p)
    except Exception as exc:
        for p in started:
            p.kill()
            p.join(timeout=2.0)
        if on_failure is not None:
            on_failure()
        raise ValueError(start_error(exc, recipe)) from exc


def context(s: BuilderSettings) -> Any:
    """The multiprocessing context workers start in (``s.start_method``)."""
    import torch.multiprocessing as tmp

    ctx = tmp.get_context(s.start_method)
    if s.start_method == "forkserver":
        ctx.set_forkserver_preload(_FORKSERVER_PRELOAD)
    return ctx


def make_spec(s: BuilderSettings, recipe: Recipe, devices: list[str], threads: Optional[int] = None,
              parent_pid: Optional[int] = None) -> Any:
    """What every worker is given: the recipe, every rank's device, the policy and the timeouts."""
    from .worker import WorkerSpec

    world = len(devices)
    n_cpu = sum(1 for d in devices if d == "cpu")
    return WorkerSpec(
        recipe=recipe,
        devices=list(devices),
        speeds=[float(v) for v in s.simulate_speeds] if s.simulate_speeds is not None else [1.0] * world,
        policy=s.policy.value,
        backend=s.backend.value,
        timeout_s=float(s.timeout_s),
        startup_timeout_s=max(120.0, float(s.timeout_s)),
        threads=threads if threads is not None else max(1, (os.cpu_count() or 1) // max(1, n_cpu)),
        parent_pid=os.getpid() if parent_pid is None else parent_pid,
        timeline=bool(s.timeline),
    )


def _too_many_files(exc: BaseException) -> bool:
    seen: set[int] = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE):
            return True
        if "Too many open files" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _short(value: object, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def start_error(exc: BaseException, recipe: Recipe) -> str:
    """The message for a failed worker start: the real cause (fd limit, an unpicklable object) and the fix."""
    what = f"the builder could not start its workers ({type(exc).__name__}: {exc})"
    if _too_many_files(exc):
        limit = ""
        try:
            import resource

            limit = f" (the limit is {resource.getrlimit(resource.RLIMIT_NOFILE)[0]})"
        except (ImportError, OSError, ValueError):
            pass
        return (
            f"{what}. The caller's process ran out of file descriptors{limit}: raise the limit before "
            "starting Python, e.g. `ulimit -n 65536`, or close files and processes this process keeps open"
        )
    for field in dataclasses.fields(recipe):
        value = getattr(recipe, field.name)
        try:
            pickle.dumps(value)
        except Exception as pexc:  # noqa: BLE001 - any pickling failure names the same culprit
            hint = (
                "use a module-level function or functools.partial of one (lambdas and functions defined "
                "inside other functions cannot be pickled)"
                if callable(value)
                else "keep only picklable data in it (no open files, locks or generators)"
            )
            return (
                f"{what}. Workers receive their recipe by pickling, and {field.name}={_short(value)} "
                f"cannot be pickled ({type(pexc).__name__}: {pexc}): {hint}"
            )
    return f"{what}. Check the system's process and memory limits; the traceback above has the details"


def wait_ready(
    w: Workers, get: Callable[[float], Optional[tuple]], cancelled: Callable[[], bool]
) -> dict[int, tuple]:
    """Wait (bounded) for every worker's "ready" message; fail fast on an error, a death or the timeout."""
    ready: dict[int, tuple] = {}
    world = len(w.procs)
    deadline = time.monotonic() + w.startup_timeout_s
    while len(ready) < world:
        if cancelled():
            raise RuntimeError("the builder run was cancelled")
        msg = get(0.05)
        if msg is not None:
            if msg[0] == "error":
                raise RuntimeError(f"worker {msg[1]} ({w.devices[msg[1]]}) failed while starting:\n{msg[2]}")
            if msg[0] == "ready":
                ready[msg[1]] = msg
            continue
        for r, p in enumerate(w.procs):
            if r not in ready and not p.is_alive():
                last = get(0.5)  # its last words, if any
                detail = f":\n{last[2]}" if last is not None and last[0] == "error" else ""
                raise DistributedError(
                    f"worker {r} ({w.devices[r]}) exited with code {p.exitcode} before it was ready{detail}"
                )
        if time.monotonic() > deadline:
            missing = sorted(set(range(world)) - set(ready))
            raise DistributedError(f"workers {missing} were not ready within {w.startup_timeout_s:.0f} s")
    return ready


def stop_workers(w: Workers, grace_s: float = 5.0) -> None:
    """Ask every worker to stop, then terminate, then kill whatever is left; reap all; close the queues."""
    for q in w.cmds:
        try:
            q.put(("stop",))
        except Exception:  # noqa: BLE001 - a closed queue: the worker is gone anyway
            pass
    deadline = time.monotonic() + grace_s
    for p in w.procs:
        p.join(timeout=max(0.05, deadline - time.monotonic()))
    for p in w.procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=2.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=2.0)
    for q in [*w.events, *(c for c in w.cmds if hasattr(c, "cancel_join_thread"))]:
        try:
            q.cancel_join_thread()  # never block this process's exit on messages nobody will read
            q.close()
            feeder = getattr(q, "_thread", None)
            if feeder is not None:
                # the feeder thread closes both ends itself once it has flushed; closing them here too raced
                # with it (EBADF in the thread, or worse, closing a descriptor number reused meanwhile)
                feeder.join(timeout=1.0)
                continue
            # no feeder (this process never put anything): nothing else will close the ends before the queue
            # is collected
            for end in (getattr(q, "_reader", None), getattr(q, "_writer", None)):
                if end is not None:
                    end.close()
        except Exception:  # noqa: BLE001 - best effort
            pass
    for close in w.closers:
        try:
            close()
        except Exception:  # noqa: BLE001 - best effort
            pass
    w.closers = []
    pids = [p.pid for p in w.procs]
    for p in w.procs:  # release each process's sentinel pipe now, not when a held handle is collected
        try:
            p.close()
        except Exception:  # noqa: BLE001 - still running after kill: keep it
            pass
    w.pids = pids
