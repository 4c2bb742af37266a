"""Hostile input never loses a user's files, never trains silently wrong, and fails before training.

Every row of ``tests/hostile_cases.py`` runs the real command line in a directory of its own: through
``flodl_hf.cli.main(argv)`` in this process (``cli_helpers.run_main``: the same exit code, stdout, stderr and files
as ``python -m flodl_hf``, without paying a Python start-up per row), or, for a row that says why it needs one (a
FIFO that would block: a timeout), ``python -m flodl_hf`` in a process of its own (``warm_python``) under a timeout.
Each row checks: the exit code; exactly one ``flodl-hf: error:`` line holding the case's needles (none for a
documented acceptance, exit 0); no traceback; and that a listing of the directory (every path and the bytes of every
file) differs after the run only by what the command owns. The cases that load a model share one tiny base
checkpoint and one tiny trained classifier (module-scoped). Then: a property test (random foreign files planted
wherever any command writes, every command run against them, ``--overwrite`` too: every foreign file stays
byte-identical), the memory bound of label values, SIGTERM, stale temporary files, and a full disk.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import time
import tracemalloc
from pathlib import Path

import pytest
from cli_helpers import command_options, python_spellings, run_main
from hostile_cases import CASES as FIRST_CASES
from hostile_round3 import CASES3
from hostile_round4 import CASES4
from tiny_models import make_checkpoint, toy_task
from warm_python import python_command

from flodl_hf import cli
from flodl_hf.data import load_text_classification

ROOT = Path(__file__).resolve().parents[3]
CASES = FIRST_CASES + CASES3 + CASES4
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), FLODL_HF_NO_LAUNCH="1")


def listing(root: Path) -> dict:
    """Every path under ``root`` with what it is: a digest of a file's bytes, a link's target, or a directory."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_dir():
            out[rel] = "dir"
        elif not path.is_file():  # a FIFO or socket a case planted: never opened (it would block)
            out[rel] = "special"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def run(argv, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(python_command("-m", "flodl_hf", *map(str, argv)), cwd=cwd, env=ENV, text=True,
                          capture_output=True, timeout=timeout, errors="replace")


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("flodl-hf: error: ")]


OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
COMMAND = re.compile(r"flodl-hf (train|predict|eval|export|verify|convert-checkpoint)\b")
#: Python-API argument names a command-line user cannot pass (rule 4: the fix names the command's options).
API_WORDS = re.compile(r"\b(doc_stride|num_labels|problem_type=|max_length=|labels=|text_pair_column=)")


def named_options(command: str, line: str) -> list[tuple[str, str]]:
    """``(command, option)`` for each option a message names: options after ``flodl-hf CMD`` (up to the next ``;``,
    ``:``, ``,``, a backtick or a closing parenthesis) belong to CMD, the others to the command that was run."""
    found, at = [], 0
    for match in COMMAND.finditer(line):
        found += [(command, o) for o in OPTION.findall(line[at:match.start()])]
        rest = line[match.end():]
        stop = re.search(r"[;:,`)]", rest)
        end = match.end() + (stop.start() if stop else len(rest))
        found += [(match.group(1), o) for o in OPTION.findall(line[match.end():end])]
        at = end
    return found + [(command, o) for o in OPTION.findall(line[at:])]


def check_fix_options(command: str, line: str) -> None:
    """Rule 4: an error names only options the command it attributes them to has, and no Python argument."""
    options = command_options()
    if command not in options:
        return
    wrong = [(c, o) for c, o in named_options(command, line) if o not in options[c]]
    assert not wrong, (wrong, line)
    assert not API_WORDS.search(line), line
    assert not python_spellings(command, line), (python_spellings(command, line), line)



@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The read-only models and data every case may name: {base}, {trained}, {data}."""
    root = tmp_path_factory.mktemp("hostile-shared")
    base = make_checkpoint("bert", root / "base", with_classifier=False)
    data = root / "toy.csv"
    data.write_text("text,label\n" + "".join(f"{t},{'pos' if y else 'neg'}\n" for t, y in toy_task(60)))
    trained = root / "trained"
    code = cli.main(["train", "--model", base, "--data", data, "--output-dir", trained, "--batch-size", "8",
                     "--max-length", "16", "--eval-rows", "12", "--no-progress"])
    assert code == 0
    os.environ["HOSTILE_BASE"] = str(base)  # model_copy() in the table copies it
    os.environ["HOSTILE_TRAINED"] = str(trained)
    before = listing(root)
    yield {"base": str(base), "trained": str(trained), "data": str(data)}
    assert listing(root) == before, "a command changed a shared input"


def expand(argv, shared) -> list[str]:
    return [str(a).format(**shared) for a in argv]


def test_the_table_is_large_and_distinct():
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    assert len(ids) >= 120, len(ids)
    page = (ROOT / "docs" / "bad-input.md").read_text(encoding="utf-8")
    assert f"`tests/hostile_round4.py`), {len(ids)} cases" in page  # docs/bad-input.md's count stays true


def _prepare(case, shared, root: Path):
    """A case's own directory with its planted files, its listing before the run, and its command line."""
    work = root / re.sub(r"[^\w.-]+", "_", case.id)
    work.mkdir()
    if case.setup is not None:
        case.setup(work)
    return work, listing(work), expand(case.argv, shared)


@pytest.fixture(scope="module")
def sweep(request, shared, tmp_path_factory):
    """The selected rows' commands, run up front; each row's test then checks its own outcome. Rows are prepared
    one after another, in table order. The rows that need a process of their own start first, in the background
    (each is mostly a Python start-up); the others then run in this process, one after another, with one torch
    thread, as the subprocesses do."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    wanted = {item.callspec.params["case"].id for item in request.session.items
              if item.originalname == "test_hostile_input" and hasattr(item, "callspec")}
    root = tmp_path_factory.mktemp("hostile-sweep")
    prepared = {case.id: _prepare(case, shared, root) for case in CASES if case.id in wanted}
    own_process = [case.id for case in CASES if case.id in prepared and case.process]

    def one(case_id: str, runner):
        work, _, argv = prepared[case_id]
        try:
            return runner(argv, work)
        except Exception as exc:  # noqa: BLE001 - a timeout or a changed process fails that row's test
            return exc

    results = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        started = {case_id: pool.submit(one, case_id, run) for case_id in own_process}
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for case_id in prepared:
                if case_id not in started:
                    results[case_id] = one(case_id, lambda argv, work: run_main(argv, work, ENV))
        finally:
            torch.set_num_threads(threads)
        results.update({case_id: future.result() for case_id, future in started.items()})
    return {case_id: (prepared[case_id][0], prepared[case_id][1], results[case_id]) for case_id in prepared}


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_hostile_input(case, sweep):
    if "without CUDA" in case.id:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    work, before, result = sweep[case.id]
    if isinstance(result, Exception):
        raise result
    err = result.stderr
    assert result.returncode == case.code, (result.returncode, err[-2000:], result.stdout[-500:])
    assert "Traceback" not in err and "Traceback" not in result.stdout, err[-3000:]
    errors = error_lines(err)
    if case.code == 2:
        assert len(errors) == 1, err[-2000:]
        for needle in case.needles:
            assert needle in errors[0], (needle, errors[0])
        check_fix_options(case.argv[0], errors[0])
    else:
        assert not errors, err[-2000:]
    after = listing(work)
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    foreign = {p for p in changed if not any(p == o or p.startswith(o + "/") for o in case.owned)}
    assert not foreign, sorted(foreign)[:10]


# --- the ownership property -----------------------------------------------------------------------------------

def _plant(rng: random.Random, root: Path, paths: list[str]) -> None:
    for rel in paths:
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.write_bytes(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64))))


def test_foreign_files_stay_byte_identical_under_every_command(shared, tmp_path):
    """Random foreign files in every path a command writes; every command run against them, with and without
    --overwrite; afterwards each foreign file is byte-identical (the only new paths are the commands' own)."""
    spots = ["out/model.safetensors", "out/metrics.json", "out/notes.txt",
             "out.checkpoint/runs/events.out", "ck/checkpoint.pt", "ck/runs/x", "ck/keep.me", "exp/config.json",
             "exp/README.md", "r.json", ".out.partial-notmine/x", ".checkpoint.pt.tmp"]
    commands = [
        ["train", "--model", "{base}", "--data", "{data}", "--output-dir", "out"],
        ["train", "--model", "{base}", "--data", "{data}", "--output-dir", "out", "--overwrite"],
        ["train", "--model", "{base}", "--data", "{data}", "--output-dir", "fresh", "--checkpoint-dir", "ck",
         "--overwrite"],
        ["train", "--model", "{base}", "--data", "{data}", "--output-dir", "fresh", "--checkpoint-dir", "ck",
         "--report-to", "tensorboard", "--overwrite"],
        ["train", "--model", "{base}", "--data", "{data}", "--output-dir", "fresh", "--checkpoint-dir",
         "out.checkpoint", "--overwrite"],
        ["eval", "--model", "{trained}", "--data", "{data}", "--json", "r.json"],
        ["export", "--model", "{trained}", "--output", "exp"],
        ["export", "--model", "{trained}", "--output", "exp", "--overwrite"],
        ["export", "--model", "{trained}", "--output", "out", "--overwrite"],
    ]
    for seed in range(3):
        rng = random.Random(seed)
        work = tmp_path / f"seed{seed}"
        work.mkdir()
        _plant(rng, work, rng.sample(spots, k=rng.randint(6, len(spots))) + [
            "out/notes.txt", "ck/checkpoint.pt", "exp/README.md", "r.json", "out.checkpoint/checkpoint.pt"])
        planted = listing(work)
        for argv in commands:
            result = run(expand(argv, shared), work)
            assert result.returncode == 2 and len(error_lines(result.stderr)) == 1, (argv, result.stderr[-1500:])
            assert "Traceback" not in result.stderr
        assert listing(work) == planted, seed


def test_a_successful_run_leaves_a_users_files_in_its_checkpoint_dir(shared, tmp_path):
    """--checkpoint-dir DIR that holds a user's files: the run writes and removes only its own entries."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "keep.me").write_bytes(b"\x00user")
    before = listing(tmp_path)
    result = run(expand(["train", "--model", "{base}", "--data", "{data}", "--output-dir", "out", "--checkpoint-dir",
                         "ck", "--checkpoint-every", "1", "--batch-size", "8", "--max-length", "16", "--eval-rows",
                         "12", "--train-rows", "16", "--no-progress", "--overwrite"], shared), tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    after = listing(tmp_path)
    assert {k: v for k, v in after.items() if k != "out" and not k.startswith("out/")} == before
    assert (tmp_path / "out" / ".flodl-hf.json").is_file()


# --- labels: memory proportional to the file ------------------------------------------------------------------

def test_a_huge_label_value_costs_memory_of_the_file_not_of_the_value(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"text": f"row {i}", "label": (0, 10**12)[i % 2]}) + "\n" for i in range(200)))
    tracemalloc.start()
    try:
        data = load_text_classification(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert data.labels == ["0", "1000000000000"] and data.label_ids[:2] == [0, 1]
    assert peak < 200 * path.stat().st_size + 1_000_000, peak


# --- signals and faults ---------------------------------------------------------------------------------------

def test_sigterm_checkpoints_like_ctrl_c_and_stale_temporaries_are_removed(shared, tmp_path):
    data = tmp_path / "long.csv"
    data.write_text("text,label\n" + "".join(f"{t},{'pos' if y else 'neg'}\n" for t, y in toy_task(3000)))
    args = ["train", "--model", shared["base"], "--data", data, "--output-dir", "out", "--batch-size", "2",
            "--max-length", "16", "--eval-rows", "20", "--no-progress", "--epochs", "5"]
    proc = subprocess.Popen(python_command("-m", "flodl_hf", *map(str, args)), cwd=tmp_path, text=True,
                            env=dict(ENV, PYTHONUNBUFFERED="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stdout.readline()
    while line and "training on" not in line:
        line = proc.stdout.readline()
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "checkpoint saved. Resume with:" in err and "Traceback" not in err
    checkpoint_dir = tmp_path / "out.checkpoint"
    assert (checkpoint_dir / "checkpoint.json").is_file()
    assert not [p for p in checkpoint_dir.iterdir() if p.name.endswith(".tmp")]
    # What a SIGKILL during a write would leave; the next start (here a refused resume) removes it.
    stale = checkpoint_dir / ".checkpoint.1.safetensors.k1ll3d00.tmp"
    stale.write_bytes(b"half a checkpoint")
    result = run([*args, "--resume", checkpoint_dir, "--batch-size", "4"], tmp_path)
    assert result.returncode == 2 and "it was written with --batch-size 2" in result.stderr
    assert not stale.exists() and (checkpoint_dir / "checkpoint.json").is_file()


def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(shared, tmp_path, capsys, monkeypatch):
    from flodl_hf.files import atomic
    from flodl_hf.job.checkpoints import read_job_state

    real_replace = os.replace
    calls = {"n": 0}

    def replace(src, dst):
        if Path(dst).name.startswith("checkpoint."):  # the tensors slot, then the manifest, of each write
            calls["n"] += 1
            if calls["n"] > 2:
                raise OSError(errno.ENOSPC, "No space left on device", str(src))
        return real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)
    code = cli.main(["train", "--model", shared["base"], "--data", shared["data"], "--output-dir",
                     str(tmp_path / "out"), "--checkpoint-every", "1", "--batch-size", "8", "--max-length", "16",
                     "--eval-rows", "12", "--no-progress"])
    monkeypatch.setattr(atomic.os, "replace", real_replace)
    err = capsys.readouterr().err
    assert code == 2 and len(error_lines(err)) == 1 and "Traceback" not in err, err
    assert "no space left on the device" in error_lines(err)[0] and "--checkpoint-dir" in error_lines(err)[0]
    checkpoint_dir = tmp_path / "out.checkpoint"
    assert read_job_state(str(checkpoint_dir))["plan"]["batch_size"] == 8  # the step-1 checkpoint still loads
    assert not [p for p in checkpoint_dir.iterdir() if p.name.endswith(".tmp")]
    assert not (tmp_path / "out").exists()


def test_a_read_only_filesystem_is_one_line():
    """EROFS from the JSON write of eval: one line naming --json (the filesystem error path of the CLI)."""
    from flodl_hf.preflight import fs_error_message

    message = fs_error_message(OSError(errno.EROFS, "Read-only file system", "/mnt/r.json"), "--json FILE")
    assert message == "read-only filesystem writing /mnt/r.json: choose a writable --json FILE"
    assert "no space left" in fs_error_message(OSError(errno.ENOSPC, "full", "x"), "--output")


def test_stale_temporaries_are_flodl_hfs_own_names_only(tmp_path):
    from flodl_hf.files.ownership import remove_stale_temporaries

    for name in (".out.partial-abcd1234", ".out.partial-notmine", ".out.old-0123abcd", ".mine.partial-abcd1234"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text(name)
    for name in (".out.abcd_123.tmp", ".out.notes.tmp", ".out.x", "out.abcd1234.tmp"):
        (tmp_path / name).write_text(name)
    remove_stale_temporaries(tmp_path, ["out"])
    left = sorted(p.name for p in tmp_path.iterdir())
    # the staging dir and temp file go; an interrupted swap's previous output is put back; the rest is foreign
    assert left == sorted([".out.partial-notmine", ".mine.partial-abcd1234", ".out.notes.tmp", ".out.x",
                           "out.abcd1234.tmp", "out"])
    assert (tmp_path / "out" / "f").read_text() == ".out.old-0123abcd"


def test_a_failed_run_leaves_no_marker_in_a_users_checkpoint_dir(shared, tmp_path):
    """A NaN loss (exit 1) with --checkpoint-dir DIR, a user's directory: DIR ends as it began."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "keep.me").write_text("mine")
    before = listing(tmp_path)
    result = run(["train", "--model", shared["base"], "--data", shared["data"], "--output-dir", "out",
                  "--checkpoint-dir", "ck", "--lr", "1e6", "--batch-size", "8", "--max-length", "16", "--eval-rows",
                  "12", "--no-progress"], tmp_path)
    assert result.returncode == 1 and len(error_lines(result.stderr)) == 1, result.stderr[-1500:]
    assert listing(tmp_path) == before
