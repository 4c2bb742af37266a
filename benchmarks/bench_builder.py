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
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

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


def train_step(model: torch.nn.Module, batch, ms: float) -> torch.Tensor:
    time.sleep(ms / 1000.0)  # modeled device time of one batch
    x, y = batch
    return F.cross_entropy(model(x), y)


optimizer = functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)


def accuracy(model: torch.nn.Module) -> float:
    data = Points(2000, seed=99)
    with torch.no_grad():
        return float((model(data.x).argmax(1) == data.y).float().mean())


def run(args, devices, speeds, epochs, batches, policy=ApplyPolicy.CADENCE, backend=AverageBackend.NCCL):
    b = (
        Trainer.builder(make_model, optimizer, functools.partial(train_step, ms=args.ms))
        .dataset(Points(batches * BATCH))
        .batch_size(BATCH)
        .num_epochs(epochs)
        .devices(devices)
        .simulate_speeds(speeds)
        .policy(policy)
        .backend(backend)
        .anchor(args.anchor)
        .progress(False)
        .start_method(args.start_method)
    )
    handle = b.run()
    state = handle.join(timeout=900)
    metrics = handle.metrics
    samples = sum(m.samples for m in metrics)
    seconds = sum(m.epoch_ms for m in metrics) / 1000.0
    return samples / seconds, metrics, state


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batches", type=int, default=48, help="batches per epoch")
    p.add_argument("--ms", type=float, default=40.0, help="modeled device ms per batch at speed 1.0")
    p.add_argument("--speeds", type=float, nargs=2, default=[1.0, 0.4])
    p.add_argument("--anchor", type=int, default=10)
    p.add_argument("--start-method", default="forkserver", choices=["spawn", "forkserver"])
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args()

    print(
        f"SIMULATION: speeds {args.speeds}, {args.ms:.0f} ms modeled per {BATCH}-sample batch, "
        f"{args.epochs} epochs x {args.batches} batches",
        flush=True,
    )
    # Solo runs happen in this process (single-device builder runs are in-process): give it the intra-op
    # threads each of the 2 workers gets, so solo and shared runs do the same work the same way.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    solo = []
    for s in args.speeds:
        _, metrics, _ = run(args, ["cpu"], [s], 2, args.batches)
        rate = max(m.samples * 1000.0 / m.epoch_ms for m in metrics)  # the better epoch: a conservative ideal
        solo.append(rate)
        print(f"solo rate at speed {s}: {rate:.1f} samples/s", flush=True)
    ideal = sum(solo)
    rows = []
    for policy in ApplyPolicy:
        for backend in AverageBackend:
            t0 = time.perf_counter()
            rate, metrics, state = run(
                args, ["cpu", "cpu"], args.speeds, args.epochs, args.batches, policy, backend
            )
            calibrated = metrics[1:] or metrics
            share = sum(m.per_rank_batch_share[0] for m in calibrated) / len(calibrated)
            row = {
                "policy": policy.name,
                "backend": backend.name,
                "samples_per_s": rate,
                "efficiency": rate / ideal,
                "fast_share": share,
                "anchor": metrics[-1].anchor,
                "rounds": state.rounds,
                "accuracy": accuracy(state.load_into(make_model(torch.device("cpu")))),
                "wall_s": time.perf_counter() - t0,
            }
            rows.append(row)
            print(
                f"{policy.name:8s} {backend.name:5s} {rate:7.1f} samples/s  "
                f"efficiency {row['efficiency']:.3f}  "
                f"fast share {share:.3f}  anchor {row['anchor']:3d}  rounds {state.rounds:4d}  "
                f"acc {row['accuracy']:.3f}  ({row['wall_s']:.1f} s)",
                flush=True,
            )
    print(
        f"ideal (sum of solo rates): {ideal:.1f} samples/s; theory for SYNC: "
        f"{2 * min(args.speeds) / sum(args.speeds):.3f}; fast share target {1 / (1 + min(args.speeds)):.3f}"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"solo": solo, "speeds": args.speeds, "ms": args.ms, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
