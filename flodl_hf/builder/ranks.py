"""Builder workers as torch.distributed ranks: started by the builder on one machine, or by ``torchrun`` on many.

Why it exists: the collective backend's workers used to be spawned children talking through ``multiprocessing``
queues and shared memory, which cannot leave one machine. Here a worker is a rank of a torch.distributed job whose
control plane is the job's c10d store (:mod:`~flodl_hf.builder.storebus`) and whose averages are the process
group's all-reduce (NCCL on GPUs, gloo on CPUs), so the same worker code runs

* **on one machine**, launched by the builder (:func:`start_store_workers`): the caller hosts a ``TCPStore`` and
  the coordinator thread and spawns one process per device, each connecting to that store as a rank;
* **under torchrun** (:class:`TorchrunRanks`), on any number of nodes: every process of the job runs the user's
  script, which builds the same ``DdpBuilder``; ``run()`` sees torchrun's environment and joins as rank ``RANK``
  on ``cuda:LOCAL_RANK`` (or the CPU), through torchrun's store. Rank 0 also hosts the coordinator, as a thread
  next to its worker. Nothing is pickled between ranks: each process built its own factories and dataset.

Liveness: every process beats a heartbeat in the store; the coordinator declares a rank lost when its heartbeat
stops for :data:`HEARTBEAT_TIMEOUT_S` and writes the run's one-line verdict to the store's ``abort`` key, which
every surviving rank reads and raises. A rank that loses the store (rank 0's node is gone) says so and stops.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import time
import uuid
from datetime import timedelta
from typing import Any, Callable, Optional

from ..distributed.errors import DistributedError
from .lifecycle import Workers, context, make_spec, start_all
from .settings import BuilderSettings
from .step import Recipe
from .storebus import (Heartbeat, Liveness, StoreBoard, StoreInbox, StoreLost, StoreQueue, command_queue,
                       event_queue, read_abort)

__all__ = ["HEARTBEAT_TIMEOUT_S", "torchrun_env", "start_store_workers", "spawned_main", "TorchrunRanks"]

#: A rank whose heartbeat has not moved for this long is lost (heartbeats beat every second).
HEARTBEAT_TIMEOUT_S = 10.0


def torchrun_env() -> Optional[dict[str, Any]]:
    """torchrun's description of this process (rank, world, local rank, store address), or None outside one."""
    env = os.environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")):
        return None
    try:
        return {
            "rank": int(env["RANK"]), "world": int(env["WORLD_SIZE"]), "local_rank": int(env["LOCAL_RANK"]),
            "host": env["MASTER_ADDR"], "port": int(env["MASTER_PORT"]),
            "agent_store": env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
            "run": f"{env.get('TORCHELASTIC_RUN_ID', 'run')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}",
        }
    except ValueError:
        return None


def connect(host: str, port: int, prefix: str, timeout_s: float, world: Optional[int] = None,
            master: bool = False) -> Any:
    """A client of the store at ``host:port`` (or, with ``master``, the store itself), under ``prefix``."""
    import torch.distributed as dist

    try:
        base = dist.TCPStore(host, port, world, master, timeout=timedelta(seconds=timeout_s),
                             wait_for_workers=False)
    except Exception as exc:  # noqa: BLE001 - any failure to reach the store means the same thing
        raise StoreLost(f"could not reach the run's store at {host}:{port} ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:160]}): check MASTER_ADDR / MASTER_PORT and that the first "
                        "node is up") from None
    return dist.PrefixStore(prefix, base)


def channels(store: Any, rank: int, world: int) -> tuple[StoreQueue, StoreQueue, StoreBoard]:
    """A worker's side of the control plane: its report queue, its command queue and the board (whose one read
    per pass also brings the command queue's count)."""
    cmds = command_queue(store, rank)
    board = StoreBoard(world, store)
    board.watch = cmds
    return event_queue(store, rank), cmds, board


def coordinator_channels(store: Any, world: int) -> tuple[StoreInbox, list[StoreQueue], StoreBoard]:
    """The coordinator's side, every key created before any worker reads it."""
    board = StoreBoard(world, store)
    board.init()
    cmds = [command_queue(store, r) for r in range(world)]
    for q in cmds:
        q.init()
    return StoreInbox(store, world), cmds, board


def rank_check(store: Any, rank: int, agent: Optional[int] = None) -> Callable[[], None]:
    """What a worker checks every second: the run's abort line, the coordinator's heartbeat, and (under torchrun)
    that its agent, the process that started it, is still its parent (a killed agent's workers are re-parented)."""
    watch = Liveness(store, ["coord"], HEARTBEAT_TIMEOUT_S)

    def check() -> None:
        if agent is not None and os.getppid() != agent:
            raise DistributedError(f"rank {rank}: its torchrun agent (pid {agent}) is gone; stopping")
        line = read_abort(store)
        if line is not None:
            raise DistributedError(line)
        silent = watch.silent()
        if silent:
            raise DistributedError(
                f"rank {rank}: the coordinator (rank 0) sent no heartbeat for {silent['coord']:.0f} s: its node "
                "is gone; stopping (resume from the last builder checkpoint with .resume_from)")

    return check


def spawned_main(rank: int, spec: Any, host: str, port: int, prefix: str) -> None:
    """Entry point of a worker process the builder spawned on this machine (store transport)."""
    from .worker import serve

    code = 0
    try:
        store = connect(host, port, prefix, spec.startup_timeout_s)
        beat = Heartbeat(store, str(rank))
        events, cmds, board = channels(store, rank, spec.world)
        try:
            serve(rank, spec, events, cmds, board, check=rank_check(store, rank), store=store)
        finally:
            beat.stop()
    except DistributedError as exc:  # the run's verdict, or the store is gone: one line, no traceback
        print(f"flodl-hf builder: worker {rank}: {exc}", file=sys.stderr, flush=True)
        code = 1
    except BaseException:  # noqa: BLE001 - serve() reported it to the coordinator
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def start_store_workers(s: BuilderSettings, recipe: Recipe, devices: list[str]) -> Workers:
    """Host a store and spawn one rank per device on this machine (the collective backend)."""
    import dataclasses

    import torch.distributed as dist

    from .data import pack_dataset

    world = len(devices)
    spec = make_spec(s, dataclasses.replace(recipe, dataset=pack_dataset(recipe.dataset)), devices)
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=spec.startup_timeout_s),
                           wait_for_workers=False)
    prefix = f"flodl-builder/{uuid.uuid4().hex}/"
    store = dist.PrefixStore(prefix, server)
    inbox, cmds, board = coordinator_channels(store, world)
    beat = Heartbeat(store, "coord")
    ctx = context(s)
    procs = [
        ctx.Process(target=spawned_main, args=(r, spec, "127.0.0.1", server.port, prefix), daemon=True,
                    name=f"flodl-hf-worker-{r}")
        for r in range(world)
    ]
    start_all(procs, recipe, on_failure=beat.stop)
    return Workers(procs, [], cmds, board, devices, spec.speeds, spec.startup_timeout_s, inbox=inbox, store=store,
                   closers=[beat.stop, lambda: server], peer_grace_s=3.0)


class RemoteRank:
    """A rank the coordinator cannot see as a process (another node): alive while its heartbeat moves."""

    def __init__(self, rank: int, watch: "RankWatch") -> None:
        self.rank = rank
        self.watch = watch
        self.pid: Optional[int] = None
        self.host: Optional[str] = None
        self.exitcode: Optional[int] = None

    def is_alive(self) -> bool:
        return self.watch.alive(self.rank)

    def describe(self) -> str:
        where = f" on {self.host}, pid {self.pid}" if self.host else ""
        silent = self.watch.silence(self.rank)
        return f"rank {self.rank}{where}: no heartbeat for {silent:.0f} s (its node or process is gone)"

    def join(self, timeout: Optional[float] = None) -> None:
        return None

    terminate = kill = close = join


class RankWatch:
    """The coordinator's view of every rank's heartbeat, read at most every 0.2 s."""

    def __init__(self, store: Any, world: int) -> None:
        self.live = Liveness(store.clone(), [str(r) for r in range(world)], HEARTBEAT_TIMEOUT_S)
        self._silent: dict[str, float] = {}
        self._read = 0.0

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._read >= 0.2:
            self._read = now
            self._silent = self.live.silent()

    def alive(self, rank: int) -> bool:
        self._refresh()
        return str(rank) not in self._silent

    def silence(self, rank: int) -> float:
        return self._silent.get(str(rank), 0.0)


class TorchrunRanks:
    """This process's part of a builder run under torchrun: its worker, and on rank 0 the coordinator.

    Has what :class:`~flodl_hf.builder.handle.DdpHandle` reads of a runner. Rank 0's ``join()`` returns the run's
    result (metrics, checkpoints and progress live there); another rank's returns its own replica after the final
    average, which every rank holds alike, with no metrics."""

    def __init__(self, s: BuilderSettings, recipe: Recipe, env: dict[str, Any], device: str) -> None:
        self.s = s
        self.env = env
        self.rank, self.world = env["rank"], env["world"]
        master = self.rank == 0 and not env["agent_store"]
        self.store = connect(env["host"], env["port"], f"flodl-builder/{env['run']}/", float(s.timeout_s),
                             world=self.world, master=master)
        self.beat = Heartbeat(self.store, str(self.rank))
        self.devices = self._gather_devices(device)
        per_node = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
        threads = os.environ.get("OMP_NUM_THREADS", "")  # torchrun sets 1 for several processes per node
        threads_n = (int(threads) if threads.isdigit() and int(threads) > 0
                     else max(1, (os.cpu_count() or 1) // per_node))
        self.spec = make_spec(s, recipe, self.devices, threads=threads_n, parent_pid=os.getppid())
        self.coordinator: Any = None
        if self.rank == 0:
            from .coordinator import Coordinator

            watch = RankWatch(self.store, self.world)
            inbox, cmds, board = coordinator_channels(self.store, self.world)
            workers = Workers(
                [RemoteRank(r, watch) for r in range(self.world)], [], cmds, board, self.devices,
                self.spec.speeds, self.spec.startup_timeout_s, inbox=inbox,
                store=self.store, closers=[Heartbeat(self.store, "coord").stop],
                peer_grace_s=HEARTBEAT_TIMEOUT_S + 2.0,
            )
            self.coordinator = Coordinator(s, workers)
        self.metrics: "queue.Queue[Any]" = self.coordinator.metrics if self.coordinator else queue.Queue()
        self.error: Optional[BaseException] = None
        self.result: Any = None
        self.procs: list[Any] = []
        self.workers = None
        self._cancelled = False

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @cancelled.setter
    def cancelled(self, flag: bool) -> None:
        self._cancelled = bool(flag)
        if self.coordinator is not None:
            self.coordinator.cancelled = bool(flag)

    # -- what the handle reads -------------------------------------------------------------------------------
    @property
    def lost(self) -> list[int]:
        return list(self.coordinator.lost) if self.coordinator else []

    @property
    def history(self) -> list[Any]:
        return list(self.coordinator.history) if self.coordinator else []

    @property
    def timeline(self) -> list[dict]:
        return list(self.coordinator.timeline) if self.coordinator else []

    def _gather_devices(self, device: str) -> list[str]:
        """Every rank's device, in rank order (each rank publishes its own; the group's backend needs all)."""
        self.store.set(f"dev/{self.rank}", f"{device}@{socket.gethostname()}")
        keys = [f"dev/{r}" for r in range(self.world)]
        try:
            self.store.wait(keys, timedelta(seconds=max(120.0, float(self.s.timeout_s))))
        except Exception as exc:  # noqa: BLE001 - a rank that never came
            raise DistributedError(f"not every rank of {self.world} joined the builder run within "
                                   f"{max(120.0, float(self.s.timeout_s)):.0f} s ({str(exc).splitlines()[0][:120]})"
                                   ) from None
        return [bytes(v).decode().split("@")[0] for v in self.store.multi_get(keys)]

    # -- the thread body -------------------------------------------------------------------------------------
    def run(self) -> None:
        coord = None
        if self.coordinator is not None:
            coord = threading.Thread(target=self.coordinator.run, name="flodl-hf-coordinator", daemon=True)
            coord.start()
        try:
            self.result = self._work()
        except BaseException as exc:  # noqa: BLE001 - handed to join()
            self.error = exc
        if coord is not None:
            coord.join()
            self.error = self.coordinator.error or self.error
            self.result = self.coordinator.result if self.coordinator.error is None else None
        else:
            self.metrics.put(None)
        self.beat.stop()

    def _work(self) -> Any:
        from .state import state_from_flat
        from .types import TrainedState
        from .worker import serve

        events, cmds, board = channels(self.store, self.rank, self.world)
        try:
            worker = serve(self.rank, self.spec, events, cmds, board,
                           check=rank_check(self.store, self.rank, agent=self.spec.parent_pid), store=self.store)
        except DistributedError:
            raise
        except BaseException as exc:
            # a collective failed: if a peer was lost, the coordinator's verdict names it (wait for it, bounded)
            deadline = time.monotonic() + HEARTBEAT_TIMEOUT_S + 5.0
            while time.monotonic() < deadline:
                try:
                    line = read_abort(self.store)
                except StoreLost as lost:
                    raise lost from None
                if line is not None:
                    raise DistributedError(line) from None
                time.sleep(0.2)
            raise exc
        line = read_abort(self.store)
        if line is not None:
            raise DistributedError(line)
        if not worker.finished:
            raise DistributedError(f"rank {self.rank}: the coordinator stopped the run before its end")
        layout = worker.state.layout
        flat = worker.state.flat_state()
        n = layout.param_numel
        state = state_from_flat(layout, flat[:n], flat[n:], worker.state.other_values())
        return TrainedState(state, world_size=self.world, devices=self.devices, rounds=worker.k,
                            epochs=int(self.s.num_epochs), global_step=worker.global_step)
