"""The ``flodl-hf`` program's end: a Ctrl-C after the command's work, while the interpreter's exit and the ranks'
teardown still run (atexit hooks, threads), ends the process in one line with exit code 130.

Why it exists: with 2 CPU ranks a Ctrl-C right after "wrote out" printed "Exception ignored ... KeyboardInterrupt"
with a traceback and exited 0, as if the run had ended well. Shown failing before the fix: with ``main`` as the
program, the lingering process printed the traceback and exited 0; on 2 ranks (before ranks killed by the signal
counted as interrupted), rank 0 printed "error: rank 1 exited with code -2" and exited 1.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time

from tiny_models import toy_task


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



def test_a_ctrl_c_right_after_a_two_rank_run_wrote_its_output_ends_in_one_line_and_130(tiny_checkpoint, tmp_path):
    data = tmp_path / "toy.csv"
    with data.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["review", "sentiment"])
        writer.writerows((text, "positive" if label else "negative") for text, label in toy_task(80, seed=0))
    argv = ["train", "--model", str(tiny_checkpoint("bert")), "--data", str(data), "--text-column", "review",
            "--label-column", "sentiment", "--batch-size", "8", "--epochs", "1", "--train-rows", "64",
            "--eval-rows", "16", "--max-length", "16", "--devices", "cpu,cpu", "--no-progress",
            "--output-dir", str(tmp_path / "out")]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.Popen([sys.executable, "-m", "flodl_hf", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        for line in proc.stdout:
            if "; wrote " in line:
                os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: every rank of the group
                break
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
    err = proc.stderr.read()
    assert (tmp_path / "out" / "metrics.json").is_file()  # the work was done before the Ctrl-C
    assert code == 130, (code, err[-3000:])
    assert "Traceback" not in err and "error" not in err, err[-3000:]
    assert [line for line in err.splitlines() if "interrupted" in line] == [
        "flodl-hf: interrupted while shutting down"], err[-3000:]
