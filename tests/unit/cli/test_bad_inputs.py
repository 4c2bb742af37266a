"""The bad-input catalogue (docs/bad-input.md): every item through the real CLI, in-process.

Each case builds its bad input in a fresh directory, runs ``flodl_hf.cli.main(["train", ...])`` and checks the
contract: exit code 2 (1 for a NaN loss), exactly one ``flodl-hf: error:`` line on stderr naming the problem and
the fix, no traceback, and no output directory or partial file left behind. Where the message comes from the
engine or the heads, this only checks that the CLI surfaces it as one clean line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
from cli_helpers import python_spellings
from tiny_models import toy_task

from flodl_hf import cli

pytestmark = pytest.mark.usefixtures("one_thread")


def write_csv(path: Path, rows, header: str = "text,label") -> Path:
    path.write_text(header + "\n" + "".join(f"{text},{label}\n" for text, label in rows), encoding="utf-8")
    return path


def toy_csv(directory: Path) -> Path:
    return write_csv(directory / "toy.csv", [(text, "pos" if label else "neg") for text, label in toy_task(60)])


def copy_model(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


# Each builder gets (tmp_path, tiny_checkpoint) and returns the train arguments (the output dir is added after).

def labels_out_of_range(tmp, ckpt):
    data = write_csv(tmp / "ints.csv", [(text, i % 6) for i, (text, _) in enumerate(toy_task(60))])
    return ["--model", ckpt("bert"), "--data", data, "--labels", "a,b"]


def num_labels_mismatch(tmp, ckpt):
    return ["--model", ckpt("bert", with_classifier=True, num_labels=3), "--data", toy_csv(tmp), "--labels",
            "neg,pos"]


def unknown_model_type(tmp, ckpt):
    model = copy_model(ckpt("bert"), tmp / "gpt")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(dict(config, model_type="gpt2")))
    return ["--model", model, "--data", toy_csv(tmp)]


def missing_weights(tmp, ckpt):
    model = copy_model(ckpt("bert"), tmp / "noweights")
    (model / "model.safetensors").unlink()
    return ["--model", model, "--data", toy_csv(tmp)]


def corrupt_weights(tmp, ckpt):
    model = copy_model(ckpt("bert"), tmp / "corrupt")
    weights = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    return ["--model", model, "--data", toy_csv(tmp)]


def empty_dataset(tmp, ckpt):
    (tmp / "empty.csv").write_text("text,label\n")
    return ["--model", ckpt("bert"), "--data", tmp / "empty.csv"]


def missing_text_column(tmp, ckpt):
    return ["--model", ckpt("bert"), "--data", toy_csv(tmp), "--text-column", "review"]


def missing_label_column(tmp, ckpt):
    return ["--model", ckpt("bert"), "--data", toy_csv(tmp), "--label-column", "sentiment"]


def non_text_values(tmp, ckpt):
    rows = [{"text": 5 if i == 3 else "a good film", "label": "pos" if i % 2 else "neg"} for i in range(20)]
    (tmp / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return ["--model", ckpt("bert"), "--data", tmp / "rows.jsonl"]


def batch_size_zero(tmp, ckpt):
    return ["--model", ckpt("bert"), "--data", toy_csv(tmp), "--batch-size", "0"]


def unknown_device(tmp, ckpt):
    return ["--model", ckpt("bert"), "--data", toy_csv(tmp), "--devices", "tpu"]


def speed_hint_below_one(tmp, ckpt):
    return ["--model", ckpt("bert"), "--data", toy_csv(tmp), "--devices", "cpu,cpu", "--speed-hint", "1:0.5"]


def overhead_target_out_of_range(tmp, ckpt):
    return ["--model", ckpt("bert"), "--data", toy_csv(tmp), "--overhead-target", "0.9"]


def overhead_target_without_room(tmp, ckpt):
    return ["--model", ckpt("bert"), "--data", toy_csv(tmp), "--overhead-target", "0.2"]


def foreign_output_dir(tmp, ckpt):
    (tmp / "out").mkdir()
    (tmp / "out" / "notes.txt").write_text("keep me")
    return ["--model", ckpt("bert"), "--data", toy_csv(tmp)]


FAST = ["--batch-size", "8", "--eval-rows", "20", "--max-length", "16", "--no-progress"]


def incompatible_checkpoint(tmp, ckpt):
    args = ["--model", ckpt("bert"), "--data", toy_csv(tmp), *FAST, "--train-rows", "16"]
    first = tmp / "first"
    assert cli.main(["train", *args, "--output-dir", first, "--checkpoint-every", "1", "--keep-checkpoint"]) == 0
    return [*args, "--batch-size", "4", "--resume", tmp / "first.checkpoint"]


def nan_loss(tmp, ckpt):
    return ["--model", ckpt("bert"), "--data", toy_csv(tmp), *FAST, "--lr", "1e6"]


CASES: list[tuple[str, Callable, int, tuple[str, ...]]] = [
    ("labels out of range", labels_out_of_range, 2,
     ("column 'label' has labels '0' (row 1), '1' (row 2)", "which are not among the known labels ['a', 'b']",
      "pass the full label list")),
    ("num_labels mismatch with the checkpoint", num_labels_mismatch, 2,
     ("holds a trained 3-label classifier", "--labels neg,pos give 2: fine-tune from the base checkpoint")),
    ("unknown model_type", unknown_model_type, 2,
     ("model_type 'gpt2' is not supported", "supported model types are bert, distilbert")),
    ("missing weights", missing_weights, 2, ("no weights file in", "expected one of model.safetensors")),
    ("corrupt weights", corrupt_weights, 2, ("is corrupt or truncated", "re-download or re-save the checkpoint")),
    ("empty dataset", empty_dataset, 2, ("has no data rows", "give a file with a header and at least one")),
    ("missing text column", missing_text_column, 2,
     ("has no text column 'review'; available columns: 'text', 'label'", "--text-column")),
    ("missing label column", missing_label_column, 2,
     ("has no label column 'sentiment'; available columns: 'text', 'label'", "--label-column")),
    ("non-text values in the text column", non_text_values, 2,
     ("row 4 has a int (5) in text column 'text'", "every text must be a string")),
    ("--batch-size 0", batch_size_zero, 2, ("argument --batch-size: 0 is too small", "use an integer >= 1")),
    ("unknown device", unknown_device, 2, ("unknown device 'tpu'", "use 'cpu', 'cuda' or 'cuda:N'")),
    ("speed hint below 1", speed_hint_below_one, 2,
     ("argument --speed-hint: ratio 0.5 in '1:0.5' must be >= 1", "name the slower rank")),
    ("overhead target out of range", overhead_target_out_of_range, 2,
     ("argument --overhead-target: 0.9 is out of range", "in [0.01, 0.5]")),
    ("overhead target without --max-anchor", overhead_target_without_room, 2,
     ("--overhead-target 0.2 is invalid: it lengthens El Che's window", "CLI --max-anchor N")),
    ("output dir exists and is not ours", foreign_output_dir, 2,
     ("is not empty and was not written by flodl-hf", "choose another --output-dir")),
    ("resume from an incompatible checkpoint", incompatible_checkpoint, 2,
     ("it was written with --batch-size 8 but this run has 4", "resume with the same settings")),
    ("NaN loss", nan_loss, 1,
     ("the training loss became nan at step 2 (epoch 1)", "retry with a lower --lr (e.g. 5e-05)")),
]


@pytest.mark.parametrize("name, build, exit_code, needles", CASES, ids=[case[0] for case in CASES])
def test_bad_input(name, build, exit_code, needles, tmp_path, tiny_checkpoint, capsys):
    args = [str(a) for a in build(tmp_path, tiny_checkpoint)]
    before = {p.name for p in tmp_path.iterdir()}
    capsys.readouterr()
    code = cli.main(["train", *args, "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == exit_code, err
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("flodl-hf: error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    assert not python_spellings("train", errors[0]), errors[0]  # rule 9: options, not Python fields
    # Only the engine's one-line setup diagnostic may precede an error raised during training.
    assert all(line.startswith("flodl-hf: ") for line in lines), err
    assert lines[-1] == errors[0]
    if name == "output dir exists and is not ours":
        assert [p.name for p in (tmp_path / "out").iterdir()] == ["notes.txt"]
    else:
        assert not (tmp_path / "out").exists()
    created = {p.name for p in tmp_path.iterdir()} - before
    assert not created, created  # no output, no staging directory, no checkpoint written from a bad state


def test_the_docs_list_the_classes_and_point_at_the_suite():
    section = (Path(__file__).resolve().parents[3] / "docs" / "bad-input.md").read_text(encoding="utf-8")
    assert "tests/e2e/cli/test_hostile_inputs.py" in section and "tests/hostile_cases.py" in section
    for kind in ("ownership", "paths", "numbers", "devices", "model directory", "data", "labels", "model damage",
                 "signals and faults"):
        assert f"| {kind} |" in section, kind
