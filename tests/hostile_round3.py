"""The third round of hostile input (issue 28), run by ``tests/cli/test_hostile_inputs.py`` beside
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
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from hostile_cases import Case, jsonl, many, model_copy, raw, text
from task_cli_helpers import qa_rows, texts, token_rows, write_conll, write_jsonl, write_squad
from tiny_models import toy_task

__all__ = ["CASES3"]

CASES3: list[Case] = []


def case(id: str, argv, needles=(), code: int = 2, setup=None, owned=()) -> None:
    CASES3.append(Case(id, tuple(argv), tuple(needles), code, setup, tuple(owned)))


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
