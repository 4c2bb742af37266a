"""Which files flodl-hf may write, replace, move or delete: only its own, marked as such.

It exists so that one module, not each command, decides ownership. The rules:

* A directory flodl-hf writes (an output directory, a checkpoint directory) carries a marker file,
  :data:`MARKER` (``.flodl-hf.json``), that records ``"generator": "flodl-hf"``, what the directory is, which
  entries flodl-hf put there and whether flodl-hf created the directory itself. An output directory written by an
  earlier version (a ``metrics.json`` with ``"generator": "flodl-hf"`` and no marker) counts as flodl-hf's too.
* ``--overwrite`` replaces an output directory only when it is flodl-hf's *and* holds nothing but the entries
  recorded in its marker: a file a user added there is named in the refusal, never deleted.
* A checkpoint directory's checkpoint files (``checkpoint.json``, ``checkpoint.{0,1}.safetensors``, a legacy
  ``checkpoint.pt``) and ``runs/`` are removed or replaced only when its marker records them; a foreign one is
  refused before anything loads, even with ``--overwrite``.
* A file-writing option (``eval --json FILE``) refuses an existing file that is not a flodl-hf result, and never
  accepts an input (the data file, a file of the model directory) as an output.
* Output and checkpoint directories may not be the same, nor one inside the other, nor hold an input.

Everything here is plain ``pathlib`` (no torch), so refusals cost milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence, Union

from .atomic import atomic_dir

#: What a job writes in its checkpoint directory (the manifest, its two tensor slots) and the legacy pickle file.
CHECKPOINT_NAMES = ("checkpoint.json", "checkpoint.0.safetensors", "checkpoint.1.safetensors")
LEGACY_CHECKPOINT = "checkpoint.pt"

__all__ = ["MARKER", "read_marker", "owns_dir", "write_marker", "check_output_dir", "staged_output_dir",
           "check_output_file", "check_disjoint", "claim_checkpoint_dir", "remove_owned", "remove_stale_temporaries",
           "owned_json", "CHECKPOINT_NAMES", "LEGACY_CHECKPOINT"]

PathLike = Union[str, Path]

#: The marker file of a directory flodl-hf wrote.
MARKER = ".flodl-hf.json"
_LEGACY_MARKER = "metrics.json"


def read_marker(directory: PathLike) -> Optional[dict]:
    """The marker of ``directory`` (None: it has none, or it is unreadable / not flodl-hf's)."""
    try:
        data = json.loads((Path(directory) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("generator") != "flodl-hf":
        return None
    return data


#: Every entry a run's output directory could hold before markers existed (a legacy output holding anything else
#: is not treated as flodl-hf's: the extra entries could be a user's).
_LEGACY_OUTPUT_NAMES = frozenset({
    "metrics.json", "README.md", "loss_curve.png", "runs", "config.json", "generation_config.json",
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt", "vocab.json",
    "merges.txt", "spiece.model", "sentencepiece.bpe.model", "chat_template.jinja"})


def _legacy_output(directory: Path) -> bool:
    """An output an earlier flodl-hf wrote (no marker): a run's ``metrics.json`` (``generator`` flodl-hf and no
    ``kind``: an ``eval --json`` result has ``kind: eval`` and says nothing about its folder)."""
    if (directory / MARKER).exists():
        return False
    try:
        data = json.loads((directory / _LEGACY_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("generator") == "flodl-hf" and "kind" not in data


def owns_dir(directory: PathLike) -> bool:
    """True when ``directory`` carries flodl-hf's marker (or is an output written by an earlier flodl-hf)."""
    directory = Path(directory)
    return read_marker(directory) is not None or _legacy_output(directory)


def write_marker(directory: PathLike, kind: str, entries: Iterable[str], created: bool = True) -> None:
    """Record ``directory`` as flodl-hf's: its kind, the entries flodl-hf put there, whether it created it."""
    data = {"generator": "flodl-hf", "kind": kind, "created": bool(created), "entries": sorted(set(entries))}
    (Path(directory) / MARKER).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def _foreign_entries(directory: Path) -> list[str]:
    """Entries of a flodl-hf directory that its marker does not record (None-safe for legacy outputs)."""
    marker = read_marker(directory)
    recorded = (set(marker.get("entries") or ()) | {MARKER}) if marker is not None else _LEGACY_OUTPUT_NAMES
    return sorted(p.name for p in directory.iterdir() if p.name not in recorded)


def check_output_dir(path: PathLike, overwrite: bool, option: str = "--output-dir") -> Path:
    """Refuse (ValueError) an output directory flodl-hf may not write: call before any long work."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise ValueError(f"{option} {path} is a dangling symbolic link: choose another {option}")
    if path.exists() and not path.is_dir():
        raise ValueError(f"output path {path} exists and is a file: choose a directory path with {option}")
    if path.is_dir() and any(path.iterdir()):
        marker = read_marker(path)
        if marker is not None and marker.get("kind") == "checkpoint":
            raise ValueError(f"{option} {path} is a flodl-hf checkpoint directory, not an output: choose "
                             f"another {option}")
        if not owns_dir(path):
            raise ValueError(f"output directory {path} is not empty and was not written by flodl-hf: "
                             f"choose another {option} (flodl-hf never replaces other files)")
        if not overwrite:
            raise ValueError(f"output directory {path} already holds a flodl-hf result: pass --overwrite "
                             f"to replace it, or choose another {option}")
        foreign = _foreign_entries(path)
        if foreign:
            raise ValueError(f"output directory {path} holds files flodl-hf did not write ({', '.join(foreign[:5])}"
                             f"{' ...' if len(foreign) > 5 else ''}), so --overwrite would lose them: move them "
                             f"out, or choose another {option}")
    return path


@contextlib.contextmanager
def staged_output_dir(path: PathLike, overwrite: bool = False, option: str = "--output-dir") -> Iterator[Path]:
    """Yield an empty temporary directory beside ``path``; on success it replaces ``path`` by renames.

    On an exception the temporary directory is removed and ``path`` is untouched. A previous flodl-hf output is
    replaced only with ``overwrite=True`` (see :func:`check_output_dir`). The new directory carries flodl-hf's
    marker, recording every entry written, so a later ``--overwrite`` can tell them from a user's files.
    """
    target = check_output_dir(path, overwrite, option).resolve()
    remove_stale_temporaries(target.parent, [target.name])
    holder: list[Path] = []
    # A directory flodl-hf did not create (an empty one the user made, perhaps a mount point or one with its own
    # mode) is filled in place and never replaced; one it created is swapped whole.
    existing = read_marker(target) if target.is_dir() else None
    in_place = target.is_dir() and (not any(target.iterdir()) or (existing is not None and
                                                                 existing.get("created") is False))

    def before_swap() -> None:
        check_output_dir(target, overwrite, option)  # nothing foreign appeared meanwhile
        staging = holder[0]
        write_marker(staging, "output", [p.name for p in staging.iterdir()], created=not in_place)
        if in_place and existing is not None:  # --overwrite in a directory the user made: ours go, theirs stay
            (target / MARKER).unlink(missing_ok=True)  # first: a half-replaced directory is not claimed as ours
            for name in existing.get("entries") or ():
                entry = target / name
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink(missing_ok=True)

    with atomic_dir(target, before_swap=before_swap, in_place=in_place, last=(MARKER,)) as staging:
        holder.append(staging)
        yield staging


def owned_json(path: Path, kind: str = "eval") -> bool:
    """True when ``path`` is a JSON result of ``kind`` flodl-hf wrote (``"generator": "flodl-hf"`` and ``"kind"``
    at its top): an eval result may replace an earlier eval result, never a run's metrics.json."""
    try:
        if path.stat().st_size > 50_000_000:
            return False
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("generator") == "flodl-hf" and data.get("kind") == kind


def _same_or_inside(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def check_output_file(path: PathLike, option: str, inputs: Sequence[PathLike] = ()) -> Path:
    """Refuse a file-writing option's target that is an input or an existing file flodl-hf did not write."""
    path = Path(path)
    resolved = path.resolve()
    for source in inputs:
        source = Path(source).resolve()
        if _same_or_inside(resolved, source):
            raise ValueError(f"{option} {path} is an input of this command ({source}): write the results to a new "
                             f"file with {option}")
    if path.is_dir():
        raise ValueError(f"{option} {path} is a directory: give a file name with {option}")
    if path.exists() and not path.is_file():
        raise ValueError(f"{option} {path} exists and is not a regular file (a FIFO, socket or device): choose a new "
                         f"file name with {option}")
    if path.is_symlink() or (path.exists() and not owned_json(path)):
        raise ValueError(f"{option} {path} already exists and is not an earlier flodl-hf result of this kind: "
                         f"choose a new file name with {option} (flodl-hf never replaces other files)")
    return path


def check_disjoint(outputs: Sequence[tuple[str, PathLike]], inputs: Sequence[tuple[str, PathLike]]) -> None:
    """Refuse output directories that coincide or nest, or that are or hold an input (call before loading)."""
    resolved = [(name, Path(p).resolve()) for name, p in outputs]
    for i, (name, path) in enumerate(resolved):
        for other, other_path in resolved[i + 1:]:
            if _same_or_inside(path, other_path) or _same_or_inside(other_path, path):
                raise ValueError(f"{name} {path} and {other} {other_path} overlap: give them separate "
                                 f"directories (e.g. {other} {path.parent / (path.name + '.checkpoint')})")
        for input_name, source in inputs:
            source = Path(source).resolve()
            if _same_or_inside(source, path):
                raise ValueError(f"{name} {path} would hold or replace the input {input_name} {source}: choose "
                                 f"another {name}")
            if source.is_dir() and source in path.parents:
                raise ValueError(f"{name} {path} would write inside the input {input_name} {source}: choose "
                                 f"another {name} outside it")


def claim_checkpoint_dir(directory: PathLike, overwrite: bool, resuming: bool, tensorboard: bool) -> None:
    """Refuse a checkpoint directory whose checkpoint files / ``runs/`` flodl-hf did not write (before loading)."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"checkpoint path {directory} exists and is a file: choose a directory with "
                         "--checkpoint-dir")
    if not directory.is_dir():
        return
    marker = read_marker(directory)
    recorded = set(marker.get("entries") or ()) if marker else set()
    if resuming:
        return  # the checkpoint itself proves it is flodl-hf's (read_job_state checks its job plan)
    names = (*CHECKPOINT_NAMES, LEGACY_CHECKPOINT) + (("runs",) if tensorboard else ())
    for name in names:
        if (directory / name).exists() and name not in recorded:
            resume = f"continue it with --resume {directory} if it is an unfinished flodl-hf run, or " \
                if name in (CHECKPOINT_NAMES[0], LEGACY_CHECKPOINT) else ""
            raise ValueError(f"{directory / name} was not written by flodl-hf (no ownership record), which never "
                             f"replaces or deletes other files: {resume}choose another --checkpoint-dir")


def adopt_checkpoint_dir(directory: PathLike, tensorboard: bool = False) -> None:
    """Create (or mark) the checkpoint directory as flodl-hf's, recording what the job will write there: the
    checkpoint files (:func:`claim_checkpoint_dir` has refused any that were there unrecorded, except the
    checkpoint being resumed, which proves itself) and, when TensorBoard is on, ``runs/`` unless a ``runs/``
    flodl-hf did not record is already there (a user's: never recorded, so no ``--overwrite`` or clean-up
    removes it)."""
    directory = Path(directory)
    marker = read_marker(directory)
    created = not directory.exists() if marker is None else bool(marker.get("created"))
    directory.mkdir(parents=True, exist_ok=True)
    recorded = set(marker.get("entries") or ()) if marker else set()
    runs = ["runs"] if tensorboard and not (directory / "runs").exists() else []
    entries = recorded | {*CHECKPOINT_NAMES, *runs}
    write_marker(directory, "checkpoint", entries, created=created)


def remove_owned(directory: PathLike, names: Sequence[str]) -> None:
    """Delete ``names`` in ``directory`` where its marker records them; the marker and the directory go too when
    flodl-hf created it and nothing else is left. Anything unrecorded stays untouched."""
    directory = Path(directory)
    marker = read_marker(directory)
    if marker is None:
        return
    recorded = set(marker.get("entries") or ())
    for name in names:
        if name not in recorded:
            continue
        target = directory / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
    left = [p.name for p in directory.iterdir() if p.name != MARKER]
    if not any(name in recorded for name in left):
        (directory / MARKER).unlink(missing_ok=True)  # nothing of ours is left: the record goes too
        if not left and marker.get("created"):
            try:
                directory.rmdir()
            except OSError:
                pass


def remove_stale_temporaries(directory: PathLike, names: Sequence[str]) -> None:
    """Remove what an interrupted atomic write of one of ``names`` left in ``directory``: exactly the temporary
    names ``flodl_hf.files.atomic`` makes (``.NAME.XXXXXXXX.tmp`` files, ``.NAME.partial-XXXXXXXX`` and
    ``.NAME.old-XXXXXXXX`` directories), nothing else."""
    directory = Path(directory)
    if not directory.is_dir():
        return
    for name in names:
        quoted = re.escape(name)
        tmp_file = re.compile(rf"^\.{quoted}\.[a-z0-9_]{{8}}\.tmp$")
        staging = re.compile(rf"^\.{quoted}\.(partial-[a-z0-9_]{{8}}|old-[0-9a-f]{{8}})$")
        for stale in list(directory.glob(f".{name}.*")):
            if stale.is_symlink():
                continue
            if stale.is_file() and tmp_file.match(stale.name):
                stale.unlink(missing_ok=True)
            elif stale.is_dir() and staging.match(stale.name):
                if stale.name.startswith(f".{name}.old-") and not (directory / name).exists():
                    os.replace(stale, directory / name)  # killed between the swap's renames: put it back
                else:
                    shutil.rmtree(stale, ignore_errors=True)


def writable_parent(path: PathLike, option: str) -> None:
    """Refuse a path whose parent is missing, not a directory or not writable, or whose name is unusable."""
    path = Path(path)
    name = path.name or str(path)
    try:
        encoded = os.fsencode(name)
    except UnicodeError:
        raise ValueError(f"{option} {path!r} has a name that cannot be encoded on this system: choose a plain "
                         f"name with {option}") from None
    if len(encoded) > 255:
        raise ValueError(f"{option} name is {len(encoded)} bytes long, over the 255 this filesystem allows: "
                         f"choose a shorter {option}")
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes from the shell: every file that records the path would fail
        shown = os.fsencode(str(path))
        raise ValueError(f"{option} {shown!r} is not valid UTF-8, and the run records it (metrics.json, the model "
                         f"card): choose a name in UTF-8 with {option}") from None
    if "\x00" in str(path):
        raise ValueError(f"{option} {path!r} contains a NUL character: choose another {option}")
    parent = path.absolute().parent
    probe = parent
    while not probe.exists():
        if probe.is_symlink():
            raise ValueError(f"{option} {path}: {probe} is a dangling symbolic link: choose another {option}")
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{option} {path}: {probe} is a file, not a directory: choose another {option}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: {probe} is not writable: choose another {option}")


def release_if_empty(directory: PathLike) -> None:
    """Drop flodl-hf's marker from a directory where nothing it recorded is left (and the directory itself when
    flodl-hf created it and it is empty): a failed run leaves no trace, a user's directory keeps only its files."""
    if Path(directory).is_dir():
        remove_owned(directory, ())
