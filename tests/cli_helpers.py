"""What CLI tests share (test helper only): the check of a refused ``flodl-hf`` command, fast training options, the
toy CSV and the environment of a ``python -m flodl_hf`` subprocess."""

from __future__ import annotations

import csv
import functools
import os
import subprocess
from pathlib import Path

from tiny_models import toy_task

ROOT = Path(__file__).resolve().parents[1]
#: Options that train the tiny BERT on the toy task in seconds.
FAST = ["--batch-size", "16", "--epochs", "3", "--lr", "2e-3", "--max-length", "16", "--eval-rows", "40",
        "--no-progress"]


def write_toy_csv(path: Path, n: int, seed: int = 0) -> Path:
    """``n`` rows of the toy sentiment task as a CSV with ``review`` / ``sentiment`` columns."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["review", "sentiment"])
        for text, label in toy_task(n, seed=seed):
            writer.writerow([text, "positive" if label else "negative"])
    return path


def cli_env() -> dict:
    """The environment of a ``python -m flodl_hf`` subprocess: this checkout first, one thread, no launcher."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def one_error(result: subprocess.CompletedProcess) -> str:
    """The single ``flodl-hf: error:`` line of a refused command (exit 2, no traceback)."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("flodl-hf: error: ")]
    assert len(lines) == 1, result.stderr[-2000:]
    return lines[0]


@functools.lru_cache(maxsize=1)
def command_options() -> dict[str, set[str]]:
    """Every option each ``flodl-hf`` command accepts, from the real parser; ``bench`` has its own parsers (plain
    and ``--simulate``), whose options count as its."""
    import argparse

    from flodl_hf.bench.cli import build_parser as bench_parser
    from flodl_hf.bench.simulate_cli import build_parser as simulate_parser
    from flodl_hf.cli.parser import build_parser

    def options(parser: argparse.ArgumentParser) -> set[str]:
        return {o for action in parser._actions for o in action.option_strings}

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    found = {name: options(parser) for name, parser in sub.choices.items()}
    found["bench"] |= options(bench_parser()) | options(simulate_parser())
    return found
