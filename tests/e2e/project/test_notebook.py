"""The example notebook runs top to bottom (nbclient, a real kernel), as a user would run it."""

from __future__ import annotations

import pytest

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_setup_head_notebook_runs(tmp_path):
    import nbclient  # dev dependencies: a missing one is a broken test environment, not a skip
    import nbformat
    nb = nbformat.read(ROOT / "examples" / "finetune_setup_head.ipynb", as_version=4)
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    outputs = "\n".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                        for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    assert "optimizer steps" in outputs
    assert "held-out accuracy:" in outputs
    errors = [o for cell in nb.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
