"""Atomic file writes: a reader, or a process killed at any instant, sees the old file or the new one, never half.

Every file flodl-hf writes that a later run reads back (checkpoints, safetensors, metrics) goes through here:
write to a temporary name in the same directory, flush and fsync, ``os.replace`` over the target, fsync the
directory. Whole directories (a saved model, a job's output) are staged in a temporary sibling and swapped in by
renames (:func:`atomic_dir`); callers decide beforehand whether the target may be replaced.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Union

__all__ = ["atomic_path", "atomic_dir", "fsync_dir", "normalise_modes", "default_file_mode"]

PathLike = Union[str, Path]


def fsync_dir(directory: PathLike) -> None:
    """Flush a directory entry (so a completed rename survives a crash); a no-op where unsupported."""
    try:
        fd = os.open(str(directory), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(target: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; when the block succeeds it is fsynced and renamed over it.

    If the block raises, the temporary file is removed and ``target`` is untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=str(target.parent))
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_file_mode() -> int:
    """The mode the umask gives a new file (``mkstemp`` makes 0600, which would hide a checkpoint from the group)."""
    return 0o666 & ~_umask()


def normalise_modes(directory: PathLike) -> None:
    """Give a staged tree the umask's usual modes: mkdtemp makes 0700 directories and transformers 5 writes 0600
    weight files, which would lock other users (a serving account, a shared cache) out of the result."""
    mask = _umask()
    directory = Path(directory)
    os.chmod(directory, 0o777 & ~mask)
    for path in directory.rglob("*"):
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def _move_entries_in(staging: Path, target: Path, last: Sequence[str]) -> None:
    """Move every entry of ``staging`` into the existing directory ``target`` (same-named files replaced, each
    by one rename; ``last`` names moved last, e.g. a marker that says the directory is complete). Refused before
    anything moves when a staged entry would replace a directory or a symbolic link of ``target``. Across
    filesystems (``target`` a mount point) each entry is first copied to a temporary name inside ``target``."""
    names = sorted(p.name for p in staging.iterdir())
    for name in names:
        there = target / name
        if there.is_symlink() or (there.exists() and (there.is_dir() or (staging / name).is_dir())):
            raise FileExistsError(f"cannot write {there}: it exists and is a directory or a link, which flodl-hf "
                                  f"does not replace: move it away or choose another directory")
    same_fs = os.stat(staging).st_dev == os.stat(target).st_dev
    for name in [n for n in names if n not in last] + [n for n in last if n in names]:
        source = staging / name
        if not same_fs:
            copy = target / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
            try:
                if source.is_dir():
                    shutil.copytree(source, copy, symlinks=True)
                else:
                    shutil.copy2(source, copy)
            except BaseException:
                if copy.is_dir():
                    shutil.rmtree(copy, ignore_errors=True)
                else:
                    copy.unlink(missing_ok=True)
                raise
            source = copy
        os.replace(source, target / name)
    shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(target: PathLike, before_swap: Optional[Callable[[], None]] = None, in_place: bool = False,
               last: Sequence[str] = ()) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``target``; when the block succeeds its entries reach ``target``.

    - ``target`` absent: the staged directory is renamed to it (one rename).
    - ``target`` an existing *empty* directory, or any existing directory with ``in_place=True``: the staged
      entries are moved into it, replacing same-named files (``last`` last) and leaving every other entry as it
      is. The directory itself (inode, mode, owner, ACLs, a mount point) is never moved or replaced: it may be
      the user's. Each entry arrives whole; between the first and the last rename a reader may see a mix.
    - otherwise (a non-empty directory the caller decided may be replaced as a whole): two renames, an existing
      target moved aside and the staged one moved in, then the old one deleted, so ``target`` is at every
      instant absent, the old directory or the new one.

    ``before_swap`` runs just before any of this (e.g. to re-check that nothing foreign appeared meanwhile). On
    an exception the staging directory is removed and ``target`` is untouched.
    """
    target = Path(os.path.expanduser(str(target))).absolute()
    if target.is_symlink() and target.is_dir():
        target = target.resolve()  # a link to a directory: write into the directory, never replace the link
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        yield staging
        if before_swap is not None:
            before_swap()
        normalise_modes(staging)
        if target.is_dir() and (in_place or not any(target.iterdir())):
            _move_entries_in(staging, target, last)
            fsync_dir(target)
        elif target.exists():
            old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(target, old)
            try:
                os.replace(staging, target)
            except BaseException:
                os.replace(old, target)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, target)
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
