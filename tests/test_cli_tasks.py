"""``flodl-hf train / eval / predict --task``: token classification, question answering and fill-mask through the
command line, on tiny offline checkpoints (tests/tiny_models.py) and real files: every output file, eval and predict
on the result, one real ``python -m flodl_hf`` subprocess, two CPU ranks, and the one-line refusals (options a task
does not support, a task that does not match the checkpoint's head, bad data)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from task_cli_helpers import head_checkpoint, qa_rows, texts, token_rows, write_conll, write_jsonl, write_squad

from flodl_hf import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="module")
def single_thread_module():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_cli(argv, capsys):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("flodl-hf: error: "), err
    return lines[0]


# --- refusals that need no model ------------------------------------------------------------------------------

@pytest.mark.parametrize("task, extra, flag", [
    ("token-classification", ["--problem-type", "multi_label"], "--problem-type"),
    ("token-classification", ["--text-pair-column", "b"], "--text-pair-column"),
    ("token-classification", ["--group-by-length"], "--group-by-length"),
    ("question-answering", ["--labels", "a,b"], "--labels"),
    ("question-answering", ["--text-column", "body"], "--text-column"),
    ("question-answering", ["--label-column", "y"], "--label-column"),
    ("fill-mask", ["--labels", "a,b"], "--labels"),
    ("fill-mask", ["--report-to", "tensorboard"], "--report-to"),
    ("fill-mask", ["--metric-for-best", "accuracy"], "--metric-for-best accuracy"),
    ("token-classification", ["--metric-for-best", "perplexity"], "--metric-for-best perplexity"),
])
def test_train_refuses_options_a_task_does_not_support(tmp_path, capsys, task, extra, flag):
    code, _, err = run_cli(["train", "--task", task, *extra, "--output-dir", tmp_path / "out"], capsys)
    line = one_error_line(err)
    assert code == 2 and flag in line and task in line
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def token_model(tmp_path_factory):
    return head_checkpoint(tmp_path_factory.mktemp("tokcls"), "ForTokenClassification")


def test_eval_and_predict_refuse_a_task_that_does_not_match_the_checkpoint(token_model, tmp_path, capsys):
    data = write_jsonl(tmp_path / "qa.jsonl", qa_rows(4))
    code, _, err = run_cli(["eval", "--task", "question-answering", "--model", token_model, "--data", data], capsys)
    line = one_error_line(err)
    assert code == 2 and "--task question-answering does not match the checkpoint's head" in line
    assert "token-classification model (BertForTokenClassification)" in line
    code, _, err = run_cli(["predict", "--task", "text-classification", "--model", token_model, "good"], capsys)
    assert code == 2 and "--task text-classification does not match the checkpoint's head" in one_error_line(err)


def test_predict_refuses_options_of_other_tasks(token_model, tmp_path, capsys):
    code, _, err = run_cli(["predict", "--model", token_model, "--question", "yes", "good"], capsys)
    assert code == 2 and "--question is not supported with --task token-classification" in one_error_line(err)
    classifier = head_checkpoint(tmp_path / "cls", "ForSequenceClassification", num_labels=2)
    code, _, err = run_cli(["predict", "--model", classifier, "--question", "yes", "good"], capsys)
    assert code == 2 and "--question is not supported with --task text-classification" in one_error_line(err)


@pytest.mark.parametrize("task, writer, message", [
    ("token-classification", lambda p: write_jsonl(p / "bad.jsonl", [{"words": ["a", "b"], "tags": ["O"]}] * 4),
     "row 1 has 2 words but 1 tags"),
    ("question-answering", lambda p: write_jsonl(p / "bad.jsonl", [dict(qa_rows(1)[0], answers={
        "text": ["good"], "answer_start": [0]})] * 4), "is not in its context at answer_start 0"),
])
def test_train_refuses_bad_task_data_in_one_line(tiny_checkpoint, tmp_path, capsys, task, writer, message):
    data = writer(tmp_path)
    code, _, err = run_cli(["train", "--task", task, "--model", tiny_checkpoint("bert"), "--data", data,
                            "--output-dir", tmp_path / "out", "--no-progress"], capsys)
    line = one_error_line(err)
    assert code == 2 and message in line and str(data) in line
    assert not (tmp_path / "out").exists()
