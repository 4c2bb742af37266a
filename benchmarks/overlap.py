"""Overlap of the window-end all-reduce with backward, on and off, on the packaged MiniLM (2 CPU ranks over gloo).

    python benchmarks/overlap.py [--rounds 2] [--steps 16] [--batch 16] [--max-length 64]

Why it exists: ``DdpConfig(overlap=True)`` must pay for itself on a model with several buckets (the packaged
MiniLM's 91 MB of fp32 gradients make 4 buckets of 25 MiB), not only stay exact. Each run trains the same rows
with the anchor fixed at 1 (one all-reduce per step), equal speeds, real compute, and reports the median time per
step after 3 warm-up steps and the median synchronisation time El Che measured after the backward pass (the part
of the reduction left on the critical path). Runs alternate on / off, each in fresh rank processes.

On a 2-core machine the two ranks' compute and gloo's reduction threads share the cores, so what overlap can hide
is bounded by idle core time; on GPUs the reduction runs on the network while the GPU computes.
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


def _rank(rank: int, world: int, overlap: bool, steps: int, batch: int, max_length: int) -> dict:
    import torch

    from flodl_hf import DdpConfig, Trainer
    from flodl_hf.bench.workloads import packaged_corpus
    from flodl_hf.defaults import CORPUS_LABELS, default_model_path
    from heads import AutoHeadForSequenceClassification

    corpus = packaged_corpus().subset(world * batch * steps, seed=0)
    torch.manual_seed(0)
    head = AutoHeadForSequenceClassification.from_pretrained(str(default_model_path()), labels=list(CORPUS_LABELS),
                                                             max_length=max_length)
    config, num_labels = head.config(), head.num_labels
    Trainer.setup_head_with(head, lambda dev: AutoHeadForSequenceClassification.on_device(config, num_labels, dev),
                            lambda ps: torch.optim.AdamW(ps, lr=5e-5, fused=True),
                            DdpConfig(verbose=False, overlap=overlap, fixed_anchor=1, timeout_s=300))
    graph = head.graph()
    graph.set_data_loader(corpus, batch_size=batch, collate_fn=head.collate)
    times, syncs, last = [], [], time.perf_counter()
    for enc, labels in graph.epoch(0):
        head.compute_loss(enc, labels).backward()
        graph.step()
        now = time.perf_counter()
        times.append(now - last)
        syncs.append(graph._runtime._last_sync_ms)  # the reduction left after backward (whitebox)
        last = now
    early = graph._runtime.overlap.launched_early if graph._runtime.overlap is not None else 0
    graph.close()
    return {"step_s": statistics.median(times[3:]), "sync_ms": statistics.median(syncs[3:]), "early": early}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--max-length", type=int, default=64)
    args = p.parse_args()
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for r in range(args.rounds):
        for overlap in ((True, False) if r % 2 == 0 else (False, True)):
            out = values(run_ranks(_rank, 2, overlap, args.steps, args.batch, args.max_length, timeout=1200))
            worst = max(out, key=lambda x: x["step_s"])
            runs[overlap].append(worst)
            print(f"round {r}: overlap={overlap}: {worst['step_s']:.3f} s/step, sync after backward "
                  f"{worst['sync_ms']:.0f} ms, buckets started during backward: {out[0]['early']}", flush=True)
    on = statistics.median(x["step_s"] for x in runs[True])
    off = statistics.median(x["step_s"] for x in runs[False])
    s_on = statistics.median(x["sync_ms"] for x in runs[True])
    s_off = statistics.median(x["sync_ms"] for x in runs[False])
    print(f"\nMiniLM, 2 CPU ranks, batch {args.batch} per rank, max length {args.max_length}, anchor 1, "
          f"{args.rounds} alternating round(s):\n\n| overlap | s/step | sync left after backward (ms) |\n"
          f"|---|---|---|\n"
          f"| on | {on:.3f} | {s_on:.0f} |\n| off | {off:.3f} | {s_off:.0f} |\n\non / off: {on / off:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
