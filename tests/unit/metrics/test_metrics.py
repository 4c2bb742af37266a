"""flodl_hf.metrics: accuracy, macro-F1 (checked against hand-computed values), summaries, the loss-curve PNG."""

from __future__ import annotations

import sys

import pytest

from flodl_hf.metrics import (accuracy, classification_summary, confusion_matrix, macro_f1, per_label_scores,
                              plot_loss_curve)

PRED = [0, 0, 1, 1, 2, 2, 0]
GOLD = [0, 1, 1, 1, 2, 0, 0]


def test_accuracy():
    assert accuracy(PRED, GOLD) == pytest.approx(5 / 7)
    assert accuracy([1, 1], [1, 1]) == 1.0


def test_macro_f1_hand_computed():
    # label 0: tp 2, fp 1, fn 1 -> p 2/3 r 2/3 f 2/3; label 1: tp 2 fp 0 fn 1 -> p 1 r 2/3 f 0.8;
    # label 2: tp 1 fp 1 fn 0 -> p 0.5 r 1 f 2/3
    assert macro_f1(PRED, GOLD) == pytest.approx((2 / 3 + 0.8 + 2 / 3) / 3)
    scores = per_label_scores(PRED, GOLD)
    assert scores[1] == {"precision": 1.0, "recall": pytest.approx(2 / 3), "f1": pytest.approx(0.8),
                         "support": 3, "predicted": 2}


def test_macro_f1_ignores_absent_labels_and_zero_divisions():
    # Label 2 never occurs in either list: it is not averaged in (scikit-learn's convention).
    assert macro_f1([0, 1], [0, 1], num_labels=3) == 1.0
    # Label 1 is predicted but never true: its F1 is 0 and counts.
    assert macro_f1([0, 1], [0, 0]) == pytest.approx((2 / 3 + 0.0) / 2)


def test_confusion_matrix_rows_are_references():
    assert confusion_matrix([1, 1, 0], [0, 1, 0]) == [[1, 1], [0, 1]]


def test_summary_is_json_ready_and_checks_ids():
    summary = classification_summary(PRED, GOLD, ["neg", "neu", "pos"])
    assert summary["accuracy"] == pytest.approx(5 / 7)
    assert summary["num_examples"] == 7
    assert set(summary["per_label"]) == {"neg", "neu", "pos"}
    assert summary["per_label"]["neu"]["support"] == 3
    assert summary["confusion_matrix"][0] == [2, 0, 1]
    with pytest.raises(ValueError, match="prediction id 3 is outside the 3 labels"):
        classification_summary([3], [0], ["a", "b", "c"])


@pytest.mark.parametrize("pred, gold, message", [([0], [0, 1], "1 predictions but 2 references"),
                                                 ([], [], "no references")])
def test_bad_inputs(pred, gold, message):
    with pytest.raises(ValueError, match=message):
        accuracy(pred, gold)


def test_loss_curve_png_leaves_pyplot_alone(tmp_path):
    pyplot_loaded = "matplotlib.pyplot" in sys.modules
    out = plot_loss_curve([1.0 / (i + 1) for i in range(200)], tmp_path / "loss.png", title="t")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    assert ("matplotlib.pyplot" in sys.modules) == pyplot_loaded
    plot_loss_curve([0.5], tmp_path / "one.png")  # a single step still plots
    with pytest.raises(ValueError, match="no loss values"):
        plot_loss_curve([], tmp_path / "none.png")
