"""Every metric flodl-hf reports, checked on seeded random cases against the library people trust for it.

Why: the metrics are pure Python so that ``flodl_hf`` needs no scikit-learn, scipy or seqeval at run
time, and a hand-written metric drifts from the reference silently (SQuAD F1 applied v2.0's empty-answer rule to
v1.1 data; multi-label macro-F1 averaged only the labels present). The references are the dev extra's pinned
scikit-learn, scipy and seqeval; for SQuAD, whose official scripts no package ships offline (``evaluate`` fetches
them from the Hub), the v1.1 and v2.0 rules are written out below from their published definitions; for
perplexity, a plain PyTorch computation from the logits. Conventions checked on purpose: ``zero_division=0``
everywhere (scikit-learn's default ``"warn"`` returns 0 too); a correlation with a constant side is 0.0 where
scipy gives NaN.
"""

from __future__ import annotations

import math
import random
import re
import string
import warnings
from collections import Counter

import numpy as np
import pytest
import scipy.stats as stats
import seqeval.metrics as seqeval_metrics
import sklearn.metrics as skm  # the references are the dev extra's: a missing one fails, it does not skip
import torch
from seqeval.metrics.sequence_labeling import get_entities

from flodl_hf.job.tasks.problems import summarize
from flodl_hf.metrics.classification import (accuracy, classification_summary, confusion_cells, confusion_matrix,
                                             macro_f1, multi_label_summary, per_label_scores)
from flodl_hf.metrics.entities import entities, entity_scores, token_accuracy
from flodl_hf.metrics.regression import pearson, spearman
from flodl_hf.metrics.squad import exact_match, normalize_answer, squad_scores, token_f1
from heads._mlm_run import perplexity

pytestmark = pytest.mark.usefixtures("one_thread")

CASES = 300
approx = lambda value: pytest.approx(value, rel=1e-9, abs=1e-12)  # noqa: E731


@pytest.fixture(autouse=True)
def _quiet():
    """The references warn about undefined scores and constant inputs: those cases are the point."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _ids(rng: random.Random, n: int, k: int) -> list[int]:
    """Label ids skewed towards the low ones, so that some labels are absent from a side."""
    return [min(int(rng.expovariate(1.0) * k / 2), k - 1) for _ in range(n)]


# --- single-label classification: scikit-learn ------------------------------------------------------------------

def test_single_label_metrics_equal_scikit_learn():
    rng = random.Random(28)
    for _ in range(CASES):
        k, n = rng.randint(2, 7), rng.randint(1, 40)
        gold = _ids(rng, n, k)
        pred = [g if rng.random() < 0.5 else rng.randrange(k) for g in gold]
        assert accuracy(pred, gold) == approx(skm.accuracy_score(gold, pred))
        # macro-F1: scikit-learn without labels= averages the labels present in either side
        macro = skm.f1_score(gold, pred, average="macro", zero_division=0)
        assert macro_f1(pred, gold, k) == approx(macro)
        p, r, f, s = skm.precision_recall_fscore_support(gold, pred, labels=list(range(k)), average=None,
                                                         zero_division=0)
        ours = per_label_scores(pred, gold, k)
        assert [x["precision"] for x in ours] == approx(list(p)) and [x["recall"] for x in ours] == approx(list(r))
        assert [x["f1"] for x in ours] == approx(list(f)) and [x["support"] for x in ours] == list(s)
        matrix = skm.confusion_matrix(gold, pred, labels=list(range(k))).tolist()
        assert confusion_matrix(pred, gold, k) == matrix
        summary = classification_summary(pred, gold, [f"l{i}" for i in range(k)])
        assert summary["confusion_matrix"] == matrix and summary["macro_f1"] == approx(macro)
        cells = [[r, c, v] for r, row in enumerate(matrix) for c, v in enumerate(row) if v]
        assert confusion_cells(pred, gold) == cells  # the sparse form: scikit-learn's non-zero cells


def test_many_labels_keep_the_confusion_matrix_sparse_and_small():
    """Above DENSE_LABELS labels the summary holds the matrix's non-zero cells, scikit-learn's (rule 10: 10,000
    labels summarise and serialise in megabytes; the dense matrix alone is 10^8 counts). Shown failing once: the dense
    matrix of 10,000 labels alone peaks at 764 MB traced (the bound is 64 MB)."""
    import json
    import tracemalloc

    from flodl_hf.metrics.classification import DENSE_LABELS

    rng = random.Random(29)
    for k in (DENSE_LABELS + 1, 3000):  # scikit-learn's dense matrix stays affordable here
        gold = _ids(rng, 500, k)
        pred = [g if rng.random() < 0.5 else rng.randrange(k) for g in gold]
        summary = classification_summary(pred, gold, [f"l{i}" for i in range(k)])
        matrix = skm.confusion_matrix(gold, pred, labels=list(range(k)))
        rows, cols = np.nonzero(matrix)
        assert summary["confusion_matrix"] is None
        assert summary["confusion_cells"] == [[int(r), int(c), int(matrix[r, c])] for r, c in zip(rows, cols)]
    k, n = 10_000, 20_000
    gold = _ids(rng, n, k)
    pred = [g if rng.random() < 0.5 else rng.randrange(k) for g in gold]
    labels = [f"label_{i}" for i in range(k)]
    tracemalloc.start()
    try:
        text = json.dumps(classification_summary(pred, gold, labels), indent=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20 and len(text) < 16 * 2**20, (peak, len(text))


# --- multi-label classification: scikit-learn on indicator rows --------------------------------------------------

def _hot(rows: list[list[int]], k: int) -> np.ndarray:
    out = np.zeros((len(rows), k), dtype=int)
    for i, ids in enumerate(rows):
        out[i, list(ids)] = 1
    return out


def test_multi_label_metrics_equal_scikit_learn():
    rng = random.Random(2028)
    for case in range(CASES):
        k, n = rng.randint(2, 6), rng.randint(1, 30)  # one column would be binary data to scikit-learn
        rate = [rng.choice((0.0, 0.1, 0.4, 0.8)) for _ in range(k)]  # rate 0: a label nobody has
        gold = [[i for i in range(k) if rng.random() < rate[i]] for _ in range(n)]
        pred = [[i for i in range(k) if (i in g) != (rng.random() < 0.2 * (case % 3))] for g in gold]
        summary = multi_label_summary(pred, gold, [f"l{i}" for i in range(k)])
        y, yhat = _hot(gold, k), _hot(pred, k)
        assert summary["micro_f1"] == approx(skm.f1_score(y, yhat, average="micro", zero_division=0))
        assert summary["macro_f1"] == approx(skm.f1_score(y, yhat, average="macro", zero_division=0))
        assert summary["accuracy"] == approx(skm.accuracy_score(y, yhat))
        p, r, f, s = skm.precision_recall_fscore_support(y, yhat, average=None, zero_division=0)
        per = list(summary["per_label"].values())
        assert [x["precision"] for x in per] == approx(list(p)) and [x["recall"] for x in per] == approx(list(r))
        assert [x["f1"] for x in per] == approx(list(f)) and [x["support"] for x in per] == list(s)


def test_multi_label_macro_f1_counts_a_label_nobody_has():
    # label c: never gold, never predicted -> F1 0 (zero_division=0) and averaged in, as scikit-learn does
    summary = multi_label_summary([[0], [1]], [[0], [1]], ["a", "b", "c"])
    assert summary["macro_f1"] == pytest.approx(2 / 3) == skm.f1_score(
        _hot([[0], [1]], 3), _hot([[0], [1]], 3), average="macro", zero_division=0)
    assert summary["micro_f1"] == 1.0


# --- the problem types' summaries (metrics.json), losses included ------------------------------------------------

def test_problem_summaries_equal_scikit_learn_and_scipy():
    torch.manual_seed(0)
    rng = random.Random(7)
    for _ in range(100):
        k, n = rng.randint(2, 5), rng.randint(2, 30)
        logits = torch.randn(n, k) * 2
        gold = _ids(rng, n, k)
        single = summarize("single_label", logits, gold, [str(i) for i in range(k)])
        pred = logits.argmax(-1).tolist()
        probs = torch.softmax(logits.double(), -1).numpy()
        assert single["accuracy"] == approx(skm.accuracy_score(gold, pred))
        assert single["macro_f1"] == approx(skm.f1_score(gold, pred, average="macro", zero_division=0))
        assert single["loss"] == pytest.approx(skm.log_loss(gold, probs, labels=list(range(k))), rel=1e-5)

        sets = [[i for i in range(k) if rng.random() < 0.3] for _ in range(n)]
        multi = summarize("multi_label", logits, sets, [str(i) for i in range(k)])
        y, yhat = _hot(sets, k), (torch.sigmoid(logits) >= 0.5).int().numpy()
        assert multi["micro_f1"] == approx(skm.f1_score(y, yhat, average="micro", zero_division=0))
        assert multi["macro_f1"] == approx(skm.f1_score(y, yhat, average="macro", zero_division=0))
        assert multi["accuracy"] == approx(skm.accuracy_score(y, yhat))
        bce = skm.log_loss(y.ravel(), torch.sigmoid(logits.double()).numpy().ravel(), labels=[0, 1])
        assert multi["loss"] == pytest.approx(bce, rel=1e-5)

        targets = [rng.choice((0.0, 1.0, 2.5, rng.uniform(0, 5))) for _ in range(n)]
        regression = summarize("regression", logits[:, :1], targets, [])
        outputs = logits[:, 0].tolist()
        assert regression["mse"] == approx(skm.mean_squared_error(targets, outputs))
        assert regression["pearson"] == _correlation(stats.pearsonr, outputs, targets)
        assert regression["spearman"] == _correlation(stats.spearmanr, outputs, targets)


# --- regression: scipy.stats -------------------------------------------------------------------------------------

def _correlation(fn, xs, ys):
    """scipy's statistic, with NaN (a constant side) read as the 0.0 flodl-hf reports."""
    value = float(fn(xs, ys)[0])
    return 0.0 if math.isnan(value) else pytest.approx(value, rel=1e-9, abs=1e-9)


def test_correlations_equal_scipy_ties_and_constants_included():
    rng = random.Random(11)
    constant = 0
    for case in range(CASES):
        n = rng.randint(2, 30)
        if case % 4 == 0:  # many ties
            xs = [float(rng.randint(0, 3)) for _ in range(n)]
            ys = [float(rng.randint(0, 3)) for _ in range(n)]
        else:
            xs = [rng.gauss(0, 1) for _ in range(n)]
            ys = [x * rng.uniform(-2, 2) + rng.gauss(0, 1) for x in xs]
        if case % 25 == 0:
            ys = [1.5] * n  # constant: scipy gives NaN, flodl-hf 0.0
        constant += len(set(xs)) == 1 or len(set(ys)) == 1
        assert pearson(xs, ys) == _correlation(stats.pearsonr, xs, ys)
        assert spearman(xs, ys) == _correlation(stats.spearmanr, xs, ys)
    assert constant >= CASES // 25
    assert math.isnan(stats.pearsonr([1.0, 2.0, 3.0], [2.0, 2.0, 2.0])[0]) and pearson([1, 2, 3], [2, 2, 2]) == 0.0


# --- entities: seqeval (default mode) ----------------------------------------------------------------------------

TAGS = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-MISC-X", "I-MISC-X"]


def _tag_case(rng: random.Random) -> tuple[list[list[str]], list[list[str]]]:
    gold, pred = [], []
    for _ in range(rng.randint(1, 10)):
        sentence = [rng.choice(TAGS) for _ in range(rng.randint(0, 14))]  # I- after O, type changes: malformed
        gold.append(sentence)
        pred.append([t if rng.random() < 0.7 else rng.choice(TAGS) for t in sentence])
    return gold, pred


def test_entity_scores_equal_seqeval():
    rng = random.Random(5)
    for _ in range(CASES):
        gold, pred = _tag_case(rng)
        for sentence in gold:
            assert entities(sentence) == get_entities(sentence)
        scores = entity_scores(gold, pred)
        assert scores["precision"] == approx(seqeval_metrics.precision_score(gold, pred))
        assert scores["recall"] == approx(seqeval_metrics.recall_score(gold, pred))
        assert scores["f1"] == approx(seqeval_metrics.f1_score(gold, pred))
        if scores["gold_entities"]:  # seqeval's report needs a gold entity
            report = seqeval_metrics.classification_report(gold, pred, output_dict=True, zero_division=0)
            for kind, per in scores["per_type"].items():
                reference = report.get(kind, {"precision": 0.0, "recall": 0.0, "f1-score": 0.0, "support": 0})
                assert (per["precision"], per["recall"], per["f1"]) == approx(
                    (reference["precision"], reference["recall"], reference["f1-score"]))
                assert per["support"] == reference["support"]
        flat_gold = [t for s in gold for t in s]
        flat_pred = [t for s in pred for t in s]
        if flat_gold:
            assert token_accuracy(gold, pred) == approx(skm.accuracy_score(flat_gold, flat_pred))
            assert token_accuracy(gold, pred) == approx(seqeval_metrics.accuracy_score(gold, pred))


def test_entity_scores_edge_cases_equal_seqeval():
    for gold, pred in ((([["O", "O"]]), [["O", "O"]]),                 # no entity anywhere: all 0
                       ([["B-PER"]], [["O"]]),                         # nothing predicted
                       ([["O"]], [["I-PER"]]),                         # I- after nothing starts an entity
                       ([["B-PER", "I-LOC"]], [["B-PER", "I-PER"]]),   # a type change splits the run
                       ([[], ["B-A"]], [[], ["B-A"]])):                # an empty sentence
        scores = entity_scores(gold, pred)
        assert (scores["precision"], scores["recall"], scores["f1"]) == approx(
            (seqeval_metrics.precision_score(gold, pred), seqeval_metrics.recall_score(gold, pred),
             seqeval_metrics.f1_score(gold, pred)))


# --- SQuAD: the official v1.1 and v2.0 rules, written out from their published definitions ----------------------

def rule_normalize(text: str) -> str:
    """Both versions: lower-case; drop every ASCII punctuation character; replace each article a / an / the that
    stands between regex word boundaries by a space; join the whitespace-separated pieces with single spaces."""
    kept = "".join(c for c in text.lower() if c not in set(string.punctuation))
    return " ".join(re.sub(r"\b(?:the|an|a)\b", " ", kept).split())


def rule_f1_v11(prediction: str, gold: str) -> float:
    """v1.1: overlap F1 of the normalised tokens; no shared token (an empty side included) scores 0."""
    p, g = rule_normalize(prediction).split(), rule_normalize(gold).split()
    shared = sum(min(Counter(p)[w], Counter(g)[w]) for w in set(p))
    return 0.0 if shared == 0 else 2 * shared / (len(p) + len(g))


def rule_f1_v20(prediction: str, gold: str) -> float:
    """v2.0: as v1.1, except that when either side has no token the score is whether both have none."""
    p, g = rule_normalize(prediction).split(), rule_normalize(gold).split()
    if not p or not g:
        return float(p == g)
    return rule_f1_v11(prediction, gold)


def rule_scores(predictions, golds, version):
    """Mean best-over-golds EM and F1; v2.0 keeps only golds with a token and scores none against ''."""
    em = f1 = 0.0
    for prediction, answers in zip(predictions, golds):
        if version == "2.0":
            answers = [a for a in answers if rule_normalize(a)] or [""]
            f1 += max(rule_f1_v20(prediction, a) for a in answers)
        else:
            f1 += max(rule_f1_v11(prediction, a) for a in answers)
        em += max(float(rule_normalize(prediction) == rule_normalize(a)) for a in answers)
    return em / len(predictions), f1 / len(predictions)


VOCAB = ["the", "a", "an", "The", "AN", "Paris", "paris,", "tower", "Tower.", "1889", "x-y", "(new)", "it's", "!",
         "...", "théâtre", "the-end", "a.", "«the»", "an’", "", " "]


def _phrase(rng: random.Random) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(rng.randint(0, 4)))


def test_squad_v11_data_are_scored_by_the_v11_rule():
    rng = random.Random(1)
    differ = 0
    predictions = [_phrase(rng) for _ in range(2000)]
    golds = [[_phrase(rng) for _ in range(rng.randint(1, 3))] for _ in predictions]
    for p, g in zip(predictions, golds):
        assert normalize_answer(p) == rule_normalize(p)
        assert exact_match(p, g[0]) == float(rule_normalize(p) == rule_normalize(g[0]))
        assert token_f1(p, g[0]) == approx(rule_f1_v11(p, g[0]))
        assert token_f1(p, g[0], "2.0") == approx(rule_f1_v20(p, g[0]))
        differ += rule_f1_v11(p, g[0]) != rule_f1_v20(p, g[0])
    assert differ > 100  # the cases exercise where the two rules part
    for start in range(0, 2000, 50):  # 40 data sets of 50 questions
        scores = squad_scores(predictions[start:start + 50], golds[start:start + 50])
        assert scores["squad_version"] == "1.1"
        assert (scores["exact_match"], scores["f1"]) == approx(
            rule_scores(predictions[start:start + 50], golds[start:start + 50], "1.1"))


def test_squad_v20_data_are_scored_by_the_v20_rule():
    rng = random.Random(2)
    predictions = [_phrase(rng) for _ in range(2000)]
    golds = [[_phrase(rng) for _ in range(rng.choice((0, 1, 1, 2, 3)))] for _ in predictions]
    for start in range(0, 2000, 50):
        chunk_p, chunk_g = predictions[start:start + 50], golds[start:start + 50]
        chunk_g[0] = []  # at least one unanswerable question: SQuAD 2.0 data
        scores = squad_scores(chunk_p, chunk_g)
        assert scores["squad_version"] == "2.0"
        assert (scores["exact_match"], scores["f1"]) == approx(rule_scores(chunk_p, chunk_g, "2.0"))
    # an unanswerable question: only an empty (normalised) prediction is right, by both EM and F1
    assert squad_scores(["the", "Paris"], [[], []]) == {"exact_match": 0.5, "f1": 0.5, "questions": 2,
                                                       "squad_version": "2.0"}


def test_squad_version_can_be_forced_and_is_checked():
    # v1.1 data scored by v2.0's rule would give the empty prediction F1 1 against an empty-normalising gold
    assert squad_scores(["a"], [["the"]])["f1"] == 0.0 and squad_scores(["a"], [["the"]], "2.0")["f1"] == 1.0
    assert squad_scores(["a"], [["the"]])["exact_match"] == 1.0  # EM is the same in both
    with pytest.raises(ValueError, match="question 1 has no gold answer, which SQuAD v1.1 cannot score"):
        squad_scores(["x"], [[]], "1.1")
    with pytest.raises(ValueError, match="SQuAD version '3' is unknown"):
        squad_scores(["x"], [["x"]], "3")


# --- fill-mask perplexity: plain PyTorch from the logits ---------------------------------------------------------

class _FakeMaskedLM:
    """The surface ``heads._mlm_run.perplexity`` uses: fixed logits and labels per text, a module for eval mode."""

    def __init__(self, logits: dict, labels: dict) -> None:
        self.logits, self.labels, self.module = logits, labels, torch.nn.Linear(1, 1)

    def graph(self):
        return self

    def _masked_batch(self, texts, seed, epoch):
        return texts, torch.stack([self.labels[t] for t in texts])

    def forward(self, texts):
        return torch.stack([self.logits[t] for t in texts])


def test_perplexity_equals_exp_of_the_mean_masked_cross_entropy():
    generator = torch.Generator().manual_seed(3)
    rng = random.Random(3)
    for _ in range(100):
        n, length, vocab = rng.randint(1, 9), rng.randint(1, 12), rng.randint(2, 30)
        logits = torch.randn(n, length, vocab, generator=generator) * 3
        labels = torch.randint(0, vocab, (n, length), generator=generator)
        labels[torch.rand(n, length, generator=generator) < 0.7] = -100  # unmasked positions
        labels[0, 0] = rng.randrange(vocab)  # at least one masked token
        texts = [str(i) for i in range(n)]
        head = _FakeMaskedLM(dict(zip(texts, logits)), dict(zip(texts, labels)))
        masked = labels != -100
        log_probs = torch.log_softmax(logits.double(), -1)[masked]
        reference = math.exp(float(-log_probs.gather(-1, labels[masked].unsqueeze(-1)).mean()))
        assert perplexity(head, texts, rng.randint(1, 4), 0) == pytest.approx(reference, rel=1e-5)
