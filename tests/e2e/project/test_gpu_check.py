"""``scripts/gpu_check.sh`` runs its CPU-capable parts in the suite (``GPU_CHECK_DEVICE=cpu``, tiny sizes): the
default job in fp32 and bf16, the single-device overhead benchmark, the comparison with transformers' Trainer and
the memory probe, so the script a GPU session runs is known to work before a GPU is at hand."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from warm_python import session

ROOT = Path(__file__).resolve().parents[3]


def test_gpu_check_script_runs_its_cpu_parts(tmp_path):
    stand_in = tmp_path / "bin"  # the script's python on the warm interpreter (tests/warm_python.py)
    stand_in.mkdir()
    session().write_wrappers(str(stand_in))
    env = {**os.environ, "FLODL_HF_PYTHON": str(stand_in / "python"), "GPU_CHECK_DEVICE": "cpu",
           "GPU_CHECK_SMALL": "1", "GPU_CHECK_OUT": str(tmp_path / "out"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for line in ("== 1. GPU-marked tests", "skipped: GPU_CHECK_DEVICE=cpu", "default job fp32:", "default job bf16:",
                 "== 3. single-device overhead", "flodl-hf / Trainer time per step", "memory probe: cpu",
                 "gpu_check: PASSED"):
        assert line in out, f"{line!r} missing from:\n{out[-4000:]}"
    assert "gpu_check: PASSED" in (tmp_path / "out" / "results.txt").read_text()
