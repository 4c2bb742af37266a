"""The safe checkpoint format on disk: a JSON manifest and a safetensors file, written so a reader never sees a mix.

Why it exists: the first checkpoints were one ``torch.save`` pickle, and opening a pickle from someone else (a shared
training directory, a downloaded run) can run arbitrary code. Here nothing is ever unpickled:

* ``NAME.json`` (the **manifest**, e.g. ``checkpoint.json``) holds everything that is not a tensor, as JSON
  (``flodl_hf.checkpoint.tree`` says how tuples, integer keys and NumPy arrays are written), plus
  ``"format": "flodl-hf-checkpoint"``, ``"version"`` (:data:`FORMAT_VERSION`), ``"kind"`` (``setup`` for
  ``graph.save_checkpoint`` and ``flodl-hf train``, ``builder`` for builder mode), the name, size and SHA-256 of
  its tensors file, and its own SHA-256 (over its canonical JSON), so a flipped byte anywhere is detected.
* ``NAME.0.safetensors`` / ``NAME.1.safetensors`` (two **slots**) hold every tensor: weights, optimizer moments,
  RNG states. The manifest names the slot in use.

A write fills the slot the current manifest does *not* name (temporary file, fsync, rename), then replaces the
manifest (temporary file, fsync, rename), then deletes the old slot; it first removes the temporary files a killed
write left (flodl-hf's own temporary names only). A reader, or a process killed at any instant,
therefore finds the old manifest with its complete slot or the new manifest with its complete slot: the rename of
the manifest is the commit. A failed write (full disk, read-only directory) raises
:class:`~flodl_hf.checkpoint.errors.CheckpointWriteError` naming the file, removes what it had written, and leaves
the previous checkpoint loadable. A write never replaces a manifest or slot file that is not flodl-hf's.

Reading checks, before any tensor is parsed: the manifest is JSON (a pickle ``.pt`` is refused as a legacy
checkpoint, with the conversion command), its format and version (a newer one is refused), its checksum, and the
size and SHA-256 of the slot it names; then safetensors (which cannot run code) loads the tensors.

Testing seam: ``FLODL_HF_CHECKPOINT_FAULT="STAGE:ACTION[@N][,...]"`` makes the N-th write (default: every write) in
this process stop at ``STAGE`` (one of :data:`STAGES`) with ACTION ``kill`` (SIGKILL itself), ``enospc`` (an
``OSError(ENOSPC)`` through the real error path) or ``sleep=SECONDS``. Unset, it costs one dictionary lookup.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import struct
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, Union

from ..files.atomic import atomic_path, default_file_mode
from ..files.ownership import remove_stale_temporaries
from .errors import CheckpointError, CheckpointWriteError, ResumeError

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "STAGES", "FAULT_ENV", "LEGACY_FIX", "slot_names", "write_state",
           "read_manifest", "read_state", "looks_like_pickle", "legacy_refusal", "refuse_legacy"]

PathLike = Union[str, Path]

FORMAT_NAME = "flodl-hf-checkpoint"
#: Version 1 was the pickle ``checkpoint.pt``; 2 is this manifest + safetensors format.
FORMAT_VERSION = 2
#: The moments of a write the fault seam can stop at, in order.
STAGES = ("tensors-open", "tensors-written", "tensors-renamed", "manifest-written", "manifest-renamed")
FAULT_ENV = "FLODL_HF_CHECKPOINT_FAULT"
#: The command that converts a legacy pickle checkpoint (named in every refusal of one).
LEGACY_FIX = "flodl-hf convert-checkpoint --trust-pickle"
_MAX_MANIFEST = 1 << 30
_faults_seen: dict[str, int] = {}


def _fault(stage: str, path: Path) -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    _faults_seen[stage] = _faults_seen.get(stage, 0) + 1
    for item in spec.split(","):
        name, _, action = item.strip().partition(":")
        action, _, nth = action.partition("@")
        if name != stage or (nth and int(nth) != _faults_seen[stage]):
            continue
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "enospc":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        elif action.startswith("sleep="):
            time.sleep(float(action[len("sleep="):]))


def slot_names(manifest: PathLike) -> tuple[str, str]:
    """The two tensor-slot file names beside ``manifest`` (``checkpoint.json`` -> ``checkpoint.0.safetensors``,
    ``checkpoint.1.safetensors``)."""
    name = Path(manifest).name
    stem = name[: -len(Path(name).suffix)] if Path(name).suffix else name
    return f"{stem}.0.safetensors", f"{stem}.1.safetensors"


def looks_like_pickle(head: bytes) -> bool:
    """True for the first bytes of a ``torch.save`` zip or a pickle (protocol 2 and later)."""
    return head.startswith(b"PK\x03\x04") or (len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5)


def legacy_refusal(path: PathLike, convert: Optional[PathLike] = None) -> ResumeError:
    """The refusal of the legacy pickle checkpoint ``path`` (opening it could run code), with the command that
    converts it (given ``convert``, the directory holding it, or the file itself)."""
    return ResumeError(f"{path} is a legacy pickle checkpoint (flodl-hf before checkpoint format "
                       f"{FORMAT_VERSION}); opening a pickle can run arbitrary code, so it is not loaded: if you "
                       f"trust where it came from, convert it once with `{LEGACY_FIX} {convert or path}`, then "
                       "resume from the converted checkpoint")


def refuse_legacy(path: PathLike) -> ResumeError:
    """The refusal of a ``.pt`` file where a manifest was expected: a legacy pickle (with the conversion command;
    a ``checkpoint.pt`` converts by its directory), or junk ("unreadable"). Nothing is unpickled."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        return ResumeError(f"checkpoint {path} is unreadable ({exc.strerror or exc})")
    if looks_like_pickle(head):
        return legacy_refusal(path, path.parent if path.name == "checkpoint.pt" else path)
    return ResumeError(f"checkpoint {path} is unreadable: not a flodl-hf checkpoint (it may be damaged or from "
                       "another program): start afresh, or resume from another checkpoint")


def _canonical(manifest: dict) -> bytes:
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True).encode("utf-8")


def _sha256(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while True:
            block = fh.read(1 << 22)
            if not block:
                return size, digest.hexdigest()
            size += len(block)
            digest.update(block)


def _safetensors_metadata(path: Path) -> Optional[dict]:
    """The ``__metadata__`` of a safetensors file's header (None: not a safetensors file)."""
    try:
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if length > 100_000_000:
                return None
            header = json.loads(fh.read(length).decode("utf-8"))
    except (OSError, ValueError, struct.error):
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else None


def _ours(path: Path) -> bool:
    """A manifest or slot file flodl-hf may replace: absent, or one of its own."""
    if not path.exists() and not path.is_symlink():
        return True
    if path.is_symlink() or not path.is_file():
        return False
    if not os.access(path, os.R_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    if path.suffix == ".safetensors":
        return (_safetensors_metadata(path) or {}).get("format") == FORMAT_NAME
    try:
        with open(path, "rb") as fh:
            return f'"{FORMAT_NAME}"'.encode() in fh.read(4096)
    except OSError:
        return False


def _current_slot(manifest: Path) -> Optional[str]:
    try:
        return json.loads(manifest.read_text(encoding="utf-8"))["tensors"]["file"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_error(exc: OSError, target: Path) -> CheckpointWriteError:
    where = exc.filename or target
    problem = {errno.ENOSPC: "no space left on the device", getattr(errno, "EDQUOT", -1): "disk quota exceeded",
               errno.EFBIG: "no space left on the device (the file size limit, ulimit -f, was reached)",
               errno.EROFS: "read-only filesystem", errno.EACCES: "permission denied",
               errno.EPERM: "permission denied"}.get(exc.errno, (exc.strerror or type(exc).__name__).lower())
    return CheckpointWriteError(f"{problem} writing checkpoint {where}; the previous checkpoint in {target.parent}, "
                                "if any, is intact and loadable: free space or make the directory writable, or "
                                "write checkpoints to another directory (flodl-hf train: --checkpoint-dir)")


def _save_tensors(tensors: dict, tmp: Path) -> tuple[int, str]:
    """Serialise ``tensors`` with safetensors in memory and write the bytes to ``tmp`` ourselves; returns (size,
    sha256). Not ``save_file``: its Rust writer creates a temporary file of its own (``.tmpXXXXXX``) beside the
    target, which a SIGKILL mid-write left in the checkpoint directory, a file flodl-hf could not recognise as its
    own. The cost is one in-memory copy of the tensors while writing."""
    from safetensors.torch import save

    data = save(tensors, metadata={"format": FORMAT_NAME})
    with open(tmp, "wb") as fh:  # a full disk is the OSError it is (ENOSPC / EFBIG)
        fh.write(data)
    return len(data), hashlib.sha256(data).hexdigest()


def write_state(manifest: PathLike, state: Any, kind: str) -> Path:
    """Write ``state`` (a nested dict of tensors and plain values) as the checkpoint ``manifest`` names, atomically
    (see the module docstring); returns the manifest path. The caller holds the directory's lock."""
    from .tree import encode

    target = Path(manifest)
    json_state, tensors = encode(state)  # an unstorable value is refused before anything is written
    slots = slot_names(target)
    new = slots[1] if _current_slot(target) == slots[0] else slots[0]
    new_path, old_path = target.parent / new, target.parent / (slots[0] if new == slots[1] else slots[1])
    slot_in_place = False
    try:
        for path in (target, new_path, old_path):
            if not _ours(path):
                raise CheckpointError(f"{path} exists and was not written by flodl-hf, which never replaces other "
                                      "files: move it away, or write checkpoints to another directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        # what a killed write left (only flodl-hf's temporary names; safe: the caller holds the lock)
        remove_stale_temporaries(target.parent, [target.name, *slots])
        with atomic_path(new_path) as tmp:
            _fault("tensors-open", tmp)
            size, digest = _save_tensors(tensors, tmp)
            os.chmod(tmp, default_file_mode())  # mkstemp makes 0600
            _fault("tensors-written", tmp)
        slot_in_place = True
        _fault("tensors-renamed", new_path)
        from .. import __version__

        record = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "kind": kind,
                  "written_by": f"flodl-hf {__version__}",
                  "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "tensors": {"file": new, "bytes": size, "sha256": digest}, "state": json_state}
        record["sha256"] = hashlib.sha256(_canonical(record)).hexdigest()
        text = json.dumps(record, indent=1, sort_keys=True, allow_nan=True) + "\n"
        with atomic_path(target) as tmp:
            os.chmod(tmp, default_file_mode())
            tmp.write_text(text, encoding="utf-8")
            _fault("manifest-written", tmp)
        slot_in_place = False  # the manifest names it now: it is the checkpoint
        _fault("manifest-renamed", target)
        old_path.unlink(missing_ok=True)
    except OSError as exc:
        if slot_in_place:
            new_path.unlink(missing_ok=True)  # written but never named by a manifest: free its space
        raise _write_error(exc, target) from exc
    return target


def _refuse(path: Path, problem: str) -> ResumeError:
    return ResumeError(f"checkpoint {path} {problem}: start afresh, or resume from another checkpoint")


def read_manifest(path: PathLike, kind: Optional[str] = None) -> dict:
    """The verified manifest at ``path`` (JSON, format, version, checksum, slot name); ResumeError naming the file
    otherwise. Reads no tensor and imports no torch."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > _MAX_MANIFEST:
            raise _refuse(path, f"is {size} bytes, larger than any flodl-hf manifest")
        raw = path.read_bytes()
    except OSError as exc:
        raise ResumeError(f"no checkpoint at {path} ({exc.strerror or exc}): pass a checkpoint written by "
                          "flodl-hf") from exc
    if looks_like_pickle(raw[:4]):
        raise legacy_refusal(path)  # a builder checkpoint path given a legacy .pt
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _refuse(path, "is unreadable: not valid JSON (truncated or damaged, or not a flodl-hf "
                            "checkpoint)") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT_NAME:
        raise _refuse(path, f"is unreadable: not a flodl-hf checkpoint (no \"format\": \"{FORMAT_NAME}\")")
    version = record.get("version")
    if type(version) is not int:
        raise _refuse(path, f"has no valid format version ({str(version)[:20]!r})")
    if version > FORMAT_VERSION:
        raise ResumeError(f"checkpoint {path} has format version {version}, newer than this flodl-hf reads "
                          f"({FORMAT_VERSION}): upgrade flodl-hf (pip install -U flodl-hf) to resume it")
    if version < FORMAT_VERSION:
        raise _refuse(path, f"has format version {version}, which was never a manifest format")
    if record.get("sha256") != hashlib.sha256(_canonical(record)).hexdigest():
        raise _refuse(path, "is corrupted: its SHA-256 does not match its content")
    tensors = record.get("tensors")
    if not isinstance(tensors, dict) or tensors.get("file") not in slot_names(path) \
            or type(tensors.get("bytes")) is not int or not isinstance(tensors.get("sha256"), str):
        raise _refuse(path, f"names no valid tensors file (expected one of {list(slot_names(path))})")
    if kind is not None and record.get("kind") != kind:
        raise _refuse(path, f"is a {str(record.get('kind'))[:20]!r} checkpoint, not a {kind!r} one")
    return record


def read_state(path: PathLike, kind: Optional[str] = None) -> dict:
    """The state :func:`write_state` wrote at ``path``, every file verified (see the module docstring)."""
    from safetensors.torch import load_file

    from .tree import decode

    path = Path(path)
    record = read_manifest(path, kind)
    info = record["tensors"]
    slot = path.parent / info["file"]
    if not slot.is_file():
        raise _refuse(path, f"names tensors file {slot}, which is missing")
    size, digest = _sha256(slot)
    if size != info["bytes"]:
        raise _refuse(slot, f"is truncated or damaged: {size} bytes where its manifest {path.name} records "
                            f"{info['bytes']}")
    if digest != info["sha256"]:
        raise _refuse(slot, f"is corrupted: its SHA-256 does not match the one its manifest {path.name} records")
    try:
        tensors = load_file(str(slot))
    except Exception as exc:  # noqa: BLE001 - safetensors' own error types differ by version
        raise _refuse(slot, f"is unreadable ({type(exc).__name__}: {str(exc)[:200]})") from exc
    state = decode(record["state"], tensors, str(path))
    if not isinstance(state, dict):
        raise _refuse(path, "holds no state dictionary")
    return state
