"""The third round of hostile input, run by ``tests/e2e/cli/test_hostile_inputs.py`` beside
``tests/hostile_cases.py``: the task CLIs, ``--resume``, tampered checkpoints, things that block, and the rules
behind the round's failures (docs/bad-input.md, "Five rules").

It exists apart from the first table so that each stays a readable catalogue under 500 lines. Rows are the same
``Case`` (argv with ``{base}``, ``{trained}``, ``{data}``; needles of the one error line; files the command may
create). Rows marked ``# kept back`` are variants that were not looked at while fixing: they check that the rule,
not the example, was fixed. Resume rows copy a checkpoint written once per kind (``_checkpoint``) into their own
directory, so the inputs it recorded are at other paths: the contents, not the names, decide.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from hostile_cases import Case, jsonl, many, model_copy, text
from task_cli_helpers import qa_rows, texts, token_rows, write_conll, write_jsonl
from tiny_models import toy_task

__all__ = ["CASES3"]

CASES3: list[Case] = []


def case(id: str, argv, needles=(), code: int = 2, setup=None, owned=(), process: str = "") -> None:
    CASES3.append(Case(id, tuple(argv), tuple(needles), code, setup, tuple(owned), process))


# --- resume: a checkpoint written once per kind, copied into each case -------------------------------------------

SMALL = ("--batch-size", "8", "--max-length", "16", "--eval-rows", "8", "--train-rows", "16", "--no-progress")
_KINDS = {  # kind -> (data file name, writer, extra train options)
    "text": ("d.csv", lambda p: p.write_text("text,label\n" + "".join(
        f"{t},{'pos' if y else 'neg'}\n" for t, y in toy_task(40))), ()),
    "eval": ("d.csv", lambda p: (p.write_text("text,label\n" + "".join(
        f"{t},{'pos' if y else 'neg'}\n" for t, y in toy_task(40))), (p.parent / "e.csv").write_text(
        "text,label\n" + "".join(f"{t},{'pos' if y else 'neg'}\n" for t, y in toy_task(12, seed=5)))),
             ("--eval-data", "e.csv")),
    "token": ("d.conll", lambda p: write_conll(p, token_rows(30)), ("--task", "token-classification")),
    "qa": ("d.jsonl", lambda p: write_jsonl(p, qa_rows(30)), ("--task", "question-answering")),
    "mask": ("d.txt", lambda p: p.write_text("\n".join(texts(30)) + "\n"), ("--task", "fill-mask")),
}
_BUILT: dict[str, Path] = {}


def _checkpoint(kind: str) -> Path:
    """A directory holding ``m`` (the base model), the data and ``ck``, a finished run's kept checkpoint."""
    if kind not in _BUILT:
        from flodl_hf import cli

        root = Path(tempfile.mkdtemp(prefix=f"hostile-{kind}-"))
        atexit.register(shutil.rmtree, root, True)
        shutil.copytree(os.environ["HOSTILE_BASE"], root / "m")
        name, writer, extra = _KINDS[kind]
        writer(root / name)
        cwd = os.getcwd()
        os.chdir(root)
        try:
            code = cli.main(["train", "--model", "m", "--data", name, "--output-dir", "first", "--checkpoint-dir",
                             "ck", "--checkpoint-every", "1", "--keep-checkpoint", *SMALL, *extra])
        finally:
            os.chdir(cwd)
        if code != 0:
            raise RuntimeError(f"the {kind} checkpoint of the hostile table did not train (exit {code})")
        _BUILT[kind] = root
    return _BUILT[kind]


def resumable(kind: str, *changes: Callable[[Path], None]) -> Callable[[Path], None]:
    """Copy the ``kind`` checkpoint, its model (``m``) and data into the case directory, then apply ``changes``."""
    def plant(root: Path) -> None:
        source = _checkpoint(kind)
        for entry in source.iterdir():
            if entry.name != "first":
                (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, root / entry.name)
        for change in changes:
            change(root)
    return plant


def edit(path: str, old: str, new: str, count: int = 1) -> Callable[[Path], None]:
    """Replace ``old`` by ``new`` in a file (the same size when they are)."""
    def change(root: Path) -> None:
        content = (root / path).read_text(encoding="utf-8")
        if old not in content:
            raise RuntimeError(f"{old!r} is not in {path}")
        (root / path).write_text(content.replace(old, new, count), encoding="utf-8")
    return change


def flip_byte(path: str, at: int = -3) -> Callable[[Path], None]:
    """One byte of a file changed (same size): a tensor value when ``at`` points into the data."""
    def change(root: Path) -> None:
        content = bytearray((root / path).read_bytes())
        content[at] ^= 0x01
        (root / path).write_bytes(bytes(content))
    return change


def resume_argv(kind: str, *extra: str, data: str = "") -> list[str]:
    name, _, options = _KINDS[kind]
    return ["train", "--model", "m", "--data", data or name, "--output-dir", "out", "--resume", "ck", *SMALL,
            *options, *extra]


CHANGED = "changed since the checkpoint was written"
case("resume: data edited in place, same size and rows", resume_argv("text"), (f"--data d.csv {CHANGED}",
                                                                               "--resume"),
     setup=resumable("text", edit("d.csv", "pos", "neg")))
case("resume: data text edited, same size (kept back)", resume_argv("text"), ("--data d.csv", CHANGED),
     setup=resumable("text", edit("d.csv", "the", "thx")))
case("resume: model weights changed, same size (kept back)", resume_argv("text"),
     ("--model m", CHANGED, "model.safetensors differs"), setup=resumable("text", flip_byte("m/model.safetensors")))
case("resume: model config changed (kept back)", resume_argv("text"), ("--model m", "config.json differs"),
     setup=resumable("text", edit("m/config.json", "gelu", "relu")))
case("resume: tokenizer changed (kept back)", resume_argv("text"), ("--model m", "tokenizer.json differs"),
     setup=resumable("text", edit("m/tokenizer.json", '"good"', '"gold"')))
case("resume: model replaced by another model's files (kept back)", resume_argv("text"), ("--model m", CHANGED),
     setup=resumable("text", lambda root: (shutil.rmtree(root / "m"), shutil.copytree(
         os.environ["HOSTILE_TRAINED"], root / "m"))))
case("resume: --eval-data edited in place (kept back)", resume_argv("eval"), ("--eval-data e.csv", CHANGED),
     setup=resumable("eval", edit("e.csv", "pos", "neg")))
case("resume: token data, one tag changed (kept back)", resume_argv("token"), ("--data d.conll", CHANGED),
     setup=resumable("token", edit("d.conll", "B-POS", "B-NEG")))
case("resume: QA data, a question changed (kept back)", resume_argv("qa"), ("--data d.jsonl", CHANGED),
     setup=resumable("qa", edit("d.jsonl", '"question": "yes"', '"question": "yep"')))
case("resume: fill-mask texts changed (kept back)", resume_argv("mask"), ("--data d.txt", CHANGED),
     setup=resumable("mask", edit("d.txt", "good", "gold")))
case("resume: --metric-for-best changed", resume_argv("text", "--metric-for-best", "macro_f1"),
     ("it was written with --metric-for-best default but this run has macro_f1",), setup=resumable("text"))
case("resume: --encoding changed (kept back)", resume_argv("text", "--encoding", "latin-1"),
     ("--encoding default but this run has latin-1",), setup=resumable("text"))
case("resume: --eval-every changed (kept back)", resume_argv("text", "--eval-every", "1"),
     ("--eval-every default but this run has 1",), setup=resumable("text"))
case("resume: --max-length changed", resume_argv("text", "--max-length", "12"),
     ("written with --max-length 16 but this run has 12",), setup=resumable("text"))
case("resume: the same data moved to another name resumes", resume_argv("text", data="moved.csv"), (), code=0,
     setup=resumable("text", lambda root: (root / "d.csv").rename(root / "moved.csv")), owned=("out", "ck"))
case("resume: a new learning rate is accepted", resume_argv("text", "--lr", "1e-4"), (), code=0,
     setup=resumable("text"), owned=("out", "ck"))

# --- tampered checkpoints -------------------------------------------------------------------------------------

def _tensors(root: Path) -> Path:
    return next(p for p in (root / "ck").iterdir() if p.name.endswith(".safetensors"))


def _truncate(root: Path) -> None:
    path = _tensors(root)
    path.write_bytes(path.read_bytes()[:100])


def _flip_tensor_byte(root: Path) -> None:
    path = _tensors(root)
    content = bytearray(path.read_bytes())
    content[-5] ^= 0xFF
    path.write_bytes(bytes(content))


case("checkpoint: tensors file truncated", resume_argv("text"), ("truncated", "ck"),
     setup=resumable("text", _truncate))
case("checkpoint: one tensor byte changed (kept back)", resume_argv("text"), ("SHA-256",),
     setup=resumable("text", _flip_tensor_byte))
def _edit_record(root: Path) -> None:
    """The data's SHA-256 in the manifest edited to match changed data (the manifest's own checksum then fails)."""
    path = root / "ck" / "checkpoint.json"
    content = path.read_text()
    at = content.index('"<file>": "') + len('"<file>": "')
    path.write_text(content[:at] + ("0" if content[at] != "0" else "1") + content[at + 1:])


case("checkpoint: the plan's data record edited (kept back)", resume_argv("text"), ("corrupted",),
     setup=resumable("text", _edit_record))
case("checkpoint: tensors file deleted (kept back)", resume_argv("text"), ("ck",),
     setup=resumable("text", lambda root: _tensors(root).unlink()))
case("checkpoint: manifest is a directory (kept back)", resume_argv("text"), ("checkpoint.json",),
     setup=resumable("text", lambda root: ((root / "ck" / "checkpoint.json").unlink(),
                                           (root / "ck" / "checkpoint.json").mkdir())))

# --- rule 2: task data validated in full, on every path, before training ----------------------------------------

TOK = ("train", "--task", "token-classification", "--model", "{base}", "--data", "t.jsonl", "--output-dir", "out",
       *SMALL)


def tagged(path: str, bad: dict, n: int = 30) -> Callable[[Path], None]:
    """Token rows with the tag of row ``r`` (0-based) replaced as ``bad[r]`` says (its first non-O tag)."""
    rows = token_rows(n)
    for r, tag in bad.items():
        tags = rows[r]["tags"]
        at = next(i for i, t in enumerate(tags) if t != "O")
        rows[r] = dict(rows[r], tags=tags[:at] + [tag] + tags[at + 1:])
    return jsonl(path, rows)


for bad, fix in (("B_POS", "write it as B-POS"), ("X-POS", "O, B-TYPE or I-TYPE"), ("b-pos", "write it as B-POS")):
    case(f"token tags: one {bad} among IOB2 tags", TOK, ("t.jsonl", "row 8", repr(bad), "not IOB2", fix),
         setup=tagged("t.jsonl", {7: bad}))
for bad, fix in (("S-POS", "convert IOBES"), ("o", "write it as O"), ("B-", "O, B-TYPE or I-TYPE"),
                 ("I_NEG", "write it as I-NEG"), ("B-POS ", "write it as B-POS")):
    case(f"token tags: {bad!r} among IOB2 tags (kept back)", TOK, ("row 5", "not IOB2", fix),
         setup=tagged("t.jsonl", {4: bad}))
case("token tags: underscores throughout (kept back)", TOK, ("row 1", "'B_", "not IOB2"),
     setup=jsonl("t.jsonl", [dict(r, tags=[t.replace("-", "_") for t in r["tags"]]) for r in token_rows(30)]))
case("token tags: a CoNLL file with one B_POS (kept back)", [*TOK[:6], "t.conll", *TOK[7:]],
     ("t.conll", "'B_POS'", "not IOB2"), setup=lambda root: write_conll(root / "t.conll", [
         dict(r, tags=["B_POS" if t == "B-POS" and i == 9 else t for t in r["tags"]])
         for i, r in enumerate(token_rows(30))]))
case("token tags: --eval-data with one b-neg (kept back)", [*TOK, "--eval-data", "e.jsonl"],
     ("e.jsonl", "'b-neg'", "not IOB2"),
     setup=many(jsonl("t.jsonl", token_rows(30)), tagged("e.jsonl", {1: "b-neg"}, n=8)))
case("token tags: --labels spelling one tag B_NEG (kept back)", [*TOK, "--labels", "O,B-POS,B_NEG"],
     ("--labels names the tag 'B_NEG'", "B-NEG"), setup=jsonl("t.jsonl", token_rows(30)))
case("token tags: part-of-speech tags (not IOB) are not checked by the IOB rule, --eval-every f1",
     [*TOK, "--eval-every", "1"], ("are not IOB2", "--metric-for-best accuracy"),
     setup=jsonl("t.jsonl", [dict(r, tags=["ADJ" if t != "O" else "NN" for t in r["tags"]]) for r in token_rows(30)]))
case("token data: a single tag O (no --problem-type suggested)", TOK, ("a single tag ['O']", "at least 2 tags"),
     setup=jsonl("t.jsonl", [dict(r, tags=["O"] * len(r["tags"])) for r in token_rows(30)]))
case("token data: --labels O alone (kept back)", [*TOK, "--labels", "O"], ("--labels names a single tag",),
     setup=jsonl("t.jsonl", [dict(r, tags=["O"] * len(r["tags"])) for r in token_rows(30)]))
case("token data: a word that is a number (kept back)", TOK, ("row 3", "non-text word 7"),
     setup=jsonl("t.jsonl", token_rows(2) + [{"words": ["a", 7], "tags": ["O", "O"]}] + token_rows(30)))

QA = ("train", "--task", "question-answering", "--model", "{base}", "--data", "q.jsonl", "--output-dir", "out",
      *SMALL)
LONG_Q = " ".join(["good"] * 6)  # 6 tokens: a 16-token window keeps 7 context tokens, below the 8-token overlap
case("QA: a question too long for --max-length names --max-length, not doc_stride", QA,
     ("question id '3'", "raise --max-length to at least", "shorten the question"),
     setup=jsonl("q.jsonl", [dict(r, question=LONG_Q) if r["id"] == "3" else r for r in qa_rows(30)]))
case("QA: a question that leaves no context token (kept back)", QA, ("no context token fits", "--max-length"),
     setup=jsonl("q.jsonl", [dict(r, question=" ".join(["bad"] * 20)) if r["id"] == "5" else r for r in qa_rows(30)]))
case("QA: --eval-data with a too long question (kept back)", [*QA, "--eval-data", "e.jsonl"],
     ("e.jsonl", "raise --max-length"),
     setup=many(jsonl("q.jsonl", qa_rows(30)), jsonl("e.jsonl", [dict(r, question=LONG_Q) for r in qa_rows(4)])))
case("QA: answer_start given as a string (kept back)", QA, ("row 2", "answer_start '", "character offset"),
     setup=jsonl("q.jsonl", qa_rows(1) + [dict(qa_rows(2)[1], answers={"text": ["good"], "answer_start": ["3"]})]
                 + qa_rows(30)[2:]))
case("QA: an answer beyond its context (kept back)", QA, ("row 30", "is not in its context"),
     setup=jsonl("q.jsonl", qa_rows(29) + [dict(qa_rows(30)[29], answers={"text": ["good"],
                                                                              "answer_start": [900]})]))
case("QA: a row without context (kept back)", QA, ("row 4", "context is missing"),
     setup=jsonl("q.jsonl", [{k: v for k, v in r.items() if k != "context" or r["id"] != "3"} for r in qa_rows(30)]))
MASK = ("train", "--task", "fill-mask", "--model", "{base}", "--data", "x.jsonl", "--output-dir", "out", *SMALL)
case("fill-mask: a number among the texts (kept back)", MASK, ("row 3", "int", "--text-column"),
     setup=jsonl("x.jsonl", [{"text": t} for t in texts(2)] + [{"text": 5}] + [{"text": t} for t in texts(30)]))
case("fill-mask: no text at all", [*MASK[:6], "x.txt", *MASK[7:]], ("holds no text",), setup=text("x.txt", "\n \n"))

# --- rule 3: a model without its task layer is refused by every command ---------------------------------------

_SUFFIXES = {"tok": "ForTokenClassification", "qa": "ForQuestionAnswering", "qa3": "ForQuestionAnswering",
             "mlm": "ForMaskedLM",
             "cls": "ForSequenceClassification"}
_LAYERS = {"tok": "classifier.", "qa": "qa_outputs.", "mlm": "cls.", "cls": "classifier."}
_MODELS: dict[str, Path] = {}


def _task_model(kind: str) -> Path:
    """A tiny transformers ``Bert<suffix>`` checkpoint with its tokenizer, written once (tags O, B-NEG, B-POS)."""
    if kind not in _MODELS:
        from task_cli_helpers import head_checkpoint

        root = Path(tempfile.mkdtemp(prefix=f"hostile-{kind}-"))
        atexit.register(shutil.rmtree, root, True)
        head_checkpoint(root / "m", _SUFFIXES[kind], num_labels=2 if kind == "qa" else 3)
        config = json.loads((root / "m" / "config.json").read_text())
        if kind == "tok":
            config["id2label"] = {"0": "O", "1": "B-NEG", "2": "B-POS"}
            config["label2id"] = {"O": 0, "B-NEG": 1, "B-POS": 2}
        (root / "m" / "config.json").write_text(json.dumps(config))
        _MODELS[kind] = root / "m"
    return _MODELS[kind]


def task_model(kind: str, path: str = "tm", layer: bool = True, **config) -> Callable[[Path], None]:
    """Copy the ``kind`` task model to ``path``, without its task layer unless ``layer``; ``config`` edits."""
    def plant(root: Path) -> None:
        from safetensors.torch import load_file, save_file

        shutil.copytree(_task_model(kind), root / path)  
        if not layer:
            weights = root / path / "model.safetensors"
            tensors = load_file(str(weights))
            save_file({k: v for k, v in tensors.items() if not k.startswith(_LAYERS[kind])}, str(weights),
                      metadata={"format": "pt"})
        if config:
            target = root / path / "config.json"
            target.write_text(json.dumps(dict(json.loads(target.read_text()), **config)))
    return plant


LAYER = "has no trained"
case("predict: a token model without its layer", ["predict", "--model", "tm", "good movie"],
     (LAYER, "token-classification layer", "flodl-hf train --task token-classification"),
     setup=task_model("tok", layer=False))
case("predict: a fill-mask model without its layer (kept back)", ["predict", "--model", "tm", "a [MASK] film"],
     (LAYER, "fill-mask layer"), setup=task_model("mlm", layer=False))
case("predict: a QA model without its layer (kept back)", ["predict", "--model", "tm", "--question", "yes", "good"],
     (LAYER, "question-answering layer"), setup=task_model("qa", layer=False))
case("predict --task fill-mask on a base model (kept back)", ["predict", "--task", "fill-mask", "--model", "{base}",
                                                             "a [MASK] film"], (LAYER, "fill-mask layer"))
case("predict --task token-classification on a base model (kept back)",
     ["predict", "--task", "token-classification", "--model", "{base}", "good"], (LAYER,))
case("eval: a token model without its layer (kept back)", ["eval", "--model", "tm", "--data", "t.jsonl"],
     (LAYER,), setup=many(task_model("tok", layer=False), jsonl("t.jsonl", token_rows(8))))
case("eval: a QA model without its layer (kept back)", ["eval", "--model", "tm", "--data", "q.jsonl"],
     (LAYER,), setup=many(task_model("qa", layer=False), jsonl("q.jsonl", qa_rows(4))))
case("eval --task fill-mask on a base model (kept back)", ["eval", "--task", "fill-mask", "--model", "{base}",
                                                          "--data", "x.txt"], (LAYER,),
     setup=text("x.txt", "\n".join(texts(8))))
for kind in ("tok", "qa", "mlm"):
    case(f"export: a {kind} model without its layer (kept back)", ["export", "--model", "tm", "--output", "o"],
         (LAYER, "--model"), setup=task_model(kind, layer=False))
    case(f"verify: a {kind} model without its layer (kept back)", ["verify", "tm"], (LAYER,),
         setup=task_model(kind, layer=False))
case("eval: token data spelling a tag b-pos against the model's tags (kept back)",
     ["eval", "--model", "tm", "--data", "t.jsonl"], ("'b-pos'", "not IOB2"),
     setup=many(task_model("tok"), tagged("t.jsonl", {2: "b-pos"}, n=8)))
case("eval: token data with a tag the model lacks names no --labels", ["eval", "--model", "tm", "--data", "t.jsonl"],
     ("B-MISC", "not among the model's tags", "fix the data"),
     setup=many(task_model("tok"), tagged("t.jsonl", {2: "B-MISC"}, n=8)))
case("eval: QA question too long for the model's windows (kept back)", ["eval", "--model", "tm", "--data", "q.jsonl"],
     ("shorten the question",), setup=many(task_model("qa"), jsonl("q.jsonl", [dict(r, question=" ".join(
         ["good"] * 130)) for r in qa_rows(4)])))
case("predict: QA --question too long for the windows (kept back)",
     ["predict", "--model", "tm", "--question", " ".join(["good"] * 130), "good and bad"],
     ("give a shorter --question",), setup=task_model("qa"))
case("train: from a trained token model with other tags names --labels, not num_labels",
     ["train", "--task", "token-classification", "--model", "tm", "--data", "t.jsonl", "--output-dir", "out",
      *SMALL], ("the model's trained tags (O,B-NEG,B-POS) lack B-X", "--labels"),
     setup=many(task_model("tok"), jsonl("t.jsonl", [dict(r, tags=["B-X" if t == "B-POS" else t for t in r["tags"]])
                                                      for r in token_rows(30)])))

case("predict: a QA layer of 3 outputs names no Python argument (rule 4)", ["predict", "--model", "tm", "--question",
                                                                           "yes", "good and bad"],
     ("tm is damaged", "3 labels"), setup=lambda root: shutil.copytree(_task_model("qa3"), root / "tm"))

# --- rule 5: nothing blocks, nothing fails late ----------------------------------------------------------------

def fifo(path: str) -> Callable[[Path], None]:
    def plant(root: Path) -> None:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(root / path)
    return plant


def truncated_weights(path: str, keep: int = 5000) -> Callable[[Path], None]:
    def plant(root: Path) -> None:
        model_copy(path)(root)
        weights = root / path / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:keep])
    return plant


#: Why the FIFO rows run in a subprocess of their own.
BLOCKS = "a planted FIFO blocks whoever opens it: the row needs a timeout"
case("a FIFO as --data", ["train", "--model", "{base}", "--data", "p.csv", "--output-dir", "out"],
     ("--data", "not a regular file"), setup=fifo("p.csv"), process=BLOCKS)
case("a FIFO as eval --data (kept back)", ["eval", "--model", "{trained}", "--data", "p.csv"],
     ("not a regular file",), setup=fifo("p.csv"), process=BLOCKS)
TRAIN_ARGS = ("train", "--model", "{base}", "--data", "{data}", "--output-dir", "out")
case("a FIFO as --eval-data (kept back)", [*TRAIN_ARGS, "--eval-data", "p.csv"],
     ("--eval-data", "not a regular file"), setup=fifo("p.csv"), process=BLOCKS)
case("a FIFO as the model's config.json (kept back)", ["predict", "--model", "m", "good"], ("not a regular file",),
     setup=lambda root: (model_copy("m", drop=("config.json",))(root), fifo("m/config.json")(root)), process=BLOCKS)
case("a FIFO as the model's weights (kept back)", ["export", "--model", "m", "--output", "o"],
     ("not a regular file",), setup=lambda root: (model_copy("m", drop=("model.safetensors",))(root),
                                                  fifo("m/model.safetensors")(root)), process=BLOCKS)
case("a FIFO as the tokenizer file (kept back)", [*TRAIN_ARGS[:2], "m", *TRAIN_ARGS[3:]], ("not a regular file",),
     setup=lambda root: (model_copy("m", drop=("tokenizer.json",))(root), fifo("m/tokenizer.json")(root)),
     process=BLOCKS)
case("a FIFO as eval --json (kept back)", ["eval", "--model", "{trained}", "--data", "{data}", "--json", "r.json"],
     ("not a regular file", "--json"), setup=fifo("r.json"), process=BLOCKS)
case("a FIFO as the output's lock file (kept back)", [*TRAIN_ARGS], ("lock file", "not a regular file"),
     setup=fifo(".out.lock"), process=BLOCKS)
case("a FIFO as --resume's manifest (kept back)", [*TRAIN_ARGS, "--resume", "ck"], ("no checkpoint at",),
     setup=fifo("ck/checkpoint.json"), process=BLOCKS)
case("export of a truncated model.safetensors", ["export", "--model", "m", "--output", "o"],
     ("model.safetensors is corrupt or truncated", "--model"), setup=truncated_weights("m"))
for command, extra in (("predict", ["good"]), ("train", ["--data", "{data}", "--output-dir", "out"]),
                       ("eval", ["--data", "{data}"])):
    case(f"{command}: a truncated model.safetensors (kept back)", [command, "--model", "m", *extra],
         ("is corrupt or truncated",), setup=truncated_weights("m"))
case("verify: a model.safetensors cut inside its header (kept back)", ["verify", "m"], ("corrupt or truncated",),
     setup=truncated_weights("m", keep=40))
case("an --output-dir that is not UTF-8", [*TRAIN_ARGS[:-1], os.fsdecode(b"out\xff")], ("not valid UTF-8",))
case("an eval --json name that is not UTF-8 (kept back)", ["eval", "--model", "{trained}", "--data", "{data}",
                                                           "--json", os.fsdecode(b"r\xfe.json")],
     ("not valid UTF-8",))
case("an export --output that is not UTF-8 (kept back)", ["export", "--model", "{trained}", "--output",
                                                          os.fsdecode(b"o\xe9")], ("not valid UTF-8", "--output"))
case("a --checkpoint-dir that is not UTF-8 (kept back)", [*TRAIN_ARGS, "--checkpoint-dir", os.fsdecode(b"c\xff")],
     ("not valid UTF-8", "--checkpoint-dir"))
