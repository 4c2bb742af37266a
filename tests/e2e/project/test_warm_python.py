"""The warm interpreter stands in for ``python``: every command gives what a fresh ``python`` gives (exit code or
signal, stdout, stderr, files), the reference being the real interpreter run the same way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from warm_python import WarmPython

SCRIPT = textwrap.dedent("""\
    import atexit, os, sys, threading, time
    atexit.register(lambda: print("atexit", flush=True))
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined before atexit"))).start()
    print(__name__, sys.argv[1:], os.path.basename(sys.argv[0]), sys.path[0] == os.getcwd(), os.getcwd())
    print(os.environ.get("WARM_TEST_SETTING"), sys.orig_argv[1:2] == sys.argv[:1])
    print(sys.stdin.read().upper())
    sys.stderr.write("to stderr\\n")
    open("written.txt", "w").write("a file")
    if len(sys.argv) > 1 and sys.argv[1].isdigit():
        sys.exit(int(sys.argv[1]))
""")
SPAWN = textwrap.dedent("""\
    import multiprocessing as mp

    def square(x):
        return x * x

    if __name__ == "__main__":
        with mp.get_context("spawn").Pool(1) as pool:
            print(pool.map(square, [2, 3]))
""")
CASES = {
    "script": (["script.py", "a", "b"], "stdin text"),
    "script exit code": (["script.py", "7"], ""),
    "module": (["-m", "json.tool"], '{"b": 1, "a": [2]}'),
    "module of the checkout": (["-m", "flodl_hf", "train", "--epochs", "0"], ""),
    "code": (["-c", "import sys; print(sys.argv); sys.exit('a message')", "x"], ""),
    "stdin": (["-"], "print('from stdin')\nraise SystemExit(4)\n"),
    "uncaught exception": (["-c", "def f():\n    raise ValueError('deep')\nf()"], ""),
    "unbuffered": (["-u", "-c", "import sys; print(1); sys.stderr.write('2\\n'); print(3)"], ""),
    "no bytecode written": (["-B", "-c", "import sys; print(sys.dont_write_bytecode)"], ""),
    "unbuffered by the environment": (["-c", "import sys; print(sys.stdout.write_through)"], ""),
    "killed by a signal": (["-c", "import os, signal; print('bye', flush=True); os.kill(os.getpid(), signal.SIGTERM)"],
                           ""),
    "killed by SIGKILL": (["-c", "import os, signal; print('bye', flush=True); os.kill(os.getpid(), signal.SIGKILL)"],
                          ""),
    "spawned workers": (["spawn.py"], ""),
    "the caller's descriptor limit": (["-c", "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))"],
                                      ""),
    "the caller's memory limit": (["-c", "import resource; print(resource.getrlimit(resource.RLIMIT_AS))"], ""),
    "an uncaught exception through the command's hook": (
        ["-c", "import sys\nsys.excepthook = lambda t, v, tb: print('hooked', t.__name__, v)\nraise KeyError('k')"],
        ""),
    "a descriptor handed to a child by number": (
        ["-c", "import os, subprocess, sys\nr, w = os.pipe()\n"
               "child = subprocess.Popen([sys.executable, '-c', f'import os; os.write({w}, b\"by number\")'], "
               "pass_fds=[w])\nos.close(w)\nprint(os.read(r, 100), child.wait())"], ""),
    "an option it leaves to the real interpreter": (["-E", "-c", "import sys; print(sys.flags.ignore_environment)"],
                                                    ""),
}


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    root = tmp_path_factory.mktemp("warm")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    server = WarmPython(env, str(root))
    yield server, env
    server.close()


#: Cases whose caller runs under a resource limit (``ulimit``): the descriptor limit, set in the fork, and a memory
#: limit, for which the stand-in runs the real interpreter.
LIMITED = {"the caller's descriptor limit": ("RLIMIT_NOFILE", 512),
           "the caller's memory limit": ("RLIMIT_AS", 16 << 30)}


def _run(command, cwd, env, stdin, limit=None):
    def set_limit():
        import resource

        resource.setrlimit(getattr(resource, limit[0]), (limit[1], limit[1]))

    return subprocess.run(command, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=120,
                          preexec_fn=set_limit if limit else None)


@pytest.mark.parametrize("case", list(CASES))
def test_a_command_gives_what_a_fresh_interpreter_gives(warm, tmp_path, case):
    server, env = warm
    args, stdin = CASES[case]
    env = dict(env, WARM_TEST_SETTING="set")
    outcomes = []
    for name, command in (("real", [sys.executable, *args]), ("warm", server.command(*args))):
        work = tmp_path / name
        work.mkdir()
        (work / "script.py").write_text(SCRIPT)
        (work / "spawn.py").write_text(SPAWN)
        result = _run(command, work, env, stdin, LIMITED.get(case))
        files = {p.name: p.read_text() for p in work.iterdir() if p.suffix == ".txt"}
        outcomes.append((result.returncode, result.stdout.replace(str(work), "WORK"),
                         result.stderr.replace(str(work), "WORK"), files))
    assert outcomes[1] == outcomes[0]


def test_the_interpreter_a_command_starts_is_warm_too(warm, tmp_path):
    server, env = warm
    probe = "import sys; print('torch' in sys.modules)"
    starts = f"import subprocess, sys; print(subprocess.run([sys.executable, '-c', {probe!r}]).returncode)"
    assert _run(server.command("-c", starts), tmp_path, env, "").stdout == "True\n0\n"
    assert _run([sys.executable, "-c", starts], tmp_path, env, "").stdout == "False\n0\n"


def test_an_environment_read_at_import_runs_the_real_interpreter(warm, tmp_path):
    server, env = warm
    probe = ["-c", "import sys; print('torch' in sys.modules)"]
    assert _run(server.command(*probe), tmp_path, env, "").stdout == "True\n"  # warm: imported by the server
    changed = dict(env, OMP_NUM_THREADS="2")
    assert _run(server.command(*probe), tmp_path, changed, "").stdout == "False\n"


def test_an_environment_read_by_a_library_the_server_has_not_imported_stays_warm(warm, tmp_path):
    server, env = warm
    probe = ["-c", "import sys; print('torch' in sys.modules, 'datasets' in sys.modules); import datasets; "
                   "print(datasets.config.HF_DATASETS_OFFLINE)"]
    for value in ("1", "0"):
        changed = dict(env, HF_DATASETS_OFFLINE=value)
        assert _run(server.command(*probe), tmp_path, changed, "").stdout == f"True False\n{value == '1'}\n"


def test_sigterm_to_the_stand_in_reaches_the_command(warm, tmp_path):
    server, env = warm
    code = ("import os, signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (os.write(1, b'terminated\\n'), sys.exit(5)))\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen(server.command("-c", code), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (5, "terminated\n"), err
    assert time.monotonic() - start < 10


def test_a_stand_in_killed_takes_its_command_with_it(warm, tmp_path):
    server, env = warm
    code = "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen(server.command("-c", code), cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    pid = int(proc.stdout.readline())
    proc.kill()  # what subprocess.run does on its timeout
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the command {pid} outlived its killed stand-in")
