"""Atomic file writes: a reader, or a process killed at any instant, sees the old file or the new one, never half.

Every file flodl-hf writes that a later run reads back (checkpoints, safetensors, metrics) goes through here:
write to a temporary name in the same directory, flush and fsync, ``os.replace`` over the target, fsync the
directory.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Union

__all__ = ["atomic_path", "fsync_dir"]

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
