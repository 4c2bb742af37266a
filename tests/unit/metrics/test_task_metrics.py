"""flodl_hf.metrics.entities and squad: hand-computed cases, and seeded random entity cases against a second,
independently written IOB2 chunker (the checks against seqeval and the official SQuAD rules are in
test_metrics_vs_libraries.py)."""

from __future__ import annotations

import random

import pytest

from flodl_hf.metrics.entities import entities, entity_scores, is_iob_tagset, token_accuracy
from flodl_hf.metrics.squad import exact_match, normalize_answer, squad_scores, token_f1


# --- entity scores: hand-computed ----------------------------------------------------------------------------

def test_entities_follow_seqeval_default_rules():
    assert entities(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
    assert entities(["I-PER", "I-PER", "O"]) == [("PER", 0, 1)]  # I- without B- starts an entity
    assert entities(["O", "I-LOC"]) == [("LOC", 1, 1)]
    assert entities(["B-PER", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 1)]  # type change: a new entity
    assert entities(["B-PER", "B-PER"]) == [("PER", 0, 0), ("PER", 1, 1)]
    assert entities(["O", "O"]) == []
    assert entities([]) == []


def test_entity_scores_hand_computed():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["B-ORG", "B-LOC"]]
    scores = entity_scores(gold, pred)
    # gold: PER(0-1), LOC(3), ORG(0); pred: PER(0-1), ORG(0), LOC(1): 2 correct of 3 predicted, of 3 gold
    assert scores["precision"] == pytest.approx(2 / 3) and scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 / 3)
    assert scores["per_type"]["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1}
    assert scores["per_type"]["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert scores["gold_entities"] == 3 and scores["predicted_entities"] == 3
    # a partial span is wrong: the boundaries must match
    assert entity_scores([["B-PER", "I-PER"]], [["B-PER", "O"]])["f1"] == 0.0
    # all-O prediction: precision 0 (nothing predicted), recall 0
    assert entity_scores([["B-PER"]], [["O"]])["f1"] == 0.0
    assert token_accuracy(gold, pred) == pytest.approx(4 / 6)


def test_entity_scores_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="sentence 1 has 2 gold tags but 1 predicted"):
        entity_scores([["O", "O"]], [["O"]])
    with pytest.raises(ValueError, match="1 gold sequences but 2 predicted"):
        entity_scores([["O"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match="'X-PER' is not IOB2"):
        entities(["X-PER"])
    assert is_iob_tagset(["O", "B-A", "I-A"]) and not is_iob_tagset(["NOUN", "VERB"])


# --- entity scores: random cases against a second chunker -----------------------------------------------------

def reference_entities(tags):
    """A second reading of seqeval's default rule: an entity starts at every non-O tag that is a B-, or whose
    previous tag is O, absent or of another type; it extends over the following I- tags of its type."""
    out = []
    i = 0
    while i < len(tags):
        tag = tags[i]
        if tag != "O":
            kind = tag[2:]
            j = i
            while j + 1 < len(tags) and tags[j + 1] == "I-" + kind:
                j += 1
            out.append((kind, i, j))
            i = j + 1
        else:
            i += 1
    return out


def reference_scores(gold, pred):
    g = {(n, *e) for n, s in enumerate(gold) for e in reference_entities(s)}
    p = {(n, *e) for n, s in enumerate(pred) for e in reference_entities(s)}
    tp = len(g & p)
    precision = tp / len(p) if p else 0.0
    recall = tp / len(g) if g else 0.0
    return precision, recall, (2 * precision * recall / (precision + recall) if tp else 0.0)


@pytest.mark.parametrize("seed", range(25))
def test_entity_scores_match_the_reference_on_random_tags(seed):
    rng = random.Random(seed)
    tagset = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    gold, pred = [], []
    for _ in range(rng.randint(1, 12)):
        n = rng.randint(0, 15)
        g = [rng.choice(tagset) for _ in range(n)]
        p = [t if rng.random() < 0.7 else rng.choice(tagset) for t in g]
        gold.append(g)
        pred.append(p)
    for sentence in gold:
        assert entities(sentence) == reference_entities(sentence)
    scores = entity_scores(gold, pred)
    precision, recall, f1 = reference_scores(gold, pred)
    assert (scores["precision"], scores["recall"]) == pytest.approx((precision, recall))
    assert scores["f1"] == pytest.approx(f1)
    for kind, per in scores["per_type"].items():
        keep = lambda seqs: [[t if t.endswith("-" + kind) else "O" for t in s] for s in seqs]  # noqa: E731
        assert per["f1"] == pytest.approx(reference_scores(keep(gold), keep(pred))[2])


# --- SQuAD: hand-computed (random cases against the official rules: test_metrics_vs_libraries.py) ---------------

def test_squad_hand_computed():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("an apple, a pear") == "apple pear"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words
    assert exact_match("the Eiffel tower.", "Eiffel Tower") == 1.0
    # pred "eiffel tower in paris" vs gold "eiffel tower": P 2/4, R 2/2, F1 2/3
    assert token_f1("Eiffel Tower in Paris", "the Eiffel Tower") == pytest.approx(2 / 3)
    # pred "eiffel tower" vs gold "eiffel tower paris": P 1, R 2/3, F1 0.8
    assert token_f1("Eiffel Tower", "Eiffel Tower, Paris") == pytest.approx(0.8)
    # both sides normalise to nothing: v1.1 shares no token (0), v2.0 calls them equal (1)
    assert token_f1("the", "a") == 0.0 and token_f1("the", "a", "2.0") == 1.0 and token_f1("the", "Paris") == 0.0
    scores = squad_scores(["Paris", "in 1889"], [["paris", "Paris, France"], ["1887"]])
    assert scores == {"exact_match": 0.5, "f1": 0.5, "questions": 2, "squad_version": "1.1"}
    with pytest.raises(ValueError, match="question 1 has no gold answer"):
        squad_scores(["x"], [[]], version="1.1")
    with pytest.raises(ValueError, match="1 predictions but 2 questions"):
        squad_scores(["x"], [["x"], ["y"]])
