"""One writer per checkpoint or output path: a lock file that names its holder and dies with it.

Why it exists: two runs writing the same checkpoint directory would take turns replacing each other's checkpoint,
and two ``flodl-hf train`` runs with the same ``--output-dir`` would race to swap it in. The second run must stop at
once with a line naming the first.

The lock of a path ``P`` (a directory or a builder checkpoint file) is the file ``.P-NAME.lock`` beside it
(``<parent>/.<name>.lock``), so the directory itself holds only what its owner wrote, and an output directory that
is swapped in whole at the end can be locked before it exists. The file holds JSON naming the holder (pid, host,
start time, what it writes, its command) and is held with ``fcntl.flock``: the kernel releases a flock when the
process dies, even by SIGKILL, so a lock file left behind by a killed run is stale, never blocking; the next run
takes it over (it is flodl-hf's own file, recognised by its content). A lock file whose content is not flodl-hf's
is refused, never overwritten. The file is created complete (written, locked, then linked into place), so a second
run never finds an empty lock; released locks are unlinked by their holder.

:func:`acquire` / :meth:`Lock.release` bracket a job; :func:`hold` keeps a lock until the process exits (setup mode:
``graph.save_checkpoint`` holds its directory from the first save on). Both count per process, so one process may
lock the same path twice. On platforms without ``fcntl`` (Windows) locking is skipped.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import stat
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Union

from ..checkpoint.errors import CheckpointLockedError, CheckpointWriteError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["Lock", "acquire", "hold", "lock_path", "holder"]

PathLike = Union[str, Path]
_KIND = "lock"
_held: dict[str, "Lock"] = {}


def lock_path(target: PathLike) -> Path:
    """The lock file of ``target``: ``<parent>/.<name>.lock`` (inside it when ``target`` is a root)."""
    target = Path(os.path.abspath(os.path.expanduser(str(target))))
    if not target.name:
        return target / ".flodl-hf.lock"
    return target.parent / f".{target.name}.lock"


def holder(path: PathLike) -> Optional[dict]:
    """The holder record in a lock file (None: absent, unreadable or not flodl-hf's)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("generator") == "flodl-hf" and data.get("kind") == _KIND \
        else None


def _record(what: str) -> bytes:
    data = {"generator": "flodl-hf", "kind": _KIND, "pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds"), "what": what,
            "command": " ".join(sys.argv)[:300]}
    return (json.dumps(data) + "\n").encode("utf-8")


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev)


class Lock:
    """A held lock (see the module docstring); :meth:`release` unlinks its file once the last user releases it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd, self.pid, self.refs = path, fd, os.getpid(), 0

    def release(self) -> None:
        """Drop one use; the last one unlinks the lock file and closes it (only in the process that locked)."""
        self.refs -= 1
        if self.refs > 0 or os.getpid() != self.pid or self.fd < 0:
            return
        _held.pop(str(self.path), None)
        try:
            if _same_file(self.fd, self.path):
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(self.fd)
            self.fd = -1


def _create(path: Path, what: str) -> Optional[int]:
    """Create ``path`` complete and locked (None: it already exists)."""
    fd, tmp = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".new", dir=str(path.parent))
    try:
        os.write(fd, _record(what))
        os.fsync(fd)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.chmod(tmp, 0o644)
        try:
            os.link(tmp, path)
        except FileExistsError:
            os.close(fd)
            return None
        return fd
    except BaseException:
        os.close(fd)
        raise
    finally:
        os.unlink(tmp)


def _busy(target: Path, path: Path, what: str, fix: str) -> CheckpointLockedError:
    info = holder(path) or {}
    who = (f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}"
           + (f": {info['command']}" if info.get("command") else "")) if info else "its holder is still writing it"
    return CheckpointLockedError(f"{what} {target} is in use by another flodl-hf run ({who}; lock {path}): wait "
                                 f"for that run to finish or stop it, or {fix}")


def _take(target: Path, what: str, fix: str) -> Optional[int]:
    path = lock_path(target)
    for _ in range(50):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = _create(path, what)
        except OSError as exc:
            raise CheckpointWriteError(f"cannot create the lock file {path} of {what} {target} "
                                       f"({(exc.strerror or str(exc)).lower()}): make {path.parent} writable, or "
                                       f"{fix}") from exc
        if fd is not None:
            return fd
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            continue  # released meanwhile: try again
        except OSError:
            raise CheckpointLockedError(f"lock file {path} of {what} {target} cannot be opened (not a regular "
                                        f"file?): move it away, or {fix}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device would block every read of its holder
            os.close(fd)
            raise CheckpointLockedError(f"lock file {path} of {what} {target} is not a regular file (a FIFO, socket "
                                        f"or device): move it away, or {fix}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _busy(target, path, what, fix) from None
        if not _same_file(fd, path):
            os.close(fd)  # its holder released (unlinked) it between our open and our lock
            continue
        if holder(path) is None:
            os.close(fd)
            raise CheckpointLockedError(f"{path} exists and was not written by flodl-hf, which never replaces other "
                                        f"files: move it away, or {fix}")
        os.ftruncate(fd, 0)  # a run that died (SIGKILL, power loss) left it: take it over
        os.pwrite(fd, _record(what), 0)
        os.fsync(fd)
        return fd
    raise CheckpointLockedError(f"could not lock {what} {target} ({path} kept changing): {fix}")


def acquire(target: PathLike, what: str = "checkpoint directory",
            fix: str = "write to another directory") -> Lock:
    """Lock ``target`` for this process (again: one more use); CheckpointLockedError naming the holder when
    another live process has it. ``what`` and ``fix`` word the refusal."""
    path = lock_path(target)
    lock = _held.get(str(path))
    if lock is None or lock.pid != os.getpid():
        if fcntl is None:  # pragma: no cover - Windows: no locking
            lock = Lock(path, -1)
        else:
            lock = Lock(path, _take(Path(target), what, fix))
        _held[str(path)] = lock
    lock.refs += 1
    return lock


def hold(target: PathLike, what: str = "checkpoint directory", fix: str = "write to another directory") -> None:
    """Hold ``target``'s lock until this process exits, unless this process already holds it (then nothing)."""
    lock = _held.get(str(lock_path(target)))
    if lock is not None and lock.pid == os.getpid():
        return
    acquire(target, what, fix)


@atexit.register
def _release_all() -> None:
    for lock in list(_held.values()):
        lock.refs = 1
        lock.release()

