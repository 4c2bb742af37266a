"""The ``flodl-hf`` program's end: a Ctrl-C after the command's work, while the interpreter's exit and the ranks'
teardown still run (atexit hooks, threads), ends the process in one line with exit code 130.

Why it exists: with 2 CPU ranks a Ctrl-C right after "wrote out" printed "Exception ignored ... KeyboardInterrupt"
with a traceback and exited 0, as if the run had ended well. Shown failing before the fix (``main`` as the program,
no end handler): the traceback, and exit code 0.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time


#: The program, then a teardown that takes its time (an atexit hook registered before it, so it runs after main).
_LINGERING = """
import atexit, sys, time
atexit.register(lambda: time.sleep(60))
atexit.register(lambda: print("ending", flush=True))
from flodl_hf.cli.entry import console
sys.exit(console(["verify", "--help"]))
"""


def test_the_program_ends_in_one_line_and_130_when_interrupted_after_its_work():
    proc = subprocess.Popen([sys.executable, "-c", _LINGERING], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 60
        for line in proc.stdout:  # the help text, then the atexit hook's marker
            if line.strip() == "ending" or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    err = proc.stderr.read()
    assert code == 130, (code, err)
    assert err.splitlines() == ["flodl-hf: interrupted while shutting down"], err

