"""The engine's public API is small, explicit and pinned (heads pin theirs in test_heads_api.py); importing
flodl_hf or heads does nothing observable."""

from __future__ import annotations

import pytest

import importlib
import re
import subprocess
import sys
from pathlib import Path

import flodl_hf

ROOT = Path(__file__).resolve().parents[3]


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


FILE_SUFFIXES = {"md", "py", "sh", "json", "png", "txt", "ipynb", "csv", "yml", "toml"}


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _resolves(dotted: str) -> bool:
    """``dotted`` is an importable module, or an attribute reached from the longest importable prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_import_path_the_docs_name_resolves():
    """Each dotted ``flodl_hf.…`` / ``heads.…`` path and each ``from X import a, b`` in README and docs is real."""
    named: dict[str, str] = {}
    for doc in _documents():
        text = doc.read_text(encoding="utf-8")
        for dotted in re.findall(r"(?<![/\w.-])(?:flodl_hf|heads)(?:\.[A-Za-z_]\w*)+", text):
            if dotted.rsplit(".", 1)[1] not in FILE_SUFFIXES:  # ``heads.md`` is a page, not a module
                named.setdefault(dotted, doc.name)
        for module, names in re.findall(r"^\s*from ((?:flodl_hf|heads)[\w.]*) import ([\w, ]+)$", text, flags=re.M):
            for name in names.split(","):
                named.setdefault(f"{module}.{name.strip().split(' as ')[0]}", doc.name)
    assert len(named) >= 15, "the scan found too few paths to be reading the docs"
    missing = sorted(f"{path} ({doc})" for path, doc in named.items() if not _resolves(path))
    assert missing == []


def test_the_resolver_refuses_a_path_that_is_not_there():
    assert _resolves("flodl_hf.elche.noise_scale.adascale_gain")
    assert not _resolves("flodl_hf.noise_scale.adascale_gain")  # moved to flodl_hf.elche; the old path must not resolve
    assert not _resolves("flodl_hf.data.no_such_loader")


def test_the_documented_entry_points_keep_working():
    from flodl_hf.builder.checkpoint import read_checkpoint
    from flodl_hf.data import load_text_classification
    from flodl_hf.elche.noise_scale import adascale_gain

    assert callable(read_checkpoint) and callable(load_text_classification) and callable(adascale_gain)
    proc = subprocess.run([sys.executable, "-m", "flodl_hf", "--help"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0 and "usage: flodl-hf" in proc.stdout, proc.stderr
    script = Path(sys.executable).with_name("flodl-hf")  # the console script scripts/bootstrap.sh installs
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and "usage: flodl-hf" in proc.stdout, proc.stderr
