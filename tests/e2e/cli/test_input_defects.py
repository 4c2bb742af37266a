"""Input defects a user trial found (defects 5-7, 9-12): each is refused in one line naming the file, the row or
value and the fix, or (valid data) accepted.

Data and API defects are checked in-process; the command-line ones run the real ``python -m flodl_hf`` in a
subprocess (exit code 2, exactly one ``flodl-hf: error:`` line, no traceback), on a tiny checkpoint that
``tiny_models`` builds offline.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import one_error
from tiny_models import make_checkpoint, toy_task

from flodl_hf import cli
from flodl_hf.data import TextDataset, load_text_classification
from flodl_hf.preflight import check_model_dir, model_labels
from flodl_hf.data.qa import load_qa_data
from warm_python import python_command

ROOT = Path(__file__).resolve().parents[3]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), FLODL_HF_NO_LAUNCH="1", HF_HUB_OFFLINE="1")


def run(*argv, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(python_command("-m", "flodl_hf") + [*map(str, argv)], cwd=cwd, env=ENV, text=True,
                          capture_output=True, timeout=300, errors="replace")


def toy_csv(path: Path, n: int = 60) -> Path:
    path.write_text("text,label\n" + "".join(f"{t},{'pos' if y else 'neg'}\n" for t, y in toy_task(n)))
    return path


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict:
    """A tiny base checkpoint, a toy CSV and a classifier trained on it (read-only: copy before damaging)."""
    root = tmp_path_factory.mktemp("defects-shared")
    base = make_checkpoint("bert", root / "base", with_classifier=False)
    data = toy_csv(root / "toy.csv")
    trained = root / "trained"
    code = cli.main(["train", "--model", base, "--data", data, "--output-dir", trained, "--batch-size", "8",
                     "--max-length", "16", "--eval-rows", "12", "--no-progress"])
    assert code == 0
    return {"root": root, "base": base, "data": data, "trained": trained}


def damaged_copy(source: Path, target: Path, id2label: dict) -> Path:
    """A copy of ``source`` whose config.json holds ``id2label`` (label2id its inverse, as the repro wrote it)."""
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config["id2label"] = id2label
    config["label2id"] = {v: int(k) if k.isdigit() else k for k, v in id2label.items()}
    (target / "config.json").write_text(json.dumps(config, indent=1))
    return target


# --- 5: deeply nested JSON -------------------------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("name, content, where", [
    ("deep.json", DEEP, "deep.json is nested too deeply"),
    ("deep.jsonl", '{"text": "a", "label": ' + DEEP + "}\n", "deep.jsonl: line 1 is nested too deeply"),
    ("rows.json", "[" + '{"text": "a", "label": ' + "[" * 990 + "]" * 990 + "}]", "rows.json"),
])
def test_deeply_nested_json_is_one_clear_error(tmp_path, name, content, where):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError) as info:
        load_text_classification(tmp_path / name)
    assert where in str(info.value) and "Recursion" not in str(info.value), str(info.value)[:300]


def test_deeply_nested_squad_json_is_one_clear_error(tmp_path):
    (tmp_path / "squad_deep.json").write_text('{"data": [' + "[" * 50_000 + "]" * 50_000 + "]}")
    with pytest.raises(ValueError, match=r"squad_deep\.json is nested too deeply"):
        load_qa_data(tmp_path / "squad_deep.json")


def test_deeply_nested_json_through_the_cli(shared, tmp_path):
    (tmp_path / "deep.json").write_text(DEEP)
    (tmp_path / "deep.jsonl").write_text('{"text": "a", "label": ' + DEEP + "}\n")
    line = one_error(run("train", "--model", shared["base"], "--data", "deep.json", "--output-dir", "out",
                         "--no-progress", cwd=tmp_path))
    assert "deep.json is nested too deeply" in line
    line = one_error(run("eval", "--model", shared["trained"], "--data", "deep.jsonl", "--no-progress",
                         cwd=tmp_path))
    assert "deep.jsonl: line 1 is nested too deeply" in line
    assert not (tmp_path / "out").exists()


# --- 6: CSV rows with more or fewer fields than the header --------------------------------------------------------

def test_csv_row_with_an_extra_field_is_refused(tmp_path):
    path = tmp_path / "extra.csv"
    path.write_text("text,label\n" + "".join(f"good movie {i},pos\nbad movie {i},neg\n" for i in range(20))
                    + "hello, world,pos\n")
    with pytest.raises(ValueError) as info:
        load_text_classification(path)
    message = str(info.value)
    assert "extra.csv: row 41 (line 42) has 3 fields but the header has 2 columns" in message, message
    assert "quote" in message, message


def test_tsv_row_with_a_missing_field_is_refused(tmp_path):
    path = tmp_path / "short.tsv"
    path.write_text("text\tlabel\tsource\n" + "good\tpos\tweb\n" + "bad\tneg\n")
    with pytest.raises(ValueError, match=r"short\.tsv: row 2 \(line 3\) has 2 fields but the header has 3 columns"):
        load_text_classification(path)


def test_quoted_delimiters_and_blank_lines_are_still_read(tmp_path):
    path = tmp_path / "ok.csv"
    path.write_text('text,label\n"hello, world",pos\n\nbad film,neg\n   \n')
    ds = load_text_classification(path)
    assert ds.texts == ["hello, world", "bad film"] and ds.dropped == 1


def test_extra_field_through_the_cli(shared, tmp_path):
    (tmp_path / "extra.csv").write_text(toy_csv(tmp_path / "t.csv").read_text() + "hello, world,pos\n")
    line = one_error(run("train", "--model", shared["base"], "--data", "extra.csv", "--output-dir", "out",
                         "--no-progress", cwd=tmp_path))
    assert "extra.csv: row 61 (line 62) has 3 fields but the header has 2 columns" in line
    assert not (tmp_path / "out").exists()


# --- 7: SQuAD JSON that repeats a key ----------------------------------------------------------------------------

def test_squad_json_repeating_a_key_is_refused(tmp_path):
    ctx = "the movie was good"
    paragraph = ('{"context": "IGNORED", "context": %s, "qas": [{"id": "q1", "question": "which word is good", '
                 '"answers": [{"text": "good", "answer_start": %d}]}]}' % (json.dumps(ctx), ctx.index("good")))
    (tmp_path / "squad_dup.json").write_text('{"data": [{"title": "t", "paragraphs": [' + paragraph + "]}]}")
    with pytest.raises(ValueError, match=r"squad_dup\.json has an object that repeats the key\(s\) 'context'"):
        load_qa_data(tmp_path / "squad_dup.json")


# --- 9: a damaged label map in a model's config.json -------------------------------------------------------------

@pytest.mark.parametrize("id2label, needle", [
    ({"0": "pos", "1": "pos"}, "repeats the label name(s) 'pos'"),
    ({"0": "neg", "2": "pos"}, "has ids 0, 2 where 2 labels need exactly 0..1"),
    ({"0": "neg", "x": "pos"}, "has ids 0, 'x' where 2 labels need exactly 0..1"),
    ({"0": "neg", "1": None}, "names id 1 None"),
])
def test_damaged_label_map_is_refused_by_the_model_check(shared, tmp_path, id2label, needle):
    model = damaged_copy(shared["trained"], tmp_path / "damaged", id2label)
    with pytest.raises(ValueError) as info:
        check_model_dir(model)
    message = str(info.value)
    assert f"{model / 'config.json'}" in message and needle in message and "--model" in message, message


@pytest.mark.parametrize("command", ["eval", "predict"])
@pytest.mark.parametrize("id2label", [{"0": "pos", "1": "pos"}, {"0": "neg", "2": "pos"}])
def test_damaged_label_map_through_eval_and_predict(shared, tmp_path, command, id2label):
    model = damaged_copy(shared["trained"], tmp_path / "damaged", id2label)
    extra = ["--data", shared["data"], "--no-progress"] if command == "eval" else ["good movie"]
    line = one_error(run(command, "--model", model, *extra, cwd=tmp_path))
    assert "config.json has a damaged label map" in line and "--labels" not in line, line


def test_fresh_head_from_a_base_whose_label_map_is_damaged_still_trains(shared, tmp_path):
    """A base checkpoint's label map describes no trained classifier: training takes the labels from the data."""
    base = damaged_copy(shared["base"], tmp_path / "base", {"0": "x", "1": "x"})
    assert check_model_dir(base) == base
    code = cli.main(["train", "--model", base, "--data", shared["data"], "--output-dir", tmp_path / "out",
                     "--batch-size", "8", "--max-length", "16", "--eval-rows", "12", "--epochs", "1",
                     "--no-progress"])
    assert code == 0
    assert model_labels(tmp_path / "out") == ["neg", "pos"]


def test_training_on_from_a_trained_classifier_with_a_damaged_map_is_refused(shared, tmp_path, capsys):
    model = damaged_copy(shared["trained"], tmp_path / "damaged", {"0": "pos", "1": "pos"})
    code = cli.main(["train", "--model", model, "--data", shared["data"], "--output-dir", tmp_path / "out",
                     "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "config.json has a damaged label map" in err, err
    assert not (tmp_path / "out").exists()


# --- 10: oversized values --------------------------------------------------------------------------------------

def test_a_5000_digit_label_names_file_row_and_value(tmp_path):
    (tmp_path / "big.jsonl").write_text('{"text": "a b", "label": 1}\n{"text": "c d", "label": ' + "9" * 5000
                                        + "}\n")
    with pytest.raises(ValueError) as info:
        load_text_classification(tmp_path / "big.jsonl")
    message = str(info.value)
    assert "big.jsonl: line 2 holds a number of 5000 digits (99999999999999999999..." in message, message
    assert "set_int_max_str_digits" not in message and len(message) < 400


def test_a_5000_digit_number_in_a_json_array_names_its_row(tmp_path):
    rows = [{"text": "a", "label": 1}, {"text": "b", "label": 2}]
    (tmp_path / "big.json").write_text(json.dumps(rows)[:-1] + ', {"text": "c", "label": ' + "7" * 5000 + "}]")
    with pytest.raises(ValueError, match=r"big\.json: row 3 holds a number of 5000 digits \(7777"):
        load_text_classification(tmp_path / "big.json")


def test_a_5000_digit_label_in_a_csv_names_its_row(tmp_path):
    (tmp_path / "big.csv").write_text("text,label\na,1\nb,2\nc," + "8" * 5000 + "\n")
    with pytest.raises(ValueError, match=r"big\.csv: row 3 has a label of 5000 digits \(8888.*--label-column"):
        load_text_classification(tmp_path / "big.csv")


def test_a_5000_digit_answer_start_in_squad_json(tmp_path):
    (tmp_path / "squad.json").write_text('{"data": [{"paragraphs": [{"context": "c", "qas": [{"question": "q", '
                                         '"answers": [{"text": "c", "answer_start": ' + "1" * 5000 + "}]}]}]}]}")
    with pytest.raises(ValueError, match=r"squad\.json.* holds a number of 5000 digits"):
        load_qa_data(tmp_path / "squad.json")


def test_a_200_kb_csv_field_is_read_and_the_field_limit_restored(tmp_path):
    before = csv.field_size_limit()
    path = tmp_path / "long.csv"
    path.write_text("text,label\n" + "word " * 40_000 + ",pos\n" + "".join(f"t {i},neg\n" for i in range(30)))
    ds = load_text_classification(path)
    assert len(ds.texts[0]) == 200_000 and ds.labels == ["neg", "pos"]
    assert csv.field_size_limit() == before


# --- 11: the Python API ----------------------------------------------------------------------------------------

def test_labels_as_one_string_are_refused(shared):
    with pytest.raises(ValueError, match=r"labels='neg,pos' is one string: pass a list of label names"):
        load_text_classification(shared["data"], labels="neg,pos")


def test_labels_as_a_tuple_still_work(shared):
    assert load_text_classification(shared["data"], labels=("pos", "neg")).labels == ["pos", "neg"]


@pytest.mark.parametrize("label_ids, needle", [
    ([0.7, 1.9], "row 1 has label id 0.7 (a float)"),
    ([True, False], "row 1 has label id True (a bool)"),
    ([0, "1"], "row 2 has label id '1' (a str)"),
])
def test_text_dataset_refuses_non_integer_label_ids(label_ids, needle):
    with pytest.raises(ValueError) as info:
        TextDataset(["a", "b"], label_ids, ["neg", "pos"])
    assert needle in str(info.value) and "integer" in str(info.value), str(info.value)


def test_text_dataset_refuses_non_integer_multi_label_ids():
    with pytest.raises(ValueError, match=r"row 2 has label id 1.5 \(a float\)"):
        TextDataset(["a", "b"], [[0], [1.5]], ["x", "y"], problem_type="multi_label")


def test_text_dataset_refuses_non_string_texts():
    with pytest.raises(ValueError, match=r"text 1 is a int \(1\), not a string"):
        TextDataset([1, None], [0, 1], ["neg", "pos"])
    with pytest.raises(ValueError, match=r"second text 2 is a NoneType \(None\), not a string"):
        TextDataset(["a", "b"], [0, 1], ["neg", "pos"], text_pairs=["x", None])


def test_text_dataset_still_takes_numpy_and_tuple_ids():
    import numpy as np

    ds = TextDataset(("a", "b"), np.array([1, 0]), ("neg", "pos"))
    assert ds.label_ids == [1, 0] and all(type(i) is int for i in ds.label_ids)
    ds = TextDataset(["a", "b"], [(1, 0), ()], ["x", "y"], problem_type="multi_label")
    assert ds.label_ids == [(0, 1), ()]


def test_from_pretrained_refuses_a_single_label(shared):
    from heads import AutoHeadForSequenceClassification

    with pytest.raises(ValueError, match=r"labels=\['only'\] names 1 class: a classifier needs at least 2"):
        AutoHeadForSequenceClassification.from_pretrained(shared["base"], labels=["only"])
    with pytest.raises(ValueError, match=r"labels='ab' is one string: pass a list"):
        AutoHeadForSequenceClassification.from_pretrained(shared["base"], labels="ab")
    head = AutoHeadForSequenceClassification.from_pretrained(shared["base"], labels=("neg", "pos"))
    assert list(head.labels()) == ["neg", "pos"]


# --- 12: a missing data file -------------------------------------------------------------------------------------

def test_missing_eval_data_says_what_to_pass(shared, tmp_path):
    line = one_error(run("eval", "--model", shared["trained"], "--data", "nope.csv", cwd=tmp_path))
    assert line == ("flodl-hf: error: data file not found: nope.csv: give an existing file, a saved datasets "
                    "directory or a Hub dataset id with --data")
