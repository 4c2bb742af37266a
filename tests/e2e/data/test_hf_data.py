"""Labels and problem types, data and CLI side: labels matched by name, problem types and their metrics, the CLI speaking
``datasets`` (splits, parquet, arrow, Hub ids), sentence-pair items, and the best checkpoint written.

Every test uses real ``datasets`` objects and the real CLI (``python -m flodl_hf`` in a subprocess where the
exit code and the one error line matter; ``cli.main`` in-process where only the written outputs do), on a tiny
offline BERT (``tests/tiny_models.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
from cli_helpers import one_error
from tiny_models import make_checkpoint, toy_task

from flodl_hf import cli
from flodl_hf.data import load_text_classification
from flodl_hf.metrics.regression import pearson, spearman
from warm_python import python_command

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.usefixtures("single_thread_module")  # one torch thread
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), FLODL_HF_NO_LAUNCH="1", HF_HUB_OFFLINE="1",
           HF_DATASETS_OFFLINE="1")
FAST = ["--batch-size", "16", "--epochs", "3", "--lr", "2e-3", "--max-length", "16", "--no-progress"]
NAMES = ["neg", "pos"]




def class_dataset(rows, names, ids_of=None) -> datasets.Dataset:
    """A Dataset with a ClassLabel column ``label`` whose names are ``names`` (rows hold label *names*)."""
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=names)})
    return datasets.Dataset.from_dict({"text": [t for t, _ in rows], "label": [names.index(n) for _, n in rows]},
                                      features=features)


def cli_run(*argv, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(python_command("-m", "flodl_hf") + [*map(str, argv)], env=ENV, text=True,
                          capture_output=True, timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfdata")
    make_checkpoint("bert", root / "base", with_classifier=False)
    rows = [(text, NAMES[y]) for text, y in toy_task(480, seed=1)]
    train, test = rows[:400], rows[400:]
    datasets.DatasetDict({"train": class_dataset(train, NAMES), "validation": class_dataset(test[:40], NAMES),
                          "test": class_dataset(test, NAMES)}).save_to_disk(str(root / "dd"))
    class_dataset(test, NAMES).save_to_disk(str(root / "test_same"))
    class_dataset(test, ["pos", "neg"]).save_to_disk(str(root / "test_reordered"))  # other ids, same names
    class_dataset([r for r in test if r[1] == "pos"], ["pos"]).save_to_disk(str(root / "test_subset"))
    odd = [(t, "meh" if i % 7 == 0 else n) for i, (t, n) in enumerate(test)]
    class_dataset(odd, ["pos", "meh", "neg"]).save_to_disk(str(root / "test_unknown"))
    return root


@pytest.fixture(scope="module")
def trained(work):
    out = work / "out"
    code = cli.main(["train", "--model", work / "base", "--data", work / "dd", "--eval-split", "validation",
                     "--output-dir", out, *FAST])
    assert code == 0
    return out


# --- 1. labels matched by name --------------------------------------------------------------------------------------

def accuracy_of(model: Path, data: Path, tmp_path: Path, name: str) -> float:
    result = cli_run("eval", "--model", model, "--data", data, "--json", tmp_path / f"{name}.json", "--no-progress")
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads((tmp_path / f"{name}.json").read_text())["accuracy"]


def test_reordered_class_label_scores_like_the_original_order(trained, work, tmp_path):
    same = accuracy_of(trained, work / "test_same", tmp_path, "same")
    assert same >= 0.75, same  # the model learned the task: a positional mix-up would show
    assert accuracy_of(trained, work / "test_reordered", tmp_path, "reordered") == same
    # a subset of the model's labels is matched by name too
    subset = accuracy_of(trained, work / "test_subset", tmp_path, "subset")
    assert subset > 0.5, subset


def test_unknown_label_names_are_refused_in_one_line(trained, work):
    line = one_error(cli_run("eval", "--model", trained, "--data", work / "test_unknown", "--no-progress"))
    assert "'meh'" in line and "the model's labels ['neg', 'pos']" in line


def test_train_labels_map_class_label_by_name(work, tmp_path):
    reordered = class_dataset([(t, NAMES[y]) for t, y in toy_task(40, seed=3)], ["pos", "neg"])
    ds = reordered.save_to_disk(str(tmp_path / "r")) or load_text_classification(tmp_path / "r", labels=NAMES)
    for text, label_id in ds:
        assert NAMES[label_id] == ("pos" if any(w in text for w in ("good", "great", "excellent", "wonderful",
                                                                       "lovely", "superb")) else "neg")
    with pytest.raises(ValueError, match=r"row \d+ has label '\w+', which is not one of the known labels \['pos'\]"):
        load_text_classification(tmp_path / "r", labels=["pos"])


def test_trained_metrics_name_the_named_eval_split(trained):
    metrics = json.loads((trained / "metrics.json").read_text())
    assert metrics["eval_size"] == 40 and metrics["train_size"] == 400 and metrics["labels"] == NAMES
    assert metrics["eval_source"].endswith("dd[validation]") and metrics["problem_type"] == "single_label"
    assert metrics["loss"] > 0 and metrics["accuracy"] >= 0.75


# --- 3. the CLI speaks datasets ----------------------------------------------------------------------------------

def test_split_and_file_formats_load(work, tmp_path):
    data = class_dataset([(t, NAMES[y]) for t, y in toy_task(30)], NAMES)
    data.to_parquet(str(tmp_path / "d.parquet"))
    data.save_to_disk(str(tmp_path / "saved"))
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    for source in (tmp_path / "d.parquet", arrow):
        ds = load_text_classification(source)
        assert len(ds) == 30 and ds.labels == NAMES, source
    assert len(load_text_classification(work / "dd", split="test")) == 80
    assert len(load_text_classification(work / "dd")) == 400  # default: train


def test_missing_split_and_unknown_hub_id_are_one_line(work, tmp_path):
    line = one_error(cli_run("train", "--model", work / "base", "--data", work / "dd", "--split", "dev",
                             "--output-dir", tmp_path / "o", "--no-progress"))
    assert "has no split 'dev'; available splits: train, validation, test" in line and "--split" in line
    line = one_error(cli_run("train", "--model", work / "base", "--data", work / "dd", "--eval-split", "dev",
                             "--output-dir", tmp_path / "o", "--no-progress"))
    assert "has no split 'dev'" in line and "--eval-split" in line
    line = one_error(cli_run("eval", "--model", work / "base", "--allow-untrained", "--data",
                             "nobody/no-such-dataset", "--no-progress"))
    assert "loading it as a Hub dataset id failed" in line
    assert not (tmp_path / "o").exists()


# --- 2. problem types ----------------------------------------------------------------------------------------------

def multi_label_rows(n: int) -> list[dict]:
    rows = []
    for text, y in toy_task(n, seed=5):
        names = ["pos" if y else "neg"] + (["screen"] if ("film" in text or "movie" in text) else [])
        rows.append({"text": text, "label": names if len(rows) % 2 else ",".join(names)})  # lists and 'a,b'
    return rows


def test_multi_label_trains_from_the_cli(work, tmp_path):
    data = tmp_path / "multi.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in multi_label_rows(400)))
    out = tmp_path / "out"
    assert cli.main(["train", "--model", work / "base", "--data", data, "--problem-type", "multi_label",
                     "--eval-rows", "80", "--output-dir", out, *FAST, "--epochs", "20"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["problem_type"] == "multi_label" and metrics["labels"] == ["neg", "pos", "screen"]
    assert metrics["micro_f1"] > 0.6 and 0 <= metrics["macro_f1"] <= 1 and "accuracy" in metrics
    config = json.loads((out / "config.json").read_text())
    assert config["problem_type"] == "multi_label_classification"
    result = cli_run("eval", "--model", out, "--data", data, "--rows", "50", "--no-progress")
    assert result.returncode == 0 and "micro_f1=" in result.stdout and "macro_f1=" in result.stdout, result.stderr


def test_regression_trains_from_the_cli(work, tmp_path):
    rows = ["text,score\n" + "".join(f"{t},{0.9 * y + 0.05 * (i % 3)}\n"
                                     for i, (t, y) in enumerate(toy_task(400, seed=seed))) for seed in (7, 8)]
    data, held_out = tmp_path / "reg.csv", tmp_path / "reg_eval.csv"
    data.write_text(rows[0])
    held_out.write_text(rows[1])
    out = tmp_path / "out"
    assert cli.main(["train", "--model", work / "base", "--data", data, "--label-column", "score",
                     "--problem-type", "regression", "--eval-data", held_out, "--eval-rows", "80",
                     "--output-dir", out, *FAST]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train_size"] == 400 and metrics["eval_size"] == 80  # nothing carved out of --data
    assert metrics["eval_source"] == str(held_out)
    assert metrics["problem_type"] == "regression" and metrics["pearson"] > 0.5 and metrics["spearman"] > 0.5
    assert "accuracy" not in metrics and metrics["mse"] >= 0
    assert (out / "README.md").read_text().count("pearson") >= 1
    result = cli_run("eval", "--model", out, "--data", data, "--label-column", "score", "--rows", "50",
                     "--no-progress")
    assert result.returncode == 0 and "pearson=" in result.stdout and "spearman=" in result.stdout, result.stderr


def test_pearson_and_spearman_match_hand_values():
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 2, 3, 4], [1, 8, 27, 64]) == pytest.approx(1.0)  # monotone, not linear
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)  # ties: average ranks
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0


# --- 4. sentence pairs: the data side ----------------------------------------------------------------------------

def test_pair_items_are_dicts_with_text_pair(tmp_path):
    data = tmp_path / "nli.jsonl"
    data.write_text("".join(json.dumps({"premise": f"p{i}", "hypothesis": f"h{i}", "label": ["yes", "no"][i % 2]})
                            + "\n" for i in range(6)))
    ds = load_text_classification(data, text_column="premise", text_pair_column="hypothesis")
    assert ds[0] == {"text": "p0", "text_pair": "h0", "label": 1} and ds.labels == ["no", "yes"]
    train, held = ds.split(2, seed=0)
    assert all(item["text_pair"] == "h" + item["text"][1:] for item in list(train) + list(held))
    with pytest.raises(ValueError, match="no text-pair column 'second'"):
        load_text_classification(data, text_column="premise", text_pair_column="second")


def entailment_rows(n: int) -> list[dict]:
    """An offline pair toy: "entailment" when both sentences share a sentiment, "contradiction" when they do not.
    Only learnable from both texts together (either one alone is at chance)."""
    import random

    rng = random.Random(9)
    good, bad = ["good", "great", "lovely", "superb"], ["bad", "awful", "poor", "dreadful"]
    rows = []
    for _ in range(n):
        a, b = rng.choice([good, bad]), rng.choice([good, bad])
        rows.append({"premise": f"the movie was {rng.choice(a)}", "hypothesis": f"the food was {rng.choice(b)}",
                     "label": "entailment" if a is b else "contradiction"})
    return rows


def test_pair_training_never_drops_the_second_text(work, tmp_path):
    """With heads that encode pairs (the heads' side), a pair task trains and predict --pair runs; with
    heads that cannot, training on pairs is refused in one line instead of silently training on the premises."""
    from heads import AutoHeadForSequenceClassification

    from flodl_hf.job.tasks.problems import supports_pairs

    data = tmp_path / "nli.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in entailment_rows(400)))
    out = tmp_path / "out"
    argv = ["train", "--model", work / "base", "--data", data, "--text-column", "premise", "--text-pair-column",
            "hypothesis", "--eval-rows", "80", "--output-dir", out, "--batch-size", "16", "--epochs", "12", "--lr",
            "3e-3", "--max-length", "16", "--no-progress"]
    head = AutoHeadForSequenceClassification.from_pretrained(str(work / "base"), labels=NAMES)
    if not supports_pairs(head):
        line = one_error(cli_run(*argv))
        assert "cannot encode sentence pairs" in line
        assert not out.exists() and not (tmp_path / "out.checkpoint").exists()
        return
    assert cli.main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["text_pair_column"] == "hypothesis" and metrics["accuracy"] > 0.6
    result = cli_run("predict", "--model", out, "the film was good", "--pair", "it was good", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["text_pair"] == "it was good"


# --- 5. the best checkpoint ----------------------------------------------------------------------------------------

def test_early_stopping_writes_the_best_weights(work, tmp_path):
    out = tmp_path / "out"
    # lr 1e-2 is too high for this tiny model: held-out accuracy peaks at the first evaluation, then falls, and
    # early stopping ends the run 3 evaluations later (deterministic on CPU with the fixed seed).
    assert cli.main(["train", "--model", work / "base", "--data", work / "dd", "--eval-split", "validation",
                     "--output-dir", out, "--batch-size", "16", "--epochs", "3", "--max-length", "16",
                     "--no-progress", "--lr", "1e-2", "--eval-every", "5", "--early-stopping-patience", "3"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    history = metrics["eval_history"]
    best = max(history, key=lambda r: r["accuracy"])  # the first of the best
    assert metrics["best_eval"] == {"metric": "accuracy", "value": best["accuracy"], "step": best["step"]}
    assert metrics["stop_reason"].startswith("early stopping: held-out accuracy did not improve for 3")
    assert metrics["written_weights"]["step"] == best["step"] < metrics["optimizer_steps"]
    assert metrics["accuracy"] == best["accuracy"] > metrics["final_weights"]["accuracy"]
    # The directory holds the best weights: eval scores them exactly as metrics.json reports.
    result = cli_run("eval", "--model", out, "--data", work / "dd", "--split", "validation", "--json",
                     tmp_path / "e.json", "--no-progress")
    assert result.returncode == 0, result.stderr
    scored = json.loads((tmp_path / "e.json").read_text())
    assert scored["accuracy"] == metrics["accuracy"]
    assert scored["loss"] == pytest.approx(metrics["loss"], abs=1e-5)
    assert "weights written" in (out / "README.md").read_text()


def test_placeholder_model_labels_take_class_label_ids_as_ids(tmp_path):
    """A model saved without label names (LABEL_0, LABEL_1) has nothing to match by: ids are ids (run_glue's rule)."""
    class_dataset([("a", "pos"), ("b", "neg")], ["pos", "neg"]).save_to_disk(str(tmp_path / "d"))
    ds = load_text_classification(tmp_path / "d", labels=["LABEL_0", "LABEL_1"])
    assert ds.label_ids == [0, 1] and ds.labels == ["LABEL_0", "LABEL_1"]


def test_multi_label_metrics_match_hand_values():
    from flodl_hf.metrics.classification import multi_label_summary

    # row 1: right; row 2: one of two labels found; row 3: a false positive and a miss
    summary = multi_label_summary([[0], [1], [0]], [[0], [1, 2], [2]], ["a", "b", "c"])
    # micro: tp=2, fp=1, fn=2 -> P 2/3, R 1/2, F1 4/7; macro: a 2/3 (P 1/2, R 1), b 1, c 0 -> 5/9
    assert summary["micro_f1"] == pytest.approx(4 / 7) and summary["macro_f1"] == pytest.approx(5 / 9)
    assert summary["accuracy"] == pytest.approx(1 / 3) and summary["per_label"]["c"]["support"] == 2
