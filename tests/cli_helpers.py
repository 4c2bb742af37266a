"""What CLI tests share (test helper only): the check of a refused ``flodl-hf`` command, fast training options, the
toy CSV and the environment of a ``python -m flodl_hf`` subprocess."""

from __future__ import annotations

import csv
import functools
import os
import subprocess
from pathlib import Path

from process_state import changed_variables, differences, restore, snapshot
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


def run_main(argv, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """``python -m flodl_hf ARGV`` run in this process through ``flodl_hf.cli.main(argv)``: the same exit code,
    stdout and stderr (both file descriptors and ``sys.stdout``/``sys.stderr``, so C-level writes are caught too)
    and the same working directory and environment (``env`` replaces ``os.environ`` for the call), without a
    Python start-up. An exception that escapes ``main`` is printed as the interpreter would (a traceback, exit 1),
    argparse's exit keeps its code. What the command changed in the process (environment, working directory,
    torch's switches, signal handlers) is put back and fails the call: a command run twice in one process (a
    notebook) must find it as it was (``process_state``).

    For commands refused before any work and for short runs on tiny models; a command that could block (a FIFO),
    needs a signal or a resource limit, or reads the environment at import runs in a subprocess instead."""
    import contextlib
    import io
    import sys
    import tempfile
    import traceback

    from flodl_hf import cli

    before = snapshot()
    saved_env = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    old_cwd = os.getcwd()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, open(os.devnull) as nothing:
        saved = [os.dup(1), os.dup(2)]
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        py_out = io.TextIOWrapper(open(1, "wb", closefd=False), encoding="utf-8", errors="replace",
                                  line_buffering=True)
        py_err = io.TextIOWrapper(open(2, "wb", closefd=False), encoding="utf-8", errors="replace",
                                  line_buffering=True)
        try:
            os.chdir(cwd)
            with contextlib.redirect_stdout(py_out), contextlib.redirect_stderr(py_err):
                old_stdin, sys.stdin = sys.stdin, nothing
                try:
                    code = cli.main([str(a) for a in argv])
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                    if isinstance(exc.code, str):
                        print(exc.code, file=sys.stderr)
                except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
                    traceback.print_exc()
                    code = 1
                finally:
                    sys.stdin = old_stdin
            py_out.flush()
            py_err.flush()
        finally:
            os.chdir(old_cwd)
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            changed_env = changed_variables(env, dict(os.environ))
            os.environ.clear()
            os.environ.update(saved_env)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    after = snapshot()
    left = differences({k: v for k, v in before.items() if k != "environment"}, after)
    restore(before)
    if changed_env:
        left.append(f"environment variables {changed_env}")
    assert not left, f"flodl-hf {' '.join(map(str, argv))} left the process changed: {left}"
    return subprocess.CompletedProcess([sys.executable, "-m", "flodl_hf", *map(str, argv)], code, stdout, stderr)


def python_spellings(command: str, line: str) -> list[str]:
    """Rule 9: a setting the command has an option for, spelled as the Python API spells it (``field=value``,
    ``DdpConfig.field``, ``TrainSettings.field``, ``field / --option``)."""
    import argparse
    import dataclasses
    import re

    from flodl_hf.cli.parser import build_parser
    from flodl_hf.cli.spelling import field_options
    from flodl_hf.config import DdpConfig
    from flodl_hf.job.settings import TrainSettings

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    options = field_options(sub.choices[command])
    fields = {f.name for cls in (TrainSettings, DdpConfig) for f in dataclasses.fields(cls)} & set(options)
    spelled = re.finditer(r"(?<![-\w.])(?:(?:DdpConfig|TrainSettings)\.)?([a-z][a-z0-9_]*)=", line)
    found = [m.group(0) for m in spelled if m.group(1) in fields]
    found += [m.group(0) for m in re.finditer(r"(?<![-\w.])([a-z][a-z0-9_]*) / --", line) if m.group(1) in options]
    return found + re.findall(r"\b(?:DdpConfig|TrainSettings|ElCheArguments)\.\w+", line)
