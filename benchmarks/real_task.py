"""Time to accuracy on the real task: El Che against torch DDP, the packaged MiniLM on the packaged corpus.

Why it exists: the time-to-accuracy claim must hold on the real job, not on a tiny BERT and a toy task.
It runs ``flodl-hf bench --workload accuracy --model minilm`` (the same harness, in-process): 2 CPU ranks over
gloo, the packaged MiniLM fine-tuned on the packaged sentiment corpus (3 labels), AdamW 5e-5, max length 64,
batch 16 per rank, modes ``ddp`` and ``elche-setup`` (defaults).

Speeds [1.0, 0.4] stretch *real* compute (``--stretch``): first this script measures this machine's real forward
and backward time of a 16-sample MiniLM micro-batch (one thread, as each rank runs), then every rank at speed v
sleeps ``measured * b/16 * (1/v - 1)`` before each forward, in both modes alike (the fast rank sleeps nothing).
So the slow rank is 2.5x slower at the model's own compute, while the optimizer step and the collectives run at
this machine's speed in both modes.

Met when El Che reaches the held-out accuracy DDP ends at (the bench's default target) at least 1.5x sooner, and
its final accuracy is within 0.01 of DDP's.

Usage: ``python benchmarks/real_task.py [--output DIR] [--steps 100] [--eval-samples 300] [--repeats 1]``
(about 10-15 min on the 2-core machine; ``--steps 8 --eval-samples 40 --eval-every 4`` is a smoke run). Writes
DIR/{table.md,results.json,plot.png,summary.md}; exits 1 if a check is missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from flodl_hf.bench.harness import run_bench  # noqa: E402
from flodl_hf.bench.report import markdown_table, prepare_output, write_outputs  # noqa: E402
from flodl_hf.bench.settings import BenchSettings  # noqa: E402
from flodl_hf.bench.workloads import WorkloadSpec, build_workload  # noqa: E402


def measure_compute_ms(max_length: int, batch: int = 16, repeats: int = 6) -> float:
    """Median real forward + backward time of one ``batch``-sample MiniLM micro-batch here, on one thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        workload = build_workload(WorkloadSpec(model="minilm", train_samples=batch * (repeats + 2), eval_samples=8,
                                               seed=0, max_length=max_length))
        model = workload.build("cpu")
        times = []
        for k in range(repeats + 2):
            items = workload.train[k * batch:(k + 1) * batch]
            start = time.perf_counter()
            workload.loss(model, workload.collate(items), torch.device("cpu")).backward()
            times.append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
        return statistics.median(times[2:]) * 1000.0 * 16 / batch
    finally:
        torch.set_num_threads(threads)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", default="bench-results/real_task")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps of 2 x 16 samples (DDP)")
    p.add_argument("--eval-samples", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--compute-ms", type=float, default=None,
                   help="real compute per 16 samples in ms (default: measured here first)")
    args = p.parse_args()
    prepare_output(args.output)
    compute_ms = args.compute_ms if args.compute_ms is not None else measure_compute_ms(args.max_length)
    print(f"real compute of a 16-sample MiniLM micro-batch here: {compute_ms:.0f} ms (forward + backward, 1 thread)",
          flush=True)
    settings = BenchSettings(modes=("ddp", "elche-setup"), workload="accuracy", speeds=(1.0, 0.4), model="minilm",
                             device_ms=compute_ms, stretch=True, steps=args.steps, repeats=args.repeats,
                             eval_every=args.eval_every, eval_samples=args.eval_samples,
                             max_length=args.max_length, timeout_s=3600.0)
    result = run_bench(settings)
    write_outputs(result, args.output)
    table = markdown_table(result)
    modes = result["modes"]
    ddp, elche = modes.get("ddp", {}), modes.get("elche-setup", {})
    t_ddp, t_elche = ddp.get("time_to_target_s"), elche.get("time_to_target_s")
    a_ddp, a_elche = ddp.get("final_accuracy"), elche.get("final_accuracy")
    speedup = (t_ddp / t_elche) if (t_ddp and t_elche) else None
    checks = [("El Che reaches DDP's final accuracy >= 1.5x sooner", speedup is not None and speedup >= 1.5),
              ("final accuracy within 0.01 of DDP's",
               a_ddp is not None and a_elche is not None and abs(a_ddp - a_elche) <= 0.01)]
    fmt = lambda x, d=1: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    lines = [f"# Real task: MiniLM on the packaged corpus, 2 CPU ranks at speeds [1.0, 0.4] (real compute "
             f"{compute_ms:.0f} ms per 16 samples, stretched), {args.steps} steps", "",
             "| mode | time to DDP's final accuracy (s) | final accuracy | samples/s |", "|---|---|---|---|",
             f"| torch DDP | {fmt(t_ddp)} | {fmt(a_ddp, 3)} | {fmt(ddp.get('samples_per_s'))} |",
             f"| El Che (setup mode) | {fmt(t_elche)} | {fmt(a_elche, 3)} | {fmt(elche.get('samples_per_s'))} |",
             "", f"El Che / DDP time to accuracy: **{fmt(speedup, 2)}x**", "",
             "| check | met |", "|---|---|"] + [f"| {c} | {'yes' if ok else 'NO'} |" for c, ok in checks]
    summary = "\n".join(lines) + "\n"
    with open(os.path.join(args.output, "summary.md"), "w") as fh:
        fh.write(summary)
    print(table)
    print(summary)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
