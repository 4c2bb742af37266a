"""``flodl-hf bench`` / ``python -m flodl_hf.bench``: parse flags into BenchSettings, run, write the report.

Why it exists: the command line stays a thin layer over :class:`~flodl_hf.bench.settings.BenchSettings`
(practices #5). Usage errors (bad flags, bad values, a foreign output directory) exit 2 with one line on stderr,
never a traceback; a mode that fails is reported in the table and makes the exit code 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .settings import ALL_MODES, WORKLOADS, BenchSettings
from .simulate_cli import number_list
from .workloads import MODELS

__all__ = ["main", "build_parser"]

PROG = "flodl-hf bench"


class _UsageError(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(f"{message} (see `{self.prog} --help`)")


def _words(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=(
        "Compare training modes on heterogeneous devices: solo (the ideal), DDP, Accelerate, Accelerate LocalSGD, "
        "flodl-hf El Che setup mode and builder mode, in the same harness. On CPU, device speeds are modelled "
        "(a sleep of device-ms * b/16 / speed per micro-batch of b samples, identical in every mode); on GPUs "
        "(--devices cuda:0,cuda:1 --device-ms 0) the devices are measured as they are."))
    p.add_argument("--modes", type=_words, default=None,
                   help=f"comma list of modes (default: every available one). Known: {', '.join(ALL_MODES)}")
    p.add_argument("--workload", choices=WORKLOADS, default="throughput",
                   help="throughput: fixed steps, samples/s and efficiency; accuracy: time to a held-out accuracy")
    p.add_argument("--speeds", type=number_list(float, "1.0,0.4"), default=(1.0, 0.4),
                   help="relative speed per rank in (0, 1], one per rank (default 1.0,0.4)")
    p.add_argument("--devices", type=_words, default=None, help="device per rank (default cpu for each)")
    p.add_argument("--device-ms", type=float, default=None,
                   help="modelled ms per 16 samples at speed 1.0 (default 40 on CPU; 0 = measure real devices)")
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step (default 16)")
    p.add_argument("--steps", type=int, default=None, help="steps per run (default 60 throughput, 200 accuracy)")
    p.add_argument("--warmup", type=int, default=5, help="throughput: untimed warm-up steps (default 5)")
    p.add_argument("--repeats", type=int, default=None,
                   help="alternating rounds (default 2 throughput, 1 accuracy)")
    p.add_argument("--model", choices=MODELS, default=None,
                   help="mlp (throughput default), tiny-bert (accuracy default), minilm (the packaged MiniLM) or "
                        "bert-4l (4-layer BERT from a config, fixed length; real compute)")
    p.add_argument("--target", type=float, default=None,
                   help="accuracy target (default: the final accuracy ddp reaches in the same round)")
    p.add_argument("--eval-every", type=int, default=10, help="accuracy: evaluate every N optimizer steps")
    p.add_argument("--eval-samples", type=int, default=1000, help="accuracy: held-out samples (default 1000)")
    p.add_argument("--lr", type=float, default=None, help="AdamW learning rate (default per model)")
    p.add_argument("--localsgd-steps", type=int, default=8, help="accelerate-localsgd: steps between averages")
    p.add_argument("--elche-max-anchor", type=int, default=None,
                   help="DdpConfig.max_anchor for elche-setup (default: the engine's)")
    p.add_argument("--sync-stretch", type=float, default=None, metavar="F",
                   help="setup modes: model a slow interconnect, sleeping F x a micro-batch's compute after every "
                        "synchronisation (e.g. 0.5: sync >= 50 %% of compute at anchor 1)")
    p.add_argument("--max-length", type=int, default=64, help="tokens per text for tiny-bert and minilm (64)")
    p.add_argument("--stretch", action="store_true",
                   help="speeds stretch real compute: --device-ms is this machine's real compute per 16 samples and a "
                        "rank at speed v sleeps device-ms * b/16 * (1/v - 1) before each forward")
    p.add_argument("--pin-cores", action="store_true",
                   help="pin rank r to core r (the r-th core this process may use) in every mode, solo included")
    p.add_argument("--busy-core", type=int, default=None, metavar="N",
                   help="run a competing busy process on core N for the whole bench (e.g. 1 with --pin-cores: rank 1 "
                        "gets about half its core)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed for one run of one mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--simulate", action="store_true",
                   help="model 2-256 ranks instead of running processes (`flodl-hf bench --simulate --help`)")
    p.add_argument("--output", default="bench-results",
                   help="directory for table.md, results.json, plot.png (created; a foreign non-empty one is refused)")
    return p


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    return BenchSettings(modes=args.modes, workload=args.workload, speeds=args.speeds, devices=args.devices,
                         device_ms=args.device_ms, batch_size=args.batch_size, steps=args.steps,
                         warmup=args.warmup, repeats=args.repeats, model=args.model, eval_every=args.eval_every,
                         eval_samples=args.eval_samples, target=args.target, lr=args.lr,
                         localsgd_steps=args.localsgd_steps, elche_max_anchor=args.elche_max_anchor,
                         sync_stretch=args.sync_stretch, max_length=args.max_length, stretch=args.stretch,
                         seed=args.seed, timeout_s=args.timeout, pin_cores=args.pin_cores,
                         busy_core=args.busy_core).resolved()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``flodl-hf bench`` with ``argv`` (default: ``sys.argv[1:]``); return the exit code (0, 1 or 2)."""
    from .harness import run_bench
    from .report import markdown_table, prepare_output, write_outputs

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--simulate" in argv:
        from .simulate_cli import main as simulate_main

        return simulate_main(argv)
    try:
        args = build_parser().parse_args(argv)
        settings = settings_from_args(args)
        prepare_output(args.output)
    except (_UsageError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    result = run_bench(settings)
    paths = write_outputs(result, args.output)
    print(markdown_table(result))
    print(f"wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    failed = [m for m, v in result["modes"].items() if "error" in v]
    return 1 if failed else 0
