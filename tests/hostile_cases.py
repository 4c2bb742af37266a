"""The hostile-input table run by ``tests/e2e/cli/test_hostile_inputs.py``: one row per careless or hostile input.

It exists apart from the runner so the table reads as a catalogue. Each case is ``Case(id, argv, needles, code,
setup, owned)``: ``argv`` is the ``flodl-hf`` command line with placeholders ``{base}`` (a tiny base checkpoint),
``{trained}`` (a tiny trained classifier) and ``{data}`` (a 60-row labelled CSV), all shared and read-only;
``setup(case_dir)`` plants the case's own files first; ``needles`` must appear in the one error line; ``owned``
lists the paths the command may create (for documented acceptances, code 0); ``process`` says why a row needs a
process of its own (a hang bound, a signal, a resource limit), and rows without one run through ``main(argv)``. The
classes follow the first hostile round: ownership, validate first (paths, devices, numbers, model directory, data columns), labels,
model damage.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

__all__ = ["Case", "CASES"]


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple
    needles: tuple = ()
    code: int = 2
    setup: Optional[Callable[[Path], None]] = None
    owned: tuple = ()
    process: str = ""  # why the row runs ``python -m flodl_hf`` in a process of its own; empty: main(argv)


TRAIN = ("train", "--model", "{base}", "--data", "{data}", "--no-progress")
CASES: list[Case] = []


def case(id: str, argv, needles=(), code: int = 2, setup=None, owned=()) -> None:
    CASES.append(Case(id, tuple(argv), tuple(needles), code, setup, tuple(owned)))


# --- file planting helpers ------------------------------------------------------------------------------------

def text(path: str, content: str = "user data\n", encoding: str = "utf-8") -> Callable[[Path], None]:
    def plant(root: Path) -> None:
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding=encoding)
    return plant


def raw(path: str, content: bytes) -> Callable[[Path], None]:
    def plant(root: Path) -> None:
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return plant


def many(*planters: Callable[[Path], None]) -> Callable[[Path], None]:
    def plant(root: Path) -> None:
        for planter in planters:
            planter(root)
    return plant


def rows(path: str, items, header: str = "text,label") -> Callable[[Path], None]:
    return text(path, header + "\n" + "".join(f"{t},{lab}\n" for t, lab in items))


def jsonl(path: str, items) -> Callable[[Path], None]:
    return text(path, "".join(json.dumps(item) + "\n" for item in items))


def model_copy(path: str, drop=(), config=None) -> Callable[[Path], None]:
    """A copy of the shared base checkpoint (placed by the runner at ``_base``), minus ``drop``."""
    def plant(root: Path) -> None:
        import shutil

        shutil.copytree(os.environ["HOSTILE_BASE"], root / path)
        for name in drop:
            (root / path / name).unlink(missing_ok=True)
        if config is not None:
            (root / path / "config.json").write_text(config)
    return plant


GOOD = [(f"the film was {'good' if i % 2 else 'bad'}", "pos" if i % 2 else "neg") for i in range(40)]
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")

# --- 1. numbers: every number finite and in range (the parser refuses; nothing is imported) ---------------------

for option in ("--epochs", "--batch-size", "--max-length", "--train-rows", "--eval-rows", "--checkpoint-every",
               "--eval-every", "--early-stopping-patience", "--fixed-anchor", "--max-micro-batch"):
    for value, needle in (("0", "too small"), ("-3", "too small"), ("abc", "is not an integer"),
                          ("1e3", "is not an integer")):
        case(f"{option} {value}", [*TRAIN, option, value], (f"argument {option}", needle))
for value, needle in (("inf", "positive number"), ("nan", "positive number"), ("-1", "positive number"),
                      ("0", "positive number"), ("fast", "is not a number")):
    case(f"--lr {value}", [*TRAIN, "--lr", value], ("argument --lr", needle))
for value in ("1", "-0.1", "nan", "inf"):
    case(f"--warmup-ratio {value}", [*TRAIN, "--warmup-ratio", value], ("argument --warmup-ratio", "[0, 1)"))
for value in ("inf", "nan", "0", "0.6"):
    case(f"--overhead-target {value}", [*TRAIN, "--overhead-target", value], ("argument --overhead-target",))
for value, needle in (("1:inf", "RANK:RATIO"), ("1:nan", "RANK:RATIO"), ("x", "RANK:RATIO"), ("1:", "RANK:RATIO"),
                      ("-1:2", "RANK:RATIO"), ("1:0.5", "must be >= 1")):
    case(f"--speed-hint {value}", [*TRAIN, "--devices", "cpu,cpu", f"--speed-hint={value}"],
         ("argument --speed-hint", needle))
case("--speed-hint rank beyond the devices", [*TRAIN, "--devices", "cpu,cpu", "--speed-hint", "5:2"],
     ("speed hint rank 5 does not exist with 2 device(s)",))
for value, needle in (("99999999999999999999999", "out of range"), ("-1", "out of range"),
                      ("1.5", "not an integer"), ("seed", "not an integer")):
    case(f"--seed {value}", [*TRAIN, "--seed", value], ("argument --seed", needle))
case("predict --top-k 0", ["predict", "--model", "{trained}", "--top-k", "0", "good"], ("argument --top-k",))
case("eval --rows 0", ["eval", "--model", "{trained}", "--data", "{data}", "--rows", "0"], ("argument --rows",))
case("eval --batch-size -1", ["eval", "--model", "{trained}", "--data", "{data}", "--batch-size", "-1"],
     ("argument --batch-size",))
case("--precision fp8", [*TRAIN, "--precision", "fp8"], ("argument --precision",))
case("--report-to wandb", [*TRAIN, "--report-to", "wandb"], ("argument --report-to",))
case("--early-stopping-patience without --eval-every", [*TRAIN, "--early-stopping-patience", "2"],
     ("needs --eval-every",))

# --- 2. devices supported on this machine (no CUDA, no MPS on the CI machine) --------------------------------

case("--devices tpu", [*TRAIN, "--devices", "tpu"], ("unknown device 'tpu'",))
case("--devices empty", [*TRAIN, "--devices", ","], ("devices is empty",))
case("--devices cpu,cuda mixed", [*TRAIN, "--devices", "cpu,cuda:0"], ("mix",))
case("--devices mps,mps", [*TRAIN, "--devices", "mps,mps"], ("MPS trains on one device only",))
case("--devices mps", [*TRAIN, "--devices", "mps"], ("MPS is not available on this machine", "--devices cpu"))
case("--devices cuda without CUDA", [*TRAIN, "--devices", "cuda"], ("no CUDA GPU", "--devices cpu"))
case("--devices cuda:0,cuda:1 without CUDA", [*TRAIN, "--devices", "cuda:0,cuda:1"], ("no CUDA GPU",))
case("--devices cuda:x", [*TRAIN, "--devices", "cuda:x"], ("unknown device",))

# --- 3. ownership: output paths flodl-hf may not write -------------------------------------------------------

case("output dir is a file", [*TRAIN, "--output-dir", "out"], ("exists and is a file", "--output-dir"),
     setup=text("out"))
case("output dir is foreign", [*TRAIN, "--output-dir", "out"], ("not written by flodl-hf", "--output-dir"),
     setup=text("out/thesis.tex"))
case("output dir is foreign, --overwrite", [*TRAIN, "--output-dir", "out", "--overwrite"],
     ("not written by flodl-hf",), setup=text("out/thesis.tex"))
case("output dir holds someone else's metrics.json", [*TRAIN, "--output-dir", "out", "--overwrite"],
     ("not written by flodl-hf",), setup=text("out/metrics.json", '{"accuracy": 1}'))
case("flodl output with a user file, --overwrite", [*TRAIN, "--output-dir", "out", "--overwrite"],
     ("holds files flodl-hf did not write (notes.txt)", "--output-dir"),
     setup=many(text("out/.flodl-hf.json", '{"generator": "flodl-hf", "entries": ["config.json"]}'),
                text("out/config.json", "{}"), text("out/notes.txt")))
case("flodl output without --overwrite", [*TRAIN, "--output-dir", "out"], ("pass --overwrite",),
     setup=text("out/.flodl-hf.json", '{"generator": "flodl-hf", "entries": []}'))
case("output dir holds an eval --json result named metrics.json, --overwrite",
     [*TRAIN, "--output-dir", "out", "--overwrite"], ("not written by flodl-hf",),
     setup=many(text("out/metrics.json", '{"generator": "flodl-hf", "kind": "eval", "accuracy": 1}'),
                text("out/thesis.tex")))
case("output of an earlier flodl-hf (no marker) with a user file, --overwrite",
     [*TRAIN, "--output-dir", "out", "--overwrite"], ("holds files flodl-hf did not write (thesis.tex)",),
     setup=many(text("out/metrics.json", '{"generator": "flodl-hf", "accuracy": 1}'), text("out/config.json", "{}"),
                text("out/thesis.tex")))
case("output dir is a flodl-hf checkpoint directory, --overwrite",
     [*TRAIN, "--output-dir", "c", "--resume", "c", "--checkpoint-dir", "ck2", "--overwrite"],
     ("--output-dir c is a flodl-hf checkpoint directory, not an output",),
     setup=many(text("c/.flodl-hf.json", '{"generator": "flodl-hf", "kind": "checkpoint", "created": true, '
                                        '"entries": ["checkpoint.json"]}'), text("c/checkpoint.json", "{}")))
case("output dir inside the --resume checkpoint", [*TRAIN, "--output-dir", "c/out", "--resume", "c",
                                                   "--checkpoint-dir", "ck2"],
     ("would write inside the input --resume",), setup=text("c/checkpoint.json", "{}"))
case("output dir under a file", [*TRAIN, "--output-dir", "afile/out"], ("is a file, not a directory",),
     setup=text("afile"))
case("output dir name of 300 characters", [*TRAIN, "--output-dir", "o" * 300], ("over the 255", "--output-dir"))
case("output dir is a dangling symlink", [*TRAIN, "--output-dir", "link"], ("dangling symbolic link",),
     setup=lambda root: os.symlink(root / "nowhere", root / "link"))
case("output dir is the current directory", [*TRAIN, "--output-dir", "."], ("--output-dir",),
     setup=text("notes.txt"))
case("output dir equals --checkpoint-dir", [*TRAIN, "--output-dir", "out", "--checkpoint-dir", "out"],
     ("overlap", "--checkpoint-dir"))
case("checkpoint dir inside the output dir", [*TRAIN, "--output-dir", "out", "--checkpoint-dir", "out/ckpt"],
     ("overlap",))
case("output dir inside the checkpoint dir", [*TRAIN, "--output-dir", "ckpt/out", "--checkpoint-dir", "ckpt"],
     ("overlap",))
case("output dir holds the data file", ["train", "--model", "{base}", "--data", "sub/d.csv", "--output-dir", "sub",
                                        "--overwrite"],
     ("not written by flodl-hf",), setup=rows("sub/d.csv", GOOD))
case("output dir is the model directory", ["train", "--model", "m", "--data", "{data}", "--output-dir", "m",
                                           "--overwrite"],
     ("would hold or replace the input --model",),
     setup=lambda root: (model_copy("m")(root), text("m/.flodl-hf.json", json.dumps(
         {"generator": "flodl-hf", "entries": sorted(p.name for p in (root / "m").iterdir())}))(root)))
case("output dir inside the model directory", ["train", "--model", "m", "--data", "{data}", "--output-dir", "m/out"],
     ("would write inside the input --model",), setup=model_copy("m"))
case("checkpoint dir is the data file", [*TRAIN, "--output-dir", "out", "--checkpoint-dir", "{data}"],
     ("--checkpoint-dir",))
case("checkpoint dir is a file", [*TRAIN, "--output-dir", "out", "--checkpoint-dir", "c"],
     ("exists and is a file", "--checkpoint-dir"), setup=text("c"))
case("foreign checkpoint.pt, --overwrite", [*TRAIN, "--output-dir", "out", "--checkpoint-dir", "c", "--overwrite"],
     ("was not written by flodl-hf", "choose another --checkpoint-dir"), setup=raw("c/checkpoint.pt", b"mine"))
case("foreign checkpoint.pt", [*TRAIN, "--output-dir", "out", "--checkpoint-dir", "c"],
     ("was not written by flodl-hf", "--resume"), setup=raw("c/checkpoint.pt", b"mine"))
case("default checkpoint dir holds a foreign checkpoint.pt, --overwrite", [*TRAIN, "--output-dir", "out",
                                                                          "--overwrite"],
     ("out.checkpoint/checkpoint.pt was not written by flodl-hf",), setup=raw("out.checkpoint/checkpoint.pt", b"x"))
case("tensorboard over a foreign runs/", [*TRAIN, "--output-dir", "out", "--checkpoint-dir", "c", "--report-to",
                                          "tensorboard"],
     ("c/runs was not written by flodl-hf",), setup=text("c/runs/events.user"))
case("tensorboard over a foreign runs/ in the default dir", [*TRAIN, "--output-dir", "out", "--report-to",
                                                             "tensorboard", "--overwrite"],
     ("runs was not written by flodl-hf",), setup=text("out.checkpoint/runs/mine.txt"))
case("--resume a missing directory", [*TRAIN, "--output-dir", "out", "--resume", "nope"],
     ("--resume nope", "no such checkpoint directory"))
case("--resume a directory without checkpoint", [*TRAIN, "--output-dir", "out", "--resume", "empty"],
     ("no checkpoint at",), setup=lambda root: (root / "empty").mkdir())
case("--resume a foreign checkpoint", [*TRAIN, "--output-dir", "out", "--resume", "c"],
     ("unreadable",), setup=raw("c/checkpoint.pt", b"not a checkpoint"))
# the safe checkpoint format. A pickle is never opened; the exec payload would create a file, which the
# listing check would catch. Its bytes: pickle.dumps of an object whose __reduce__ is (exec, ("open('PWNED','w')",)).
_EXEC_PICKLE = b"\x80\x04\x95-\x00\x00\x00\x00\x00\x00\x00\x8c\x08builtins\x94\x8c\x04exec\x94\x93\x94\x8c" \
    b"\x11open('PWNED','w')\x94\x85\x94R\x94."
_NEWER = json.dumps({"format": "flodl-hf-checkpoint", "version": 99, "kind": "setup", "state": {}})
_BAD_SUM = json.dumps({"format": "flodl-hf-checkpoint", "version": 2, "kind": "setup", "state": {}, "sha256": "0" * 64,
                       "tensors": {"file": "checkpoint.0.safetensors", "bytes": 1, "sha256": "0" * 64}})
case("--resume a legacy pickle checkpoint.pt", [*TRAIN, "--output-dir", "out", "--resume", "c"],
     ("c/checkpoint.pt is a legacy pickle checkpoint", "flodl-hf convert-checkpoint --trust-pickle c"),
     setup=raw("c/checkpoint.pt", _EXEC_PICKLE))
case("--resume a checkpoint of a newer format", [*TRAIN, "--output-dir", "out", "--resume", "c"],
     ("format version 99, newer than this flodl-hf reads", "upgrade flodl-hf"), setup=text("c/checkpoint.json", _NEWER))
case("--resume a truncated manifest", [*TRAIN, "--output-dir", "out", "--resume", "c"],
     ("c/checkpoint.json is unreadable: not valid JSON",), setup=text("c/checkpoint.json", _NEWER[:30]))
case("--resume a manifest whose checksum fails", [*TRAIN, "--output-dir", "out", "--resume", "c"],
     ("c/checkpoint.json is corrupted: its SHA-256 does not match",), setup=text("c/checkpoint.json", _BAD_SUM))
case("convert-checkpoint without --trust-pickle", ["convert-checkpoint", "c"], ("pass --trust-pickle",),
     setup=raw("c/checkpoint.pt", _EXEC_PICKLE))
case("convert-checkpoint of a malicious pickle", ["convert-checkpoint", "--trust-pickle", "c"],
     ("refused",), setup=raw("c/checkpoint.pt", _EXEC_PICKLE))
case("convert-checkpoint of a missing checkpoint", ["convert-checkpoint", "--trust-pickle", "nope"],
     ("no legacy checkpoint at nope",))
for name, setup_json, needle in (
        ("foreign file", text("r.json", '{"mine": 1}'), "already exists and is not an earlier flodl-hf result"),
        ("the data file", None, "is an input of this command"),
        ("a file of the model dir", None, "is an input of this command"),
        ("a directory", lambda root: (root / "r.json").mkdir(), "is a directory"),
        ("under a file", text("afile"), "is a file, not a directory"),
        ("a 300-character name", None, "over the 255"),
        ("a dangling symlink", lambda root: os.symlink(root / "nowhere", root / "r.json"), "already exists")):
    target = {"the data file": "{data}", "a file of the model dir": "{trained}/config.json",
              "under a file": "afile/r.json", "a 300-character name": "r" * 300}.get(name, "r.json")
    case(f"eval --json {name}", ["eval", "--model", "{trained}", "--data", "{data}", "--json", target],
         (needle, "--json"), setup=setup_json)
case("export to a foreign dir", ["export", "--model", "{trained}", "--output", "o"], ("not written by flodl-hf",),
     setup=text("o/keep.txt"))
case("export to a foreign dir, --overwrite", ["export", "--model", "{trained}", "--output", "o", "--overwrite"],
     ("not written by flodl-hf", "--output"), setup=text("o/keep.txt"))
case("export onto a file", ["export", "--model", "{trained}", "--output", "o"], ("exists and is a file",),
     setup=text("o"))
case("export onto the model dir", ["export", "--model", "m", "--output", "m", "--overwrite"],
     ("--output",), setup=model_copy("m"))
case("export inside the model dir", ["export", "--model", "m", "--output", "m/out"],
     ("would write inside the input --model",), setup=model_copy("m"))
case("export under a file", ["export", "--model", "{trained}", "--output", "afile/o"], ("is a file",),
     setup=text("afile"))
case("export name of 300 characters", ["export", "--model", "{trained}", "--output", "e" * 300], ("over the 255",))

# --- 4. the model directory complete ---------------------------------------------------------------------------

for command in ("train", "predict", "eval", "export"):
    extra = {"train": ["--data", "{data}", "--output-dir", "out"], "predict": ["good"],
             "eval": ["--data", "{data}"], "export": ["--output", "o"]}[command]
    case(f"{command}: model dir missing", [command, "--model", "nope", *extra], ("model directory not found",))
    case(f"{command}: model is a file", [command, "--model", "f", *extra], ("is a file, not a model directory",),
         setup=text("f"))
    case(f"{command}: model dir without config", [command, "--model", "m", *extra], ("no config.json",),
         setup=model_copy("m", drop=("config.json",)))
    case(f"{command}: model dir without weights", [command, "--model", "m", *extra], ("no weights file",),
         setup=model_copy("m", drop=("model.safetensors",)))
    case(f"{command}: config is not JSON", [command, "--model", "m", *extra], ("is not valid JSON",),
         setup=model_copy("m", config="{not json"))
    case(f"{command}: config without model_type", [command, "--model", "m", *extra], ("names no model_type",),
         setup=model_copy("m", config='{"hidden_size": 32}'))
for command, extra in (("train", ["--data", "{data}", "--output-dir", "out"]), ("predict", ["good"]),
                       ("eval", ["--data", "{data}"]), ("export", ["--output", "o"])):
    case(f"{command}: model dir without tokenizer", [command, "--model", "m", *extra], ("no tokenizer files",),
         setup=model_copy("m", drop=TOKENIZER))
case("verify: missing dir", ["verify", "nope"], ("model directory not found",))
case("export --tokenizer missing", ["export", "--model", "{trained}", "--output", "o", "--tokenizer", "nope"],
     ("model directory not found", "--tokenizer"))

# --- 5. no silent model damage: untrained classifiers ---------------------------------------------------------

case("predict on a base checkpoint", ["predict", "--model", "{base}", "good"], ("no trained classifier",
                                                                                  "--allow-untrained"))
case("eval on a base checkpoint", ["eval", "--model", "{base}", "--data", "{data}"], ("no trained classifier",
                                                                                      "--allow-untrained"))
case("predict an empty text", ["predict", "--model", "{trained}", ""], ("TEXT 1 is empty",))
case("eval data with labels the model lacks", ["eval", "--model", "{trained}", "--data", "d.csv"],
     ("label 'maybe', which is not one of the model's labels ['neg', 'pos']",),
     setup=rows("d.csv", [("good", "maybe")]))

# --- 6. data: columns distinct and unambiguous, formats, labels --------------------------------------------------

DATA = ("train", "--model", "{base}", "--data", "d.csv", "--output-dir", "out", "--no-progress")
case("data file missing", [*DATA[:4], "nope.csv", *DATA[5:]], ("data file not found",))
case("repeated header text,label,text", DATA, ("repeats the column(s) 'text'",),
     setup=text("d.csv", "text,label,text\na,pos,b\nc,neg,d\n"))
case("same column for text and label", [*DATA, "--text-column", "label", "--label-column", "label"],
     ("both 'label'", "--text-column"), setup=rows("d.csv", GOOD))
case("semicolon-separated file", DATA, ("semicolon-separated",),
     setup=text("d.csv", "text;label\n" + "".join(f"{t};{lab}\n" for t, lab in GOOD)))
case("UTF-16 without BOM", DATA, ("NUL bytes", "--encoding"),
     setup=raw("d.csv", ("text,label\n" + "".join(f"{t},{lab}\n" for t, lab in GOOD)).encode("utf-16-le")))
case("binary data file", DATA, ("NUL bytes",), setup=raw("d.csv", bytes(range(256)) * 4))
case("unknown --encoding", [*DATA, "--encoding", "klingon"], ("unknown encoding", "--encoding"),
     setup=rows("d.csv", GOOD))
case("wrong --encoding", [*DATA, "--encoding", "ascii"], ("is not valid ascii", "--encoding"),
     setup=text("d.csv", "text,label\ncafé good,pos\nbad,neg\n"))
case("unsupported suffix .txt", [*DATA[:4], "d.txt", *DATA[5:]], ("unsupported data file",), setup=text("d.txt"))
case("unsupported suffix .xlsx", [*DATA[:4], "d.xlsx", *DATA[5:]], ("unsupported data file",),
     setup=raw("d.xlsx", b"PK\x03\x04"))
case("empty data file", DATA, ("has no data rows",), setup=text("d.csv", ""))
case("header only", DATA, ("has no data rows",), setup=text("d.csv", "text,label\n"))
case("missing text column", [*DATA, "--text-column", "review"], ("no text column 'review'", "--text-column"),
     setup=rows("d.csv", GOOD))
case("missing label column", [*DATA, "--label-column", "stars"], ("no label column 'stars'", "--label-column"),
     setup=rows("d.csv", GOOD))
case("every text empty", DATA, ("no rows with text",), setup=rows("d.csv", [(" ", "pos")] * 5))
case("blank labels reported by row", DATA, ("rows 2, 4 have no label",),
     setup=rows("d.csv", [("a", "pos"), ("b", ""), ("c", "neg"), ("d", " ")]))
case("NaN labels reported by row", DATA, ("row 3 has the label NaN",),
     setup=rows("d.csv", [("a", "pos"), ("b", "neg"), ("c", "NaN")]))
case("JSON NaN label", [*DATA[:4], "d.jsonl", *DATA[5:]], ("row 2 has the label NaN",),
     setup=text("d.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": NaN}\n'))
case("float label", [*DATA[:4], "d.jsonl", *DATA[5:]], ("float label",),
     setup=jsonl("d.jsonl", [{"text": "a", "label": 1.5}]))
case("boolean label", [*DATA[:4], "d.jsonl", *DATA[5:]], ("bool label",),
     setup=jsonl("d.jsonl", [{"text": "a", "label": True}]))
case("list text", [*DATA[:4], "d.jsonl", *DATA[5:]], ("every text must be a string",),
     setup=jsonl("d.jsonl", [{"text": ["a"], "label": 1}]))
case("single class", DATA, ("a single label ['pos']", "at least 2 classes"), setup=rows("d.csv", [("a", "pos")] * 30))
case("label 10**12 only", [*DATA[:4], "d.jsonl", *DATA[5:]], ("a single label ['1000000000000']",),
     setup=jsonl("d.jsonl", [{"text": f"t{i}", "label": 10**12} for i in range(30)]))
case("label 99999999999 with a mismatched --labels", [*DATA[:4], "d.jsonl", *DATA[5:], "--labels", "a,b"],
     ("label id 99999999999, outside the 2 known labels",),
     setup=jsonl("d.jsonl", [{"text": "t", "label": 99999999999}]))
case("too many distinct labels", DATA, ("distinct labels, more than the 10000", "--label-column"),
     setup=rows("d.csv", [(f"t{i}", f"l{i}") for i in range(10_001)]))
case("negative integer label", [*DATA[:4], "d.jsonl", *DATA[5:]], ("negative label id -1",),
     setup=jsonl("d.jsonl", [{"text": "a", "label": -1}, {"text": "b", "label": 0}]))
case("--labels repeated", [*DATA, "--labels", "a,a"], ("repeat",), setup=rows("d.csv", GOOD))
case("--labels with an empty name", [*DATA, "--labels", "a,,b"], ("argument --labels",))
case("--labels missing a data label", [*DATA, "--labels", "pos,meh"], ("'neg', which is not one of the known",),
     setup=rows("d.csv", GOOD))
case("invalid JSON", [*DATA[:4], "d.json", *DATA[5:]], ("is not valid JSON",), setup=text("d.json", "[{"))
case("JSON that is a number", [*DATA[:4], "d.json", *DATA[5:]], ("expected a list of objects",),
     setup=text("d.json", "42"))
case("JSON-lines with a broken line", [*DATA[:4], "d.jsonl", *DATA[5:]], ("line 2 is not valid JSON",),
     setup=text("d.jsonl", '{"text": "a", "label": 1}\n{oops\n'))
case("JSON rows that are lists", [*DATA[:4], "d.jsonl", *DATA[5:]], ("row 1 is a list",),
     setup=text("d.jsonl", '["a", 1]\n'))
case("JSON columns of different lengths", [*DATA[:4], "d.json", *DATA[5:]], ("different lengths",),
     setup=text("d.json", '{"text": ["a", "b"], "label": [1]}'))
case("--eval-rows beyond the data", [*DATA, "--eval-rows", "500"], ("cannot hold out 500 of 40 rows", "--eval-rows"),
     setup=rows("d.csv", GOOD))
case("fewer rows than one batch", [*DATA, "--batch-size", "64"], ("fewer than one global batch", "--batch-size"),
     setup=rows("d.csv", GOOD))
case("one row", DATA, ("a single label",), setup=rows("d.csv", [("a", "pos")]))
case("two rows", DATA, ("fewer than one global batch",), setup=rows("d.csv", [("a", "pos"), ("b", "neg")]))
case("a directory that is not a dataset", [*DATA[:4], "dd", *DATA[5:]], ("is a directory",),
     setup=text("dd/readme.txt"))

# --- 7. documented acceptances (exit 0, and only what the command owns appears) ------------------------------------

case("UTF-16 with a byte-order mark trains", [*DATA, "--batch-size", "8", "--max-length", "16", "--eval-rows", "8",
                                              "--train-rows", "16"], (), code=0,
     setup=raw("d.csv", ("text,label\n" + "".join(f"{t},{lab}\n" for t, lab in GOOD)).encode("utf-16")),
     owned=("out",))
case("integer labels 0/5/100 give 3 labels", [*DATA[:4], "d.jsonl", *DATA[5:], "--batch-size", "8",
                                              "--max-length", "16", "--eval-rows", "9", "--train-rows", "16"],
     (), code=0, owned=("out",),
     setup=jsonl("d.jsonl", [{"text": f"the film {i}", "label": (0, 5, 100)[i % 3]} for i in range(45)]))
case("eval --json over its own earlier result", ["eval", "--model", "{trained}", "--data", "{data}", "--json",
                                                 "r.json", "--no-progress"], (), code=0,
     setup=text("r.json", '{"generator": "flodl-hf", "kind": "eval", "accuracy": 0.5}'), owned=("r.json",))
case("eval --json over a run's metrics.json", ["eval", "--model", "{trained}", "--data", "{data}", "--json",
                                               "run/metrics.json"],
     ("already exists and is not an earlier flodl-hf result",),
     setup=text("run/metrics.json", '{"generator": "flodl-hf", "accuracy": 0.5}'))
case("predict on a base checkpoint with --allow-untrained", ["predict", "--model", "{base}", "--allow-untrained",
                                                             "good"], (), code=0)
case("--labels in another order than the trained model", ["train", "--model", "{trained}", "--data", "{data}",
                                                          "--labels", "pos,neg", "--output-dir", "out"],
     ("order the classes differently", "--labels neg,pos"))
case("eval: missing label column", ["eval", "--model", "{trained}", "--data", "{data}",
     "--label-column", "nope"],
     ("no label column 'nope'", "--label-column"))
case("predict a text of undecodable bytes", ["predict", "--model", "{trained}", os.fsdecode(b"caf\xe9 good")],
     ("TEXT 1 is not valid UTF-8",))
case("verify a model without tokenizer files fails (exit 1)", ["verify", "m"], (), code=1,
     setup=model_copy("m", drop=TOKENIZER))
case("output dir . in an empty directory", [*TRAIN, "--output-dir", "."], ("overlap", "--checkpoint-dir"))
case("output dir given as an empty string", [*TRAIN, "--output-dir", ""], ("--output-dir",), setup=text("mine.txt"))
case("export takes the tokenizer from --tokenizer", ["export", "--model", "m", "--output", "o", "--tokenizer",
                                                     "{trained}"], (), code=0, owned=("o",),
     setup=lambda root: (__import__("shutil").copytree(Path(os.environ["HOSTILE_TRAINED"]), root / "m"),
                         [(root / "m" / name).unlink(missing_ok=True) for name in TOKENIZER]))
case("JSON-lines object with a repeated key", [*DATA[:4], "d.jsonl", *DATA[5:]],
     ("line 2 has an object that repeats the key(s) 'text'",),
     setup=text("d.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "text": "c", "label": 0}\n'))
case("JSON array object with a repeated key", [*DATA[:4], "d.json", *DATA[5:]], ("repeats the key(s) 'label'",),
     setup=text("d.json", '[{"text": "a", "label": 1, "label": 0}]'))

# --- 8. labels by name, splits, problem types, sentence pairs ---------------------------------------

def saved_dataset(path: str, splits=("train", "test"), names=("neg", "pos"), items=GOOD) -> Callable[[Path], None]:
    """A ``DatasetDict`` saved with ``save_to_disk``, its ``label`` a ClassLabel with ``names`` (in that order)."""
    def plant(root: Path) -> None:
        import datasets

        features = datasets.Features({"text": datasets.Value("string"),
                                      "label": datasets.ClassLabel(names=list(names))})
        part = datasets.Dataset.from_dict({"text": [t for t, _ in items],
                                           "label": [list(names).index(lab) if lab in names else 0
                                                     for _, lab in items]}, features=features)
        datasets.DatasetDict({split: part for split in splits}).save_to_disk(str(root / path))
    return plant


PAIRS = [{"text": t, "hyp": f"so {t}", "label": lab} for t, lab in GOOD]
case("eval: ClassLabel names the model lacks", ["eval", "--model", "{trained}", "--data", "dd", "--split", "test"],
     ("label 'meh'", "the model's labels ['neg', 'pos']"),
     setup=saved_dataset("dd", names=("meh", "pos", "neg"), items=[(t, "meh") for t, _ in GOOD[:3]] + GOOD))
case("train: a split that does not exist", [*DATA[:4], "dd", *DATA[5:], "--split", "dev"],
     ("has no split 'dev'; available splits: train, test", "--split"), setup=saved_dataset("dd"))
case("eval: a split that does not exist", ["eval", "--model", "{trained}", "--data", "dd", "--split", "dev"],
     ("has no split 'dev'; available splits: train, test",), setup=saved_dataset("dd"))
case("--eval-split that does not exist", [*DATA[:4], "dd", *DATA[5:], "--eval-split", "validation"],
     ("has no split 'validation'; available splits: train, test", "--eval-split"), setup=saved_dataset("dd"))
case("--split of a CSV file", [*DATA, "--split", "test"], ("has no split 'test'; available splits: train",),
     setup=rows("d.csv", GOOD))
case("--eval-split equal to the training split", [*DATA[:4], "dd", *DATA[5:], "--eval-split", "train"],
     ("--eval-split train is the split training uses",), setup=saved_dataset("dd"))
case("DatasetDict without train and no --split", [*DATA[:4], "dd", *DATA[5:]],
     ("holds splits ['a', 'b']: choose one with --split",), setup=saved_dataset("dd", splits=("a", "b")))
case("--eval-data missing", [*DATA, "--eval-data", "nope.csv"], ("--eval-data nope.csv: no such file",),
     setup=rows("d.csv", GOOD))
case("--eval-data with labels training lacks", [*DATA, "--eval-data", "e.csv"],
     ("label 'meh'", "the training labels ['neg', 'pos']"),
     setup=many(rows("d.csv", GOOD), rows("e.csv", [("good", "pos"), ("fine", "meh")])))
case("unknown --problem-type", [*DATA, "--problem-type", "ranking"],
     ("argument --problem-type: invalid choice: 'ranking'",), setup=rows("d.csv", GOOD))
case("regression target that is not a number", [*DATA, "--problem-type", "regression"],
     ("row 1 has the target 'neg'", "not a finite number", "--problem-type regression"), setup=rows("d.csv", GOOD))
case("regression target inf", [*DATA[:4], "d.jsonl", *DATA[5:], "--problem-type", "regression"],
     ("row 2 has the target 'inf'", "not a finite number"),
     setup=jsonl("d.jsonl", [{"text": "a", "label": 0.5}, {"text": "b", "label": "inf"}]))
case("regression with --labels", [*DATA, "--problem-type", "regression", "--labels", "a,b"],
     ("--problem-type regression has none",), setup=rows("d.csv", GOOD))
case("--metric-for-best of another problem type", [*DATA, "--problem-type", "regression", "--metric-for-best",
                                                    "accuracy"],
     ("--metric-for-best accuracy is not a metric of a regression problem", "pearson"), setup=rows("d.csv", GOOD))
case("--metric-for-best unknown", [*DATA, "--metric-for-best", "bleu"], ("--metric-for-best bleu",),
     setup=rows("d.csv", GOOD))
case("multi-label list holding a float", [*DATA[:4], "d.jsonl", *DATA[5:], "--problem-type", "multi_label"],
     ("row 2 has a float (0.5) in its label list",),
     setup=jsonl("d.jsonl", [{"text": "a", "label": ["x"]}, {"text": "b", "label": ["x", 0.5]}]))
case("multi-label names the model lacks", [*DATA[:4], "d.jsonl", *DATA[5:], "--problem-type", "multi_label",
                                          "--labels", "x,y"],
     ("label 'z', which is not one of the known labels ['x', 'y']",),
     setup=jsonl("d.jsonl", [{"text": "a", "label": "x,z"}, {"text": "b", "label": ["y"]}]))
case("--text-pair-column missing", [*DATA[:4], "d.jsonl", *DATA[5:], "--text-pair-column", "second"],
     ("no text-pair column 'second'", "--text-pair-column"), setup=jsonl("d.jsonl", PAIRS))
case("--text-pair-column not text", [*DATA[:4], "d.jsonl", *DATA[5:], "--text-pair-column", "hyp"],
     ("row 2 has a int (7) in text-pair column 'hyp'",),
     setup=jsonl("d.jsonl", [PAIRS[0], dict(PAIRS[1], hyp=7)] + PAIRS[2:]))
case("--text-pair-column empty in a row", [*DATA[:4], "d.jsonl", *DATA[5:], "--text-pair-column", "hyp"],
     ("row 3 has no text in text-pair column 'hyp'",),
     setup=jsonl("d.jsonl", PAIRS[:2] + [dict(PAIRS[2], hyp=" ")] + PAIRS[3:]))
case("--text-pair-column equal to --text-column", [*DATA, "--text-pair-column", "text"], ("named twice",),
     setup=rows("d.csv", GOOD))
case("eval: --text-pair-column missing", ["eval", "--model", "{trained}", "--data", "{data}", "--text-pair-column",
                                          "hyp"], ("no text-pair column 'hyp'",))
case("predict: --pair count differs from TEXT count", ["predict", "--model", "{trained}", "a", "b", "--pair", "c"],
     ("2 TEXT(s) but 1 --pair",))
case("parquet file that is not parquet", [*DATA[:4], "d.parquet", *DATA[5:]], ("is not a readable parquet file",),
     setup=text("d.parquet", "text,label\n"))
case("a saved DatasetDict with ClassLabel names in another order trains", [
        *DATA[:4], "dd", *DATA[5:], "--eval-split", "test", "--batch-size", "8", "--max-length", "16",
        "--train-rows", "16"], (), code=0, owned=("out",),
     setup=saved_dataset("dd", names=("pos", "neg")))
case("a parquet file trains", [*DATA[:4], "d.parquet", *DATA[5:], "--batch-size", "8", "--max-length", "16",
                               "--eval-rows", "8", "--train-rows", "16"], (), code=0, owned=("out",),
     setup=lambda root: __import__("datasets").Dataset.from_dict(
         {"text": [t for t, _ in GOOD], "label": [lab for _, lab in GOOD]}).to_parquet(str(root / "d.parquet")))
