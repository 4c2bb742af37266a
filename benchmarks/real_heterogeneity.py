"""El Che on real heterogeneity (a busy core), against the ideal and DDP, with a per-window timeline.

Why it exists: the issue's figures on real compute (rank r pinned to core r, a busy process sharing core 1, a
4-layer BERT, no modelled sleeps) put El Che at 0.89-0.93 of the sum of solo rates; the acceptance asks for
>= 0.93 of ideal and >= 1.35x DDP in each of 3 rounds, or else a timeline that says where the rest goes. This
script runs ``flodl-hf bench`` (the same harness, in-process) with ``--pin-cores --busy-core 1``: 2 CPU ranks
over gloo, rank r pinned to core r in every mode (solo too, so the ideal is measured on the same cores under the
same load), a busy process on core 1 for the whole bench, real compute (``--device-ms 0``, speeds 1.0,1.0: the
heterogeneity is the busy core, not a model), model ``bert-4l`` (BERT from a config: 4 layers, hidden 128,
2 heads, intermediate 512, every batch padded to 64 tokens), modes ``solo``, ``ddp``, ``elche-setup`` in
alternating rounds (default 3).

Per round it reports El Che / ideal, DDP / ideal and El Che / DDP, and the gap accounting of
:mod:`flodl_hf.bench.timeline`: ideal time vs El Che's time, the gap split into (a) sync, (b) waiting at window
ends (imbalance: the split lagging the real speeds), (c) compute slower than solo's per sample (the busy core's
scheduling, micro-batch size), (d) the loop against solo's (input, accumulation, one optimizer step per window
instead of one per micro-batch) and what no interval covers; the wait is compared with what the best constant
split in hindsight, and the previous window's balanced split, would have waited on the same windows.

Met: El Che >= 0.93 of ideal and >= 1.35x DDP in every round (the issue's target). Also checked and shown (the
issue's fallback): the timeline accounts for >= 90 % of the gap in every round. Exits 1 when the target is missed.

Usage: ``python benchmarks/real_heterogeneity.py [--output DIR] [--repeats 3] [--steps 60] [--batch-size 32]
[--busy-core 1] [--modes solo,ddp,elche-setup]``. About 1 min per round on a 2-core machine. Needs 2 otherwise
idle cores. Writes DIR/bench/{table.md,results.json,plot.png} (the bench's; per-window rows in results.json under
rounds[].runs[elche-setup].timeline) and DIR/summary.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from flodl_hf.bench.harness import run_bench  # noqa: E402
from flodl_hf.bench.report import markdown_table, prepare_output, write_outputs  # noqa: E402
from flodl_hf.bench.settings import BenchSettings  # noqa: E402
from flodl_hf.bench.timeline import timeline_markdown  # noqa: E402

TARGET_IDEAL, TARGET_DDP, TARGET_ACCOUNTED = 0.93, 1.35, 0.90
ELCHE = "elche-setup"
PARTS = (("sync", "(a) sync"), ("wait", "(b) wait at window ends"), ("compute", "(c) compute vs solo"),
         ("loop", "(d) loop vs solo"), ("unmeasured", "unmeasured"))


def _fmt(x: Optional[float], spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def round_figures(rd: dict[str, Any], elche: str = ELCHE) -> dict[str, Any]:
    """El Che / ideal, DDP / ideal, El Che / DDP of one round (None where a run is missing or failed)."""
    runs = rd["runs"]
    ideal = rd.get("ideal_samples_per_s")

    def rate(mode: str) -> Optional[float]:
        r = runs.get(mode, {})
        return None if "error" in r or "samples_per_s" not in r else r["samples_per_s"]

    e, d = rate(elche), rate("ddp")
    return {"ideal": ideal, "elche": e, "ddp": d, "elche_ideal": e / ideal if e and ideal else None,
            "ddp_ideal": d / ideal if d and ideal else None, "elche_ddp": e / d if e and d else None,
            "gap": runs.get(elche, {}).get("gap"), "timeline": runs.get(elche, {}).get("timeline")}


def _round_table(figs: list[dict[str, Any]], orders: list[list[str]]) -> list[str]:
    lines = ["| round | order | ideal samples/s | El Che samples/s | DDP samples/s | El Che / ideal | DDP / ideal "
             "| El Che / DDP |", "|---|---|---|---|---|---|---|---|"]
    for i, (f, order) in enumerate(zip(figs, orders)):
        lines.append(f"| {i + 1} | {' > '.join(order)} | {_fmt(f['ideal'], '.1f')} | {_fmt(f['elche'], '.1f')} "
                     f"| {_fmt(f['ddp'], '.1f')} | {_fmt(f['elche_ideal'])} | {_fmt(f['ddp_ideal'])} "
                     f"| {_fmt(f['elche_ddp'], '.2f')} |")
    return lines


def _accounting_table(figs: list[dict[str, Any]]) -> list[str]:
    head = ["round", "ideal time s", "El Che time s", "gap s"] + [label for _, label in PARTS] + ["accounted"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, f in enumerate(figs):
        g = f["gap"]
        if not g:
            lines.append(f"| {i + 1} | (no timeline) |" + " |" * (len(head) - 2))
            continue
        cells = [f"{g['parts_s'][k]:+.3f} ({_pct(g['fractions'][k])})" for k, _ in PARTS]
        lines.append(f"| {i + 1} | {g['ideal_s']:.2f} | {g['elapsed_s']:.2f} | {g['gap_s']:.3f} | "
                     + " | ".join(cells) + f" | {_pct(g['accounted'])} |")
    return lines


def _wait_table(figs: list[dict[str, Any]]) -> list[str]:
    lines = ["| round | wait as run s | wait at the best constant split s (split) | wait at the previous window's "
             "balanced split s | El Che's last split | solo ms/sample | El Che compute ms/sample | anchors |",
             "|---|---|---|---|---|---|---|---|"]
    for i, f in enumerate(figs):
        g, t = f["gap"], f["timeline"]
        if not g or not t or not t["windows"]:
            continue
        c = g["wait_counterfactuals"]
        last = t["windows"][-1]["split"]
        lines.append(f"| {i + 1} | {c['wait_as_run_s']:.3f} | {_fmt(c['wait_if_best_constant_split_s'])} "
                     f"({'/'.join(map(str, c['best_constant_split'] or []))}) "
                     f"| {c['wait_if_previous_window_split_s']:.3f} | {'/'.join(map(str, last))} "
                     f"| {'/'.join(f'{x:.2f}' for x in g['solo_ms_per_sample'])} "
                     f"| {'/'.join(f'{x:.2f}' for x in g['elche_compute_ms_per_sample'])} "
                     f"| {','.join(map(str, g['anchors']))} |")
    return lines


def checks(figs: list[dict[str, Any]]) -> tuple[list[tuple[str, bool]], bool]:
    """The rows of the check table, and whether the target (the first two) is met."""
    def all_rounds(key: str, low: float) -> bool:
        return bool(figs) and all(f[key] is not None and f[key] >= low for f in figs)

    shown = {k: ", ".join(_fmt(f[k], ".3f") for f in figs) for k in ("elche_ideal", "elche_ddp")}

    def accounted(f: dict[str, Any]) -> tuple[str, bool]:
        """A round at or above the target needs no accounting ("met"); else the timeline's accounted share."""
        if f["elche_ideal"] is not None and f["elche_ideal"] >= TARGET_IDEAL:
            return "met", True
        a = f["gap"]["accounted"] if f["gap"] else None
        return _pct(a), a is not None and a >= TARGET_ACCOUNTED

    acc = [accounted(f) for f in figs]
    rows = [(f"El Che >= {TARGET_IDEAL} of ideal in every round ({shown['elche_ideal']})",
             all_rounds("elche_ideal", TARGET_IDEAL)),
            (f"El Che >= {TARGET_DDP}x DDP in every round ({shown['elche_ddp']})", all_rounds("elche_ddp", TARGET_DDP)),
            (f"fallback: where a round misses {TARGET_IDEAL}, the timeline accounts for >= {TARGET_ACCOUNTED:.0%} of "
             f"its gap ({', '.join(a for a, _ in acc)})", bool(acc) and all(ok for _, ok in acc))]
    return rows, rows[0][1] and rows[1][1]


def summary_markdown(result: dict[str, Any], elche: str = ELCHE) -> tuple[str, bool]:
    s = result["settings"]
    figs = [round_figures(rd, elche) for rd in result["rounds"]]
    orders = [rd["order"] for rd in result["rounds"]]
    rows, met = checks(figs)
    lines = [f"# Real heterogeneity: {s['model']}, 2 CPU ranks pinned to cores "
             f"{','.join(map(str, result.get('cores') or []))}, busy process on core {s['busy_core']}, "
             f"{s['steps']} steps x 2 x {s['batch_size']} samples ({s['warmup']} warm-up), {len(figs)} round(s)", "",
             "## Throughput against the ideal (sum of solo rates, same cores, same load, same round)", ""]
    lines += _round_table(figs, orders)
    lines += ["", "## Where El Che's time goes (gap = El Che's time - samples / ideal rate)", "",
              "Seconds (share of the gap). Each rank's lost seconds are weighted by its share of the ideal rate. "
              "(a) last rank's arrival at the window end to the optimizer step; (b) ranks idle at window ends "
              "until the slowest arrives; (c) compute (batch in hand to backward done) beyond solo's per-sample "
              "compute; (d) input, accumulation, optimizer, El Che's update against solo's input and per-step "
              "optimizer; unmeasured: the timed region's edges.", ""]
    lines += _accounting_table(figs)
    lines += ["", "### The wait against counterfactual splits on the same windows (weighted seconds)", ""]
    lines += _wait_table(figs)
    for i, f in enumerate(figs):
        if f["timeline"]:
            lines += ["", f"### Per-window timeline, round {i + 1} (rank 0/rank 1)", "",
                      timeline_markdown(f["timeline"]).rstrip()]
    lines += ["", "## Checks", "", "| check | met |", "|---|---|"]
    lines += [f"| {c} | {'yes' if ok else 'NO'} |" for c, ok in rows]
    return "\n".join(lines) + "\n", met


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", default="bench-results/real_heterogeneity")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=60, help="steps per run (W x batch-size samples each)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (El Che: nominal)")
    p.add_argument("--max-length", type=int, default=64, help="tokens per text (every batch padded to it)")
    p.add_argument("--busy-core", type=int, default=1)
    p.add_argument("--modes", default="solo,ddp,elche-setup",
                   help="comma list; solo, ddp and elche-setup are required (extra setup modes get a timeline too)")
    args = p.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    if not {"solo", "ddp", ELCHE} <= set(modes):
        p.error("--modes must include solo, ddp and elche-setup")
    try:
        settings = BenchSettings(modes=modes, workload="throughput", speeds=(1.0, 1.0), device_ms=0.0,
                                 batch_size=args.batch_size, steps=args.steps, warmup=args.warmup,
                                 repeats=args.repeats, model="bert-4l", max_length=args.max_length,
                                 pin_cores=True, busy_core=args.busy_core, timeout_s=900.0).resolved()
        bench_dir = os.path.join(args.output, "bench")
        prepare_output(bench_dir)
    except ValueError as exc:
        p.error(str(exc))
    result = run_bench(settings)
    write_outputs(result, bench_dir)
    print(markdown_table(result))
    text, met = summary_markdown(result)
    with open(os.path.join(args.output, "summary.md"), "w") as fh:
        fh.write(text)
    print(text)
    print(json.dumps({"summary": os.path.join(args.output, "summary.md")}))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
