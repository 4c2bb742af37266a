"""The README's quickstart code runs as written (on the packaged model and corpus), and its claims hold."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quickstart_runs_as_written(tmp_path):
    block = next(b for b in _python_blocks() if "Trainer.setup_head(" in b)
    script = tmp_path / "quickstart.py"
    script.write_text(block)
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"\[\[\('(negative|neutral|positive)', 0\.\d+\)\]\]", proc.stdout), proc.stdout
    assert (tmp_path / "my-classifier" / "config.json").is_file()
    assert "flodl-hf: cpu |" in proc.stderr


def test_readme_names_the_commands_that_exist():
    assert "bash scripts/default_job.sh" in README and (ROOT / "scripts" / "default_job.sh").is_file()
    assert "bash scripts/test.sh" in README and (ROOT / "scripts" / "test.sh").is_file()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci  # CI runs exactly the README's test command
    for path in re.findall(r"`(examples/[\w./-]+)`", README):
        assert (ROOT / path).exists(), path


@pytest.mark.timeout(300)
def test_task_heads_block_runs_as_written(tmp_path):
    """The README's token classification / QA / masked-LM block runs as written on the packaged MiniLM."""
    block = next(b for b in _python_blocks() if "AutoHeadForMaskedLM.from_pretrained(" in b)
    script = tmp_path / "task_heads.py"
    script.write_text(block + "\nprint('answer', qa.answer(q, c)['answer'] in c)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "answer True" in proc.stdout
