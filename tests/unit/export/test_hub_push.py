"""Pushing to the Hub, tested at the level of the operations it would send (no network here, and no mocks):
``plan_push`` lists the real ``huggingface_hub.CommitOperationAdd`` objects, and the push refuses clearly offline
or without a token before any request."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub import CommitOperationAdd, ModelCard

import heads
from flodl_hf.export import push_output_dir
from flodl_hf.export.hub import plan_push
from heads._hub import write_push_dir
from tiny_models import tiny_config, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def head():
    torch.manual_seed(0)
    return heads.AutoHeadForSequenceClassification.from_config(
        tiny_config("roberta", 2), tokenizer=tiny_tokenizer("roberta"), labels=["no", "yes"], max_length=24
    )


def test_plan_of_a_head_push_lists_model_tokenizer_and_card(head, tmp_path):
    out = write_push_dir(head, tmp_path / "push", name="my-classifier")
    operations = plan_push(out)
    assert all(isinstance(op, CommitOperationAdd) for op in operations)
    names = [op.path_in_repo for op in operations]
    assert names == sorted(names)
    assert {"config.json", "model.safetensors", "README.md", "tokenizer_config.json"} <= set(names)
    by_name = {op.path_in_repo: op for op in operations}
    assert by_name["model.safetensors"].path_or_fileobj == str(out / "model.safetensors")
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 24
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "transformers" and "flodl-hf" in card.data.tags
    assert "no, yes" in card.text


def test_plan_of_an_output_dir_skips_the_marker_and_refuses_incomplete_dirs(head, tmp_path):
    out = write_push_dir(head, tmp_path / "out", name="x")
    (out / ".flodl-hf.json").write_text("{}")
    (out / "runs").mkdir()
    (out / "runs" / "events.out").write_text("log")
    names = [op.path_in_repo for op in plan_push(out)]
    assert ".flodl-hf.json" not in names and "runs/events.out" in names
    (out / "README.md").unlink()
    with pytest.raises(ValueError, match=r"lacks a model card \(README.md\)"):
        plan_push(out)
    with pytest.raises(FileNotFoundError):
        plan_push(tmp_path / "nothing")


def test_push_refuses_offline_and_without_a_token(head, tmp_path, monkeypatch):
    out = write_push_dir(head, tmp_path / "out", name="x")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE is set.*unset HF_HUB_OFFLINE"):
        push_output_dir(out, "someone/my-classifier", token="hf_dummy")
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE is set"):
        head.push_to_hub("someone/my-classifier", token="hf_dummy")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no saved login there
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf-home" / "stored_tokens"))
    # the suite runs with HF_HUB_OFFLINE=1 (scripts/test.sh), which huggingface_hub read at import: clear that too,
    # so the token check is reached (nothing below contacts the Hub: every call is refused before a request)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ValueError, match=r"no Hugging Face token\. Pass token="):
        push_output_dir(out, "someone/my-classifier")
    with pytest.raises(ValueError, match="repo_id='not a repo' is not a valid Hub id"):
        push_output_dir(out, "not a repo", token="hf_dummy")
    with pytest.raises(ValueError, match="has no tokenizer"):
        head.tokenizer = None
        write_push_dir(head, tmp_path / "again", name="x")
