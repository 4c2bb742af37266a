"""One reader for the files a user hands flodl-hf: checked before they are opened, bounded while they are read.

Why it exists: a path can name something a plain ``open().read()`` never returns from (a FIFO blocks, ``/dev/zero``
never ends), a symlink loop makes ``pathlib`` throw, and JSON nested a few thousand levels deep overflows the
parser's stack. Each reader that met one of these failed in its own way (a hang, ``MemoryError``,
``RecursionError``, a chained traceback). Here every such file gets the same checks, refused in one line naming the
option and a fix: a regular file (or, where allowed, a directory), no symlink loop, a size bound fit for its kind,
and, for JSON, a nesting bound.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any

__all__ = ["JSON_DEPTH", "RefusedFile", "UnreadableJson", "read_bytes", "read_json", "require_regular_file"]

#: Nesting deeper than this is refused in JSON a user hands flodl-hf (its own files nest a few levels).
JSON_DEPTH = 64


class RefusedFile(ValueError):
    """A file refused before it is read: not a regular file, a symlink loop, too large or nested too deep."""


class UnreadableJson(ValueError):
    """A regular file, within its bounds, that is not valid UTF-8 JSON."""


def require_regular_file(path: Any, option: str, missing_ok: bool = False, directory_ok: bool = True) -> None:
    """Refuse an input that exists but is not a regular file (a FIFO, a socket, a device), or a symlink loop,
    before it is opened: reading one blocks, never ends or throws."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if missing_ok:
            return
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RefusedFile(f"{option}: {os.fspath(path)} is a symlink loop (its links never reach a file): "
                              f"give {option} the path of the file itself") from None
        return  # unreadable: the reader names it
    if stat.S_ISDIR(mode) and directory_ok:
        return
    if not stat.S_ISREG(mode):
        raise RefusedFile(f"{option}: {os.fspath(path)} is not a regular file (a FIFO, socket or device), which "
                          f"could block forever or change while read: give a regular file with {option}")


def read_bytes(path: Any, option: str, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (checked before and while reading)."""
    require_regular_file(path, option, directory_ok=False)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise RefusedFile(f"{option}: {os.fspath(path)} is larger than {limit:,} bytes, more than a file of this "
                          f"kind holds: give {option} the file an earlier run wrote")
    return data


def read_json(path: Any, option: str, limit: int = 64 * 1024 * 1024, depth: int = JSON_DEPTH) -> Any:
    """The JSON in a regular file of at most ``limit`` bytes, nested at most ``depth`` levels."""
    data = read_bytes(path, option, limit)
    try:
        value = json.loads(data.decode("utf-8"))
    except RecursionError:
        value, deep = None, True
    except (UnicodeDecodeError, ValueError) as exc:
        raise UnreadableJson(f"{option}: {os.fspath(path)} is not valid JSON ({type(exc).__name__}: "
                             f"{str(exc)[:160]})") from None
    else:
        deep = _depth(value) > depth
    if deep:
        raise RefusedFile(f"{option}: {os.fspath(path)} is JSON nested deeper than {depth} levels, which no file of "
                          f"this kind is: give {option} the file an earlier run wrote")
    return value


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in item if isinstance(child, (dict, list)))
    return deepest
