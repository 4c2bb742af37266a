"""A write that fails says what happened and what is intact, in one line, and leaves what it said (rule 8).

Each command runs as ``flodl-hf`` does, in a process of its own, with every file capped at a size its output
exceeds (``tests/size_limited.py``: the kernel then fails the write with EFBIG, in Python's writes and in
safetensors' Rust writer alike). Each writes over an earlier output of its own (``--overwrite``, an earlier
``--json``), which must be byte for byte as it was, with no temporary left beside it. A full disk (ENOSPC) takes the
same path; safetensors reports it inside its own exception, whose OS error is read out. Shown failing once: before,
``export`` ended in a ``SafetensorError`` traceback and ``eval --json`` and ``train`` in an ``OSError`` traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import cli_env
from tiny_models import make_checkpoint, toy_task

from flodl_hf import cli

LIMITED = Path(__file__).resolve().parents[2] / "size_limited.py"
FAST = ["--batch-size", "8", "--max-length", "16", "--eval-rows", "12", "--no-progress"]


def _listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("writes")
    make_checkpoint("bert", root / "base", with_classifier=False)
    (root / "toy.csv").write_text("text,label\n" + "".join(f"{t},{'pos' if y else 'neg'}\n" for t, y in toy_task(60)))
    assert cli.main(["train", "--model", str(root / "base"), "--data", str(root / "toy.csv"), "--output-dir",
                     str(root / "trained"), *FAST]) == 0
    assert cli.main(["export", "--model", str(root / "trained"), "--output", str(root / "exported")]) == 0
    assert cli.main(["eval", "--model", str(root / "trained"), "--data", str(root / "toy.csv"), "--json",
                     str(root / "e.json")]) == 0
    return root


CASES = {  # command, the cap in bytes, what the line says is intact, the option it names
    "export": (["export", "--model", "trained", "--output", "exported", "--overwrite"], 20_000,
               "--output is as it was", "choose another --output"),
    "eval --json": (["eval", "--model", "trained", "--data", "toy.csv", "--json", "e.json"], 64,
                    "--json FILE is as it was", "choose another --json FILE"),
    "train": (["train", "--model", "base", "--data", "toy.csv", "--output-dir", "trained", "--overwrite", *FAST],
              20_000, "the previous checkpoint, if any, and --output-dir are as they were",
              "choose another --output-dir or --checkpoint-dir"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_failed_write_is_one_line_and_leaves_the_earlier_output(work, name):
    argv, cap, intact, option = CASES[name]
    before = _listing(work)
    result = subprocess.run([sys.executable, str(LIMITED), str(cap), *argv], cwd=work, env=cli_env(),
                            capture_output=True, text=True, timeout=300)
    errors = [line for line in result.stderr.splitlines() if line.startswith("flodl-hf: error: ")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert errors[0].startswith("flodl-hf: error: a file grew past the size limit"), errors[0]
    assert f"; {intact}: raise the limit, or {option}" in errors[0], errors[0]
    assert _listing(work) == before  # byte for byte, and no temporary or staging directory left
    assert sorted(p.name for p in work.iterdir()) == sorted({Path(p).parts[0] for p in before})


def test_a_full_disk_inside_safetensors_is_read_out():
    """safetensors reports a failed write as ``SafetensorError("... (os error 28)")``: its OS error is the one
    line's, as for any other full disk."""
    from safetensors import SafetensorError

    from flodl_hf.preflight import fs_error_message, os_error_of

    # the wording of safetensors' writer, as it reports EFBIG in the test above, with ENOSPC's code
    error = os_error_of(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"))
    assert error is not None and error.errno == 28
    assert fs_error_message(error, "--output", "--output is as it was") == (
        "no space left on the device; --output is as it was: free space, or choose another --output")
    assert os_error_of(SafetensorError("header too large")) is None and os_error_of(ValueError("x")) is None
