"""Builder-mode throughput on devices of different (SIMULATED) speeds: how close each policy x backend gets to
the sum of the devices' solo rates.

Workload (modeled device time, so the numbers do not depend on the host CPU): a tiny MLP on a 2-D toy task,
and every 16-sample batch sleeps 40 ms inside ``train_fn``. ``simulate_speeds`` then stretches each worker's
batch time to ``time / speed`` (a SIMULATION of a slower device), so at speeds [1.0, 0.4] a fast batch takes
~40 ms and a slow one ~100 ms.

Efficiency = (samples / training time of the 2-worker run) / (solo rate of the fast device + solo rate of the
slow device); the solo rates are measured in the same invocation by single-device runs of the same workload at
the same simulated speed (and the same intra-op thread count as each worker), taking the faster of two epochs.
Training time is the sum of the epochs' ``epoch_ms`` (worker start-up excluded). Plain synchronous data
parallelism (SYNC: equal split, average after every batch) should land near ``2 * 0.4 / 1.4 = 0.57``; CADENCE
and ASYNC aim at >= 0.90. The fast rank's batch share should be near ``1 / 1.4 = 0.714``.

Usage: ``python benchmarks/bench_builder.py [--epochs 4] [--batches 48] [--ms 40] [--json out.json]``

Big model (``--model bag32m``): an ``EmbeddingBag(250_000, 128)`` + ``Linear(128, 4)`` classifier (32.0M
parameters, 128 MB in fp32) on 16-token rows, real compute (no modeled sleep, speeds [1.0, 1.0] unless given).
A batch is cheap to compute but its dense gradient and optimizer step touch every parameter, and averaging
moves the whole model: this is where the builder's own overhead shows. For it, and for every row of the toy
run, the table also reports

- worker idle fraction = 1 - busy / span per worker, where busy sums each batch's time from the start of
  ``train_fn`` (stamped by ``train_fn`` itself) to the end of the optimizer step (stamped by an optimizer step
  post-hook), divided by the worker's simulated speed (the SIMULATED slowdown sleep comes after the step and
  is compute time), and span runs from the worker's first batch start to its last batch end; both are written
  by the worker to a per-pid file;
- the engine's own account (``.timeline()``, ``flodl_hf.builder.timeline.summarize``) per worker: ``wait`` = the
  fraction of its span spent neither loading and computing batches nor averaging (throttles, waiting for work
  or for an average: what "idle" means for the acceptance target), and ``sync`` = the fraction spent taking
  snapshots or all-reducing and applying averages. The outside figure above also counts data loading and
  collation (before ``train_fn``) as idle;
- peak memory: VmHWM of the caller and of each worker pid (``/proc/<pid>/status``, polled until ``join``), in
  MB and as a multiple of the model's fp32 size. VmHWM counts shared-memory pages (the CPU backend's slots) in
  every process that touches them, so the table also gives the peak of the processes' summed PSS (each shared
  page divided among its users): the machine's real footprint. The caller's VmHWM is the bench process's peak
  over its whole life, earlier runs included.

Command for the 32M figures (CPU backend, CADENCE and ASYNC, no solo runs):
``python benchmarks/bench_builder.py --model bag32m --policies CADENCE ASYNC --backends CPU --no-solo
--epochs 2 --batches 48``
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from flodl_hf import ApplyPolicy, AverageBackend, Trainer  # noqa: E402

BATCH = 16


class Points(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 2, generator=g)
        self.y = (self.x[:, 0] + 0.5 * self.x[:, 1] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def make_model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to(device)


class BagRows(torch.utils.data.Dataset):
    """Rows of 16 random token ids below ``vocab``; label = first token mod 4 (one big tensor: cheap to
    pickle)."""

    def __init__(self, n: int, vocab: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, 16), generator=g)
        self.y = self.ids[:, 0] % 4

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        return self.ids[i], self.y[i]


class BagClassifier(torch.nn.Module):
    """Mean token embedding, then a linear layer (``vocab * dim + dim * 4 + 4`` parameters)."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(vocab, dim, mode="mean")
        self.head = torch.nn.Linear(dim, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(ids))


BAG_VOCAB, BAG_DIM = 250_000, 128


def make_bag_model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return BagClassifier(BAG_VOCAB, BAG_DIM).to(device)


_LAST_START: Optional[float] = None  # per worker process: perf_counter at the start of the current train_fn


def train_step(model: torch.nn.Module, batch, ms: float) -> torch.Tensor:
    global _LAST_START
    _LAST_START = time.perf_counter()
    if ms:
        time.sleep(ms / 1000.0)  # modeled device time of one batch
    x, y = batch
    return F.cross_entropy(model(x), y)


def _stamp_step_end(timing_dir: Optional[str], optimizer: Any, args: Any, kwargs: Any) -> None:
    """Optimizer step post-hook: append ``train_fn start, step end`` (perf_counter s) to the worker's file."""
    if timing_dir is None or _LAST_START is None:
        return
    with open(os.path.join(timing_dir, f"t{os.getpid()}.log"), "a") as fh:
        fh.write(f"{_LAST_START:.6f} {time.perf_counter():.6f}\n")


def optimizer(params: Any, timing_dir: Optional[str] = None) -> torch.optim.Optimizer:
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if timing_dir is not None:
        opt.register_step_post_hook(functools.partial(_stamp_step_end, timing_dir))
    return opt


def idle_fractions(timing_dir: str, pids: list[int], speeds: list[float]) -> list[Optional[float]]:
    """Per worker (rank order): 1 - busy / span from its timing file (None if it logged nothing)."""
    out: list[Optional[float]] = []
    for rank, pid in enumerate(pids):
        path = os.path.join(timing_dir, f"t{pid}.log")
        if not os.path.exists(path):
            out.append(None)
            continue
        with open(path) as fh:
            spans = [tuple(map(float, ln.split())) for ln in fh if ln.strip()]
        if not spans:
            out.append(None)
            continue
        busy = sum(e - s for s, e in spans) / speeds[rank]
        span = max(e for _, e in spans) - min(s for s, _ in spans)
        last = spans[-1][1] - spans[-1][0]
        span += last * (1.0 / speeds[rank] - 1.0)  # the last batch's simulated sleep ends the worker's span
        out.append(max(0.0, 1.0 - busy / span) if span > 0 else None)
    return out


def _proc_mb(pid: Any, filename: str, key: str) -> Optional[float]:
    """A ``key:  N kB`` line of ``/proc/<pid>/<filename>`` in MB, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/{filename}") as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def vm_hwm_mb(pid: Any = "self") -> Optional[float]:
    """Peak resident set size (VmHWM) of a process in MB, or None if it is gone."""
    return _proc_mb(pid, "status", "VmHWM:")


def pss_mb(pid: Any = "self") -> Optional[float]:
    """Proportional set size of a process in MB (shared pages divided among the processes mapping them)."""
    return _proc_mb(pid, "smaps_rollup", "Pss:")


def accuracy(model: torch.nn.Module) -> float:
    data = Points(2000, seed=99)
    with torch.no_grad():
        return float((model(data.x).argmax(1) == data.y).float().mean())


def run(args, devices, speeds, epochs, batches, policy=ApplyPolicy.CADENCE, backend=AverageBackend.NCCL):
    """One builder run: (samples/s, metrics, state, probe), where probe holds idle and memory figures."""
    bag = args.model == "bag32m"
    timing_dir = tempfile.mkdtemp(prefix="flodl-bench-")
    data = BagRows(batches * BATCH, BAG_VOCAB) if bag else Points(batches * BATCH)
    b = (
        Trainer.builder(
            make_bag_model if bag else make_model,
            functools.partial(optimizer, timing_dir=timing_dir),
            functools.partial(train_step, ms=args.ms),
        )
        .dataset(data)
        .batch_size(BATCH)
        .num_epochs(epochs)
        .devices(devices)
        .simulate_speeds(speeds)
        .policy(policy)
        .backend(backend)
        .anchor(args.anchor)
        .progress(False)
        .start_method(args.start_method)
        .timeline()
    )
    base_pss = pss_mb() or 0.0
    handle = b.run()
    pids = [p for p in handle.worker_pids if p is not None]
    peaks: dict[int, float] = {}
    pss_peak = 0.0
    while not handle.done:  # VmHWM only grows: the last reading before a worker exits is its peak
        for pid in pids:
            v = vm_hwm_mb(pid)
            if v is not None:
                peaks[pid] = max(peaks.get(pid, 0.0), v)
        if pids:
            total = sum(v for v in (pss_mb(pid) for pid in [*pids, "self"]) if v is not None) - base_pss
            pss_peak = max(pss_peak, total)
        time.sleep(0.2)
    caller_mb = vm_hwm_mb()
    state = handle.join(timeout=900)
    metrics = handle.metrics
    samples = sum(m.samples for m in metrics)
    seconds = sum(m.epoch_ms for m in metrics) / 1000.0
    model_mb = sum(v.numel() * 4 for v in state.state_dict().values()) / 2**20
    from flodl_hf.builder.timeline import summarize

    engine = summarize(handle.timeline())
    probe = {
        "engine_wait": [engine[r]["idle"] / engine[r]["span"] if engine.get(r, {}).get("span") else None
                        for r in range(len(pids))],
        "engine_sync": [(engine[r].get("sync", 0.0) + engine[r].get("apply", 0.0)) / engine[r]["span"]
                        if engine.get(r, {}).get("span") else None for r in range(len(pids))],
        "pss_peak_mb": pss_peak if pids else None,
        "idle": idle_fractions(timing_dir, pids, list(speeds)) if pids else [],
        "worker_peak_mb": [peaks.get(p) for p in pids],
        "caller_peak_mb": caller_mb,
        "model_fp32_mb": model_mb,
    }
    shutil.rmtree(timing_dir, ignore_errors=True)
    return samples / seconds, metrics, state, probe


def _fmt_probe(probe: dict) -> str:
    idle = ", ".join("-" if v is None else f"{v:.3f}" for v in probe["idle"])
    m = probe["model_fp32_mb"]

    def mb(v: Optional[float]) -> str:  # the multiple of the model's size says little for a tiny model
        return "-" if v is None else f"{v:.0f} MB" + (f" ({v / m:.1f}x model)" if m >= 1.0 else "")

    workers = ", ".join(mb(v) for v in probe["worker_peak_mb"])

    def fr(vals: list) -> str:
        return ", ".join("-" if v is None else f"{v:.3f}" for v in vals)

    return (f"engine: wait [{fr(probe['engine_wait'])}] sync [{fr(probe['engine_sync'])}]  outside train_fn/step "
            f"[{idle}]\n         peak workers [{workers}]  caller {mb(probe['caller_peak_mb'])}  "
            f"run's PSS sum {mb(probe['pss_peak_mb'])}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batches", type=int, default=48, help="batches per epoch")
    p.add_argument("--model", default="toy", choices=["toy", "bag32m"], help="toy MLP or 32M EmbeddingBag")
    p.add_argument(
        "--ms", type=float, default=None, help="modeled device ms per batch at speed 1.0 (toy 40, bag32m 0)"
    )
    p.add_argument("--speeds", type=float, nargs=2, default=None, help="default [1.0, 0.4] (toy), [1.0, 1.0]")
    names = [x.name for x in ApplyPolicy]
    p.add_argument("--policies", nargs="+", default=names, choices=names)
    names = [x.name for x in AverageBackend]
    p.add_argument("--backends", nargs="+", default=names, choices=names)
    p.add_argument("--no-solo", action="store_true", help="skip the solo runs (no efficiency column)")
    p.add_argument("--anchor", type=int, default=10)
    p.add_argument("--start-method", default="forkserver", choices=["spawn", "forkserver"])
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args()
    bag = args.model == "bag32m"
    if args.ms is None:
        args.ms = 0.0 if bag else 40.0
    if args.speeds is None:
        args.speeds = [1.0, 1.0] if bag else [1.0, 0.4]
    if bag:
        print(f"model: EmbeddingBag({BAG_VOCAB}, {BAG_DIM}) + Linear({BAG_DIM}, 4), real compute", flush=True)

    print(
        f"SIMULATION: speeds {args.speeds}, {args.ms:.0f} ms modeled per {BATCH}-sample batch, "
        f"{args.epochs} epochs x {args.batches} batches",
        flush=True,
    )
    # Solo runs happen in this process (single-device builder runs are in-process): give it the intra-op
    # threads each of the 2 workers gets, so solo and shared runs do the same work the same way.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    solo = []
    for s in [] if args.no_solo else args.speeds:
        _, metrics, _, _ = run(args, ["cpu"], [s], 2, args.batches)
        rate = max(m.samples * 1000.0 / m.epoch_ms for m in metrics)  # the better epoch: a conservative ideal
        solo.append(rate)
        print(f"solo rate at speed {s}: {rate:.1f} samples/s", flush=True)
    ideal = sum(solo) if solo else None
    rows = []
    for policy in [ApplyPolicy[n] for n in args.policies]:
        for backend in [AverageBackend[n] for n in args.backends]:
            t0 = time.perf_counter()
            rate, metrics, state, probe = run(
                args, ["cpu", "cpu"], args.speeds, args.epochs, args.batches, policy, backend
            )
            calibrated = metrics[1:] or metrics
            share = sum(m.per_rank_batch_share[0] for m in calibrated) / len(calibrated)
            row = {
                "policy": policy.name,
                "backend": backend.name,
                "samples_per_s": rate,
                "efficiency": rate / ideal if ideal else None,
                "fast_share": share,
                "anchor": metrics[-1].anchor,
                "rounds": state.rounds,
                "accuracy": None if bag else accuracy(state.load_into(make_model(torch.device("cpu")))),
                "wall_s": time.perf_counter() - t0,
                **probe,
            }
            rows.append(row)
            print(
                f"{policy.name:8s} {backend.name:5s} {rate:7.1f} samples/s  "
                + (f"efficiency {row['efficiency']:.3f}  " if ideal else "")
                + f"fast share {share:.3f}  anchor {row['anchor']:3d}  rounds {state.rounds:4d}  "
                + (f"acc {row['accuracy']:.3f}  " if row["accuracy"] is not None else "")
                + f"({row['wall_s']:.1f} s)\n         {_fmt_probe(probe)}",
                flush=True,
            )
    if ideal:
        print(
            f"ideal (sum of solo rates): {ideal:.1f} samples/s; theory for SYNC: "
            f"{2 * min(args.speeds) / sum(args.speeds):.3f}; "
            f"fast share target {1 / (1 + min(args.speeds)):.3f}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {"model": args.model, "solo": solo, "speeds": args.speeds, "ms": args.ms, "rows": rows},
                fh,
                indent=2,
            )


if __name__ == "__main__":
    main()
