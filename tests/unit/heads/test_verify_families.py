"""`flodl-hf verify` passes on a saved head of every family: zero missing / unexpected keys, logits identical."""

from __future__ import annotations

import json

import pytest
import torch

import tiny_models
from flodl_hf.cli import main
from heads import AutoHeadForSequenceClassification


@pytest.mark.parametrize("family", tiny_models.FAMILIES)
def test_verify_a_saved_head(family, tmp_path, capsys):
    torch.manual_seed(0)
    config = tiny_models.tiny_config(family, num_labels=3)
    head = AutoHeadForSequenceClassification.from_config(config, tokenizer=tiny_models.tiny_tokenizer(family),
                                                         labels=["neg", "mid", "pos"])
    out = tmp_path / f"{family}-head"
    head.save_pretrained(out)
    capsys.readouterr()
    assert main(["verify", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert report["missing_keys"] == [] and report["unexpected_keys"] == []
    assert report["max_abs_diff"] == 0.0
