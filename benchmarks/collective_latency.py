"""What one synchronisation costs on this machine: a small gloo all-reduce, back to back and after the ranks idle.

    python benchmarks/collective_latency.py [--worlds 2,4] [--idle-ms 60] [--iters 60] [--floats 21250]

Why it exists: the throughput bench (``benchmarks/setup_mode.py``) models device time by *sleeping*, so between
two synchronisations every rank is idle. On a small virtual machine an idle process (and its virtual CPU) takes
milliseconds to wake, and a ring all-reduce needs every rank awake. This script measures that cost with plain
``torch.distributed`` (no flodl-hf code in the timed path), so the bound it sets applies to every mode alike, DDP
included:

- **back to back**: the ranks call ``all_reduce`` in a tight loop (no idling);
- **after idle**: every rank sleeps ``idle_ms`` (staggered by up to 4 ms, as balanced El Che ranks finish), then
  calls ``all_reduce``; the figure is the time from the *last* rank's arrival to the last rank's completion, the
  synchronisation cost no scheduler can hide at one synchronisation per step.

It then prints the anchor-1 efficiency bound of the bench's four-rank case: El Che's integer split of the 64-sample
step at speeds [1.0, 0.8, 0.5, 0.3] (the slowest rank's modelled time), plus the measured real compute and the
after-idle synchronisation, against the ideal (the sum of the solo rates, each paying the same compute).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the rank launcher the tests use

from dist_helpers import run_ranks, values  # noqa: E402


def _rank(rank: int, world: int, idle_ms: float, iters: int, floats: int) -> dict:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        t = torch.zeros(floats)
        stamp = torch.zeros(2, dtype=torch.float64)
        gathered = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
        tight, after_idle = [], []
        for _ in range(iters):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            tight.append(time.perf_counter() - t0)
        for i in range(iters):
            time.sleep((idle_ms + 4.0 * ((rank + i) % world) / max(world - 1, 1)) / 1000.0)
            stamp[0] = time.perf_counter()
            dist.all_reduce(t)
            stamp[1] = time.perf_counter()
            dist.all_gather(gathered, stamp)  # perf_counter is CLOCK_MONOTONIC: comparable across processes
            after_idle.append(max(float(g[1]) for g in gathered) - max(float(g[0]) for g in gathered))
        warm = max(iters // 10, 1)
        return {"tight_ms": 1000 * statistics.median(tight[warm:]),
                "after_idle_ms": 1000 * statistics.median(after_idle[warm:])}
    finally:
        dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--idle-ms", type=float, default=60.0)
    p.add_argument("--iters", type=int, default=60)
    p.add_argument("--floats", type=int, default=21250, help="all-reduced floats (the bench MLP's gradient: 21,250)")
    p.add_argument("--compute-ms", type=float, default=1.8,
                   help="real compute + optimizer step of one step of the bench MLP (for the bound; solo pays it too)")
    args = p.parse_args()
    worlds = [int(w) for w in args.worlds.split(",") if w]
    if any(w < 2 for w in worlds) or args.iters < 2 or args.idle_ms < 0 or args.floats < 1:
        p.error("use worlds >= 2, --iters >= 2, --idle-ms >= 0 and --floats >= 1")
    print("| ranks | all-reduce back to back (ms) | after idling (ms, last arrival to done) |")
    print("|---|---|---|")
    measured = {}
    for w in worlds:
        res = values(run_ranks(_rank, w, args.idle_ms, args.iters, args.floats, timeout=300.0))
        tight = statistics.median(r["tight_ms"] for r in res)
        idle = statistics.median(r["after_idle_ms"] for r in res)
        measured[w] = idle
        print(f"| {w} | {tight:.2f} | {idle:.2f} |")
    if 4 in measured:
        speeds, step, ms16 = (1.0, 0.8, 0.5, 0.3), 64, 40.0
        split = [25, 20, 12, 7]  # El Che's integer split of 64 samples at these speeds (the bench's plan)
        slowest = max(b * ms16 / 16 / s for b, s in zip(split, speeds))
        # The ideal is the sum of the solo rates; a solo step (16 samples) pays the same real compute.
        ideal_ms = step / sum(16 / (ms16 / s + args.compute_ms) for s in speeds)
        bound = ideal_ms / (slowest + args.compute_ms + measured[4])
        print(f"\nFour-rank case at anchor 1: ideal {ideal_ms:.1f} ms per 64 samples; split {split} takes "
              f"{slowest:.1f} ms + {args.compute_ms:.1f} ms compute + {measured[4]:.1f} ms sync -> efficiency bound "
              f"{bound:.3f} (before any scheduler cost)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
