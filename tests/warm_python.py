"""A warm Python: ``python ARGS`` as a fork of a server that imported torch and transformers once.

Why it exists: a fresh interpreter that imports torch and transformers costs 3-6 s on the project's 2-core machine,
and the docs' blocks and the command-line tests start dozens of them. Here a server imports the heavy modules once
and forks for every command; the fork runs the command as a fresh ``python`` would (a new ``__main__``, ``sys.argv``,
``sys.path[0]``, the caller's working directory, environment and standard streams, the interpreter's exit: non-daemon
threads joined, ``atexit`` run, the exit code or the killing signal handed back), so each command is still a process
of its own, only one that starts with its imports done.

The client (``python -I -S tests/warm_python.py client SOCKET ARGS...``, a few milliseconds of start-up) stands in
for ``python ARGS``: it hands its three standard streams, working directory and environment to the server, forwards
SIGINT / SIGTERM / SIGHUP to the command and exits with its code (or dies of its signal). Where the fork could differ
from a fresh interpreter the client runs the real one instead: an interpreter option other than ``-m``, ``-c``,
``-u``, ``-B``, a script or ``-``, an environment that differs from the server's in a variable read at import
(torch's, OpenMP's, Hugging Face's, Python's own), or a resource limit other than the descriptors'. Commands that
are killed with SIGKILL (which cannot be forwarded) or that check what a fresh interpreter imports keep a real
subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

__all__ = ["WarmPython", "session", "python_command", "torchrun_command", "close_session", "serve", "client",
           "IMPORT_TIME_PREFIXES", "PRELOAD"]

#: Environment variables whose value a module may read once, at import: a request that changes one runs the real
#: interpreter. PYTHONPATH is applied per command (``sys.path``), so it may differ.
IMPORT_TIME_PREFIXES = ("OMP_", "MKL_", "KMP_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TORCH", "PYTORCH_", "CUDA_",
                        "NCCL_", "GLOO_", "TOKENIZERS_", "PYTHON", "XDG_CACHE_HOME", "LD_", "TQDM_", "NUMEXPR_",
                        "OPENBLAS_")
#: Modules the server imports before it forks: what the docs' blocks and the command line spend their start-up on.
PRELOAD = ("torch", "torch.distributed", "torch.utils.data", "numpy", "safetensors.torch", "tokenizers",
           "transformers", "transformers.models.bert.modeling_bert", "transformers.models.auto.modeling_auto",
           "transformers.models.auto.tokenization_auto", "flodl_hf.cli", "flodl_hf.cli.parser")
_LENGTH = struct.Struct("!Q")
_CODE = struct.Struct("!q")
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Resource limits a command inherits from its caller (``ulimit``). The descriptor limit is set in the fork; a
#: different limit of another kind (memory, say, which the server's imports already use) runs the real interpreter.
LIMITS = ("RLIMIT_NOFILE", "RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_STACK", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NPROC",
          "RLIMIT_CORE", "RLIMIT_MEMLOCK")
_MAX_FDS = 250  # SCM_RIGHTS carries at most 253 descriptors in one message
#: The stand-in for ``python`` next to the server's socket: a command's ``sys.executable`` and multiprocessing's
#: interpreter, so the processes a command starts itself are warm too.
STAND_IN = "python-stand-in"


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except socket.timeout:  # the client's short timeout: its signal handlers get their turn
            continue
        if not chunk:
            return data
        data += chunk
    return data


#: What torchrun sets for its workers under a TORCH prefix; torch reads them when a rank joins its group, not at
#: import, so a worker of a warm torchrun stays warm.
LAUNCH_TIME = ("TORCHELASTIC_", "TORCH_NCCL_ASYNC_ERROR_HANDLING")


#: Variables read at the import of one library, which the server may not have imported: they matter only if it has.
READ_BY = {"HF_DATASETS_": "datasets", "MPL": "matplotlib"}


def _differs_at_import(env: dict, base: dict) -> list[str]:
    ignored = tuple(prefix for prefix, module in READ_BY.items() if module not in sys.modules)
    keys = set(env) | set(base)
    return sorted(k for k in keys if k.startswith(IMPORT_TIME_PREFIXES + tuple(READ_BY))
                  and not k.startswith(LAUNCH_TIME + ignored) and k != "PYTHONPATH" and env.get(k) != base.get(k))


# --- the client: stands in for `python ARGS` ---------------------------------------------------------------------

def client(path: str, args: list[str]) -> None:
    """Run ``python ARGS`` through the server at ``path``; exit as that command exits."""
    target: list[int] = []
    pending: list[int] = []

    def forward(number: int, _frame: object) -> None:
        if target:
            os.kill(target[0], number)
        else:  # before the command has a process: delivered as soon as it has one
            pending.append(number)

    for number in _FORWARDED:
        signal.signal(number, forward)
    inherited = _open_fds()  # before the connection: the command gets what this process was started with
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    # A signal that lands just before a blocking recv starts would wait for the recv to return before its Python
    # handler runs (possibly never): waiting in short slices lets every forwarded signal through at once.
    sock.settimeout(0.2)
    message = json.dumps({"argv": args, "cwd": os.getcwd(), "env": dict(os.environ), "fds": inherited,
                          "limits": _limits()}).encode()
    socket.send_fds(sock, [_LENGTH.pack(len(message)) + message], inherited)
    head = _recv_exact(sock, _CODE.size)
    if len(head) < _CODE.size:
        os.write(2, b"warm_python: the server closed the connection before starting the command\n")
        os._exit(1)
    target.append(_CODE.unpack(head)[0])
    for number in pending:
        os.kill(target[0], number)
    tail = _recv_exact(sock, _CODE.size)
    status = _CODE.unpack(tail)[0] if len(tail) == _CODE.size else -int(signal.SIGKILL)
    if status < 0:  # the command died of a signal: so does its stand-in, as its caller would see it
        if -status not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status)


def _limits() -> dict[str, list[int]]:
    import resource

    return {name: list(resource.getrlimit(getattr(resource, name))) for name in LIMITS}


def _set_limits(limits: dict[str, list[int]]) -> None:
    import resource

    for name, value in limits.items():
        if list(resource.getrlimit(getattr(resource, name))) != value:
            resource.setrlimit(getattr(resource, name), tuple(value))


def _open_fds() -> list[int]:
    """Every descriptor this process holds (the standard streams and what a caller passed, such as the pipes
    multiprocessing's spawned children are handed by number), at most what one message can carry."""
    listed = sorted(int(name) for name in os.listdir("/proc/self/fd"))
    fds = []
    for fd in listed:
        try:
            os.fstat(fd)
        except OSError:  # the listing's own descriptor, closed by now
            continue
        fds.append(fd)
    if len(fds) > _MAX_FDS:
        os.write(2, f"warm_python: {len(fds)} open descriptors, more than {_MAX_FDS} can be handed on\n".encode())
        os._exit(1)
    return fds


# --- the server: imports once, forks per command -----------------------------------------------------------------

def serve(path: str) -> None:
    """Import the heavy modules, listen at ``path`` and fork a command per connection (never returns)."""
    import importlib
    import select

    for name in PRELOAD:
        importlib.import_module(name)
    base_env = dict(os.environ)
    base_path = [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the forks are reaped by the kernel: the server never waits
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    parent = os.getppid()
    while True:
        if not select.select([server], [], [], 1.0)[0]:
            if os.getppid() != parent:  # the test session is gone (killed before it could stop the server)
                os._exit(0)
            continue
        conn, _ = server.accept()
        try:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 16, _MAX_FDS)
            size = _LENGTH.unpack(data[:_LENGTH.size])[0]
            body = data[_LENGTH.size:]
            body += _recv_exact(conn, size - len(body))
            request = json.loads(body)
            request["socket"] = path
        except Exception:  # noqa: BLE001 - a broken client: drop it, keep serving
            conn.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            server.close()
            _supervise(conn, request, fds, base_env, base_path)
        conn.close()
        for fd in fds:
            os.close(fd)


def _supervise(conn: socket.socket, request: dict, fds: list[int], base_env: dict, base_path: list[str]) -> None:
    """In the fork: start the command (one more fork, or the real interpreter) and report how it ended."""
    import fcntl

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    targets = request["fds"][:len(fds)]
    floor = max([*targets, 2]) + 1  # above every target, so moving one never overwrites another
    kept = fcntl.fcntl(conn.fileno(), fcntl.F_DUPFD_CLOEXEC, floor)
    conn.close()
    conn = socket.socket(fileno=kept)
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in fds]
    for fd in fds:
        os.close(fd)
    for target, fd in zip(targets, moved):
        os.dup2(fd, target)  # inheritable, as the caller's descriptor was
        os.close(fd)
    status = 1
    try:
        args = request["argv"]
        real = _needs_real_interpreter(args, request, base_env)
        pid = os.fork()
        if pid == 0:
            conn.close()
            if real:
                os.chdir(request["cwd"])
                _set_limits(request["limits"])
                os.execve(sys.executable, [sys.executable, *args], request["env"])
            _run_command(args, request, base_path)
        conn.sendall(_CODE.pack(pid))
        status = _wait(pid, conn)
    finally:
        try:
            conn.sendall(_CODE.pack(status))
        finally:
            os._exit(0)


def _split_flags(args: list[str]) -> tuple[set[str], list[str]]:
    """The leading ``-u`` and ``-B`` (multiprocessing passes on the latter) and the arguments after them."""
    flags = set()
    while args and args[0] in ("-u", "-B"):
        flags, args = flags | {args[0]}, args[1:]
    return flags, args


def _wait(pid: int, conn: socket.socket) -> int:
    """The command's exit code (minus its signal); a stand-in that goes away first (killed, say by a test's
    timeout) takes the command with it, as killing a real interpreter would."""
    import select

    pidfd = os.pidfd_open(pid)
    try:
        while True:
            ready, _, _ = select.select([pidfd, conn], [], [])
            if pidfd in ready:
                break
            if not conn.recv(1):  # the stand-in is gone
                os.kill(pid, signal.SIGKILL)
                break
    finally:
        os.close(pidfd)
    _, wait_status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(wait_status)


def _needs_real_interpreter(args: list[str], request: dict, base_env: dict) -> bool:
    _, rest = _split_flags(args)
    if _differs_at_import(request["env"], base_env) or not rest:  # not rest: an interactive interpreter
        return True
    server_limits = _limits()  # the descriptor limit is set in the fork; another one would need fresh imports
    if any(value != server_limits[name] for name, value in request["limits"].items() if name != "RLIMIT_NOFILE"):
        return True
    return rest[0].startswith("-") and rest[0] not in ("-m", "-c", "-")


def _run_command(args: list[str], request: dict, base_path: list[str]) -> None:
    """In the command's process: become ``python ARGS`` and exit as the interpreter would (never returns)."""
    import atexit
    import importlib
    import io
    import runpy
    import threading
    import traceback
    import types

    flags, args = _split_flags(args)
    unbuffered = "-u" in flags or bool(request["env"].get("PYTHONUNBUFFERED"))
    sys.dont_write_bytecode = "-B" in flags or bool(request["env"].get("PYTHONDONTWRITEBYTECODE"))
    os.chdir(request["cwd"])
    _set_limits(request["limits"])  # by now only the descriptor limit can differ
    os.environ.clear()
    os.environ.update(request["env"])
    stand_in = os.path.join(os.path.dirname(request["socket"]), STAND_IN)
    if os.path.exists(stand_in):  # what the command starts with sys.executable, or multiprocessing spawns, is warm
        sys.executable = stand_in
        spawn = sys.modules.get("multiprocessing.spawn")
        if spawn is not None:  # read at its import; a later import reads the sys.executable above
            spawn.set_executable(stand_in)
    process = sys.modules.get("multiprocessing.process")
    if process is not None:  # read at its import, in a fresh interpreter the command's start directory
        process.ORIGINAL_DIR = os.path.abspath(request["cwd"])  # type: ignore[attr-defined]
    sys.stdin = io.TextIOWrapper(open(0, "rb", closefd=False, buffering=0 if unbuffered else -1))
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), line_buffering=unbuffered or os.isatty(1),
                                  write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), errors="backslashreplace", line_buffering=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    code = 0
    try:
        if args[0] == "-m":
            sys.path[:] = [os.getcwd(), *extra, *base_path]
        elif args[0] in ("-c", "-"):
            sys.path[:] = ["", *extra, *base_path]
        else:
            sys.path[:] = [os.path.dirname(os.path.abspath(args[0])), *extra, *base_path]
        importlib.invalidate_caches()
        sys.orig_argv = [sys.executable, *args]
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = __builtins__
        sys.modules["__main__"] = main
        if args[0] == "-m":
            sys.argv = ["-m", *args[2:]]
            runpy._run_module_as_main(args[1])  # type: ignore[attr-defined] - what `python -m` itself calls
        elif args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            exec(compile(args[1], "<string>", "exec"), main.__dict__)
        elif args[0] == "-":
            sys.argv = ["-", *args[1:]]
            exec(compile(sys.stdin.read(), "<stdin>", "exec"), main.__dict__)
        else:
            sys.argv = list(args)
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__, "<frozen runpy>"):
            tb = tb.tb_next  # the interpreter's traceback starts at the command's own frames
        try:
            sys.excepthook(type(exc), exc.with_traceback(tb), tb)  # the command's own hook, as the interpreter
        except BaseException:  # noqa: BLE001 - a failing hook: the interpreter's own report of both
            print("Error in sys.excepthook:", file=sys.stderr)
            traceback.print_exc()
            print("\nOriginal exception was:", file=sys.stderr)
            traceback.print_exception(type(exc), exc, tb)
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined] - the interpreter joins non-daemon threads first
        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = _exit_code(exc)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe: nothing more to say
            pass
    os._exit(code)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


# --- in the test process ---------------------------------------------------------------------------------------

class WarmPython:
    """A server started with ``env`` (its import-time environment); ``command(*args)`` is the command line that
    stands in for ``[sys.executable, *args]``, ``write_wrappers(dir)`` writes ``python`` and ``flodl-hf`` there."""

    def __init__(self, env: dict, workdir: str) -> None:
        import subprocess

        self.socket = os.path.join(workdir, "warm.sock")
        self._write_stand_in(os.path.join(workdir, STAND_IN))
        self._proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", self.socket], env=env,
                                      cwd=workdir, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        line = self._proc.stdout.readline() if self._proc.stdout is not None else b""
        if line.strip() != b"ready":
            self.close()
            raise RuntimeError(f"the warm Python server did not start (exit code {self._proc.poll()})")

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-I", "-S", os.path.abspath(__file__), "client", self.socket, *map(str, args)]

    def torchrun(self, options: list[str], *script: str) -> list[str]:
        """``[sys.executable, "-m", "torch.distributed.run", *options, *script]`` with torchrun and its workers
        warm (torchrun's ``--no-python`` runs the stand-in for ``python`` in each worker)."""
        wrapper = os.path.join(os.path.dirname(self.socket), STAND_IN)
        return self.command("-m", "torch.distributed.run", *map(str, options), "--no-python", wrapper,
                            *map(str, script))

    def write_wrappers(self, directory: str) -> None:
        self._write_stand_in(os.path.join(directory, "python"))
        self._write_stand_in(os.path.join(directory, "flodl-hf"), " -m flodl_hf")

    def _write_stand_in(self, path: str, args: str = "") -> None:
        """An executable at ``path`` that is ``python{args}`` on this server."""
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(f'#!/bin/sh\nexec "{sys.executable}" -I -S "{os.path.abspath(__file__)}" client '
                         f'"{self.socket}"{args} "$@"\n')
        os.chmod(path, 0o755)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except Exception:  # noqa: BLE001 - it would not stop: force it
                self._proc.kill()
                self._proc.wait()


_SESSION: "WarmPython | None" = None
_SESSION_DIR: "str | None" = None


def session() -> WarmPython:
    """The test session's warm server (started on first use, with this process's environment and one torch thread,
    what the suite's subprocesses run with)."""
    global _SESSION, _SESSION_DIR
    if _SESSION is None:
        import tempfile

        _SESSION_DIR = tempfile.mkdtemp(prefix="warm-python-")
        _SESSION = WarmPython(dict(os.environ, OMP_NUM_THREADS="1"), _SESSION_DIR)
    return _SESSION


def python_command(*args: str) -> list[str]:
    """``[sys.executable, *args]`` on the test session's warm server."""
    return session().command(*args)


def torchrun_command(options: list[str], *script: str) -> list[str]:
    """``[sys.executable, "-m", "torch.distributed.run", *options, *script]`` on the test session's warm server,
    workers included."""
    return session().torchrun(options, *script)


def close_session() -> None:
    """Stop the session's server (the commands it started have their own processes)."""
    global _SESSION, _SESSION_DIR
    if _SESSION is not None:
        import shutil

        _SESSION.close()
        shutil.rmtree(_SESSION_DIR or "", ignore_errors=True)
    _SESSION = _SESSION_DIR = None


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        client(sys.argv[2], sys.argv[3:])
