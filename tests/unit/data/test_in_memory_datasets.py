"""In-memory ``datasets`` objects through the API, as a transformers ``Trainer`` user holds them.

``load_text_classification`` takes a ``Dataset`` or ``DatasetDict`` (labels matched by name, a ``ClassLabel``
through its names); ``head.collate`` takes the pre-tokenised rows ``dataset.map(tokenizer)`` leaves (padded as
transformers' ``DataCollatorWithPadding`` pads them: checked against it); ``head.collator(names)`` matches a
``ClassLabel``'s ids by name where ``head.collate`` takes ids as the head's own.
"""

from __future__ import annotations

import pytest
import torch

datasets = pytest.importorskip("datasets")

from transformers import DataCollatorWithPadding  # noqa: E402

from flodl_hf.data import load_text_classification  # noqa: E402
from heads import AutoHeadForSequenceClassification  # noqa: E402
from tiny_models import toy_task  # noqa: E402

REVERSED = ["positive", "negative"]  # the ClassLabel lists the classes in the other order than the head


def _dataset(n: int = 12) -> "datasets.Dataset":
    rows = toy_task(n)
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=REVERSED)})
    # toy_task's 1 is positive: in this ClassLabel positive is id 0
    return datasets.Dataset.from_dict({"text": [t for t, _ in rows], "label": [1 - y for _, y in rows]},
                                      features=features)


@pytest.fixture
def head(tiny_checkpoint):
    return AutoHeadForSequenceClassification.from_pretrained(str(tiny_checkpoint("bert")),
                                                             labels=["negative", "positive"], max_length=16)


def test_load_text_classification_takes_a_dataset_and_a_dataset_dict_matching_labels_by_name():
    ds = _dataset()
    loaded = load_text_classification(ds, labels=["negative", "positive"])
    assert loaded.source == "the in-memory Dataset" and len(loaded) == len(ds)
    assert [loaded.target(i) for i in range(len(ds))] == [y for _, y in toy_task(len(ds))]  # by name, not by id
    split = load_text_classification(datasets.DatasetDict(train=ds, test=ds.select(range(4))), split="test")
    assert len(split) == 4 and split.labels == REVERSED  # without labels: the ClassLabel's names, in its order
    with pytest.raises(ValueError, match="validation"):
        load_text_classification(datasets.DatasetDict(train=ds), split="validation")


def test_collate_pads_pre_tokenised_rows_as_trainers_collator(head):
    ds = _dataset().map(lambda batch: head.tokenizer(batch["text"], truncation=True, max_length=16), batched=True)
    items = [ds[i] for i in range(5)]
    enc, labels = head.collate(items)
    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in items[0]]
    reference = DataCollatorWithPadding(head.tokenizer)([{k: row[k] for k in keys} for row in items])
    assert set(enc) == set(reference) & set(head.input_names) and "input_ids" in enc
    for name in enc:
        assert torch.equal(enc[name], reference[name]), name
    assert labels.tolist() == [row["label"] for row in items]  # plain collate: ids are the head's own
    assert head.compute_loss(enc, labels).dim() == 0
    with pytest.raises(ValueError, match="item at index 1 has no 'input_ids' but item 0 has"):
        head.collate([items[0], {"text": "good", "label": 0}])
    long = dict(items[0], input_ids=list(range(5, 25)), attention_mask=[1] * 20)
    with pytest.raises(ValueError, match="has 20 tokens, more than this head's max_length 16: tokenise with "
                                         "truncation=True, max_length=16"):
        head.collate([long])


def test_collator_matches_class_label_ids_by_name(head):
    ds = _dataset()
    items = [ds[i] for i in range(6)]
    _, by_name = head.collator(ds.features["label"].names)(items)
    assert by_name.tolist() == [1 - row["label"] for row in items]  # ClassLabel "positive" (0) is the head's 1
    assert 0 < sum(by_name.tolist()) < len(items)
    _, by_id = head.collate(items)
    assert by_id.tolist() == [row["label"] for row in items]
    with pytest.raises(ValueError, match="label 2 at index 0 is not an id of the 2 label names"):
        head.collator(REVERSED)([{"text": "good", "label": 2}])
    with pytest.raises(ValueError, match="label 'neutral' at index 0 is not one of this head's labels"):
        head.collator(["neutral", "positive"])([{"text": "good", "label": 0}])
    with pytest.raises(ValueError, match="label_names='positive' is invalid"):
        head.collator("positive")
