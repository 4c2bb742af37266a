"""`flodl-hf verify` / `export` of token-classification, question-answering and masked-LM directories.

Every family x task: a saved head verifies (zero missing / unexpected / mismatched keys, logits equal on short and
over-long texts, the pipeline round trip). Damaged directories fail with one clear line: a weight missing from the
file, an MLM decoder saved different from the embeddings while the config ties them, architectures that name
another head than the weights hold. ``export`` re-saves a task model the transformers way (the tied decoder is
left out of the file) and verifies it. One real subprocess runs ``python -m flodl_hf verify``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from flodl_hf.cli import main
from heads import AutoHeadForMaskedLM, AutoHeadForQuestionAnswering, AutoHeadForTokenClassification
from mlm_helpers import no_dropout_config
from tiny_models import FAMILIES, tiny_config, tiny_tokenizer
from tokcls_helpers import TAGS, subword_config, subword_tokenizer
from warm_python import python_command

TASKS = ("token-classification", "question-answering", "fill-mask")
ROOT = Path(__file__).resolve().parents[3]


def save_head(task: str, family: str, out: Path, seed: int = 0) -> Path:
    """A seeded head of ``task`` and ``family`` saved with its own save_pretrained (short max_length, so the
    verify's long texts are cut, or windowed for QA)."""
    torch.manual_seed(seed)
    if task == "token-classification":
        head = AutoHeadForTokenClassification.from_config(subword_config(family), labels=TAGS,
                                                          tokenizer=subword_tokenizer(family), max_length=16)
    elif task == "question-answering":
        head = AutoHeadForQuestionAnswering.from_config(tiny_config(family), tokenizer=tiny_tokenizer(family),
                                                        max_length=24)
    else:
        head = AutoHeadForMaskedLM.from_config(no_dropout_config(family), tokenizer=tiny_tokenizer(family),
                                               max_length=16)
    return Path(head.save_pretrained(out))


def verify_json(path: Path, capsys) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["verify", str(path), "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_saved_head_verifies(family, task, tmp_path, capsys):
    out = save_head(task, family, tmp_path / f"{task}-{family}", seed=FAMILIES.index(family))
    code, report = verify_json(out, capsys)
    assert report["problems"] == [] and report["ok"] is True and code == 0
    assert report["missing_keys"] == report["unexpected_keys"] == report["mismatched_keys"] == []
    assert report["max_abs_diff"] == 0.0
    assert report["checks"][:2] == ["sentences", "long texts (2x, 5x max_length)"]
    assert {"token-classification": "pipeline token-classification", "fill-mask": "pipeline fill-mask",
            "question-answering": "no QA pipeline"}[task] in report["checks"][2]
    assert report["tokens_match"] is (None if task == "token-classification" else True)


def _without(path: Path, key: str) -> None:
    weights = load_file(str(path / "model.safetensors"))
    assert key in weights
    del weights[key]
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("task, key", [("token-classification", "classifier.bias"),
                                       ("question-answering", "qa_outputs.weight"),
                                       ("fill-mask", "cls.predictions.transform.dense.weight")])
def test_a_weight_missing_from_the_file_fails(task, key, tmp_path, capsys):
    out = save_head(task, "bert", tmp_path / "m")
    _without(out, key)
    code, report = verify_json(out, capsys)
    assert code == 1 and report["missing_keys"] == [key]
    assert f"1 missing key(s), freshly initialised by transformers: {key}" in report["problems"][0]


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_an_mlm_decoder_saved_apart_from_tied_embeddings_fails(family, tmp_path, capsys):
    out = save_head("fill-mask", family, tmp_path / "m")
    weights = load_file(str(out / "model.safetensors"))
    decoder = {"bert": "cls.predictions.decoder.weight", "roberta": "lm_head.decoder.weight"}[family]
    embeddings = f"{family}.embeddings.word_embeddings.weight"
    assert decoder not in weights  # saved the transformers way: the tied decoder is the embeddings
    weights[decoder] = weights[embeddings] + 0.5
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    code, report = verify_json(out, capsys)
    assert code == 1
    assert any("decoder is not tied to the word embeddings although config.tie_word_embeddings is true" in p
               for p in report["problems"])
    weights[decoder] = weights[embeddings].clone()  # a copy equal to the embeddings: transformers ties it
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    assert verify_json(out, capsys)[0] == 0


def _architectures(path: Path, names: list[str]) -> None:
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    config["architectures"] = names
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")


def test_architectures_that_disagree_with_the_weights_fail(tmp_path, capsys):
    out = save_head("fill-mask", "bert", tmp_path / "m")
    _architectures(out, ["BertForTokenClassification"])  # the weights are a masked LM's
    code, report = verify_json(out, capsys)
    assert code == 1
    assert any("missing key(s)" in p and "classifier." in p for p in report["problems"])
    assert any("unexpected key(s)" in p and "cls.predictions" in p for p in report["problems"])


def test_architectures_of_two_tasks_are_refused_in_one_line(tmp_path, capsys):
    out = save_head("question-answering", "bert", tmp_path / "m")
    _architectures(out, ["BertForQuestionAnswering", "BertForMaskedLM"])
    assert main(["verify", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "names heads of 2 tasks (BertForQuestionAnswering, BertForMaskedLM)" in err


@pytest.mark.parametrize("task, family", [("fill-mask", "distilbert"), ("question-answering", "albert"),
                                          ("token-classification", "xlm-roberta")])
def test_export_resaves_a_task_model_and_verifies_it(task, family, tmp_path, capsys):
    from transformers import AutoModelForMaskedLM

    source = save_head(task, family, tmp_path / "src")
    out = tmp_path / "exported"
    assert main(["export", "--model", str(source), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"flodl-hf: exported {source} to {out}" in printed and f"OK: {out}" in printed
    before, after = load_file(str(source / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(before) == sorted(after) and all(torch.equal(before[k], after[k]) for k in before)
    if task == "fill-mask":
        assert "vocab_projector.weight" not in after  # tied: saved the transformers way, as the embeddings only
        model = AutoModelForMaskedLM.from_pretrained(str(out))
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_export_of_a_damaged_task_model_is_refused(tmp_path):
    source = save_head("token-classification", "bert", tmp_path / "src")
    _without(source, "classifier.weight")
    with pytest.raises(ValueError, match=r"lacks weights for 1 key\(s\) \(classifier.weight\)"):
        main_raising(["export", "--model", str(source), "--output", str(tmp_path / "out")])


def main_raising(argv: list[str]) -> None:
    """Run the export command body (main() turns its ValueError into exit code 2 and one stderr line)."""
    from flodl_hf.cli import build_parser
    from flodl_hf.cli.model_dirs import cmd_export as _cmd_export

    _cmd_export(build_parser().parse_args(argv))


def test_python_m_flodl_hf_verify_a_tagger(tmp_path):
    out = save_head("token-classification", "roberta", tmp_path / "tagger")
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")  # the warm interpreter's (one thread)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(python_command("-m", "flodl_hf") + ["verify", str(out)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"OK: {out}") and "missing_keys=0 unexpected_keys=0 mismatched_keys=0" in done.stdout
    assert "pipeline token-classification (simple) = head.tag: max_abs_diff=0" in done.stdout
    _without(out, "classifier.bias")
    done = subprocess.run(python_command("-m", "flodl_hf") + ["verify", str(out)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 1 and done.stdout.startswith(f"FAILED: {out}")
    assert "problem: 1 missing key(s), freshly initialised by transformers: classifier.bias" in done.stdout


@pytest.mark.parametrize("task, trained", [("token-classification", 10), ("question-answering", 20),
                                           ("fill-mask", 10)])
def test_a_tokenizer_that_cuts_elsewhere_than_training_fails_and_export_fixes_it(task, trained, tmp_path, capsys):
    """metrics.json says training cut at ``trained`` tokens; the saved tokenizer says 16 (24 for QA): the
    pipeline would cut long texts elsewhere than the head. ``export`` writes the trained length; then it verifies."""
    source = save_head(task, "bert", tmp_path / "src")
    (source / "metrics.json").write_text(json.dumps({"settings": {"max_length": trained}}), encoding="utf-8")
    code, report = verify_json(source, capsys)
    assert code == 1 and report["problems"]
    hint = f"max_length={trained}"
    assert all(hint in p for p in report["problems"]), report["problems"]
    if task != "token-classification":
        assert report["tokens_match"] is False
    out = tmp_path / "exported"
    assert main(["export", "--model", str(source), "--output", str(out)]) == 0
    assert json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))["model_max_length"] == trained
    assert verify_json(out, capsys)[0] == 0


@pytest.mark.parametrize("task", TASKS)
def test_a_head_with_other_weights_fails_the_logit_and_prediction_checks(task, tmp_path):
    """The comparison can fail: a head loaded from another seed's directory differs from transformers' model."""
    from flodl_hf.cli.head_classes import head_class as _task_head_class
    from flodl_hf.export.verify_tasks import verify_task_dir

    out, other = save_head(task, "bert", tmp_path / "a", seed=1), save_head(task, "bert", tmp_path / "b", seed=2)
    head_cls = _task_head_class(task)
    report = verify_task_dir(out, task, head_loader=lambda _: head_cls.from_pretrained(str(other)))
    assert not report.ok and report.max_abs_diff > 0.01
    assert any("head and transformers logits differ by up to" in p and "(allowed 0)" in p for p in report.problems)
    if task != "question-answering":
        assert any("disagree on text" in p for p in report.problems), report.problems
    assert verify_task_dir(out, task, head_loader=lambda p: head_cls.from_pretrained(p)).ok
