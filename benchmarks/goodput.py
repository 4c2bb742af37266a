"""Goodput El Che vs the throughput rule vs an anchor fixed at 1: time to a held-out accuracy, one command.

Why it exists: the goodput rule's figures (and AdaScale's, for ``lr_scaling="adascale"``) must be reproducible
with one command. It runs ``flodl-hf bench`` (the same harness, in-process) on the packaged MiniLM and the packaged
sentiment corpus, 2 CPU ranks over gloo, real compute (no modelled device time), default settings otherwise, modes
``elche-setup`` (the default goodput rule), ``elche-throughput`` (the earlier throughput rule), ``elche-anchor1``
(``fixed_anchor=1``) and ``elche-adascale`` (goodput with the LR following AdaScale's gain), in alternating rounds,
for two cases:

1. ``real-compute``: the machine's own synchronisation. Met when goodput's mean time to the target is at most the
   better of the other two plus the rounds' spread (half the range of that mode's times), and its final accuracy
   is within 0.01 of the anchor-1 run's.
2. ``slow-interconnect``: ``--sync-stretch`` (default 0.5, so sync >= 50 % of compute at anchor 1) models a slow
   link. Met when goodput reaches the target sooner than the anchor-1 run; for ``elche-adascale``, when
   in every round both reach the target and AdaScale's run reaches it sooner.

The default size is the one the figures were measured at: 20 steps of 2 x 16 samples (640 rows, one epoch), 200 held-out rows, max length 32,
target 0.60 held-out accuracy, 3 rounds; about 15-25 min (estimated from the smoke run: 18 runs of ~50 s).
``--steps 6 --eval-samples 40 --repeats 1`` is a smoke run of a few minutes. Evaluations (off the clock) every
``--eval-every`` micro-steps.

Usage: ``python benchmarks/goodput.py [--output DIR] [--steps 20] [--repeats 3] [--target 0.6] [--sync-stretch 0.5]
[--modes elche-adascale,elche-anchor1]``. Writes DIR/{real-compute,slow-interconnect}/{table.md,results.json,plot.png}
and DIR/summary.md; exits 1 if a check is missed.
"""

from __future__ import annotations

import argparse
import os
import sys
from statistics import mean
from typing import Any, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from flodl_hf.bench.harness import run_bench  # noqa: E402
from flodl_hf.bench.report import markdown_table, prepare_output, write_outputs  # noqa: E402
from flodl_hf.bench.settings import BenchSettings  # noqa: E402

MODES = ("elche-setup", "elche-throughput", "elche-anchor1", "elche-adascale")
LABELS = {"elche-setup": "goodput (default)", "elche-throughput": "throughput rule", "elche-anchor1": "anchor 1",
          "elche-adascale": "goodput, lr_scaling=adascale"}


def _per_round(result: dict, mode: str, key: str) -> list[float]:
    return [rd["runs"][mode][key] for rd in result["rounds"]
            if mode in rd["runs"] and rd["runs"][mode].get(key) is not None]


def _spread(values: list[float]) -> float:
    return (max(values) - min(values)) / 2 if len(values) > 1 else 0.0


def _fmt(x: Optional[float], digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _case_rows(name: str, result: dict, modes: tuple = MODES) -> tuple[list[str], dict[str, Any]]:
    rows, figures = [], {}
    for mode in modes:
        agg = result["modes"].get(mode, {})
        times = _per_round(result, mode, "time_to_target_s")
        accs = _per_round(result, mode, "final_accuracy")
        anchors = agg.get("anchor_history") or []
        noise = [v for v in (agg.get("noise_scale_history") or []) if v is not None]
        reached = f"{len(times)}/{len(result['rounds'])}"
        figures[mode] = {"time": mean(times) if times else None, "spread": _spread(times),
                         "reached_all": len(times) == len(result["rounds"]), "acc": mean(accs) if accs else None,
                         "rounds": [rd["runs"][mode].get("time_to_target_s") for rd in result["rounds"]
                                    if mode in rd["runs"]]}
        rows.append(f"| {name} | {LABELS[mode]} | {_fmt(figures[mode]['time'])} ± {_fmt(_spread(times))} "
                    f"({reached}) | {_fmt(figures[mode]['acc'], 3)} | {max(anchors) if anchors else '-'} "
                    f"| {_fmt(noise[-1] if noise else None)} |")
    return rows, figures


def _adascale_checks(name: str, f: dict[str, Any]) -> list[tuple[str, bool]]:
    """With lr_scaling="adascale", in every round both runs reach the target and AdaScale's sooner."""
    s, a = f["elche-adascale"], f.get("elche-anchor1")
    if a is None or name != "slow-interconnect":
        return []
    pairs = list(zip(s["rounds"], a["rounds"]))
    ok = bool(pairs) and all(x is not None and y is not None and x < y for x, y in pairs)
    shown = ", ".join(f"{_fmt(x)} vs {_fmt(y)}" for x, y in pairs)
    return [(f"slow-interconnect: adascale reaches the target sooner than anchor 1 in every round ({shown})", ok)]


def _checks(name: str, f: dict[str, Any]) -> list[tuple[str, bool]]:
    extra = _adascale_checks(name, f) if "elche-adascale" in f else []
    if "elche-setup" not in f:
        return extra
    return extra + _goodput_checks(name, f)


def _goodput_checks(name: str, f: dict[str, Any]) -> list[tuple[str, bool]]:
    g, t, a = f["elche-setup"], f.get("elche-throughput"), f.get("elche-anchor1")
    if a is None or (name == "real-compute" and t is None):
        return [(f"{name}: not checked (run every mode it compares)", False)]
    if not g["reached_all"] or g["time"] is None:
        return [(f"{name}: goodput reaches the target in every round", False)]
    out = []
    if name == "real-compute":
        others = [x for x in (t, a) if x["reached_all"] and x["time"] is not None]
        best = min(others, key=lambda x: x["time"]) if others else None
        out.append(("real-compute: goodput time <= the better rule's + spread",
                    best is None or g["time"] <= best["time"] + max(g["spread"], best["spread"])))
        out.append(("real-compute: goodput final accuracy within 0.01 of anchor 1",
                    g["acc"] is not None and a["acc"] is not None and abs(g["acc"] - a["acc"]) <= 0.01))
    else:
        out.append(("slow-interconnect: goodput reaches the target sooner than anchor 1",
                    not a["reached_all"] or a["time"] is None or g["time"] < a["time"]))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", default="bench-results/goodput")
    p.add_argument("--steps", type=int, default=20, help="micro-steps of 2 x batch-size samples (one epoch)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--target", type=float, default=0.60, help="held-out accuracy to reach")
    p.add_argument("--eval-samples", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=2, help="micro-steps between held-out evaluations")
    p.add_argument("--max-length", type=int, default=32)
    p.add_argument("--sync-stretch", type=float, default=0.5)
    p.add_argument("--cases", default="real-compute,slow-interconnect")
    p.add_argument("--modes", default=",".join(MODES),
                   help="comma list of elche-setup (goodput), elche-throughput, elche-anchor1, elche-adascale "
                        "(goodput with lr_scaling=adascale); default: all four")
    args = p.parse_args()
    cases = {"real-compute": None, "slow-interconnect": args.sync_stretch}
    chosen = [c for c in args.cases.split(",") if c]
    if not chosen or any(c not in cases for c in chosen):
        p.error(f"--cases takes a comma list of {', '.join(cases)}")
    modes = tuple(m for m in args.modes.split(",") if m)
    if not modes or any(m not in MODES for m in modes) or not {"elche-setup", "elche-adascale"} & set(modes):
        p.error(f"--modes takes a comma list of {', '.join(MODES)}, elche-setup or elche-adascale included")
    lines = [f"# Goodput El Che: time to {args.target:g} held-out accuracy (MiniLM, packaged corpus, 2 CPU ranks, "
             f"{args.steps} x 2 x {args.batch_size} samples, {args.repeats} round(s))", "",
             "| case | rule | time to target s (± half-range, rounds reached) | final accuracy | max anchor "
             "| last noise scale |", "|---|---|---|---|---|---|"]
    checks: list[tuple[str, bool]] = []
    for name in chosen:
        out = os.path.join(args.output, name)
        prepare_output(out)
        settings = BenchSettings(modes=modes, workload="accuracy", speeds=(1.0, 1.0), device_ms=0.0,
                                 batch_size=args.batch_size, steps=args.steps, repeats=args.repeats, model="minilm",
                                 eval_every=args.eval_every, eval_samples=args.eval_samples, target=args.target,
                                 max_length=args.max_length, sync_stretch=cases[name], timeout_s=1800.0,
                                 elche_max_anchor=8)  # goodput's window needs the opt-in room (the old default)
        result = run_bench(settings)
        write_outputs(result, out)
        print(markdown_table(result))
        rows, figures = _case_rows(name, result, modes)
        lines += rows
        checks += _checks(name, figures)
    lines += ["", "| check | met |", "|---|---|"] + [f"| {c} | {'yes' if ok else 'NO'} |" for c, ok in checks]
    summary = "\n".join(lines) + "\n"
    with open(os.path.join(args.output, "summary.md"), "w") as fh:
        fh.write(summary)
    print(summary)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
