"""Every family head, parametrised over all six families: loading, labels, dispatch, inputs, losses, prediction.

Saving/reloading lives in test_heads_io.py, bad inputs in test_heads_errors.py, fine-tuning in
test_heads_training.py.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import heads
from tiny_models import FAMILIES, tiny_config, tiny_tokenizer, toy_task

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = {
    "bert": heads.BertForSequenceClassification,
    "distilbert": heads.DistilBertForSequenceClassification,
    "roberta": heads.RobertaForSequenceClassification,
    "albert": heads.AlbertForSequenceClassification,
    "xlm-roberta": heads.XLMRobertaForSequenceClassification,
    "deberta-v2": heads.DebertaV2ForSequenceClassification,
}
WITH_TOKEN_TYPES = {"bert", "albert", "deberta-v2"}
TEXTS = ["the movie was really good", "bad", "the plot seemed quite awful to me", "the music was lovely"]


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


def fresh_head(family: str, num_labels: int = 3, problem_type: str | None = None, seed: int = 0):
    config = tiny_config(family, num_labels)
    config.problem_type = problem_type
    torch.manual_seed(seed)
    head = CLASSES[family].from_config(config, tokenizer=tiny_tokenizer(family))
    head.model.eval()  # deterministic forwards for exact comparisons
    return head


# --- loading --------------------------------------------------------------------------------------------------
def test_base_checkpoint_gives_fresh_head_logged_once(family, tiny_checkpoint, caplog, capfd):
    path = tiny_checkpoint(family, with_classifier=False)
    caplog.set_level(logging.INFO, logger="flodl_hf.heads")
    head = CLASSES[family].from_pretrained(path, num_labels=3)
    fresh = [r for r in caplog.records if "no classifier weights" in r.getMessage()]
    assert len(fresh) == 1
    assert fresh[0].levelno == logging.WARNING and fresh[0].name == "flodl_hf.heads"
    message = fresh[0].getMessage()
    assert str(path) in message and "3-label head" in message and "fine-tune before use" in message
    for key in CLASSES[family].head_keys.head:
        assert key in message
    out, err = capfd.readouterr()
    assert out == "" and "LOAD REPORT" not in err and "Loading weights" not in err  # transformers kept quiet
    assert head.num_labels == 3 and head.labels() == ["LABEL_0", "LABEL_1", "LABEL_2"]
    assert head.tokenizer is not None and head.model.training
    # every encoder weight of the base checkpoint (keys without the family prefix) was loaded exactly
    prefix = head.model.base_model_prefix
    model_sd = head.model.state_dict()
    loaded = 0
    for key, value in load_file(str(path / "model.safetensors")).items():
        target = f"{prefix}.{key}"
        if target in model_sd:
            assert torch.equal(model_sd[target], value), key
            loaded += 1
    assert loaded >= len([k for k in model_sd if k.startswith(prefix + ".")]) - 2


def test_classifier_checkpoint_loads_exactly(family, tiny_checkpoint, caplog):
    path = tiny_checkpoint(family, with_classifier=True, num_labels=2)
    caplog.set_level(logging.INFO, logger="flodl_hf.heads")
    head = CLASSES[family].from_pretrained(path)
    assert not [r for r in caplog.records if "no classifier weights" in r.getMessage()]
    saved = load_file(str(path / "model.safetensors"))
    model_sd = head.model.state_dict()
    assert set(saved) == set(model_sd)
    assert all(torch.equal(model_sd[k], v) for k, v in saved.items())
    assert head.num_labels == 2
    same = CLASSES[family].from_pretrained(path, num_labels=2)  # agreeing num_labels is fine
    assert same.num_labels == 2


def test_labels_set_id2label_and_label2id(family, tiny_checkpoint):
    head = CLASSES[family].from_pretrained(tiny_checkpoint(family), labels=["neg", "pos", "mixed"])
    config = head.config()
    assert head.num_labels == 3 and config.num_labels == 3
    assert config.id2label == {0: "neg", 1: "pos", 2: "mixed"}
    assert config.label2id == {"neg": 0, "pos": 1, "mixed": 2}
    assert head.labels() == ["neg", "pos", "mixed"]
    _, labels = head.collate([("good", "pos"), ("bad", "neg"), ("okay", 2)])
    assert labels.tolist() == [1, 0, 2]


def test_auto_dispatch(family, tiny_checkpoint):
    cls = CLASSES[family]
    head = heads.AutoHeadForSequenceClassification.from_pretrained(tiny_checkpoint(family), num_labels=2)
    assert type(head) is cls
    config = tiny_config(family)
    assert type(heads.AutoHeadForSequenceClassification.on_device(config, 2, "cpu")) is cls
    assert type(heads.AutoHeadForSequenceClassification.from_config(config)) is cls
    assert heads.AutoHeadForSequenceClassification.head_class(family) is cls


def test_on_device_builds_a_fresh_replica_on_the_device(family):
    config = tiny_config(family, num_labels=2)
    head = CLASSES[family].on_device(config, 4, "cpu")
    assert head.tokenizer is None and head.num_labels == 4 and head.graph().device == torch.device("cpu")
    assert config.num_labels == 2  # the caller's config is not mutated
    assert head.model.training
    assert isinstance(head, heads.SequenceClassificationHead) and not isinstance(head, torch.nn.Module)
    meta = CLASSES[family].on_device(
        config, 3, torch.device("meta")
    )  # built there directly, never on the CPU
    assert all(p.device.type == "meta" for p in meta.model.parameters())
    assert meta.graph().device == torch.device("meta")


def test_head_follows_the_graphs_live_module(family):
    """Trainer.setup_head swaps graph.module for a replica: the head must use the new one, never a cached model."""
    head = fresh_head(family, num_labels=2)
    replica = CLASSES[family].on_device(tiny_config(family), 3, "cpu").graph().module
    optimizer = torch.optim.SGD(replica.parameters(), lr=0.1)
    from flodl_hf.config import DdpConfig

    head.graph().attach(replica, optimizer, torch.device("cpu"), DdpConfig(verbose=False))
    assert head.model is replica and head.num_labels == 3
    assert head.forward(head.encode(TEXTS)).shape == (len(TEXTS), 3)


def test_forward_runs_under_the_graphs_autocast(family):
    from flodl_hf.config import DdpConfig

    head = fresh_head(family, num_labels=2)
    head.graph().config = DdpConfig(precision="bf16", verbose=False)
    enc, labels = head.collate(toy_task(4))
    assert head.forward(enc).dtype == torch.bfloat16
    loss = head.compute_loss(enc, labels)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()


# --- inputs ---------------------------------------------------------------------------------------------------
def test_encode_returns_the_family_inputs(family):
    head = fresh_head(family)
    enc = head.encode(TEXTS)
    expected = {"input_ids", "attention_mask"} | ({"token_type_ids"} if family in WITH_TOKEN_TYPES else set())
    assert set(enc) == expected
    lengths = [len(tiny_tokenizer(family)(t)["input_ids"]) for t in TEXTS]
    assert enc["input_ids"].shape == (len(TEXTS), max(lengths))  # dynamic padding to the longest
    assert enc["attention_mask"].sum(1).tolist() == lengths
    assert all(t.device == head.graph().device for t in enc.values())
    short = head.encode(TEXTS, max_length=4)
    assert short["input_ids"].shape == (len(TEXTS), 4)


def test_max_length_is_capped_by_the_positions(family):
    head = fresh_head(family)
    limit = 62 if family in ("roberta", "xlm-roberta") else 64  # RoBERTa positions start after pad_token_id
    assert head.max_length == limit
    long_text = " ".join(["good"] * 200)
    assert head.encode([long_text])["input_ids"].shape[1] == limit
    head.forward(head.encode([long_text]))  # embeds without an index error
    head.max_length = 16
    assert head.encode([long_text])["input_ids"].shape[1] == 16


def test_collate_accepts_pairs_dicts_and_bare_texts(family):
    head = fresh_head(family, num_labels=2)
    data = toy_task(6)
    enc, labels = head.collate(data)
    assert labels.dtype == torch.long and labels.tolist() == [y for _, y in data]
    assert enc["input_ids"].shape[0] == 6
    _, from_dicts = head.collate([{"text": t, "label": y} for t, y in data])
    assert torch.equal(from_dicts, labels)
    _, none = head.collate([t for t, _ in data])
    assert none is None
    _, none = head.collate([(t, None) for t, _ in data])
    assert none is None
    _, soft = head.collate([("good", [0.2, 0.8]), ("bad", [1.0, 0.0])])
    assert soft.dtype == torch.float32 and soft.shape == (2, 2)
    _, floats = head.collate([("good", 1.5), ("bad", 0)])
    assert floats.dtype == torch.float32 and floats.tolist() == [1.5, 0.0]


# --- losses ---------------------------------------------------------------------------------------------------
def test_integer_labels_cross_entropy_ignores_minus_100(family):
    head = fresh_head(family, num_labels=3)
    enc = head.encode(TEXTS)
    labels = torch.tensor([0, 2, -100, 1])
    loss = head.compute_loss(enc, labels)
    logits = head.forward(enc).float()
    keep = labels != -100
    manual = -torch.log_softmax(logits[keep], -1).gather(1, labels[keep, None]).mean()
    torch.testing.assert_close(loss, manual)
    reference = copy.deepcopy(head.model)  # transformers' own loss (it would set config.problem_type)
    torch.testing.assert_close(loss, reference(**enc, labels=labels).loss)
    assert head.config().problem_type is None
    all_ignored = head.compute_loss(enc, torch.full((4,), -100))
    assert all_ignored.item() == 0.0 and all_ignored.requires_grad


def test_soft_labels_cross_entropy(family):
    head = fresh_head(family, num_labels=3)
    enc = head.encode(TEXTS)
    targets = torch.tensor([[0.7, 0.2, 0.1], [0.0, 0.0, 1.0], [0.3, 0.3, 0.4], [0.5, 0.5, 0.0]])
    loss = head.compute_loss(enc, targets)
    manual = -(targets * torch.log_softmax(head.forward(enc).float(), -1)).sum(-1).mean()
    torch.testing.assert_close(loss, manual)
    one_hot = head.compute_loss(enc, F.one_hot(torch.tensor([0, 2, 1, 1]), 3).float())
    torch.testing.assert_close(one_hot, head.compute_loss(enc, torch.tensor([0, 2, 1, 1])))


def test_multi_label_bce(family):
    head = fresh_head(family, num_labels=3, problem_type="multi_label_classification")
    enc = head.encode(TEXTS)
    targets = torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]])
    loss = head.compute_loss(enc, targets)
    probs = torch.sigmoid(head.forward(enc).float())
    manual = -(targets * probs.log() + (1 - targets) * (1 - probs).log()).mean()
    torch.testing.assert_close(loss, manual)
    torch.testing.assert_close(loss, head.model(**enc, labels=targets.float()).loss)


def test_regression_mse(family):
    head = fresh_head(family, num_labels=1)
    enc = head.encode(TEXTS)
    targets = torch.tensor([0.5, -1.0, 2.0, 0.0])
    loss = head.compute_loss(enc, targets)
    manual = ((head.forward(enc).float().squeeze(-1) - targets) ** 2).mean()
    torch.testing.assert_close(loss, manual)
    reference = copy.deepcopy(head.model)
    torch.testing.assert_close(loss, reference(**enc, labels=targets).loss)
    torch.testing.assert_close(head.compute_loss(enc, targets[:, None]), loss)  # [B, 1] works too


def test_loss_is_the_mean_over_samples(family):
    """The engine's exact multi-rank averaging relies on a per-sample mean: loss(A+B) = mean of halves."""
    head = fresh_head(family, num_labels=2)
    data = toy_task(8)
    whole = head.compute_loss(*head.collate(data))
    halves = [head.compute_loss(*head.collate(data[:4])), head.compute_loss(*head.collate(data[4:]))]
    # halves are padded differently; masked attention keeps logits equal up to float noise
    torch.testing.assert_close(whole, (halves[0] + halves[1]) / 2, atol=1e-5, rtol=1e-5)


# --- prediction -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("start_training", [True, False])
def test_predict_sorted_probabilities_and_mode_restored(family, start_training):
    head = fresh_head(family, num_labels=3)
    head.model.train(start_training)
    head.model.classifier.train(not start_training)  # a submodule in the other mode must be restored too
    modes = {name: m.training for name, m in head.model.named_modules()}
    results = head.predict(TEXTS, batch_size=3)
    assert {name: m.training for name, m in head.model.named_modules()} == modes
    assert len(results) == len(TEXTS)
    for pairs in results:
        probs = [p for _, p in pairs]
        assert probs == sorted(probs, reverse=True)
        assert sorted(name for name, _ in pairs) == ["LABEL_0", "LABEL_1", "LABEL_2"]
        assert abs(sum(probs) - 1.0) < 1e-5
    head.model.eval()
    with torch.no_grad():
        expected = torch.softmax(head.forward(head.encode(TEXTS[:1])).float(), -1)[0]
    assert max(p for _, p in results[0]) == pytest.approx(float(expected.max()), abs=1e-5)
    top = head.predict(TEXTS, top_k=1)
    assert [len(p) for p in top] == [1] * len(TEXTS)
    assert [p[0][0] for p in top] == [p[0][0] for p in results]
    assert [p[0][1] for p in top] == pytest.approx([p[0][1] for p in results], abs=1e-5)  # other padding
    assert head.predict([]) == []


def test_predict_multi_label_and_regression(family):
    multi = fresh_head(family, num_labels=3, problem_type="multi_label_classification")
    pairs = multi.predict(TEXTS[:1])[0]
    with torch.no_grad():
        probs = torch.sigmoid(multi.forward(multi.encode(TEXTS[:1])).float())[0]
    assert [p for _, p in pairs] == pytest.approx(sorted((float(p) for p in probs), reverse=True), abs=1e-6)
    regression = fresh_head(family, num_labels=1)
    (result,) = regression.predict(TEXTS[:1])
    assert len(result) == 1 and result[0][0] == "score"
    with torch.no_grad():
        score = float(regression.forward(regression.encode(TEXTS[:1]))[0, 0])
    assert result[0][1] == pytest.approx(score, abs=1e-6)
