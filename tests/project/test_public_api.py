"""The engine's public API is small, explicit and pinned (heads pin theirs in test_heads_api.py); importing
flodl_hf or heads does nothing observable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import flodl_hf

ROOT = Path(__file__).resolve().parents[2]


def test_flodl_hf_all_is_pinned():
    assert flodl_hf.__all__ == sorted([
        "ApplyPolicy", "AverageBackend", "Ddp", "DdpBuilder", "DdpConfig", "DdpHandle", "DistributedError", "ElChe",
        "EpochMetrics", "Graph", "HasGraph", "TrainedState", "Trainer", "record_scalar"]) + ["__version__"]
    for name in flodl_hf.__all__:
        assert getattr(flodl_hf, name) is not None


def test_import_is_silent_and_changes_nothing():
    code = ("import os, sys; before = dict(os.environ); import flodl_hf, heads, flodl_hf.cli, flodl_hf.trainer; "
            "assert dict(os.environ) == before, 'environment changed'; "
            "print('OK')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "OK\n"
    assert proc.stderr == ""


def test_package_import_is_lazy():
    proc = subprocess.run([sys.executable, "-c", "import sys, flodl_hf; print('torch' in sys.modules)"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr
