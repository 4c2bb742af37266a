"""The Python API's share of the third hostile round: arguments that were accepted and silently misread are refused
with a ValueError naming the field (``TextDataset``, ``DdpConfig``, ``TrainSettings``, the token and QA readers)."""

from __future__ import annotations

import json
import math

import pytest

from flodl_hf.config import DdpConfig
from flodl_hf.data import TextDataset
from flodl_hf.data.tokens import check_iob_spelling, iob_spelling_fix, load_token_data


@pytest.mark.parametrize("labels, match", [
    ("ab", "labels='ab' is one string"),
    (b"ab", "is one string"),
    (7, "is one int"),
    (["a", "a"], "repeat \\['a'\\]"),
    (["a"], "outside the 1 known labels"),  # id 1 has no name
])
def test_text_dataset_refuses_labels_that_do_not_match(labels, match):
    with pytest.raises(ValueError, match=match):
        TextDataset(["x", "y"], [0, 1], labels)


def test_text_dataset_refuses_class_names_for_a_regression_and_keeps_good_input():
    with pytest.raises(ValueError, match="a regression has none"):
        TextDataset(["x", "y"], [0.5, 1.5], ["a", "b"], problem_type="regression")
    assert TextDataset(["x", "y"], [0, 1], ("neg", "pos")).labels == ["neg", "pos"]
    assert TextDataset(["x", "y"], [0.5, 1.5], [], problem_type="regression").label_ids == [0.5, 1.5]


@pytest.mark.parametrize("hint", [(0, math.nan), (0, math.inf), (1, -math.inf), (0, 0), (0.5, 2.0), (True, 2.0),
                                  (-1, 2.0), (0, "2"), (1,), (0, 2.0, 3)])
def test_ddp_config_speed_hint_must_be_a_rank_and_a_finite_ratio(hint):
    with pytest.raises(ValueError, match="speed_hint"):
        DdpConfig(speed_hint=hint)


def test_ddp_config_accepts_a_valid_speed_hint():
    assert DdpConfig(speed_hint=(0, 2)).speed_hint == (0, 2.0)


@pytest.mark.parametrize("tag, fix", [("B_POS", "B-POS"), ("b-pos", "B-POS"), ("i_pos", "I-POS"), ("o", "O"),
                                      ("S-POS", "convert IOBES"), ("X-POS", "O, B-TYPE or I-TYPE"), ("B-", "O, B-"),
                                      ("B-POS ", "B-POS"), ("O", None), ("B-POS", None), ("I-pos", None)])
def test_the_iob2_spelling_rule(tag, fix):
    found = iob_spelling_fix(tag, {"b-pos": "B-POS", "i-pos": "I-POS"})
    assert (found is None) if fix is None else (fix in found), (tag, found)


def test_tags_that_do_not_look_iob_are_not_checked_and_given_labels_are():
    check_iob_spelling({"NN": 1, "VB": 1, "-LRB-": 2}, "pos.jsonl")  # part-of-speech tags: not IOB
    with pytest.raises(ValueError, match="row 2 has the tag 'B_POS'"):
        check_iob_spelling({"O": 1, "B-NEG": 1, "B_POS": 2}, "t.jsonl")
    with pytest.raises(ValueError, match="--labels names the tag 'b-neg'"):
        check_iob_spelling({"O": 1, "B-POS": 1}, "t.jsonl", ["O", "B-POS", "b-neg"])


def test_every_reader_path_applies_the_rule(tmp_path):
    rows = [{"words": ["a", "b"], "tags": ["O", "B-X"]}, {"words": ["c"], "tags": ["b-x"]}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for known, labels in (("--labels", None), ("the model's tags", ["O", "B-X"]),
                          ("the training tags", ["O", "B-X"])):
        with pytest.raises(ValueError, match="row 2 has the tag 'b-x'.*write it as B-X"):
            load_token_data(path, labels=labels, known=known)
