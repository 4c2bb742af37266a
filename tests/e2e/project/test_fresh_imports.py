"""What importing flodl-hf's modules does, seen from a fresh interpreter: these checks need one (the test process
has long imported torch), so they live in the end-to-end tier, each starting ``python -c``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

import heads
from flodl_hf import DdpConfig, Graph, Trainer
from flodl_hf.elche.noise_scale import statistical_efficiency

REPO = ROOT = Path(__file__).resolve().parents[3]
HEADS_DIR = Path(heads.__file__).parent


def test_el_che_import_does_not_load_torch():
    code = "import sys, flodl_hf.elche.scheduler; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.split() == ["False", "False"]


def test_noise_scale_import_does_not_load_torch():
    code = ("import sys, flodl_hf.elche.noise_scale, flodl_hf.elche.goodput, flodl_hf.elche.scheduler; "
            "sys.exit(1 if 'torch' in sys.modules or 'torch.distributed' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    assert math.isfinite(statistical_efficiency(1.0, 1, 1))


def test_importing_heads_does_nothing_observable():
    probe = r"""
import contextlib, io, json, logging, os, sys, warnings
import torch
env, threads, dtype = dict(os.environ), torch.get_num_threads(), torch.get_default_dtype()
root = logging.getLogger()
handlers, level = list(root.handlers), root.level
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    import heads
ours = logging.getLogger("flodl_hf.heads")
print(json.dumps({
    "env_changed": sorted(k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k)),
    "threads": torch.get_num_threads() == threads, "dtype": torch.get_default_dtype() == dtype,
    "root": list(root.handlers) == handlers and root.level == level,
    "ours": [len(ours.handlers), ours.level], "stdout": out.getvalue(), "stderr": err.getvalue(),
}))
"""
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=180, cwd=HEADS_DIR.parent
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {
        "env_changed": [],
        "threads": True,
        "dtype": True,
        "root": True,
        "ours": [0, 0],
        "stdout": "",
        "stderr": "",
    }


def _graph() -> Graph:
    def build(dev=None):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 2))

    graph = Graph(build())
    Trainer.setup_with(graph, build, lambda p: torch.optim.AdamW(p, lr=1e-2), DdpConfig(verbose=False))
    return graph


def test_the_job_plan_is_read_without_torch(tmp_path):
    graph = _graph()
    graph.module(torch.randn(4, 6)).pow(2).mean().backward()
    graph.step()
    graph.save_checkpoint(tmp_path, extra={"plan": {"seed": 3}, "loop": {"losses": [0.5]}})
    code = ("import sys; from flodl_hf.job.checkpoints import read_job_state; "
            f"e = read_job_state({str(tmp_path)!r}); assert e['plan'] == {{'seed': 3}}, e; "
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.stdout.strip() == "ok", result.stderr[-2000:]
