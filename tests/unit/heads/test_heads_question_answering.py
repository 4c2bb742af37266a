"""Extractive question-answering heads, for every family: loss equal to transformers', the refusal of positions
outside a window, character answer spans mapped to tokens over stride windows, export and transformers reload,
``answer`` equal to the question-answering pipeline's algorithm on the exported model, a short fine-tune, bad input.
"""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch
from transformers import AutoModelForQuestionAnswering, AutoTokenizer
from transformers.modeling_outputs import QuestionAnsweringModelOutput

from flodl_hf.graph import HasGraph
from heads import CheckpointError
from heads.question_answering import QA_HEAD_CLASSES, AutoHeadForQuestionAnswering, QuestionAnsweringHead
from qa_helpers import normalise, opinion_task, pipeline_answers, random_context, random_item
from tiny_models import FAMILIES, tiny_config, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
Auto = AutoHeadForQuestionAnswering


def fresh(family: str, max_length: int = 32, seed: int = 0) -> QuestionAnsweringHead:
    torch.manual_seed(seed)
    return Auto.from_config(tiny_config(family), tokenizer=tiny_tokenizer(family), max_length=max_length)


# --- declarations ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_family_declarations_match_the_transformers_layout(family):
    cls = QA_HEAD_CLASSES[family]
    head = cls.on_device(tiny_config(family), None, "cpu")
    model = head.model
    assert cls.model_class is type(model) and type(model).__name__ == cls.__name__
    assert cls.config_class is type(tiny_config(family)) and cls.model_type == family
    prefix = model.base_model_prefix + "."
    assert {k for k in model.state_dict() if not k.startswith(prefix)} == set(cls.head_keys.head)
    assert model.state_dict()[cls.head_keys.classifier].shape[0] == 2
    assert isinstance(head, HasGraph) and head.graph().module is model and not isinstance(head, torch.nn.Module)
    positions = 62 if family in ("roberta", "xlm-roberta") else 64  # RoBERTa positions start after the pad id
    assert cls.max_positions(tiny_config(family)) == positions == head.max_length  # 128 asked, capped
    assert head.labels() == [] and f"{cls.__name__}(max_length={positions}, doc_stride={positions // 2}," in repr(head)


# --- loss -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_loss_equals_transformers_on_random_positions(family):
    head = fresh(family).eval()
    rng = random.Random(7)
    items = [random_item(rng, rng.choice((4, 12, 40))) for _ in range(5)]
    enc, _ = head.collate(items)
    windows = enc["input_ids"].shape[0]
    assert windows > len(items)  # the long contexts give several windows
    lengths = enc["attention_mask"].sum(1).tolist()
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        starts = torch.tensor([int(torch.randint(0, n, (1,), generator=g)) for n in lengths])
        ends = torch.tensor([int(torch.randint(int(s), n, (1,), generator=g)) for s, n in zip(starts, lengths)])
        labels = torch.stack([starts, ends], 1)
        want = head.model(**enc, start_positions=starts, end_positions=ends)
        got = head(**enc, start_positions=starts, end_positions=ends)
        assert isinstance(got, QuestionAnsweringModelOutput)
        torch.testing.assert_close(head.compute_loss(enc, labels), want.loss, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(got.start_logits, want.start_logits)
        torch.testing.assert_close(got.end_logits, want.end_logits)
    plain = head(enc)
    assert plain.loss is None and plain.start_logits.shape == enc["input_ids"].shape


@pytest.mark.parametrize("labels,expect", [
    ([[0, 0], [3, 20]], "(3, 20) but its window holds"),  # past the end: transformers would ignore it
    ([[0, 0], [-1, 2]], "(-1, 2) but its window holds"),
    ([[0, 0], [5, 4]], "start 5 after end 4"),
    ([[0, 0, 0], [1, 1, 1]], "give [W, 2]"),
    ([[0.0, 0.0], [1.0, 1.0]], "integer token positions"),
    ([[0, 0]], "one row per window"),
])
def test_positions_outside_the_window_are_refused(labels, expect):
    head = fresh("bert")
    enc = head.encode(["good movie", "bad"], ["the movie was good", "the food was bad and the plot was poor"])
    length = enc["input_ids"].shape[1]
    assert length < 20
    with pytest.raises(ValueError) as info:
        head.compute_loss(enc, labels)
    assert expect in str(info.value)
    if "window holds" in expect:
        assert f"holds {length} tokens" in str(info.value) and "clamp" in str(info.value)


# --- windows and spans ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_char_spans_map_to_token_positions_over_stride_windows(family):
    head = fresh(family, max_length=24)
    head.doc_stride = 6
    tokenizer = head.tokenizer
    rng = random.Random(hash(family) % 1000)
    items = [random_item(rng, rng.randint(2, 60)) for _ in range(30)]
    enc, labels = head.collate(items)
    windows = head._windows([i["question"] for i in items], [i["context"] for i in items], None)
    assert enc["input_ids"].shape[0] == len(windows) == labels.shape[0] > len(items)
    labelled = [0] * len(items)
    for w in range(len(windows)):
        item = items[windows.sample[w]]
        text = item["answers"]["text"][0] if "answers" in item else item["answer_text"]
        start_char = item["answers"]["answer_start"][0] if "answers" in item else item["answer_start"]
        offsets, seq = windows.encodings[w].offsets, windows.encodings[w].sequence_ids
        context_tokens = [t for t, s in enumerate(seq) if s == 1]
        holds = offsets[context_tokens[0]][0] <= start_char and offsets[context_tokens[-1]][1] >= start_char + len(text)
        s, e = labels[w].tolist()
        if not holds:
            assert (s, e) == (windows.cls[w], windows.cls[w]) == (0, 0)
            continue
        labelled[windows.sample[w]] += 1
        assert offsets[s][0] == start_char and offsets[e][1] == start_char + len(text)
        want_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert enc["input_ids"][w, s : e + 1].tolist() == want_ids
    assert all(n >= 1 for n in labelled)  # the overlap (6 tokens) is longer than any answer (<= 3 words + 3 marks)


@pytest.mark.parametrize("family", FAMILIES)
def test_encode_puts_the_whole_question_first_in_every_window(family):
    head = fresh(family, max_length=20)
    rng = random.Random(2)
    questions = ["what was good", "the movie"]
    contexts = [random_context(rng, 50), random_context(rng, 3)]
    enc = head.encode(questions, contexts)
    assert set(enc) == set(head.input_names)
    rows = enc["input_ids"].tolist()
    assert len(rows) > 2 and all(len(row) <= 20 for row in rows)
    tokenizer = head.tokenizer
    asked = [tokenizer(q, add_special_tokens=False)["input_ids"] for q in questions]
    for row, mask in zip(rows, enc["attention_mask"].tolist()):
        real = row[: sum(mask)]
        found = [ids for ids in asked if real[1 : 1 + len(ids)] == ids]
        assert len(found) == 1, real  # one whole question right after CLS, never cut
        assert real[0] == tokenizer.cls_token_id and real[1 + len(found[0])] == tokenizer.sep_token_id
    if "token_type_ids" in enc:  # the context is segment 1
        assert enc["token_type_ids"][0, -2].item() == 1 and enc["token_type_ids"][0, 1].item() == 0


def test_unanswerable_items_label_every_window_with_cls():
    head = fresh("roberta", max_length=16)
    context = random_context(random.Random(0), 30)
    item = {"question": "what", "context": context, "answers": {"text": [], "answer_start": []}}
    enc, labels = head.collate([item])
    assert labels.shape[0] == enc["input_ids"].shape[0] > 2
    assert labels.eq(0).all()


# --- save, reload ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_base_checkpoint_then_save_reloads_strictly_in_transformers(family, tiny_checkpoint, tmp_path):
    base = tiny_checkpoint(family)
    head = Auto.from_pretrained(base)
    assert type(head) is QA_HEAD_CLASSES[family] and head.labels() == [] and head.num_labels == 2
    assert head.model.qa_outputs.weight.shape[0] == 2
    with torch.no_grad():
        head.model.qa_outputs.weight.normal_()  # not the init values: the reload must carry them
    out = head.save_pretrained(tmp_path / "qa")
    model, info = AutoModelForQuestionAnswering.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    model.eval()
    head.eval()
    enc = head.encode(["good movie"], ["the movie was good and the plot was bad"])
    want = model(**enc)
    got = head(**enc)
    assert torch.equal(got.start_logits, want.start_logits) and torch.equal(got.end_logits, want.end_logits)
    again = Auto.from_pretrained(out, doc_stride=5)  # a full QA checkpoint: loaded strictly, its max_length kept
    assert again.max_length == head.max_length and again.stride() == 5
    for (name, p), q in zip(again.model.state_dict().items(), head.model.state_dict().values()):
        assert torch.equal(p, q), name
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [type(head).__name__] and len(config.get("id2label", {"0": 0, "1": 1})) == 2


# --- answer vs the pipeline's algorithm -------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_answer_equals_the_pipeline_on_the_exported_model(family, tmp_path):
    head = fresh(family, max_length=40)
    with torch.no_grad():
        head.model.qa_outputs.weight.mul_(30)  # sharp, distinct span scores
    out = head.save_pretrained(tmp_path / "qa")
    model = AutoModelForQuestionAnswering.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    rng = random.Random(11)
    cases = [(6, 1, None, False, 15), (30, 3, None, False, 4), (150, 1, None, False, 15), (150, 5, 7, True, 15),
             (120, 2, 30, False, 1)]  # 150 words: 4x max_length, 6+ windows
    for n_words, top_k, stride, impossible, max_answer_len in cases:
        question = " ".join(rng.choice(("good", "the movie", "what", "was it")) for _ in range(rng.randint(1, 3)))
        context = random_context(rng, n_words)
        got = normalise(head.answer(question, context, top_k=top_k, doc_stride=stride,
                                    handle_impossible_answer=impossible, max_answer_len=max_answer_len))
        want = pipeline_answers(model, tokenizer, question, context, top_k=top_k, doc_stride=stride,
                                handle_impossible_answer=impossible, max_answer_len=max_answer_len)
        assert len(got) == len(want) == top_k
        for g, w in zip(got, want):
            assert (g["answer"], g["start"], g["end"]) == (w["answer"], w["start"], w["end"]), (n_words, got, want)
            assert g["score"] == pytest.approx(w["score"], abs=1e-5)
            assert context[g["start"]:g["end"]] == g["answer"]
    # batched: lists in, one result per pair, equal to the single calls
    questions, contexts = ["good", "what was it"], [random_context(rng, 80), random_context(rng, 5)]
    batched = head.answer(questions, contexts, top_k=2, batch_size=3)
    for got, (q, c) in zip(batched, zip(questions, contexts)):
        alone = head.answer(q, c, top_k=2)  # padded with other windows or not: same spans, scores to float noise
        spans = [(a["answer"], a["start"], a["end"]) for a in got]
        assert spans == [(a["answer"], a["start"], a["end"]) for a in alone]
        assert [a["score"] for a in got] == pytest.approx([a["score"] for a in alone], abs=1e-6)


# --- fine-tuning ------------------------------------------------------------------------------------------------
def exact_match(head, items) -> float:
    answers = head.answer([i["question"] for i in items], [i["context"] for i in items])
    return sum(a["answer"] == i["answer_text"] for a, i in zip(answers, items)) / len(items)


@pytest.mark.parametrize("family", FAMILIES)
def test_short_fine_tune_learns_the_opinion_task(family):
    head = fresh(family, max_length=24)
    train, test = opinion_task(256, seed=0), opinion_task(64, seed=1)
    baseline = exact_match(head, test)  # the untrained head; a random context word would be right ~1 in 10
    optimizer = torch.optim.AdamW(head.graph().module.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    draw = random.Random(0)
    for _ in range(STEPS):
        loss = head.compute_loss(*head.collate(draw.sample(train, 16)))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.graph().module.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
    score = exact_match(head, test)
    assert baseline < 0.25 and score >= 0.9, (baseline, score)


STEPS = 40


# --- bad input --------------------------------------------------------------------------------------------------
def test_an_answer_not_in_its_context_is_refused():
    head = fresh("bert")
    good = {"question": "what", "context": "the movie was good", "answer_text": "good", "answer_start": 14}
    bad = dict(good, answer_start=4)
    with pytest.raises(ValueError, match=r"answer at row 1 is not in its context: context\[4:8\] is 'movi'"
                                         r".*occurs at offset 14"):
        head.collate([good, bad])
    squad = {"question": "what", "context": "the movie", "answers": {"text": ["plot"], "answer_start": [0]}}
    with pytest.raises(ValueError, match="row 0 is not in its context.*does not occur"):
        head.collate([squad])


@pytest.mark.parametrize("item,expect", [
    ({"question": "", "context": "the movie", "answer_text": "movie", "answer_start": 4}, "question at row 0 is empty"),
    ({"question": "what", "context": "  ", "answer_text": " ", "answer_start": 0}, "context at row 0 is empty"),
    ({"question": "what", "context": "the movie", "answer_text": "", "answer_start": 0}, "non-empty text"),
    ({"question": "what", "context": "the movie", "answer_text": "movie", "answer_start": "4"}, "character offset"),
    ({"question": "what", "context": "the movie"}, "no answer"),
    (("what", "the movie"), "give SQuAD-style dicts"),
])
def test_malformed_items_are_refused(item, expect):
    with pytest.raises(ValueError, match=expect):
        fresh("bert").collate([item])


def test_empty_or_mismatched_answer_inputs_are_refused():
    head = fresh("bert")
    with pytest.raises(ValueError, match="question at row 0 is empty"):
        head.answer("", "the movie")
    with pytest.raises(ValueError, match="context at row 1 is empty"):
        head.answer(["what", "what"], ["the movie", ""])
    with pytest.raises(ValueError, match="2 questions but 1 contexts"):
        head.answer(["what", "why"], ["the movie"])
    with pytest.raises(ValueError, match="top_k=0 is invalid"):
        head.answer("what", "the movie", top_k=0)


def test_a_question_too_long_or_a_stride_too_large_is_refused():
    head = fresh("bert", max_length=12)
    with pytest.raises(ValueError, match="question at row 0 has 10 tokens.*no context token fits"):
        head.answer("the movie was good the movie was good the movie", "the plot")
    long_context = random_context(random.Random(0), 30)
    with pytest.raises(ValueError, match=r"doc_stride=6 is not below the 6 context tokens.*use doc_stride < 6"):
        head.answer("what was it", long_context, doc_stride=6)
    with pytest.raises(ValueError, match=r"doc_stride=12 is invalid: use an integer in \[0, 12\)"):
        head.answer("what", long_context, doc_stride=12)
    with pytest.raises(ValueError, match="doc_stride=-1 is invalid"):
        head.doc_stride = -1


def test_labels_and_other_label_counts_are_refused(tiny_checkpoint):
    with pytest.raises(ValueError, match="no label names"):
        Auto.from_config(tiny_config("bert"), labels=["a", "b"])
    with pytest.raises(ValueError, match="num_labels=3 is invalid for question answering"):
        Auto.on_device(tiny_config("bert"), 3, "cpu")
    with pytest.raises(ValueError, match="num_labels=3 is invalid"):
        Auto.from_pretrained(tiny_checkpoint("roberta"), num_labels=3)
    assert Auto.on_device(tiny_config("bert", num_labels=5), None, "cpu").model.qa_outputs.out_features == 2
    assert Auto.on_device(tiny_config("bert"), 2, "cpu").num_labels == 2


def test_a_checkpoint_fine_tuned_for_another_task_is_refused(tiny_checkpoint, tmp_path):
    classifier = tiny_checkpoint("bert", with_classifier=True, num_labels=3)
    with pytest.raises(CheckpointError, match="BertForSequenceClassification checkpoint.*another task.*AutoModel"):
        Auto.from_pretrained(classifier)
    # the fix the message names: save the encoder as a base checkpoint, then it loads with a fresh QA layer
    from transformers import AutoModel

    base = tmp_path / "base"
    AutoModel.from_pretrained(classifier).save_pretrained(base)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(classifier / name, base / name)
    assert Auto.from_pretrained(base).num_labels == 2


def test_a_qa_checkpoint_missing_its_qa_layer_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    out = fresh("albert").save_pretrained(tmp_path / "qa")
    weights = load_file(out / "model.safetensors")
    del weights["qa_outputs.bias"]
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="only part of the classifier: qa_outputs.bias missing"):
        Auto.from_pretrained(out)
    del weights["qa_outputs.weight"]  # no QA layer at all, though config.json says AlbertForQuestionAnswering
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="names AlbertForQuestionAnswering but its weights hold no qa_outputs"):
        Auto.from_pretrained(out)


def test_unsupported_model_type_and_the_shared_base_are_refused():
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        Auto.head_class("gpt2")
    with pytest.raises(TypeError, match="shared base"):
        QuestionAnsweringHead(torch.nn.Linear(1, 1))
    with pytest.raises(TypeError, match="not instantiable"):
        Auto()


def test_push_writes_a_question_answering_card_and_refuses_offline(tmp_path, monkeypatch):
    from huggingface_hub import ModelCard

    from heads._qa_card import write_qa_push_dir

    head = fresh("distilbert")
    out = write_qa_push_dir(head, tmp_path / "push", name="my-qa")
    card = ModelCard.load(out / "README.md")
    assert card.data.pipeline_tag == "question-answering" and "flodl-hf" in card.data.tags
    assert "windows of 32 tokens overlapping by 16" in card.text
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE is set"):
        head.push_to_hub("someone/my-qa")
    with pytest.raises(ValueError, match="card= takes a classifier's CardInfo"):
        head.push_to_hub("someone/my-qa", card=object())
