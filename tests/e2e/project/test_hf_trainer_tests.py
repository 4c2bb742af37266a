"""``scripts/hf_trainer_tests.sh`` judges ElCheTrainer by transformers' own Trainer tests; this checks the judge.

Why it exists: the script's verdict (every test that passes with ``transformers.Trainer`` passes with ElCheTrainer in
its place) is reported in docs/trainer.md, so the script must really swap the class before the test modules load,
really compare the two runs test by test, and import the classes transformers 5 removed as None. transformers'
files are not part of this project, so the folder here is written in their layout: a ``trainer_test_utils.py`` and
``test_trainer*.py`` files importing ``Trainer`` from transformers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

UTILS = '''
import torch
from torch import nn


class Line(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(0.5))

    def forward(self, x, labels=None):
        y = self.a * x
        return (nn.functional.mse_loss(y, labels), y) if labels is not None else (y,)


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"x": torch.tensor(float(i)), "labels": torch.tensor(2.0 * i)}
'''

TESTS = '''
from transformers import (
    GlueDataset,
    Trainer,
    TrainingArguments,
)

from .trainer_test_utils import Line, Rows


def test_trains_and_predicts(tmp_path):
    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to=[], max_steps=2, per_device_train_batch_size=4,
                             disable_tqdm=True, save_strategy="no")
    trainer = Trainer(Line(), args, train_dataset=Rows())
    trainer.train()
    assert trainer.predict(Rows()).predictions.shape == (8,)


def test_is_transformers_own_class():
    assert Trainer.__name__ == "Trainer" and GlueDataset in (None, GlueDataset)
'''


def test_script_swaps_the_class_compares_the_runs_and_guards_removed_imports(tmp_path):
    folder = tmp_path / "trainer"
    folder.mkdir()
    (folder / "trainer_test_utils.py").write_text(UTILS)
    (folder / "test_trainer_judge.py").write_text(TESTS)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = subprocess.run(["bash", "scripts/hf_trainer_tests.sh", str(folder)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "FLODL_HF_PYTHON": sys.executable, "TMPDIR": str(scratch)})
    out = proc.stdout
    assert proc.returncode == 1, (out, proc.stderr)  # the class-name test passes only with transformers' own Trainer
    assert "plain: 2 passed" in out and "swap: 1 failed, 1 passed" in out, out
    lost = out.split("passes with Trainer, not with ElCheTrainer:")[1].split()
    assert lost == ["tests/trainer/test_trainer_judge.py::test_is_transformers_own_class"], out
    assert (folder / "test_trainer_judge.py").read_text() == TESTS  # the folder given is read, never changed
    assert not list(scratch.glob("flodl-hf-trainer-tests.*"))  # its working copy is gone
