"""Token classification heads, every family: loss, alignment, export, strict loading, pipeline agreement, training,
bad input.

References are transformers itself: ``model(**enc, labels=...)`` for the loss, the tokenizer's own ``word_ids()``
for the alignment, ``AutoModelForTokenClassification`` for the export and ``pipeline("token-classification")`` on
the exported directory for ``tag``. Words are split into several subwords by a real WordPiece tokenizer
(``tokcls_helpers.subword_tokenizer``); the word-level ``tiny_tokenizer`` covers the pipeline's fallback heuristic.
"""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForTokenClassification, pipeline

import heads
from heads.token_classification import (
    HEAD_CLASSES,
    AutoHeadForTokenClassification,
    TokenClassificationHead,
)
from tiny_models import FAMILIES, tiny_config, tiny_tokenizer
from tokcls_helpers import (
    TAGS,
    byte_level_tokenizer,
    random_labels,
    random_tagged,
    subword_config,
    subword_tokenizer,
    toy_tagging,
)

pytestmark = pytest.mark.usefixtures("one_thread")
CheckpointError = heads.CheckpointError


def make_head(family: str, seed: int = 0, **kwargs) -> TokenClassificationHead:
    torch.manual_seed(seed)
    return AutoHeadForTokenClassification.from_config(
        subword_config(family), tokenizer=subword_tokenizer(family), **kwargs
    )


def reference_alignment(tokenizer, words, tags, all_subwords, max_length):
    """The transformers token-classification recipe (``tokenize_and_align_labels`` of the course / run_ner.py)."""
    ids = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_length).word_ids()
    b_to_i = {t: t.replace("B-", "I-") for t in TAGS if t.startswith("B-")}
    out, previous = [], None
    for w in ids:
        if w is None:
            out.append(-100)
        elif w != previous:
            out.append(TAGS.index(tags[w]))
        else:
            out.append(TAGS.index(b_to_i.get(tags[w], tags[w])) if all_subwords else -100)
        previous = w
    return ids, out


# --- loss ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_loss_equals_transformers(family):
    head = make_head(family).eval()
    data = random_tagged(6, seed=1)
    enc, _ = head.collate(data)
    seen = []
    head.graph().loss_items = lambda items, **_: seen.append(items)  # record what the head reports
    for seed, masked in [(0, 0.0), (1, 0.3), (2, 0.8)]:
        labels = random_labels(tuple(enc["input_ids"].shape), len(TAGS), seed, masked)
        labels[2] = -100  # a fully masked row
        want = head.model(**enc, labels=labels).loss
        got = head.compute_loss(enc, labels)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        assert seen[-1] == int((labels != -100).sum())
        out = head(**enc, labels=labels)
        assert type(out).__name__ == "TokenClassifierOutput" and out.logits.shape == (*labels.shape, len(TAGS))
        torch.testing.assert_close(out.loss, want, rtol=1e-6, atol=1e-7)
    with torch.no_grad():
        n = len(seen)
        head.compute_loss(enc, labels)
        assert len(seen) == n  # no gradient, nothing to weight


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_batch_without_labelled_tokens_is_a_zero_loss_over_zero_items(family):
    head = make_head(family).eval()
    enc, labels = head.collate(random_tagged(3, seed=2))
    labels[:] = -100
    seen = []
    head.graph().loss_items = lambda items, **_: seen.append(items)
    loss = head.compute_loss(enc, labels)
    assert loss.item() == 0.0 and loss.requires_grad and seen == [0]
    loss.backward()  # a graph, all-zero gradients: the rank contributes nothing
    assert all(p.grad is None or not p.grad.any() for p in head.model.parameters())
    assert torch.isnan(head.model(**enc, labels=labels).loss)  # what transformers gives instead


# --- alignment -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("all_subwords", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_alignment_matches_tokenizer_word_ids(family, all_subwords):
    head = make_head(family, label_all_subwords=all_subwords)
    head.max_length = 12  # some sentences are cut: their trailing words have no label
    data = random_tagged(16, seed=3, max_words=7)
    enc, labels = head.collate(data)
    assert labels.device.type == "cpu" and labels.dtype == torch.long
    split_words = truncated = 0
    for i, (words, tags) in enumerate(data):
        ids, want = reference_alignment(head.tokenizer, words, tags, all_subwords, 12)
        row = labels[i].tolist()
        assert row[: len(want)] == want and all(v == -100 for v in row[len(want):]), (words, tags)
        assert enc.word_ids[i][: len(ids)] == ids
        visible = max(w for w in ids if w is not None) + 1
        assert enc.truncated_words[i] == len(words) - visible
        truncated += enc.truncated_words[i]
        split_words += sum(ids.count(w) > 1 for w in range(visible))
    assert split_words > 20 and truncated > 0  # the alignment and the cut were really exercised
    if all_subwords:  # a B- word continues as I- (one entity), other tags are repeated
        assert any(TAGS[a].startswith("B-") and TAGS[b] == "I-" + TAGS[a][2:]
                   for row in labels.tolist() for a, b in zip(row, row[1:]) if a >= 0 and b >= 0)


def test_item_forms_and_tag_ids_give_the_same_batch():
    head = make_head("bert")
    words, tags = random_tagged(1, seed=4, min_words=4)[0]
    forms = [
        (words, tags),
        {"words": words, "tags": tags},
        {"tokens": words, "ner_tags": [TAGS.index(t) for t in tags]},
        {"words": " ".join(words), "labels": torch.tensor([TAGS.index(t) for t in tags])},
    ]
    batches = [head.collate([form]) for form in forms]
    for enc, labels in batches[1:]:
        assert torch.equal(enc["input_ids"], batches[0][0]["input_ids"]) and torch.equal(labels, batches[0][1])
    enc, labels = head.collate([words, " ".join(words)])  # untagged: prediction
    assert labels is None and torch.equal(enc["input_ids"][0], enc["input_ids"][1])


# --- export and loading ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_save_then_transformers_reload(family, tmp_path):
    head = make_head(family, labels=TAGS).eval()
    enc, _ = head.collate(random_tagged(4, seed=5))
    out = head.save_pretrained(tmp_path / "tagger")
    model, info = AutoModelForTokenClassification.from_pretrained(out, output_loading_info=True)
    assert type(model).__name__ == type(head).__name__
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(**enc).logits, head(**enc).logits, rtol=0, atol=0)
    assert json.loads((out / "config.json").read_text())["id2label"] == {str(i): t for i, t in enumerate(TAGS)}
    again = AutoHeadForTokenClassification.from_pretrained(out)  # strict: a full tagger checkpoint
    assert again.labels() == TAGS and again.max_length == head.max_length
    for (k, a), b in zip(head.model.state_dict().items(), again.model.state_dict().values()):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("family", FAMILIES)
def test_base_checkpoint_gets_fresh_classifier_and_damaged_one_is_refused(family, tiny_checkpoint, tmp_path):
    base = tiny_checkpoint(family)  # a bare encoder (BertModel...)
    head = AutoHeadForTokenClassification.from_pretrained(base, labels=TAGS)
    assert type(head) is HEAD_CLASSES[family] and head.model.classifier.out_features == len(TAGS)
    saved = head.save_pretrained(tmp_path / "full")
    with pytest.raises(CheckpointError, match="7 labels, not 3"):
        AutoHeadForTokenClassification.from_pretrained(saved, num_labels=3)
    damaged = shutil.copytree(saved, tmp_path / "damaged")
    weights = load_file(damaged / "model.safetensors")
    del weights["classifier.bias"]
    save_file(weights, damaged / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="only part of the classifier: classifier.bias missing"):
        AutoHeadForTokenClassification.from_pretrained(damaged)


@pytest.mark.parametrize("arch", ["ForSequenceClassification", "ForQuestionAnswering"])
@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_another_tasks_checkpoint_is_refused(family, arch, tiny_checkpoint, tmp_path):
    import transformers

    if arch == "ForSequenceClassification":
        path = tiny_checkpoint(family, with_classifier=True)  # its classifier.* keys would load silently
    else:
        path = tmp_path / "qa"
        name = heads.families.FAMILIES[family].transformers_name(arch)
        getattr(transformers, name)(tiny_config(family)).save_pretrained(path)
        tiny_tokenizer(family).save_pretrained(path)
    cls = heads.families.FAMILIES[family].transformers_name(arch)
    with pytest.raises(CheckpointError, match=f"is a {cls} checkpoint \\(config.architectures\\), not a token"):
        AutoHeadForTokenClassification.from_pretrained(path, labels=TAGS)


def test_masked_lm_checkpoint_is_a_base(tmp_path):
    from transformers import BertForMaskedLM

    BertForMaskedLM(tiny_config("bert")).save_pretrained(tmp_path)
    head = AutoHeadForTokenClassification.from_pretrained(tmp_path, labels=TAGS, tokenizer=tiny_tokenizer("bert"))
    assert head.labels() == TAGS


# --- prediction agrees with the pipeline -----------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_tag_equals_pipeline_on_the_export(family, tmp_path):
    head = make_head(family, seed=7, labels=TAGS)
    head.max_length = 40
    texts = [" ".join(words) for words, _ in random_tagged(8, seed=8, max_words=12)]
    texts += ["the movie, was GOOD!", "a", "zqxv good " * 12]  # punctuation, case, one word, cut at max_length
    out = head.save_pretrained(tmp_path / "tagger")
    pipe = pipeline("token-classification", model=str(out), device="cpu")
    assert head.model.training  # tag() leaves the mode as it found it
    for strategy in ("none", "simple", "first", "average", "max"):
        got = head.tag(texts, aggregation_strategy=strategy, batch_size=3)
        want = pipe(texts, aggregation_strategy=strategy)
        assert_same_entities(got, want)
    assert head.model.training
    assert sum(len(g) for g in head.tag(texts, "simple", ignore_labels=[])) > sum(map(len, want))


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_tag_equals_pipeline_with_a_word_level_tokenizer(family, tmp_path):
    torch.manual_seed(9)
    head = AutoHeadForTokenClassification.from_config(tiny_config(family, len(TAGS)), labels=TAGS,
                                                      tokenizer=tiny_tokenizer(family))
    texts = ["the movie was good", "it's okay, i think!", "zebra and the plot"]  # unknown word, punctuation
    pipe = pipeline("token-classification", model=str(head.save_pretrained(tmp_path / "t")), device="cpu")
    for strategy in ("none", "simple", "first"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Tokenizer does not support real words", from both
            assert_same_entities(head.tag(texts, strategy), pipe(texts, aggregation_strategy=strategy))


def assert_same_entities(got, want):
    assert len(got) == len(want)
    for g_row, w_row in zip(got, want):
        assert [sorted(e) for e in g_row] == [sorted(e) for e in w_row]
        for g, w in zip(g_row, w_row):
            assert {k: v for k, v in g.items() if k != "score"} == {k: v for k, v in w.items() if k != "score"}
            assert abs(g["score"] - float(w["score"])) < 1e-5


# --- fine-tuning -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_fine_tune_learns_a_toy_tagging_task(family):
    torch.manual_seed(0)
    head = AutoHeadForTokenClassification.from_config(subword_config(family), labels=TAGS,
                                                      tokenizer=subword_tokenizer(family))
    data = toy_tagging(64, seed=0)
    optimizer = torch.optim.AdamW(head.model.parameters(), lr=3e-3)
    draw = torch.Generator().manual_seed(0)
    for _ in range(40):
        batch = [data[i] for i in torch.randint(0, len(data), (16,), generator=draw).tolist()]
        head.compute_loss(*head.collate(batch)).backward()
        optimizer.step()
        optimizer.zero_grad()
    test = toy_tagging(32, seed=1)
    predicted = head.predict_words([words for words, _ in test])
    pairs = [(p, t) for row, (_, tags) in zip(predicted, test) for p, t in zip(row, tags, strict=True)]
    assert sum(p == t for p, t in pairs) / len(pairs) >= 0.95
    entities = [(p, t) for p, t in pairs if t != "O"]
    assert sum(p == t for p, t in entities) / len(entities) >= 0.9


# --- bad input -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("items,message", [
    ([(["the", "movie"], ["O"])], "item 0 has 2 words but 1 tags: give exactly one tag per word"),
    ([(["the", "movie"], ["O", "B-PER"])], "tag 'B-PER' of word 1 \\('movie'\\) in item 0 is not one of"),
    ([(["the", "movie"], [0, 7])], "tag id 7 of word 1 \\('movie'\\) in item 0 is out of range: valid ids are 0..6"),
    ([(["the", ""], ["O", "O"])], "word 1 of item 0 is '': an empty or whitespace word"),
    ([(["the"], ["O"]), ["the"]], "item at index 1 lacks tags but item 0 has them"),
    ([(["the"], "O")], "tags of item 0 are str"),
    ([{"text": "the movie"}], "has keys \\['text'\\] but no 'words' or 'tokens'"),
    ([(["a"], [True])], "tag True of word 0 in item 0 is bool"),
])
def test_bad_items_fail_with_one_clear_line(items, message):
    with pytest.raises(ValueError, match=message):
        make_head("bert").collate(items)


def test_bad_labels_and_arguments_fail_clearly():
    head = make_head("bert")
    enc, labels = head.collate(random_tagged(2, seed=6, min_words=3))
    with pytest.raises(ValueError, match=r"labels of shape \[2, 3\] do not match input_ids of shape"):
        head.compute_loss(enc, labels[:, :3])
    with pytest.raises(ValueError, match="labels have dtype torch.float32: token labels are integer"):
        head.compute_loss(enc, labels.float())
    bad = labels.clone()
    bad[1, 1] = 7
    with pytest.raises(ValueError, match="label 7 at row 1, token 1 is out of range: valid ids are 0..6"):
        head.compute_loss(enc, bad)
    with pytest.raises(ValueError, match="compute_loss needs labels"):
        head.compute_loss(enc, None)
    with pytest.raises(ValueError, match="aggregation_strategy='longest' is unknown"):
        head.tag(["the movie"], aggregation_strategy="longest")
    with pytest.raises(ValueError, match="takes a list of sentences, got a single str"):
        head.encode("the movie")
    with pytest.raises(ValueError, match="a token classifier needs at least 2 tags, got 1"):
        AutoHeadForTokenClassification.from_config(tiny_config("bert"), num_labels=1)
    with pytest.raises(ValueError, match="label_all_subwords='yes' is invalid"):
        head.label_all_subwords = "yes"
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        AutoHeadForTokenClassification.head_class("gpt2")
    with pytest.raises(TypeError, match="use a family class such as BertForTokenClassification"):
        TokenClassificationHead(head.model)
    short = make_head("bert")
    short.max_length = 6
    with pytest.raises(ValueError, match="sentence 0 has 2 word\\(s\\) beyond max_length=6"):
        short.predict_words([["the", "movie", "was", "good", "today", "yes"]], truncated=None)
    assert short.predict_words([["the", "movie", "was", "good", "today", "yes"]])[0][-2:] == ["O", "O"]


def test_setup_head_swaps_in_a_replica_and_trains():
    from flodl_hf import DdpConfig, Trainer

    head = make_head("bert", labels=TAGS)
    config = head.config()
    original = head.graph().module
    Trainer.setup_head_with(head, lambda dev: AutoHeadForTokenClassification.on_device(config, len(TAGS), dev),
                            lambda p: torch.optim.SGD(p, lr=0.1), DdpConfig(verbose=False))
    assert head.model is head.graph().module is not original and head.labels() == TAGS
    graph = head.graph()
    graph.set_data_loader(toy_tagging(16), batch_size=8, collate_fn=head.collate)
    before = [p.detach().clone() for p in head.model.parameters()]
    for enc, labels in graph.epoch(0):
        head.compute_loss(enc, labels).backward()
        graph.step()
    graph.close()
    assert graph.training_step == 2 and any(not torch.equal(a, b) for a, b in zip(before, head.model.parameters()))


def test_push_dir_has_a_token_classification_card(tmp_path):
    from huggingface_hub import ModelCard

    from flodl_hf.export.hub import plan_push
    from heads._hub import write_push_dir

    out = write_push_dir(make_head("roberta", labels=TAGS), tmp_path / "push", name="my-tagger")
    assert {"config.json", "model.safetensors", "README.md"} <= {op.path_in_repo for op in plan_push(out)}
    card = ModelCard.load(out / "README.md")
    assert card.data.pipeline_tag == "token-classification" and "token-classification" in card.data.tags
    assert 'pipeline("token-classification", model="my-tagger", aggregation_strategy="simple")' in card.text
    assert ", ".join(TAGS) in card.text


def test_byte_level_bpe_words_keep_their_leading_space(tmp_path):
    """RoBERTa's tokenizer marks a word start with a space: pre-split words need add_prefix_space=True, which
    from_pretrained sets (as run_ner.py does); a tokenizer without it is refused. tag() still equals the pipeline."""
    from transformers import RobertaModel

    plain = byte_level_tokenizer()
    config = tiny_config("roberta")
    config.vocab_size = len(plain)
    torch.manual_seed(0)
    RobertaModel(config).save_pretrained(tmp_path / "base")
    plain.save_pretrained(tmp_path / "base")
    head = AutoHeadForTokenClassification.from_pretrained(tmp_path / "base", labels=TAGS)
    words = ["the", "film", "was", "good!"]
    enc = head.encode([words])
    tokens = head.tokenizer.convert_ids_to_tokens(enc["input_ids"][0].tolist())
    assert [t for t in tokens if t.startswith("Ġ")] == ["Ġt", "Ġf", "Ġw", "Ġg"] and len(tokens) > len(words) + 4
    with pytest.raises(ValueError, match="has add_prefix_space=False, so pre-split words would lose the leading"):
        AutoHeadForTokenClassification.from_config(config, labels=TAGS, tokenizer=plain).encode([words])
    texts = ["the film was good!", "in the end, i think it's fine", "zebra"]
    pipe = pipeline("token-classification", model=str(head.save_pretrained(tmp_path / "tagger")), device="cpu")
    for strategy in ("none", "simple", "max"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            assert_same_entities(head.tag(texts, strategy, ignore_labels=[]),
                                 pipe(texts, aggregation_strategy=strategy, ignore_labels=[]))
