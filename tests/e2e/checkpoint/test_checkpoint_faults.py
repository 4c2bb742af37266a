"""The checkpoint fault matrix: every injected fault ends in a clear error or a successful resume.

Real files and real processes: a writer subprocess (a tiny setup-mode Graph) saves a checkpoint after each step and
is killed, starved of space or denied its directory at a chosen moment of its second write, through the writer's
own fault seam (``FLODL_HF_CHECKPOINT_FAULT``) or the kernel (``RLIMIT_FSIZE``, file modes, a second process holding
the lock). Afterwards the checkpoint must load (the first write's, or the second's once its manifest was renamed)
and a new write must succeed; damaged files must be refused naming the file.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from flodl_hf import DdpConfig, Graph, Trainer, cli
from flodl_hf.checkpoint.errors import ResumeError
from flodl_hf.checkpoint.format import FAULT_ENV, STAGES
from warm_python import python_command

ROOT = Path(__file__).resolve().parents[3]
OWN = {"checkpoint.json", "checkpoint.0.safetensors", "checkpoint.1.safetensors"}

WRITER = """
import os, resource, signal, sys, time, torch
from flodl_hf import DdpConfig, Graph, Trainer
from flodl_hf.checkpoint.errors import CheckpointError
ckpt, steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
build = lambda dev=None: torch.nn.Linear(16, 16)
graph = Graph(build())
Trainer.setup_with(graph, build, lambda p: torch.optim.Adam(p, lr=1e-3), DdpConfig(verbose=False))
if mode == "resume":
    graph.load_checkpoint(ckpt)
for _ in range(steps):
    graph.module(torch.randn(4, 16)).sum().backward()
    graph.step()
    if mode == "fsize" and graph.training_step == 2:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))
    if mode == "readonly" and graph.training_step == 2:
        open(ckpt + ".go", "w").close()
        while os.path.exists(ckpt + ".go"):
            time.sleep(0.05)
        if os.geteuid() == 0:  # root ignores file modes: drop to nobody (everything the write needs is loaded)
            os.setgid(65534)
            os.setuid(65534)
    try:
        graph.save_checkpoint(ckpt)
    except CheckpointError as exc:
        print("ERROR", type(exc).__name__, exc, flush=True)
        sys.exit(3)
    print("SAVED", graph.training_step, flush=True)
if mode == "hold":
    sys.stdin.read()
"""


def _writer(tmp_path: Path, ckpt: Path, steps: int, mode: str = "plain", fault: str = "", real: bool = False,
            **kw) -> subprocess.Popen:
    """The writer in a process of its own: a fork of the warm interpreter (``warm_python``), or with ``real`` a
    fresh one (a test that kills it and at once needs its lock freed: a warm command dies just after its stand-in)."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    python = [sys.executable] if real else python_command()
    return subprocess.Popen([*python, str(script), str(ckpt), str(steps), mode], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _load(ckpt: Path) -> Graph:
    build = lambda dev=None: torch.nn.Linear(16, 16)  # noqa: E731
    graph = Graph(build())
    Trainer.setup_with(graph, build, lambda p: torch.optim.Adam(p, lr=1e-3), DdpConfig(verbose=False))
    graph.load_checkpoint(ckpt)
    return graph


def _resumes(tmp_path: Path, ckpt: Path, expected_step: int) -> None:
    """The checkpoint loads at ``expected_step``; a resumed writer saves the next one, which loads too."""
    assert _load(ckpt).training_step == expected_step
    code, out, err = _finish(_writer(tmp_path, ckpt, 1, "resume"))
    assert code == 0 and f"SAVED {expected_step + 1}" in out, err[-2000:]
    assert _load(ckpt).training_step == expected_step + 1
    names = {p.name for p in ckpt.iterdir()}
    assert names <= OWN and "checkpoint.json" in names and len(names) == 2, names  # the manifest and one slot


@pytest.mark.parametrize("stage", STAGES)
def test_sigkill_at_each_moment_of_a_write_resumes(tmp_path, stage):
    ckpt = tmp_path / "ckpt"
    code, out, err = _finish(_writer(tmp_path, ckpt, 2, fault=f"{stage}:kill@2"))
    assert code == -signal.SIGKILL and "SAVED 1" in out and "SAVED 2" not in out, (code, err[-2000:])
    leftovers = {p.name for p in ckpt.iterdir()} - OWN
    assert all(name.endswith(".tmp") for name in leftovers), leftovers  # an atomic write's temporary at most
    _resumes(tmp_path, ckpt, 2 if stage == "manifest-renamed" else 1)  # the manifest's rename is the commit


def _refused_second_write(tmp_path: Path, proc: subprocess.Popen, ckpt: Path, needle: str) -> None:
    code, out, err = _finish(proc)
    assert code == 3 and "SAVED 1" in out and "ERROR CheckpointWriteError" in out, (code, out, err[-2000:])
    assert needle in out and "the previous checkpoint" in out and "Traceback" not in err, out
    assert {p.name for p in ckpt.iterdir()} == {"checkpoint.json", "checkpoint.0.safetensors"}  # nothing half-written


def test_a_full_disk_enospc_at_the_manifest_keeps_the_previous_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = _writer(tmp_path, ckpt, 2, fault="manifest-written:enospc@2")
    _refused_second_write(tmp_path, proc, ckpt, "no space left on the device")  # the new slot was removed again
    _resumes(tmp_path, ckpt, 1)


def test_a_real_file_size_limit_keeps_the_previous_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = _writer(tmp_path, ckpt, 2, "fsize")  # RLIMIT_FSIZE: the kernel refuses the write (EFBIG)
    _refused_second_write(tmp_path, proc, ckpt, "no space left on the device (the file size limit")
    _resumes(tmp_path, ckpt, 1)


def test_a_read_only_checkpoint_directory_keeps_the_previous_checkpoint(tmp_path):
    """chmod 0555 stops a normal user; root ignores modes, so as root the writer drops to uid 65534 (nobody) after
    its first write, in a directory tree nobody may traverse but not write."""
    root = os.geteuid() == 0
    base = Path(tempfile.mkdtemp(prefix="flodl-ro-")) if root else tmp_path
    try:
        os.chmod(base, 0o755)
        ckpt = base / "ckpt"
        proc = _writer(tmp_path, ckpt, 2, "readonly")
        go = Path(str(ckpt) + ".go")
        deadline = time.monotonic() + 120
        while not go.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the writer saved step 1 and waits for its directory to turn read-only
        assert go.exists(), _finish(proc)
        os.chmod(ckpt, 0o555)
        go.unlink()
        _refused_second_write(tmp_path, proc, ckpt, "permission denied")
        os.chmod(ckpt, 0o755)
        _resumes(tmp_path, ckpt, 1)
    finally:
        if root:
            shutil.rmtree(base, ignore_errors=True)


def test_concurrent_writers_the_second_is_refused_naming_the_first_and_a_dead_holder_frees_it(tmp_path):
    ckpt = tmp_path / "ckpt"
    first = _writer(tmp_path, ckpt, 1, "hold", real=True, stdin=subprocess.PIPE)
    assert first.stdout.readline().strip() == "SAVED 1"  # it holds the directory until it exits
    code, out, err = _finish(_writer(tmp_path, ckpt, 1))
    assert code == 3 and "ERROR CheckpointLockedError" in out and f"pid {first.pid} on " in out, (out, err[-1500:])
    assert "is in use by another flodl-hf run" in out and "started" in out
    first.kill()  # SIGKILL: no clean-up ran, the kernel drops its flock
    first.wait()
    assert (tmp_path / ".ckpt.lock").exists()  # its stale lock file is still there ...
    code, out, err = _finish(_writer(tmp_path, ckpt, 1))  # ... and taken over
    assert code == 0 and "SAVED 1" in out, err[-2000:]
    assert not (tmp_path / ".ckpt.lock").exists()  # released at exit


def test_a_second_train_job_on_the_same_directories_is_refused(tmp_path, capsys):
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from flodl_hf.files import dirlock; "
                               f"dirlock.acquire({str(tmp_path / 'out.checkpoint')!r}); print('held', flush=True); "
                               "sys.stdin.read()"], env=dict(os.environ, PYTHONPATH=str(ROOT)), text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "held"
        code = cli.main(["train", "--output-dir", str(tmp_path / "out"), "--no-progress"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("flodl-hf: error:") == 1 and "Traceback" not in err, err
        assert f"checkpoint directory {tmp_path / 'out.checkpoint'} is in use by another flodl-hf run (pid " \
               f"{holder.pid} on " in err and "choose another --checkpoint-dir" in err
        assert not (tmp_path / "out").exists() and not (tmp_path / ".out.lock").exists()
    finally:
        holder.kill()
        holder.wait()


@pytest.fixture
def saved(tmp_path) -> Path:
    build = lambda dev=None: torch.nn.Linear(16, 16)  # noqa: E731
    graph = Graph(build())
    Trainer.setup_with(graph, build, lambda p: torch.optim.Adam(p, lr=1e-3), DdpConfig(verbose=False))
    graph.module(torch.randn(4, 16)).sum().backward()
    graph.step()
    graph.save_checkpoint(tmp_path / "ckpt")
    return tmp_path / "ckpt"


@pytest.mark.parametrize("damage, needle", [
    ("truncate slot", r"checkpoint\.0\.safetensors is truncated or damaged: \d+ bytes where its manifest"),
    ("truncate manifest", r"checkpoint\.json is unreadable: not valid JSON \(truncated or damaged"),
    ("flip slot byte", r"checkpoint\.0\.safetensors is corrupted: its SHA-256 does not match"),
    ("flip manifest digit", r"checkpoint\.json is corrupted: its SHA-256 does not match its content"),
    ("delete slot", r"names tensors file .*checkpoint\.0\.safetensors, which is missing"),
])
def test_damaged_files_are_detected_and_named(saved, damage, needle):
    slot, manifest = saved / "checkpoint.0.safetensors", saved / "checkpoint.json"
    if damage == "truncate slot":
        slot.write_bytes(slot.read_bytes()[: slot.stat().st_size // 2])
    elif damage == "truncate manifest":
        manifest.write_bytes(manifest.read_bytes()[:-40])
    elif damage == "flip slot byte":
        data = bytearray(slot.read_bytes())
        data[-5] ^= 0x01
        slot.write_bytes(bytes(data))
    elif damage == "flip manifest digit":
        text = manifest.read_text()
        at = text.index('"training_step": ') + len('"training_step": ')
        manifest.write_text(text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1:])
    else:
        slot.unlink()
    with pytest.raises(ResumeError, match=needle):
        _load(saved)
