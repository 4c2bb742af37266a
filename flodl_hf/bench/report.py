"""Write a bench result as ``table.md`` (Markdown), ``results.json`` and ``plot.png``, into a directory we own.

Why it exists: the figures are only useful if they are read the same way every time: one table with the
definitions under it, one machine-readable file with every round (per mode: samples/s, efficiency, time to
target, final accuracy, El Che anchor and share history), and one picture (throughput bars against the ideal;
accuracy against training wall time). The output directory is created if needed, and a non-empty directory that
is not a previous bench output is refused rather than mixed with foreign files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

__all__ = ["OUTPUT_FILES", "prepare_output", "markdown_table", "write_outputs"]

OUTPUT_FILES = ("table.md", "results.json", "plot.png")


def prepare_output(directory: str | Path) -> Path:
    """Create ``directory``, or accept it if empty or a previous bench output (whose files are overwritten)."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--output {path} is a file: give a directory")
    if path.is_dir():
        entries = sorted(p.name for p in path.iterdir())
        foreign = [e for e in entries if e not in OUTPUT_FILES]
        ours = not entries  # a directory holding only table.md / plot.png may be a user's: refuse it
        if "results.json" in entries:
            try:
                ours = json.loads((path / "results.json").read_text()).get("tool") == "flodl-hf bench"
            except (OSError, ValueError, AttributeError):
                ours = False
        if foreign or not ours:
            shown = ", ".join(foreign[:5]) or (", ".join(entries) + " without a flodl-hf bench results.json")
            raise ValueError(f"--output {path} is not empty and not a flodl-hf bench output (found {shown}): "
                             "give a new or empty directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a part of the path is a file, or a parent is not writable
        raise ValueError(f"--output {path} cannot be created ({exc.strerror or type(exc).__name__}): give a "
                         "directory whose parents are directories you can write to") from None
    return path


def _num(x: Optional[float], fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def markdown_table(result: dict[str, Any]) -> str:
    """The Markdown report: settings line, the per-mode table and the definitions."""
    s = result["settings"]
    acc = s["workload"] == "accuracy"
    speeds = ", ".join(f"{v:g}" for v in s["speeds"])
    lines = [f"# flodl-hf bench: {s['workload']}", "",
             f"{len(s['speeds'])} ranks at speeds [{speeds}] on {', '.join(s['devices'])}; model {s['model']}; "
             f"modelled {s['device_ms']:g} ms per 16 samples at speed 1.0; batch {s['batch_size']} per rank; "
             f"{s['steps']} steps per run; {s['repeats']} alternating round(s); seed {s['seed']}.", ""]
    ideal = result.get("ideal_samples_per_s")
    if ideal:
        solo = result["modes"].get("solo", {}).get("per_rank_samples_per_s") or []
        lines += [f"Ideal (sum of solo rates measured in the same rounds): **{ideal:.1f} samples/s** "
                  f"(per rank: {', '.join(f'{r:.1f}' for r in solo)}).", ""]
    header = ["mode", "samples/s", "min-max", "efficiency"]
    if acc:
        header += ["time to target (s)", "speed-up vs DDP", "final accuracy"]
    header += ["El Che plan (last round)"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for mode, m in result["modes"].items():
        if "error" in m:
            lines.append(f"| {mode} | failed: {m['error'].splitlines()[0][:80]} |" + " |" * (len(header) - 2))
            continue
        row = [mode, _num(m["samples_per_s"], ".1f"),
               f"{m['samples_per_s_min']:.1f}-{m['samples_per_s_max']:.1f}", _num(m.get("efficiency"), ".3f")]
        if acc:
            row += [_num(m.get("time_to_target_s"), ".1f"), _num(m.get("speedup_vs_ddp"), ".2f"),
                    _num(m.get("final_accuracy"), ".3f")]
        row.append(m.get("final_plan") or "")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "- samples/s: every rank's samples in the timed region / its longest duration, mean over rounds.",
              "- efficiency: samples/s / the ideal of the same round."]
    if acc:
        targets = sorted({rd.get("target") for rd in result["rounds"] if rd.get("target") is not None})
        lines += [f"- target accuracy: {', '.join(f'{t:.3f}' for t in targets) or '-'} "
                  f"({'--target' if s.get('target') is not None else 'the final accuracy of ddp in each round'}); "
                  "time is the training clock, held-out evaluation excluded."]
    else:
        lines.append(f"- timed region: from the first synchronisation point after {s['warmup']} warm-up steps "
                     "(El Che calibration windows excluded) to the last step.")
    for note in result.get("notes", []):
        lines.append(f"- note: {note}")
    gaps = [(rd["round"], mode, run["gap"]) for rd in result["rounds"] for mode, run in rd["runs"].items()
            if run.get("gap")]
    if gaps:
        lines += ["", "## Where the setup modes' time goes (flodl_hf/bench/timeline.py)", "",
                  "| round | mode | efficiency | gap s | (a) sync | (b) wait | (c) compute vs solo | (d) loop vs solo "
                  "| unmeasured |", "|" + "---|" * 9]
        for round_no, mode, g in gaps:
            f = g["fractions"]
            cells = " | ".join(f"{g['parts_s'][k]:.2f} s ({_num(f[k] * 100 if f[k] is not None else None, '.0f')} %)"
                               for k in ("sync", "wait", "compute", "loop", "unmeasured"))
            lines.append(f"| {round_no + 1} | {mode} | {g['efficiency']:.3f} | {g['gap_s']:.2f} | {cells} |")
        lines.append("- gap = timed seconds - samples / ideal rate; each rank's lost seconds weighted by its share of "
                     "the ideal rate; per-window rows in results.json (rounds[].runs[mode].timeline).")
    return "\n".join(lines) + "\n"


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = result["settings"]["workload"] == "accuracy"
    modes = {m: v for m, v in result["modes"].items() if "error" not in v}
    fig, axes = plt.subplots(1, 2 if acc else 1, figsize=(13 if acc else 8, 4.8), squeeze=False)
    ax = axes[0][0]
    names = list(modes)
    rates = [modes[m]["samples_per_s"] for m in names]
    bars = ax.bar(range(len(names)), rates, color=["#2a9d8f" if m.startswith("elche") else "#8d99ae" for m in names])
    for bar, m in zip(bars, names):
        eff = modes[m].get("efficiency")
        if eff is not None and m != "solo":
            ax.annotate(f"{eff:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                        va="bottom", fontsize=9)
    if result.get("ideal_samples_per_s"):
        ax.axhline(result["ideal_samples_per_s"], color="#e76f51", linestyle="--", label="ideal (sum of solo)")
        ax.legend(loc="lower right")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("samples/s")
    speeds = ", ".join(f"{v:g}" for v in result["settings"]["speeds"])
    ax.set_title(f"throughput, speeds [{speeds}] (labels: efficiency)")
    if acc:
        ax2 = axes[0][1]
        last = result["rounds"][-1]
        for mode, run in last["runs"].items():
            if "error" in run or not run.get("curve"):
                continue
            ts, _, accs = zip(*run["curve"])
            ax2.plot(ts, accs, marker=".", label=mode)
        if last.get("target") is not None:
            ax2.axhline(last["target"], color="#e76f51", linestyle=":", label="target")
        ax2.set_xlabel("training wall time (s, evaluation excluded)")
        ax2.set_ylabel("held-out accuracy")
        ax2.set_title("accuracy vs wall time (last round)")
        ax2.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(result: dict[str, Any], directory: str | Path, *, table: Optional[str] = None,
                  plot: Optional[Callable[[dict[str, Any], Path], None]] = None) -> dict[str, Path]:
    """Write table.md, results.json and plot.png into ``directory`` (see :func:`prepare_output`); ``table`` and
    ``plot`` replace the bench's own table text and plot (the simulator's)."""
    out = prepare_output(directory)
    paths = {name: out / name for name in OUTPUT_FILES}
    paths["table.md"].write_text(markdown_table(result) if table is None else table)
    paths["results.json"].write_text(json.dumps(result, indent=1, default=str) + "\n")
    (_plot if plot is None else plot)(result, paths["plot.png"])
    return paths
