"""Judge ``examples/builder_multinode.sh``'s runs from outside: coverage, SYNC against one process, accuracies.

Why it exists: the multi-node example is the acceptance of builder mode on torch.distributed, and its verdict must
come from what the workers logged and what the runs saved, not from the engine's own metrics:

* every policy trained every batch of every epoch exactly once (the rows each rank logged, matched to the epoch's
  permutation);
* SYNC's model equals the one-process reference (``--reference``) to 1e-5;
* CADENCE and ASYNC reach SYNC's held-out accuracy within 0.02, printed with the gap's paired standard error (both
  models answered the same held-out rows), so that a reader sees how much of a gap the held-out set can resolve.

Usage: ``python scripts/check_multinode.py OUT [--rows N --epochs E --batch B]`` (the example's arguments). Prints
one line per check and exits 1 if any fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

__all__ = ["main"]


def coverage(run: Path, n: int, batch: int, epochs: int) -> str:
    """'' when every batch of every epoch was trained exactly once, else what is wrong."""
    from flodl_hf.elche.partition import epoch_permutation

    where = {}
    for e in range(epochs):
        perm = epoch_permutation(n, e).tolist()
        for b in range(n // batch):
            where[tuple(sorted(perm[b * batch:(b + 1) * batch]))] = (e, b)
    got: Counter = Counter()
    for f in sorted(run.glob("rank*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                got[where.get(tuple(sorted(json.loads(line))), "unknown")] += 1
    want = Counter({key: 1 for key in where.values()})
    if got == want:
        return ""
    return f"missing {sum((want - got).values())} batches, extra {sum((got - want).values())}"


def paired_se(a: dict, b: dict) -> float:
    """The standard error of ``a``'s accuracy minus ``b``'s, from their row-by-row answers on the same rows."""
    x = [int(i) - int(j) for i, j in zip(a["correct"], b["correct"])]
    n = len(x)
    mean = sum(x) / n
    var = sum((v - mean) ** 2 for v in x) / max(n - 1, 1)
    return (var / n) ** 0.5


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--rows", type=int, default=4000)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    a, _ = p.parse_known_args(argv)
    import torch
    from safetensors.torch import load_file

    out = Path(a.out)
    results = {d.name: json.loads((d / "result.json").read_text()) for d in out.iterdir()
               if (d / "result.json").exists()}
    failures = 0
    for policy in ("sync", "cadence", "async"):
        if policy not in results:
            print(f"{policy}: no result (the run failed; see its log)")
            failures += 1
            continue
        bad = coverage(out / policy, a.rows, a.batch, a.epochs)
        print(f"{policy}: coverage {'exact' if not bad else bad}; held-out accuracy {results[policy]['accuracy']:.4f}; "
              f"train {results[policy]['train_s']} s")
        failures += bool(bad)
    if "sync" in results and "reference" in results:
        got = load_file(str(out / "sync" / "state.safetensors"))
        ref = load_file(str(out / "reference" / "state.safetensors"))
        diff = max(float((got[k].double() - ref[k].double()).abs().max()) for k in ref)
        same = sorted(got) == sorted(ref) and all(torch.allclose(got[k], ref[k], rtol=1e-5, atol=1e-5) for k in ref)
        print(f"sync vs one process: largest difference {diff:.2e} ({'equal to 1e-5' if same else 'NOT equal'}); "
              f"reference accuracy {results['reference']['accuracy']:.4f}")
        failures += not same
    for policy in ("cadence", "async"):
        if policy in results and "sync" in results:
            gap = results["sync"]["accuracy"] - results[policy]["accuracy"]
            ok = gap <= 0.02
            spread = ""
            if len(results["sync"].get("correct", "")) == len(results[policy].get("correct", "")) > 0:
                spread = f" ± {paired_se(results['sync'], results[policy]):.4f} (paired standard error)"
            print(f"{policy} vs sync accuracy: {gap:+.4f}{spread} below, on {results[policy].get('eval_rows', '?')} "
                  f"held-out rows ({'within' if ok else 'NOT within'} 0.02)")
            failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
