"""``flodl-hf bench --simulate``: command line, table, JSON and plot of the scale simulator.

Why it exists: the simulator (:mod:`flodl_hf.bench.simulate`) answers "how does El Che behave at 8-256 ranks?",
which the process-based bench cannot; this layer turns flags into :class:`SimSettings`, prints the efficiency
table and, with ``--output DIR``, writes ``table.md``, ``results.json`` and ``plot.png`` (the same directory rules
as the bench's). ``--calibrate`` prints the model's predictions for the bench's measured 2- and 4-rank cases.
Nothing here imports torch. Usage errors exit 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Sequence

from .simulate import CPU_BENCH, DEFAULT_RANKS, SimSettings, calibrate, simulate

__all__ = ["build_parser", "main", "markdown_table", "calibration_table", "number_list", "parse_fleet",
           "write_outputs"]

PROG = "flodl-hf bench --simulate"


class _UsageError(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(f"{message} (see `{self.prog} --help`)")


def number_list(kind: type, example: str) -> Any:
    """An argparse type: a comma list of finite numbers of ``kind`` (``inf`` or ``nan`` would fill a table with nan)."""
    def parse(text: str) -> tuple:
        try:
            values = tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError:
            values = (math.nan,)
        if not all(math.isfinite(v) for v in values):
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of finite numbers, e.g. {example}")
        return values
    return parse


def parse_fleet(text: str) -> tuple[tuple[str, float, float], ...]:
    """``NAME:SPEED[:SHARE],...`` -> groups; SHARE is a fraction or a count (normalised), default equal."""
    groups = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        parts = item.split(":")
        try:
            if len(parts) not in (2, 3) or not parts[0]:
                raise ValueError
            groups.append((parts[0], float(parts[1]), float(parts[2]) if len(parts) == 3 else 1.0))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{item!r} is not NAME:SPEED[:SHARE], e.g. h100:1.0:0.5,a100:0.5:0.5") from None
    return tuple(groups)


def build_parser() -> argparse.ArgumentParser:
    d = SimSettings()
    p = _Parser(prog=PROG, description=(
        "Model El Che at 2-256 ranks: the real El Che scheduler (setup mode, no processes) against modelled "
        "device times with noise and a ring all-reduce cost, beside synchronous DDP in the same model. "
        "A model, not a measurement."))
    p.add_argument("--simulate", action="store_true", help="(selects this simulator)")
    p.add_argument("--ranks", type=number_list(int, "8,16,32"), default=DEFAULT_RANKS,
                   help=f"rank counts to simulate (default {','.join(map(str, DEFAULT_RANKS))})")
    p.add_argument("--fleet", type=parse_fleet, default=d.fleet,
                   help="NAME:SPEED[:SHARE] groups, shares as fractions or counts (default new:1.0,old:0.5: "
                        "half the ranks at speed 1.0, half at 0.5)")
    p.add_argument("--speeds", type=number_list(float, "1.0,0.4"), default=None,
                   help="a speed pattern tiled over the ranks, instead of --fleet (e.g. 1.0,0.4)")
    p.add_argument("--device-ms", type=float, default=d.device_ms, help="ms per 16 samples at speed 1.0 (40)")
    p.add_argument("--overhead-ms", type=float, default=d.overhead_ms,
                   help=f"fixed ms per micro-batch at any speed ({d.overhead_ms:g})")
    p.add_argument("--noise", type=float, default=d.noise, help=f"relative compute noise ({d.noise:g})")
    p.add_argument("--sync-noise", type=float, default=d.sync_noise,
                   help=f"relative all-reduce noise ({d.sync_noise:g})")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="samples per rank per step (16)")
    p.add_argument("--model-mb", type=float, default=d.model_mb,
                   help="gradient MB all-reduced per window (91 = 22.7M fp32 parameters)")
    p.add_argument("--bandwidth-gbps", type=float, default=d.bandwidth_gbps, help="GB/s within a node (25)")
    p.add_argument("--inter-bandwidth-gbps", type=float, default=d.inter_bandwidth_gbps,
                   help="GB/s across nodes (12.5)")
    p.add_argument("--latency-us", type=float, default=d.latency_us, help="µs per ring hop (10)")
    p.add_argument("--ranks-per-node", type=int, default=d.ranks_per_node, help="ranks per node (8)")
    p.add_argument("--steps", type=int, default=d.steps, help=f"micro-steps per run ({d.steps})")
    p.add_argument("--warmup", type=int, default=d.warmup, help=f"untimed steps ({d.warmup})")
    p.add_argument("--ddp-overlap", type=float, default=d.ddp_overlap,
                   help="fraction of DDP's all-reduce hidden behind backward (0)")
    p.add_argument("--max-anchor", type=int, default=d.max_anchor, help="El Che max_anchor (8; 0 = off)")
    p.add_argument("--overhead-target", type=float, default=d.overhead_target, help="El Che tau (0.10)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--calibrate", action="store_true",
                   help="print the model of the bench's CPU machine against its measured 2- and 4-rank figures")
    p.add_argument("--output", default=None, help="directory for table.md, results.json, plot.png")
    return p


def settings_from_args(args: argparse.Namespace) -> SimSettings:
    return SimSettings(ranks=args.ranks, speeds=args.speeds, fleet=args.fleet, device_ms=args.device_ms,
                       overhead_ms=args.overhead_ms, noise=args.noise, sync_noise=args.sync_noise,
                       batch_size=args.batch_size, model_mb=args.model_mb, bandwidth_gbps=args.bandwidth_gbps,
                       inter_bandwidth_gbps=args.inter_bandwidth_gbps, latency_us=args.latency_us,
                       ranks_per_node=args.ranks_per_node, steps=args.steps, warmup=args.warmup,
                       ddp_overlap=args.ddp_overlap, max_anchor=args.max_anchor,
                       overhead_target=args.overhead_target, seed=args.seed).resolved()


def markdown_table(result: dict[str, Any]) -> str:
    """The efficiency table, with the settings line and the definitions."""
    s = result["settings"]
    who = (f"speeds {list(s['speeds'])} tiled" if s["speeds"] is not None else
           "fleet " + ", ".join(f"{n} at {v:g} ({w:g})" for n, v, w in s["fleet"]))
    lines = [
        "# flodl-hf bench --simulate (a model, not a measurement)", "",
        f"{who}; {s['device_ms']:g} ms per 16 samples at speed 1.0 + {s['overhead_ms']:g} ms per micro-batch, "
        f"noise {s['noise']:g} (sync {s['sync_noise']:g}); batch {s['batch_size']} per rank; ring all-reduce of "
        f"{s['model_mb']:g} MB at {s['bandwidth_gbps']:g} GB/s within {s['ranks_per_node']} ranks, "
        f"{s['inter_bandwidth_gbps']:g} GB/s beyond, {s['latency_us']:g} µs per hop; {s['steps']} steps, "
        f"{s['warmup']} warm-up; seed {s['seed']}.", "",
        "| ranks | speeds | all-reduce ms | El Che / ideal | DDP / ideal | DDP theory | El Che / DDP | anchor "
        "(final, mean) | fast ranks' share (speed share) |",
        "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        groups = " + ".join(f"{c}×{v}" for v, c in r["speed_groups"].items())
        lines.append(f"| {r['ranks']} | {groups} | {r['allreduce_ms']:.2f} | **{r['elche_efficiency']:.3f}** | "
                     f"{r['ddp_efficiency']:.3f} | {r['ddp_theory']:.3f} | {r['elche_vs_ddp']:.2f}× | "
                     f"{r['final_anchor']}, {r['mean_anchor']:.2f} | {r['fast_share']:.3f} "
                     f"({r['fast_speed_share']:.3f}) |")
    lines += ["", "- ideal: the sum of every rank's solo rate (same device model, no sync). DDP theory: "
              "N × min(speed) / sum(speeds).",
              "- all-reduce (ring): 2 (N-1)/N × bytes / bandwidth + 2 (N-1) × latency per window (El Che) or step "
              "(DDP); neither overlaps it with compute unless --ddp-overlap.",
              "- El Che's anchor > 1 means several micro-batches per optimizer step (effective batch anchor × N × "
              "batch); DDP keeps N × batch."]
    return "\n".join(lines) + "\n"


def calibration_table(rows: list[dict[str, Any]]) -> str:
    """Predicted against measured efficiencies for the bench's CPU machine."""
    lines = ["# Simulator calibration against the bench's measured setup-mode figures", "",
             "| case | El Che predicted | measured | error | DDP predicted | measured | error | sync ms model "
             "(measured mean) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['elche_predicted']:.3f} | {r['elche_measured']:.3f} | "
                     f"{r['elche_error']:+.1%} | {r['ddp_predicted']:.3f} | {r['ddp_measured']:.3f} | "
                     f"{r['ddp_error']:+.1%} | {r['sync_ms_model']:.2f} ({r['sync_ms_measured']:.2f}) |")
    lines += ["", "Model: flodl_hf.bench.simulate.CPU_BENCH (mean over seeds 0-2, as the bench's 3 rounds)."]
    return "\n".join(lines) + "\n"


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    n = [r["ranks"] for r in rows]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    ax.plot(n, [r["elche_efficiency"] for r in rows], marker="o", color="#2a9d8f", label="El Che (setup mode)")
    ax.plot(n, [r["ddp_efficiency"] for r in rows], marker="s", color="#8d99ae", label="synchronous DDP")
    ax.plot(n, [r["ddp_theory"] for r in rows], linestyle=":", color="#8d99ae", label="DDP theory N·min/sum")
    ax.axhline(1.0, color="#e76f51", linestyle="--", label="ideal (sum of solo rates)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(n, [str(v) for v in n])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("ranks")
    ax.set_ylabel("efficiency (samples/s ÷ ideal)")
    ax.set_title("modelled efficiency (a model, not a measurement)")
    ax.legend(loc="lower left")
    ax2.plot(n, [r["elche_vs_ddp"] for r in rows], marker="o", color="#2a9d8f")
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(n, [str(v) for v in n])
    ax2.axhline(1.0, color="#8d99ae", linestyle=":")
    ax2.set_ylim(0, max(1.0, *(r["elche_vs_ddp"] for r in rows)) * 1.15)
    ax2.set_xlabel("ranks")
    ax2.set_ylabel("El Che samples/s ÷ DDP samples/s")
    ax2.set_title("El Che against DDP")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(result: dict[str, Any], directory: str | Path) -> dict[str, Path]:
    """Write table.md, results.json and plot.png (the bench's rules: a foreign non-empty directory is refused)."""
    from . import report

    text = markdown_table(result)
    if result.get("calibration"):
        text += "\n" + calibration_table(result["calibration"])
    return report.write_outputs(result, directory, table=text, plot=_plot)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``flodl-hf bench --simulate`` with ``argv``; returns 0, or 2 on a usage error."""
    from .report import prepare_output

    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        settings = settings_from_args(args)
        if args.calibrate:
            settings = replace(CPU_BENCH, seed=args.seed).resolved()
        if args.output is not None:
            prepare_output(args.output)
    except (_UsageError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    result = simulate(settings)
    if args.calibrate:
        result["calibration"] = calibrate(settings)
    print(markdown_table(result))
    if args.calibrate:
        print(calibration_table(result["calibration"]))
    if args.output is not None:
        paths = write_outputs(result, args.output)
        print(f"wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    return 0
