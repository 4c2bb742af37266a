"""What CLI tests check of a refused ``flodl-hf`` command, in one place (test helper only)."""

from __future__ import annotations

import subprocess


def one_error(result: subprocess.CompletedProcess) -> str:
    """The single ``flodl-hf: error:`` line of a refused command (exit 2, no traceback)."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("flodl-hf: error: ")]
    assert len(lines) == 1, result.stderr[-2000:]
    return lines[0]
