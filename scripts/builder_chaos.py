"""Chaos and soak harness for builder mode: many seeded runs of random policy x backend x world x model size x
dataset size and shape x (optional) SIGKILL of a worker x optional settings, each judged from the outside.

Why it exists: the builder's own tests run a few hand-picked tiny cases in the test process; the defects that
matter (a segfaulting caller, a hang, lost or doubled batches, leaked processes, file descriptors, shared
memory or sockets) show up with big models, big datasets, odd settings and dying workers. Here every run's
caller is its own subprocess under ``ulimit -n 1024`` and a hard timeout, so a crash (rc -11 / 139) or a hang
is a reported outcome, not the harness's death. Coverage is checked against the indices the workers' own
``train_fn`` logged (see ``chaos_workload.py``), not against the engine's metrics.

Usage::

    python scripts/builder_chaos.py --runs 50 --seed 0 [--max-params 32e6] [--max-rows 100000] [--out DIR]

Outcome classes: ok, clear-error (expected: a killed worker under the NCCL backend must fail the run with a
``DistributedError`` naming it), and the bad ones: caller-crash, hang, wrong-coverage, leak, unexpected-error.
One line per run, then a table of counts; results JSON in ``--out``; exit status 1 if any run is bad.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

__all__ = ["RunConfig", "draw_config", "execute", "BAD_OUTCOMES", "OUTCOMES", "main"]

OUTCOMES = ("ok", "clear-error", "caller-crash", "hang", "wrong-coverage", "leak", "unexpected-error")
BAD_OUTCOMES = frozenset(OUTCOMES[2:])
FD_LIMIT = 1024
FD_GROWTH_LIMIT = 32  # the forkserver, resource tracker and queue pipes legitimately keep some caller fds
# (name, vocab, dim, batches-per-epoch range, modeled ms per batch); classes are always 4
SIZES = [
    ("tiny", 2_000, 16, (60, 200), 3.0),
    ("small", 20_000, 64, (40, 120), 2.0),
    ("medium", 100_000, 128, (20, 60), 0.0),
    ("large", 250_000, 128, (20, 40), 0.0),
]
ROWS = [1_000, 5_000, 20_000, 100_000]
CLASSES = 4
SEQ_LEN = 16


@dataclass
class RunConfig:
    """One run of the harness (drawn by :func:`draw_config`, or written by hand in tests)."""

    seed: int
    policy: str = "CADENCE"  # ApplyPolicy name
    backend: str = "CPU"  # AverageBackend name
    world: int = 2
    size: str = "tiny"
    vocab: int = 2_000
    dim: int = 16
    rows: int = 1_000
    batch_size: int = 10
    epochs: int = 1
    shape: str = "tensor"  # chaos_workload.DATASET_SHAPES
    optimizer: str = "sgd"  # "sgd" | "adamw" (+ linear warmup scheduler)
    sleep_ms: float = 0.0
    kill: Optional[str] = None  # None | "self" (train_fn SIGKILLs itself) | "external" (caller kills a pid)
    kill_at: int = 0  # "self": the victim's n-th batch
    kill_delay_s: float = 0.0  # "external": after the victim's first logged batch
    kill_rank: int = 0  # "external": which worker
    anchor: Optional[int] = None
    max_batch_diff: Optional[int] = None
    round_timeout_s: Optional[float] = None
    speeds: Optional[list[float]] = None
    start_method: str = "forkserver"
    timeout_s: float = 30.0  # builder .timeout (collectives)
    run_timeout_s: float = 150.0  # the caller's join budget; the harness adds a margin on top

    @property
    def params(self) -> int:
        return self.vocab * self.dim + self.dim * CLASSES + CLASSES

    @property
    def batches_per_epoch(self) -> int:
        return self.rows // self.batch_size

    def label(self) -> str:
        extra = []
        if self.kill:
            extra.append(f"kill={self.kill}")
        if self.anchor is not None:
            extra.append(f"anchor={self.anchor}")
        if self.max_batch_diff is not None:
            extra.append(f"mbd={self.max_batch_diff}")
        if self.round_timeout_s is not None:
            extra.append(f"rt={self.round_timeout_s:g}")
        if self.speeds is not None:
            extra.append(f"speeds={self.speeds}")
        return (
            f"{self.policy}/{self.backend} w{self.world} {self.size}({self.params / 1e6:.1f}M) "
            f"{self.rows}x{self.shape} B{self.batch_size} E{self.epochs} {self.optimizer} " + " ".join(extra)
        ).strip()


def draw_config(seed: int, max_params: float = 32e6, max_rows: int = 100_000) -> RunConfig:
    """A seeded random run: every choice comes from ``random.Random(seed)``."""
    rng = random.Random(seed)
    sizes = [s for s in SIZES if s[1] * s[2] <= max_params] or SIZES[:1]
    name, vocab, dim, (lo, hi), ms = rng.choice(sizes)
    rows = rng.choice([r for r in ROWS if r <= max_rows] or [min(ROWS)])
    nb = rng.randint(lo, min(hi, rows // 2))
    batch = max(1, rows // nb)
    if rows % batch == 0 and batch > 1:
        batch -= 1  # keep an incomplete last batch (dropped) in most runs
    world = rng.choice([2, 3])
    cfg = RunConfig(
        seed=seed,
        policy=rng.choice(["SYNC", "CADENCE", "ASYNC"]),
        backend=rng.choice(["NCCL", "CPU"]),
        world=world,
        size=name,
        vocab=vocab,
        dim=dim,
        rows=rows,
        batch_size=batch,
        epochs=rng.choice([1, 2]),
        shape=rng.choice(["tensor", "items", "dicts"]),
        optimizer=rng.choice(["sgd", "adamw"]),
        sleep_ms=ms,
    )
    per_worker = max(1, cfg.batches_per_epoch * cfg.epochs // world)
    if rng.random() < 0.3:
        cfg.kill = rng.choice(["self", "external"])
        cfg.kill_at = rng.randint(1, max(1, per_worker // 2))
        cfg.kill_rank = rng.randrange(world)
        cfg.kill_delay_s = round(rng.uniform(0.0, 3.0), 2)
    if rng.random() < 0.4:
        cfg.anchor = rng.randint(1, 20)
    if rng.random() < 0.25:
        cfg.max_batch_diff = rng.randint(1, 5)
    if rng.random() < 0.3:
        cfg.round_timeout_s = round(rng.uniform(0.5, 5.0), 2)
    if rng.random() < 0.3:
        cfg.speeds = [1.0, 0.4, 0.7][:world]
    return cfg


# -- the caller (a subprocess per run) -----------------------------------------------------------------------
def _fd_targets() -> dict[str, str]:
    """fd -> what it points at (``pipe:[..]``, ``socket:[..]``, ``/dev/shm/..``, a path) for this process."""
    out = {}
    for n in os.listdir("/proc/self/fd"):
        try:
            out[n] = os.readlink(f"/proc/self/fd/{n}")
        except OSError:
            continue
    return out


def _fd_kind(target: str) -> str:
    """``pipe``, ``socket``, ``anon_inode``, ``shm:torch`` (a torch shared-memory segment), ``shm:other``,
    or ``file``."""
    if target.startswith("/dev/shm/"):
        return "shm:torch" if target.startswith("/dev/shm/torch_") else "shm:other"
    if target.startswith("/"):
        return "file"
    return target.split(":")[0]


def _socket_inodes(pid: str = "self") -> set[str]:
    out = set()
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for n in names:
        try:
            target = os.readlink(os.path.join(base, n))
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def listening() -> dict[str, int]:
    """LISTEN TCP sockets on this machine: inode -> port (``/proc/net/tcp`` and ``tcp6``, state 0A)."""
    out: dict[str, int] = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A":
                out[f[9]] = int(f[1].rsplit(":", 1)[1], 16)
    return out


def _external_killer(cfg: RunConfig, pids: list[int], log_dir: str, info: dict, stop: Any) -> None:
    """Kill worker ``cfg.kill_rank`` ``kill_delay_s`` after its first logged batch (if it is still alive)."""
    victim = pids[cfg.kill_rank]
    log = os.path.join(log_dir, f"w{victim}.log")
    while not stop.is_set() and not os.path.exists(log):
        time.sleep(0.02)
    if stop.wait(cfg.kill_delay_s):
        return
    try:
        os.kill(victim, signal.SIGKILL)
        info["kill_time"] = time.time()
        info["victim_pid"] = victim
    except ProcessLookupError:
        pass


def child_main(cfg_path: str) -> None:  # noqa: C901 - one linear script of a run
    """Run one builder job as the caller; write ``result.json`` next to ``cfg_path``."""
    import functools
    import gc
    import threading

    sys.path.insert(0, HERE)
    sys.path.insert(1, REPO)
    import chaos_workload as wl

    from flodl_hf import ApplyPolicy, AverageBackend, DistributedError, Trainer

    run_dir = os.path.dirname(os.path.abspath(cfg_path))
    with open(cfg_path) as fh:
        cfg = RunConfig(**json.load(fh))
    log_dir = os.path.join(run_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    token = os.path.join(run_dir, "kill.token")
    ds = wl.build_dataset(cfg.shape, cfg.rows, cfg.vocab, SEQ_LEN, CLASSES, seed=cfg.seed)
    total = cfg.batches_per_epoch * cfg.epochs
    b = (
        Trainer.builder(
            functools.partial(wl.make_model, vocab=cfg.vocab, dim=cfg.dim, classes=CLASSES),
            functools.partial(
                wl.make_optimizer, kind=cfg.optimizer, lr=0.05 if cfg.optimizer == "sgd" else 1e-3
            ),
            functools.partial(
                wl.train_step,
                log_dir=log_dir,
                kill_at=cfg.kill_at if cfg.kill == "self" else None,
                kill_token=token if cfg.kill == "self" else None,
                sleep_ms=cfg.sleep_ms,
            ),
        )
        .dataset(ds)
        .batch_size(cfg.batch_size)
        .num_epochs(cfg.epochs)
        .policy(ApplyPolicy[cfg.policy])
        .backend(AverageBackend[cfg.backend])
        .devices(["cpu"] * cfg.world)
        .seed(cfg.seed)
        .timeout(cfg.timeout_s)
        .progress(False)
        .start_method(cfg.start_method)
    )
    if cfg.optimizer == "adamw":
        b.scheduler(functools.partial(wl.linear_warmup, warmup=max(1, total // 10), total=total))
    if cfg.anchor is not None:
        b.anchor(cfg.anchor)
    if cfg.max_batch_diff is not None:
        b.max_batch_diff(cfg.max_batch_diff)
    if cfg.round_timeout_s is not None:
        b.round_timeout(cfg.round_timeout_s)
    if cfg.speeds is not None:
        b.simulate_speeds(cfg.speeds)

    gc.collect()
    fds0 = _fd_targets()
    res: dict[str, Any] = {
        "fd_before": len(fds0),
        "listen_before": sorted(_socket_inodes() & set(listening())),
    }
    kill_info: dict[str, Any] = {}
    stop = threading.Event()
    t0 = time.time()
    pids: list[int] = []
    try:
        handle = b.run()
        pids = [int(p) for p in handle.worker_pids if p is not None]
        with open(os.path.join(run_dir, "pids.json"), "w") as fh:
            json.dump(pids, fh)
        if cfg.kill == "external":
            threading.Thread(
                target=_external_killer, args=(cfg, pids, log_dir, kill_info, stop), daemon=True
            ).start()
        # A hang is no progress, not a slow run: on a loaded 2-core machine a 32M-parameter AdamW run held in
        # lockstep by max_batch_diff=1 legitimately takes longer than any fixed budget. The run fails as hung
        # when no worker logged a batch and no epoch finished for run_timeout_s (and in any case after 4x it).
        def progress() -> int:
            return sum(os.path.getsize(os.path.join(log_dir, f)) for f in os.listdir(log_dir))

        start = last_move = time.monotonic()
        seen = progress()
        epochs = []
        while True:
            try:
                m = handle.next_metrics(timeout=5.0)
            except TimeoutError:
                now, size = time.monotonic(), progress()
                if size != seen:
                    seen, last_move = size, now
                if now - last_move > cfg.run_timeout_s or now - start > 4 * cfg.run_timeout_s:
                    raise TimeoutError(
                        f"no progress for {now - last_move:.0f} s ({now - start:.0f} s into the run)"
                    ) from None
                continue
            if m is None:
                break
            last_move = time.monotonic()
            epochs.append(m.epoch)
        state = handle.join(timeout=cfg.run_timeout_s)
        res.update(status="ok", epochs=epochs, lost_ranks=list(state.lost_ranks), rounds=state.rounds)
    except TimeoutError as exc:
        res.update(status="hang", error=f"TimeoutError: {exc}")
        try:
            handle.cancel()
            handle.join(timeout=15)
        except BaseException:  # noqa: BLE001 - the run is already reported as a hang
            pass
    except DistributedError as exc:
        res.update(status="distributed-error", error=f"DistributedError: {exc}")
    except BaseException as exc:  # noqa: BLE001 - any other failure is reported, not raised
        res.update(status="error", error=f"{type(exc).__name__}: {exc}"[:4000])
    res["end_time"] = time.time()
    res["elapsed_s"] = res["end_time"] - t0
    stop.set()
    try:
        res["lost_ranks_handle"] = list(handle.lost_ranks)
    except BaseException:  # noqa: BLE001 - no handle (run() raised)
        pass
    res["pids"] = pids
    alive = []
    for _ in range(50):  # the handle's join reaps its workers: give a killed-run teardown 5 s at most
        alive = [p for p in pids if _pid_alive(p)]
        if not alive:
            break
        time.sleep(0.1)
    res["workers_alive_after_join"] = alive
    res.update(kill_info)
    gc.collect()
    fds1 = _fd_targets()
    res["fd_after"] = len(fds1)
    grown = Counter(fds1.values()) - Counter(fds0.values())
    res["fd_new_kinds"] = dict(Counter(_fd_kind(t) for t in grown.elements()))
    res["listen_after"] = sorted(_socket_inodes() & set(listening()))
    with open(os.path.join(run_dir, "result.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    sys.stdout.flush()
    sys.stderr.flush()
    if res["status"] == "hang":
        os._exit(0)  # the run is stuck: do not wait for its threads at exit


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# -- the harness's side of a run -----------------------------------------------------------------------------
def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, start time) of every process."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
            out[int(name)] = (int(f[1]), f[19])
        except (OSError, IndexError, ValueError):
            continue
    return out


def _descendants(root: int, table: dict[int, tuple[int, str]]) -> dict[int, str]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, list(children.get(root, []))
    while todo:
        p = todo.pop()
        out[p] = table[p][1]
        todo.extend(children.get(p, []))
    return out


def _same_process_alive(pid: int, start: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            f = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return f[19] == start and f[0] != "Z"


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _read_batches(log_dir: str) -> dict[int, list[list[int]]]:
    """pid -> the batches (index lists) its train_fn logged; a torn last line (killed mid-write) is kept."""
    out: dict[int, list[list[int]]] = {}
    if not os.path.isdir(log_dir):
        return out
    for name in os.listdir(log_dir):
        if name.startswith("w") and name.endswith(".log"):
            with open(os.path.join(log_dir, name)) as fh:
                out[int(name[1:-4])] = [[int(x) for x in ln.split()] for ln in fh.read().splitlines() if ln]
    return out


def check_coverage(
    cfg: RunConfig, logs: dict[int, list[list[int]]], victim: Optional[int], complete: bool
) -> dict:
    """Judge the logged batches against the epochs' permutations (``seed + e``, as documented).

    Every logged batch must be one of the ``epochs * (rows // batch_size)`` (epoch, batch) slices; no survivor
    may log one twice (nor two survivors the same one); when the run succeeded every slice must be logged, and
    no index more than ``epochs`` times except for slices the killed worker also logged (re-dispatched).
    """
    sys.path.insert(0, REPO)
    from flodl_hf.elche.partition import epoch_permutation

    B, nb = cfg.batch_size, cfg.batches_per_epoch
    slices: dict[tuple[int, ...], tuple[int, int]] = {}
    for e in range(cfg.epochs):
        perm = epoch_permutation(cfg.rows, cfg.seed + e).tolist()
        for i in range(nb):
            slices[tuple(perm[i * B : (i + 1) * B])] = (e, i)
    seen: Counter = Counter()
    by_survivors: Counter = Counter()
    by_victim: set = set()
    foreign, torn = 0, 0
    index_count: Counter = Counter()
    for pid, batches in logs.items():
        for k, batch in enumerate(batches):
            key = slices.get(tuple(batch))
            if key is None:
                if pid == victim and k == len(batches) - 1 and len(batch) < B:
                    torn += 1
                else:
                    foreign += 1
                continue
            seen[key] += 1
            index_count.update(batch)
            if pid == victim:
                by_victim.add(key)
            else:
                by_survivors[key] += 1
    survivor_dups = sum(1 for c in by_survivors.values() if c > 1)
    redispatched = sum(1 for k, c in seen.items() if c > 1 and k in by_victim)
    missing = [k for k in slices.values() if seen[k] == 0] if complete else []
    over = sum(1 for c in index_count.values() if c > cfg.epochs)
    issues = []
    if foreign:
        issues.append(f"{foreign} logged batches are no (epoch, batch) slice of the permutations")
    if survivor_dups:
        issues.append(f"{survivor_dups} slices trained twice by survivors")
    if missing:
        issues.append(f"{len(missing)} of {len(slices)} slices never trained, e.g. {missing[:3]}")
    if victim is None and over:
        issues.append(f"{over} indices seen more than {cfg.epochs} times without any kill")
    expected = cfg.epochs * nb * B
    total = sum(index_count.values())
    if complete and victim is None and total != expected:
        issues.append(f"{total} samples trained, expected epochs * (N // B) * B = {expected}")
    return {
        "slices": len(slices),
        "logged_batches": sum(seen.values()),
        "samples": total,
        "expected_samples": expected,
        "redispatched_duplicates": redispatched,
        "torn_lines": torn,
        "issues": issues,
    }


def _tracker_warnings(path: str) -> list[str]:
    """multiprocessing's resource tracker lines ("leaked semaphore objects", ...) in the caller's output."""
    try:
        with open(path, errors="replace") as fh:
            return [ln.strip()[:200] for ln in fh if "resource_tracker: There appear" in ln]
    except OSError:
        return []


def _shm() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _owners(inodes: set[str], pids: set[int]) -> dict[str, int]:
    out = {}
    for p in pids:
        for ino in _socket_inodes(str(p)) & inodes:
            out[ino] = p
    return out


def execute(cfg: RunConfig, run_dir: str, margin_s: float = 60.0) -> dict:  # noqa: C901 - one judgement
    """Run ``cfg`` in a caller subprocess (``ulimit -n 1024``, hard timeout), then classify it."""
    os.makedirs(run_dir, exist_ok=True)
    cfg_path = os.path.join(run_dir, "config.json")
    with open(cfg_path, "w") as fh:
        json.dump(dataclasses.asdict(cfg), fh, indent=1)
    shm0, listen0 = _shm(), listening()
    out_f = open(os.path.join(run_dir, "caller.log"), "wb")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--child", cfg_path],
        stdout=out_f,
        stderr=subprocess.STDOUT,
        preexec_fn=_limit_fds,
        start_new_session=True,
        cwd=REPO,
    )
    tracked: dict[int, str] = {}
    hard = 5 * cfg.run_timeout_s + margin_s  # the child judges progress itself (no progress for run_timeout_s)
    rc: Optional[int] = None
    while True:
        tracked.update(_descendants(proc.pid, _proc_table()))
        rc = proc.poll()
        if rc is not None or time.monotonic() - t0 > hard:
            break
        time.sleep(0.5)
    timed_out = rc is None
    if timed_out:
        tracked.update(_descendants(proc.pid, _proc_table()))
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        rc = proc.wait()
    out_f.close()
    wall = time.monotonic() - t0
    result: dict[str, Any] = {}
    try:
        with open(os.path.join(run_dir, "result.json")) as fh:
            result = json.load(fh)
    except (OSError, ValueError):
        pass
    pids: list[int] = result.get("pids") or []
    if not pids and os.path.exists(os.path.join(run_dir, "pids.json")):
        with open(os.path.join(run_dir, "pids.json")) as fh:
            pids = json.load(fh)
    orphans: list[int] = []
    for _ in range(20):  # the forkserver and resource tracker exit once the caller is gone
        orphans = [p for p, st in tracked.items() if _same_process_alive(p, st)]
        if not orphans:
            break
        time.sleep(0.25)
    ours = {str(p) for p in tracked}
    leaked_shm = sorted(n for n in _shm() - shm0 if n.startswith("torch_") and n.split("_")[1] in ours)
    new_listen = {ino: port for ino, port in listening().items() if ino not in listen0}
    listen_owned = _owners(set(new_listen), set(orphans))
    if timed_out or orphans:
        for p in orphans:  # never leave our own debris behind
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # who was killed, and when
    victim: Optional[int] = None
    kill_time: Optional[float] = None
    token = os.path.join(run_dir, "kill.token")
    if cfg.kill == "self" and os.path.exists(token):
        with open(token) as fh:
            pid_s, when = fh.read().split()
        victim, kill_time = int(pid_s), float(when)
    elif cfg.kill == "external" and result.get("victim_pid"):
        victim, kill_time = int(result["victim_pid"]), float(result["kill_time"])
    victim_rank = pids.index(victim) if victim in pids else None
    status = result.get("status")
    cov = check_coverage(cfg, _read_batches(os.path.join(run_dir, "logs")), victim, complete=status == "ok")

    issues: list[str] = []
    outcome = "ok"
    if timed_out:
        outcome = "hang"
        issues.append(f"the caller did not exit within {hard:.0f} s (killed)")
    elif rc != 0 or not result:
        outcome = "caller-crash"
        issues.append(f"caller exit status {rc}" + (f" (signal {-rc})" if rc < 0 else "") + ", no result")
    elif status == "hang":
        outcome = "hang"
        issues.append(result.get("error", "join timed out"))
    elif status == "distributed-error":
        err = result.get("error", "")
        named = victim_rank is not None and f"worker {victim_rank} " in err
        latency = result["end_time"] - kill_time if kill_time is not None else None
        if cfg.backend == "NCCL" and named and latency is not None and latency <= cfg.timeout_s + 15:
            outcome = "clear-error"
        elif cfg.backend == "NCCL" and named:
            outcome = "hang"
            issues.append(f"the dead worker was reported {latency:.0f} s after the kill")
        else:
            outcome = "unexpected-error"
        issues.append(err.splitlines()[0][:300] if err else "DistributedError")
        if latency is not None:
            result["failure_latency_s"] = round(latency, 2)
    elif status == "error":
        outcome = "unexpected-error"
        issues.append(result.get("error", "")[:300])
    if status == "ok" and cfg.backend == "CPU" and victim_rank is not None:
        lost = result.get("lost_ranks", [])
        if lost and lost != [victim_rank]:
            issues.append(f"lost_ranks {lost}, but worker {victim_rank} was killed")
    if outcome in ("ok", "clear-error") and cov["issues"]:
        outcome = "wrong-coverage"
    issues.extend(cov["issues"])
    leaks = []
    if result.get("workers_alive_after_join"):
        leaks.append(f"workers alive after join: {result['workers_alive_after_join']}")
    if orphans:
        leaks.append(f"{len(orphans)} orphan processes after the caller exited: {orphans[:5]}")
    fd_delta = (result["fd_after"] - result["fd_before"]) if "fd_after" in result else None
    if fd_delta is not None and fd_delta > FD_GROWTH_LIMIT:
        leaks.append(f"caller fds grew by {fd_delta}")
    if result.get("listen_after") and set(result["listen_after"]) - set(result.get("listen_before", [])):
        leaks.append("the caller still holds a LISTEN socket")
    if listen_owned:
        leaks.append(f"LISTEN sockets left by our processes: {sorted(new_listen[i] for i in listen_owned)}")
    if leaked_shm:
        leaks.append(f"{len(leaked_shm)} /dev/shm files left: {leaked_shm[:3]}")
    if leaks and outcome in ("ok", "clear-error"):
        outcome = "leak"
    issues.extend(leaks)
    return {
        "seed": cfg.seed,
        "label": cfg.label(),
        "outcome": outcome,
        "issues": issues,
        "caller_rc": rc,
        "wall_s": round(wall, 1),
        "status": status,
        "error": result.get("error"),
        "fd_delta": fd_delta,
        "fd_before": result.get("fd_before"),
        "fd_new_kinds": result.get("fd_new_kinds"),
        "tracker_warnings": _tracker_warnings(os.path.join(run_dir, "caller.log")),
        "kill_happened": victim is not None,
        "victim_rank": victim_rank,
        "lost_ranks": result.get("lost_ranks"),
        "failure_latency_s": result.get("failure_latency_s"),
        "coverage": cov,
        "new_listen_ports_any_owner": sorted(new_listen.values()),
        "config": dataclasses.asdict(cfg),
        "run_dir": run_dir,
    }


def summary_line(i: int, r: dict) -> str:
    extra = "; ".join(r["issues"])[:240]
    dup = r["coverage"]["redispatched_duplicates"]
    return (
        f"[{i:3d}] seed {r['seed']:<5d} {r['outcome']:<16s} {r['wall_s']:6.1f}s fdΔ {r['fd_delta']!s:>4} "
        f"dup {dup} | {r['label']}" + (f" | {extra}" if extra else "")
    )


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--seed", type=int, default=0, help="run i uses seed + i")
    p.add_argument("--max-params", type=float, default=32e6)
    p.add_argument("--max-rows", type=int, default=100_000)
    p.add_argument("--out", default=None, help="directory for per-run files and results.json")
    p.add_argument("--run-timeout", type=float, default=150.0, help="caller's join budget per run (s)")
    p.add_argument("--start-method", default="forkserver", choices=["forkserver", "spawn"])
    p.add_argument("--backend", default=None, choices=["NCCL", "CPU"],
                   help="every run on this averaging backend (NCCL: the torch.distributed transport); default: drawn")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child_main(args.child)
        return 0
    out = os.path.abspath(args.out or f"chaos-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(out, exist_ok=True)
    results = []
    t0 = time.monotonic()
    for i in range(args.runs):
        cfg = draw_config(args.seed + i, args.max_params, args.max_rows)
        if args.backend is not None:  # the rest of the draw is the seed's, unchanged
            cfg = dataclasses.replace(cfg, backend=args.backend)
        cfg.run_timeout_s = args.run_timeout
        cfg.start_method = args.start_method
        r = execute(cfg, os.path.join(out, f"run{i:03d}-seed{cfg.seed}"))
        results.append(r)
        print(summary_line(i, r), flush=True)
        with open(os.path.join(out, "results.json"), "w") as fh:
            json.dump({"args": vars(args), "results": results}, fh, indent=1)
    counts = Counter(r["outcome"] for r in results)
    print(f"\n{len(results)} runs in {time.monotonic() - t0:.0f} s")
    print(f"{'outcome':<18s} count  seeds")
    for o in OUTCOMES:
        seeds = [r["seed"] for r in results if r["outcome"] == o]
        print(f"{o:<18s} {counts.get(o, 0):5d}  {seeds if o != 'ok' else ''}")
    print(f"results: {os.path.join(out, 'results.json')}")
    return 1 if any(r["outcome"] in BAD_OUTCOMES for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
