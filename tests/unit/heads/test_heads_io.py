"""Saving and reloading heads: transformers-compatible output, determinism, atomicity, alternative inputs."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import heads
from tiny_models import FAMILIES, tiny_config, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["the movie was really good", "bad", "the plot seemed quite awful to me"]


def trained_looking_head(family: str, labels=("neg", "pos", "mixed")):
    """A head with a non-default classifier (so a save/reload that dropped it would be caught)."""
    torch.manual_seed(1)
    head = heads.AutoHeadForSequenceClassification.from_config(
        tiny_config(family), tokenizer=tiny_tokenizer(family), labels=list(labels)
    )
    with torch.no_grad():
        for name, param in head.model.named_parameters():
            if "classifier" in name:
                param.normal_(0.0, 0.5)
    return head


@pytest.mark.parametrize("family", FAMILIES)
def test_save_reloads_in_transformers_with_identical_logits(family, tmp_path):
    head = trained_looking_head(family)
    out = head.save_pretrained(tmp_path / "model")
    assert out == (tmp_path / "model").absolute()
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "pos", "2": "mixed"}
    assert config["label2id"] == {"neg": 0, "pos": 1, "mixed": 2}
    model, info = AutoModelForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert type(model) is head.model_class
    tokenizer = AutoTokenizer.from_pretrained(out)
    enc = head.encode(TEXTS)
    reloaded_enc = tokenizer(TEXTS, padding="longest", return_tensors="pt")
    assert torch.equal(reloaded_enc["input_ids"], enc["input_ids"])
    head.model.eval()
    model.eval()
    with torch.no_grad():
        assert torch.equal(head.forward(enc), model(**enc).logits)
    again = heads.AutoHeadForSequenceClassification.from_pretrained(out)
    assert again.labels() == ["neg", "pos", "mixed"]


@pytest.mark.parametrize("family", FAMILIES)
def test_save_is_byte_deterministic(family, tmp_path):
    head = trained_looking_head(family)
    first = (head.save_pretrained(tmp_path / "a") / "model.safetensors").read_bytes()
    second = (head.save_pretrained(tmp_path / "b") / "model.safetensors").read_bytes()
    assert first == second


def test_default_labels_are_written_explicitly(tmp_path):
    head = heads.BertForSequenceClassification.from_config(
        tiny_config("bert"), tokenizer=tiny_tokenizer("bert")
    )
    config = json.loads((head.save_pretrained(tmp_path / "m") / "config.json").read_text())
    assert config["id2label"] == {"0": "LABEL_0", "1": "LABEL_1"}
    assert config["label2id"] == {"LABEL_0": 0, "LABEL_1": 1}


def test_save_replaces_the_files_of_an_existing_model_directory_and_keeps_the_rest(tmp_path):
    head = trained_looking_head("bert")
    target = tmp_path / "model"
    head.save_pretrained(target)
    (target / "user_extra.bin").write_bytes(b"not ours")  # a file the save does not write is never deleted
    with torch.no_grad():
        head.model.classifier.bias.fill_(3.0)
    head.save_pretrained(target)
    assert (target / "user_extra.bin").read_bytes() == b"not ours"
    assert torch.equal(load_file(str(target / "model.safetensors"))["classifier.bias"], torch.full((3,), 3.0))
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temporary or old directories left


def test_save_into_an_empty_existing_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    trained_looking_head("distilbert").save_pretrained(tmp_path / "empty")
    assert (tmp_path / "empty" / "config.json").is_file()


def test_failed_save_leaves_nothing_behind(tmp_path, monkeypatch):
    head = trained_looking_head("roberta")

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(head.tokenizer, "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):
        head.save_pretrained(tmp_path / "model")
    assert list(tmp_path.iterdir()) == []
    # and an existing model directory survives a failed overwrite untouched
    monkeypatch.undo()
    head.save_pretrained(tmp_path / "model")
    before = {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()}
    monkeypatch.setattr(head.tokenizer, "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):
        head.save_pretrained(tmp_path / "model")
    assert {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_pytorch_model_bin_checkpoint_is_accepted(tiny_checkpoint, tmp_path):
    path = shutil.copytree(tiny_checkpoint("bert", with_classifier=True), tmp_path / "ckpt")
    state = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    torch.save(state, path / "pytorch_model.bin")
    head = heads.BertForSequenceClassification.from_pretrained(path)
    assert all(torch.equal(head.model.state_dict()[k], v) for k, v in state.items())


def test_checkpoint_without_tokenizer(tiny_checkpoint, tmp_path, caplog):
    path = shutil.copytree(tiny_checkpoint("bert"), tmp_path / "ckpt")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).unlink()
    caplog.set_level(logging.WARNING, logger="flodl_hf.heads")
    head = heads.BertForSequenceClassification.from_pretrained(path)
    assert head.tokenizer is None
    assert any("no tokenizer files" in r.getMessage() for r in caplog.records)
    with pytest.raises(RuntimeError, match="has no tokenizer"):
        head.encode(["good"])
    given = heads.BertForSequenceClassification.from_pretrained(path, tokenizer=tiny_tokenizer("bert"))
    assert given.encode(["good"])["input_ids"].shape == (1, 3)


def test_problem_type_is_set_from_pretrained(tiny_checkpoint):
    head = heads.AutoHeadForSequenceClassification.from_pretrained(
        tiny_checkpoint("deberta-v2"), num_labels=4, problem_type="multi_label_classification"
    )
    assert head.problem_type == "multi_label_classification" and head.num_labels == 4


def test_packaged_minilm_base_checkpoint(caplog):
    """The real base checkpoint the CLI defaults to: a BertModel (keys without ``bert.``) and a WordPiece vocab."""
    from flodl_hf.defaults import default_model_path

    caplog.set_level(logging.INFO, logger="flodl_hf.heads")
    head = heads.AutoHeadForSequenceClassification.from_pretrained(
        default_model_path(), labels=["neg", "pos", "neutral"]
    )
    assert type(head) is heads.BertForSequenceClassification
    assert len([r for r in caplog.records if "no classifier weights" in r.getMessage()]) == 1
    assert head.max_length == 128 and head.labels() == ["neg", "pos", "neutral"]
    enc, labels = head.collate([("I love this car", "pos"), ("this is a terrible idea", "neg")])
    assert set(enc) == {"input_ids", "attention_mask", "token_type_ids"}
    assert torch.isfinite(head.compute_loss(enc, labels))
    (pairs,) = head.predict(["I love this car"])
    assert abs(sum(p for _, p in pairs) - 1.0) < 1e-5
