"""Heads keep a transformers user's habits: pipeline agrees with predict on long texts and on sentence pairs,
pairs encode and collate, ``head(**enc)`` returns a ``SequenceClassifierOutput``, and ``from_pretrained`` takes
transformers' keywords. Real transformers objects throughout, built offline from tiny configs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForSequenceClassification, pipeline
from transformers.modeling_outputs import SequenceClassifierOutput

import heads
from tiny_models import FAMILIES, tiny_config, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_LENGTH = 16
WITH_TOKEN_TYPES = {"bert", "albert", "deberta-v2"}
SHORT = ["the movie was good", "the plot was awful", "this book is fine"]
# 2x to 5x MAX_LENGTH tokens (one token per word in the tiny tokenizers); still within the tiny models' 64 positions
# only up to about 3.5x, so an untruncated pipeline call could not even run the longest ones.
LONG = [
    " ".join(["the music was lovely but the ending felt dreadful"] * n)[: 10_000] for n in (4, 6, 9)
]
FIRSTS = ["the movie was good", "the food was awful today", " ".join(["the show was great"] * 8)]
SECONDS = ["the film was excellent", "the story is lovely", "the acting was poor to me"]


def saved_head(family, tmp_path, num_labels=3, seed=0):
    torch.manual_seed(seed)
    head = heads.AutoHeadForSequenceClassification.from_config(
        tiny_config(family, num_labels), tokenizer=tiny_tokenizer(family), max_length=MAX_LENGTH,
        labels=["neg", "mid", "pos"][:num_labels],
    )
    out = head.save_pretrained(tmp_path / family)
    head.eval()
    return head, out


def pipe_scores(classifier, inputs):
    return [{d["label"]: d["score"] for d in row} for row in classifier(inputs, top_k=None)]


def head_scores(predictions):
    return [dict(row) for row in predictions]


def assert_same(pipe, ours):
    assert len(pipe) == len(ours)
    for a, b in zip(pipe, ours):
        assert max(a, key=a.get) == max(b, key=b.get)
        assert a.keys() == b.keys()
        for label in a:
            assert a[label] == pytest.approx(b[label], abs=1e-5)


# --- max_length travels with the saved model ---------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_pipeline_equals_predict_on_long_texts_and_pairs(family, tmp_path):
    head, out = saved_head(family, tmp_path)
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == MAX_LENGTH
    assert head.tokenizer.model_max_length > 10**8  # the head's own tokenizer object is not changed by saving
    lengths = [len(head.tokenizer(text)["input_ids"]) for text in LONG]
    assert min(lengths) >= 2 * MAX_LENGTH and max(lengths) >= 5 * MAX_LENGTH
    classifier = pipeline("text-classification", model=str(out), truncation=True)
    assert_same(pipe_scores(classifier, LONG + SHORT), head_scores(head.predict(LONG + SHORT)))
    pairs = [{"text": a, "text_pair": b} for a, b in zip(FIRSTS, SECONDS)]
    assert_same(pipe_scores(classifier, pairs), head_scores(head.predict(FIRSTS, SECONDS)))
    # A reloaded head takes its max_length from the saved tokenizer, so it agrees without being told.
    reloaded = heads.AutoHeadForSequenceClassification.from_pretrained(out)
    assert reloaded.max_length == MAX_LENGTH
    assert_same(pipe_scores(classifier, LONG), head_scores(reloaded.predict(LONG)))


def test_per_call_truncation_agrees_too(tmp_path):
    head, out = saved_head("bert", tmp_path)
    classifier = pipeline("text-classification", model=str(out))
    assert_same(pipe_scores_call(classifier, LONG), head_scores(head.predict(LONG)))


def pipe_scores_call(classifier, inputs):
    return [{d["label"]: d["score"] for d in row} for row in classifier(inputs, top_k=None, truncation=True)]


# --- sentence pairs ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_pair_encoding_matches_the_tokenizer(family, tmp_path):
    head, _ = saved_head(family, tmp_path)
    enc = head.encode(FIRSTS, SECONDS)
    ref = head.tokenizer(FIRSTS, SECONDS, padding=True, truncation="longest_first", max_length=MAX_LENGTH,
                         return_tensors="pt")
    assert torch.equal(enc["input_ids"], ref["input_ids"])
    assert int(enc["attention_mask"].sum(1).max()) == MAX_LENGTH  # the long first text was cut
    if family in WITH_TOKEN_TYPES:
        assert set(enc) == {"input_ids", "attention_mask", "token_type_ids"}
        assert int(enc["token_type_ids"][0].max()) == 1  # second segment has type 1
    else:
        assert "token_type_ids" not in enc


def test_collate_takes_pair_dicts_and_triples(tmp_path):
    head, _ = saved_head("bert", tmp_path)
    dicts = [{"text": a, "text_pair": b, "label": i % 3} for i, (a, b) in enumerate(zip(FIRSTS, SECONDS))]
    triples = [(a, b, "pos") for a, b in zip(FIRSTS, SECONDS)]
    enc, labels = head.collate(dicts)
    assert torch.equal(enc["input_ids"], head.encode(FIRSTS, SECONDS)["input_ids"])
    assert labels.tolist() == [0, 1, 2]
    enc2, labels2 = head.collate(triples)
    assert torch.equal(enc2["input_ids"], enc["input_ids"]) and labels2.tolist() == [2, 2, 2]
    _, none = head.collate([{"text": "good", "text_pair": "bad"}])
    assert none is None
    assert heads._inputs.split_items(triples)[1] == SECONDS
    assert heads._inputs.split_items([("good", 1)]) == (["good"], None, [1])


def test_mixed_and_bad_pairs_are_refused(tmp_path):
    head, _ = saved_head("bert", tmp_path)
    with pytest.raises(ValueError, match=r"item at index 1 lacks a text_pair but item 0 has one.*all pairs"):
        head.collate([{"text": "a", "text_pair": "b", "label": 0}, {"text": "c", "label": 1}])
    with pytest.raises(ValueError, match=r"text_pair at index 0 is int"):
        head.collate([("a", 3, 0)])
    with pytest.raises(ValueError, match=r"got 2 texts but 1 text_pairs"):
        head.encode(["a", "b"], ["c"])
    with pytest.raises(ValueError, match=r"second argument is text_pairs.*top_k=1 by keyword"):
        head.predict(["a"], 1)
    with pytest.raises(ValueError, match="takes a list of texts, got a single str"):
        head.predict(["a"], "b")


def test_a_pair_head_learns_an_entailment_toy():
    """Pairs labelled 1 when both texts share a sentiment: only learnable from both segments together."""
    import random

    rng = random.Random(0)
    good, bad = ["good", "great", "lovely", "superb"], ["bad", "awful", "poor", "dreadful"]
    items = []
    for i in range(96):
        a, b = rng.choice([good, bad]), rng.choice([good, bad])
        items.append((f"the movie was {rng.choice(a)}", f"the food was {rng.choice(b)}", int(a is b)))
    torch.manual_seed(0)
    config = tiny_config("bert", 2)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    head = heads.BertForSequenceClassification.from_config(config, tokenizer=tiny_tokenizer("bert"), max_length=16)
    optimizer = torch.optim.AdamW(head.model.parameters(), lr=3e-3)
    for _ in range(12):
        for start in range(0, 96, 16):
            enc, labels = head.collate(items[start : start + 16])
            loss = head(**enc, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    predictions = head.predict([a for a, _, _ in items], [b for _, b, _ in items], top_k=1)
    accuracy = sum(int(p[0][0] == f"LABEL_{y}") for p, (_, _, y) in zip(predictions, items)) / len(items)
    assert accuracy > 0.8


# --- callable heads ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_head_call_returns_a_sequence_classifier_output(family, tmp_path):
    head, out = saved_head(family, tmp_path)
    enc = head.encode(SHORT)
    output = head(**enc)
    assert isinstance(output, SequenceClassifierOutput) and output.loss is None
    assert torch.equal(output.logits, head.forward(enc)) and torch.equal(head(enc).logits, output.logits)
    labels = torch.tensor([0, 2, 1])
    with_loss = head(**enc, labels=labels)
    assert torch.equal(with_loss.loss, head.compute_loss(enc, labels))
    reference = AutoModelForSequenceClassification.from_pretrained(out).eval()
    ref = reference(**enc, labels=labels)
    assert torch.allclose(with_loss.loss, ref.loss, atol=1e-6) and torch.allclose(output.logits, ref.logits)
    tokenizer_batch = dict(head.tokenizer(SHORT, padding=True, return_tensors="pt"), labels=labels)
    assert head(**tokenizer_batch).loss is not None  # a tokenizer's batch with labels, as in a transformers loop


def test_head_call_refuses_unknown_inputs(tmp_path):
    head, _ = saved_head("roberta", tmp_path)
    enc = head.encode(SHORT)
    with pytest.raises(ValueError, match=r"unknown model inputs \['pixel_values'\]"):
        head(**enc, pixel_values=torch.zeros(1))
    with pytest.raises(ValueError, match="not both"):
        head(enc, input_ids=enc["input_ids"])
    with pytest.raises(ValueError, match="label 3 out of range|out of range|labels"):
        head(**enc, labels=torch.tensor([0, 1, 3]))


# --- from_pretrained keywords --------------------------------------------------------------------------------------
def test_from_pretrained_takes_transformers_keywords(tmp_path, tiny_checkpoint):
    _, out = saved_head("bert", tmp_path)
    fp16 = heads.AutoHeadForSequenceClassification.from_pretrained(out, dtype=torch.float16)
    assert {p.dtype for p in fp16.model.parameters()} == {torch.float16}
    old_name = heads.BertForSequenceClassification.from_pretrained(out, torch_dtype="bfloat16")
    assert {p.dtype for p in old_name.model.parameters()} == {torch.bfloat16}
    default = heads.AutoHeadForSequenceClassification.from_pretrained(out)
    assert {p.dtype for p in default.model.parameters()} == {torch.float32}
    cache = tmp_path / "hf-cache"
    local = heads.AutoHeadForSequenceClassification.from_pretrained(
        out, local_files_only=True, cache_dir=cache, revision="main", token=False, trust_remote_code=False
    )
    assert local.labels() == ["neg", "mid", "pos"] and local.max_length == MAX_LENGTH
    local.eval(), default.eval()
    assert torch.equal(local.forward(local.encode(SHORT)), default.forward(default.encode(SHORT)))
    # A Hub id is looked up in cache_dir only, with local_files_only: nothing there, so a clear not-found error.
    with pytest.raises(heads.CheckpointNotFoundError, match="org/not-cached"):
        heads.AutoHeadForSequenceClassification.from_pretrained("org/not-cached", local_files_only=True,
                                                                cache_dir=cache)
    base = heads.AutoHeadForSequenceClassification.from_pretrained(tiny_checkpoint("bert"), num_labels=2)
    assert base._max_length == heads._base.DEFAULT_MAX_LENGTH  # base checkpoint: 128 (capped at 64 positions)


def test_bad_from_pretrained_keywords_are_refused(tmp_path):
    _, out = saved_head("bert", tmp_path)
    load = heads.AutoHeadForSequenceClassification.from_pretrained
    with pytest.raises(ValueError, match=r"trust_remote_code=True is not supported: flodl-hf heads wrap .* six"):
        load(out, trust_remote_code=True)
    with pytest.raises(ValueError, match=r"trust_remote_code=True is not supported"):
        heads.BertForSequenceClassification.from_pretrained(out, trust_remote_code=True)
    with pytest.raises(ValueError, match=r"dtype='float8' is invalid"):
        load(out, dtype="float8")
    with pytest.raises(ValueError, match="disagree: pass only dtype"):
        load(out, dtype=torch.float16, torch_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="local_files_only='yes' is invalid"):
        load(out, local_files_only="yes")
    with pytest.raises(ValueError, match="revision='' is invalid"):
        load(out, revision="")


def test_a_copied_head_dir_still_loads_with_auto_dtype(tmp_path):
    _, out = saved_head("distilbert", tmp_path)
    copy = shutil.copytree(out, tmp_path / "copy")
    head = heads.AutoHeadForSequenceClassification.from_pretrained(copy, dtype="auto")
    assert head.max_length == MAX_LENGTH
