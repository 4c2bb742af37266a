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
from tiny_models import FAMILIES, tiny_config

from flodl_hf import cli
from warm_python import python_command

ROOT = Path(__file__).resolve().parents[3]


pytestmark = pytest.mark.usefixtures("single_thread_module")  # one torch thread


def subprocess_env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


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
    ("token-classification", ["--labels", "O,B-X"], "--labels describes --data"),  # the packaged corpus
    ("fill-mask", ["--split", "test"], "--split describes --data"),
    ("question-answering", ["--eval-split", "validation"], "--eval-split describes --data"),
    ("question-answering", ["--max-micro-batch", "auto"], "--max-micro-batch auto"),
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


def test_export_and_verify_check_another_task_s_model(token_model, tmp_path, capsys):
    """A token-classification checkpoint saved by transformers is verified as one (tests/e2e/export/test_verify_tasks.py has
    the rest): its tokenizer states no model_max_length, the one finding; export takes it from metrics.json."""
    import shutil

    code, out, err = run_cli(["verify", token_model], capsys)
    assert code == 1 and err == "" and "missing_keys=0 unexpected_keys=0 mismatched_keys=0" in out
    assert [line for line in out.splitlines() if "problem:" in line] == [
        "  problem: the tokenizer has no model_max_length, so transformers' pipeline does not cut long texts where "
        "the head does: re-save it with a flodl-hf head's save_pretrained, or run `flodl-hf export` on a flodl-hf "
        "output (it takes max_length from metrics.json)"]
    source = Path(shutil.copytree(token_model, tmp_path / "trained"))
    (source / "metrics.json").write_text(json.dumps({"settings": {"max_length": 24}}), encoding="utf-8")
    code, out, _ = run_cli(["export", "--model", source, "--output", tmp_path / "exported"], capsys)
    assert code == 0 and f"OK: {tmp_path / 'exported'}" in out


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


# --- training through the command line ------------------------------------------------------------------------

FAST = ["--batch-size", "16", "--lr", "2e-3", "--eval-rows", "40", "--no-progress"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    write_jsonl(root / "tokens.jsonl", token_rows(200))
    write_conll(root / "tokens.conll", token_rows(60, seed=1))
    write_squad(root / "squad.json", qa_rows(200))
    (root / "texts.txt").write_text("\n".join(texts(200)) + "\n", encoding="utf-8")
    return root


def check_output_dir(out: Path, task: str, architecture: str) -> dict:
    from huggingface_hub import ModelCard

    from flodl_hf.export.cards import check_model_card

    for name in ("config.json", "model.safetensors", "tokenizer.json", "README.md", "metrics.json", "loss_curve.png"):
        assert (out / name).is_file(), name
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [architecture]
    check_model_card(out / "README.md")
    card = ModelCard.load(out / "README.md")
    assert card.data.pipeline_tag == task and "flodl-hf" in card.data.tags
    assert "| task | " + task + " |" in card.text and "loss_curve.png" in card.text
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == task and metrics["settings"]["task"] == task
    assert len(metrics["train_loss"]) == metrics["steps"] > 0
    return metrics


def test_token_classification_trains_evaluates_and_predicts(tiny_checkpoint, work, tmp_path, capsys):
    out = tmp_path / "tok"
    code, stdout, err = run_cli(["train", "--task", "token-classification", "--model", tiny_checkpoint("bert"),
                                 "--data", work / "tokens.jsonl", "--epochs", "4", "--max-length", "16",
                                 "--output-dir", out, *FAST], capsys)
    assert code == 0, err
    metrics = check_output_dir(out, "token-classification", "BertForTokenClassification")
    assert metrics["labels"] == ["O", "B-NEG", "B-POS"] and metrics["train_size"] == 160
    assert metrics["baselines"]["all O tags"]["f1"] == 0.0
    assert metrics["f1"] > 0.9 > metrics["before_training"]["f1"]  # the toy task is learnt
    assert set(metrics["scores"]["per_type"]) == {"NEG", "POS"}
    assert "entity_f1=" in stdout and "(before training: entity_f1=" in stdout

    from transformers import pipeline

    tagger = pipeline("token-classification", model=str(out), aggregation_strategy="simple")
    assert [e["entity_group"] for e in tagger("the movie was good")] == ["POS"]

    report = tmp_path / "eval.json"
    code, stdout, err = run_cli(["eval", "--model", out, "--data", work / "tokens.conll", "--json", report,
                                 "--no-progress"], capsys)
    assert code == 0, err
    assert stdout.startswith("entity_f1=") and "task=token-classification" in stdout
    scores = json.loads(report.read_text())
    assert scores["task"] == "token-classification" and scores["sentences"] == 60 and scores["f1"] > 0.9
    code, stdout, err = run_cli(["predict", "--model", out, "the plot was awful", "the movie was great"], capsys)
    assert code == 0, err
    first, second = stdout.splitlines()
    assert first.startswith("NEG=awful(") and second.startswith("POS=great(")


def test_question_answering_from_squad_json_beats_its_baselines(tiny_checkpoint, work, tmp_path, capsys):
    out = tmp_path / "qa"
    code, _, err = run_cli(["train", "--task", "question-answering", "--model", tiny_checkpoint("bert"),
                            "--data", work / "squad.json", "--epochs", "6", "--max-length", "48",
                            "--output-dir", out, *FAST], capsys)
    assert code == 0, err
    metrics = check_output_dir(out, "question-answering", "BertForQuestionAnswering")
    baseline = metrics["baselines"]["first word of the context"]
    assert metrics["exact_match"] > max(baseline["exact_match"], metrics["before_training"]["exact_match"]) + 0.2
    code, stdout, err = run_cli(["predict", "--model", out, "--question", "yes", "--question", "no",
                                 "the film was lovely and the food was dreadful",
                                 "the food was dreadful and the film was lovely"], capsys)
    assert code == 0, err
    assert len(stdout.splitlines()) == 2 and stdout.splitlines()[0].endswith(
        "\tyes | the film was lovely and the food was dreadful")
    code, _, err = run_cli(["predict", "--model", out, "--question", "yes", "--question", "no", "a", "b", "c"], capsys)
    assert code == 2 and "3 TEXT(s) (the contexts) but 2 --question" in one_error_line(err)


def test_fill_mask_in_a_real_subprocess_lowers_perplexity(tiny_checkpoint, work, tmp_path):
    out = tmp_path / "mlm"
    env = subprocess_env()
    proc = subprocess.run(python_command("-m", "flodl_hf") + ["train", "--task", "fill-mask", "--model",
                           str(tiny_checkpoint("bert")), "--data", str(work / "texts.txt"), "--epochs", "3",
                           "--max-length", "16", "--output-dir", str(out), *FAST], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = check_output_dir(out, "fill-mask", "BertForMaskedLM")
    assert metrics["perplexity"] < 0.7 * metrics["before_training"]["perplexity"]
    assert "perplexity=" in proc.stdout and "Traceback" not in proc.stderr
    proc = subprocess.run(python_command("-m", "flodl_hf") + ["predict", "--model", str(out), "--top-k", "3",
                           "the movie was [MASK]"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("=") == 3 and proc.stdout.rstrip().endswith("\tthe movie was [MASK]")


def test_two_cpu_ranks_train_token_classification(tiny_checkpoint, work, tmp_path):
    out = tmp_path / "tok2"
    proc = subprocess.run(python_command("-m", "flodl_hf") + ["train", "--task", "token-classification", "--model",
                           str(tiny_checkpoint("bert")), "--data", str(work / "tokens.jsonl"), "--epochs", "2",
                           "--max-length", "16", "--devices", "cpu,cpu", "--batch-size", "8", "--lr", "2e-3",
                           "--eval-rows", "40", "--no-progress", "--output-dir", str(out)],
                          cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("before training: entity_f1=") == 2  # rank 0 alone reports (its line, its summary)
    assert proc.stdout.count("wrote ") == 1
    metrics = check_output_dir(out, "token-classification", "BertForTokenClassification")
    assert metrics["world_size"] == 2 and metrics["devices"] == ["cpu", "cpu"] and metrics["el_che"] is not None
    assert metrics["f1"] > metrics["before_training"]["f1"] + 0.3


def test_interrupted_task_run_resumes_exactly_with_periodic_evaluation(tiny_checkpoint, work, tmp_path):
    import signal

    import heads

    from flodl_hf.job.loop import TrainingInterrupted
    from flodl_hf.cli.train import settings_from_args
    from flodl_hf.job.run import run_train

    argv = ["train", "--task", "token-classification", "--model", str(tiny_checkpoint("bert")), "--data",
            str(work / "tokens.jsonl"), "--epochs", "3", "--batch-size", "8", "--train-rows", "80", "--eval-rows",
            "40", "--lr", "2e-3", "--max-length", "16", "--warmup-ratio", "0.1", "--eval-every", "4",
            "--no-progress"]
    full = tmp_path / "full"
    assert cli.main([*argv, "--output-dir", str(full)]) == 0
    uninterrupted = json.loads((full / "metrics.json").read_text())
    assert [e["step"] for e in uninterrupted["eval_history"]] == [4, 8, 12, 16, 20, 24, 28]
    assert uninterrupted["best_eval"]["metric"] == "f1"

    out = tmp_path / "out"
    args = cli.build_parser().parse_args([*argv, "--output-dir", str(out), "--checkpoint-every", "3"])

    def log(line: str) -> None:
        if "checkpoint at step 3 " in line:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C right after the first checkpoint

    with pytest.raises(TrainingInterrupted) as stopped:
        run_train(settings_from_args(args), heads.AutoHeadForTokenClassification, log=log)
    checkpoint_dir = tmp_path / "out.checkpoint"
    assert stopped.value.step == 4 and (checkpoint_dir / "checkpoint.json").is_file() and not out.exists()
    assert cli.main([*argv, "--output-dir", str(out), "--resume", str(checkpoint_dir)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train_loss"] == uninterrupted["train_loss"]  # exactly, float for float
    assert metrics["eval_history"] == uninterrupted["eval_history"]  # the checkpoint carries the earlier ones
    assert metrics["before_training"] == uninterrupted["before_training"]  # carried by the checkpoint
    assert [r["step"] for r in metrics["resumed"]] == [4] and not checkpoint_dir.exists()
    assert cli.main([*argv, "--task", "fill-mask", "--output-dir", str(tmp_path / "x"), "--resume",
                     str(full)]) == 2  # not a checkpoint: refused in one line


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("task, data, suffix", [
    ("token-classification", "tokens.jsonl", "ForTokenClassification"),
    ("question-answering", "squad.json", "ForQuestionAnswering"),
    ("fill-mask", "texts.txt", "ForMaskedLM"),
])
def test_every_family_trains_every_task_and_the_output_loads_in_transformers(tiny_checkpoint, work, tmp_path, capsys,
                                                                             family, task, data, suffix):
    import transformers

    out = tmp_path / "out"
    code, _, err = run_cli(["train", "--task", task, "--model", tiny_checkpoint(family), "--data", work / data,
                            "--train-rows", "32", "--eval-rows", "16", "--batch-size", "16", "--max-length", "48",
                            "--lr", "2e-3", "--no-progress", "--output-dir", out], capsys)
    assert code == 0, err
    architecture = type(tiny_config(family)).__name__.removesuffix("Config") + suffix
    metrics = check_output_dir(out, task, architecture)
    assert metrics["steps"] == 2 and metrics["train_size"] == 32 and metrics["eval_size"] == 16
    auto = {"ForTokenClassification": transformers.AutoModelForTokenClassification,
            "ForQuestionAnswering": transformers.AutoModelForQuestionAnswering,
            "ForMaskedLM": transformers.AutoModelForMaskedLM}[suffix]
    model, info = auto.from_pretrained(out, output_loading_info=True)
    assert type(model).__name__ == architecture and not info["missing_keys"] and not info["unexpected_keys"]


def test_task_card_metadata_and_its_bad_input(tmp_path):
    from huggingface_hub import ModelCard

    from flodl_hf.export.cards import write_task_card

    common = dict(model_name="m", dataset_name="d", dataset_description="`d.jsonl`", training={"epochs": 1})
    path = write_task_card(tmp_path, task="token-classification", scores={"f1": 0.5, "accuracy": 0.9},
                           labels=["O", "B-X"], baselines={"all O tags": {"f1": 0.0}}, model_type="bert", **common)
    card = ModelCard.load(path)
    assert card.data.pipeline_tag == "token-classification" and card.data.metrics == ["f1", "accuracy"]
    assert {r.metric_type: r.metric_value for r in card.data.eval_results} == {"f1": 0.5, "accuracy": 0.9}
    assert "Tags (2): O, B-X." in card.text and "Baseline, all O tags: f1 0.0000." in card.text
    with pytest.raises(ValueError, match="task 'text-classification' has no task card"):
        write_task_card(tmp_path, task="text-classification", scores={"accuracy": 1.0}, **common)
    with pytest.raises(ValueError, match="scores is empty"):
        write_task_card(tmp_path, task="fill-mask", scores={}, **common)


def test_tags_that_are_not_iob2_train_and_report_word_accuracy(tiny_checkpoint, tmp_path, capsys):
    rows = [{"words": r["words"], "tags": ["ADJ" if t != "O" else "W" for t in r["tags"]]} for r in token_rows(64)]
    data = write_jsonl(tmp_path / "pos.jsonl", rows)
    argv = ["train", "--task", "token-classification", "--model", tiny_checkpoint("bert"), "--data", data,
            "--batch-size", "16", "--eval-rows", "16", "--max-length", "16", "--no-progress"]
    code, stdout, err = run_cli([*argv, "--output-dir", tmp_path / "out"], capsys)
    assert code == 0, err
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert "f1" not in metrics and 0.0 <= metrics["accuracy"] <= 1.0 and "word_accuracy=" in stdout
    code, _, err = run_cli([*argv, "--eval-every", "1", "--output-dir", tmp_path / "out2"], capsys)
    assert code == 2 and "are not IOB2" in one_error_line(err) and "--metric-for-best accuracy" in err
    code, _, err = run_cli([*argv, "--eval-every", "1", "--metric-for-best", "accuracy", "--output-dir",
                            tmp_path / "out3"], capsys)
    assert code == 0, err
