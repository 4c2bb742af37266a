"""A user's directories and files survive every write flodl-hf makes: what a user-trial found deleted or replaced.

Each test reproduces one way a file flodl-hf did not create was lost (a user's ``runs/`` recorded as ours and
removed by a later ``--overwrite``; an empty directory the user made, with its own mode, moved aside and replaced;
a folder holding an ``eval --json`` result named ``metrics.json`` taken for an old output; ``save_pretrained``
wiping a Hub clone's ``.git/``), on real files, with the real CLI in a subprocess where the CLI is the path.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import make_checkpoint, toy_task

from flodl_hf.files.atomic import _move_entries_in, atomic_dir
from flodl_hf.files.ownership import MARKER, owns_dir, read_marker
from warm_python import python_command

ROOT = Path(__file__).resolve().parents[3]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), FLODL_HF_NO_LAUNCH="1", HF_HUB_OFFLINE="1")


def digest(root: Path) -> dict:
    return {str(p.relative_to(root)): ("dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*"))}


def flodl(cwd: Path, *argv) -> subprocess.CompletedProcess:
    return subprocess.run(python_command("-m", "flodl_hf") + [*map(str, argv)], cwd=cwd, env=ENV, text=True,
                          capture_output=True, timeout=180)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("safety-inputs")
    base = make_checkpoint("bert", root / "base", with_classifier=False)
    data = root / "toy.csv"
    data.write_text("text,label\n" + "".join(f"{t},{'pos' if y else 'neg'}\n" for t, y in toy_task(40)))
    return {"base": base, "data": data}


def train_argv(inputs, *extra):
    return ["train", "--model", inputs["base"], "--data", inputs["data"], "--batch-size", "8", "--max-length", "16",
            "--eval-rows", "8", "--no-progress", *extra]


# --- atomic_dir: the user's directory itself is never moved or replaced -----------------------------------------

def test_an_empty_user_directory_is_filled_in_place(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    os.chmod(target, 0o2770)
    inode = target.stat().st_ino
    with atomic_dir(target) as staging:
        (staging / "a.txt").write_text("a")
    assert target.stat().st_ino == inode and stat.S_IMODE(target.stat().st_mode) == 0o2770
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (target / "a.txt").read_text() == "a"


def test_in_place_writes_leave_other_entries_and_refuse_before_moving_anything(tmp_path):
    target = tmp_path / "clone"
    (target / ".git").mkdir(parents=True)
    (target / "notes.md").write_text("mine")
    (target / "x").mkdir()
    with pytest.raises(FileExistsError, match="is a directory or a link"):
        with atomic_dir(target, in_place=True) as staging:
            (staging / "a.txt").write_text("a")
            (staging / "x").write_text("would replace a directory")
    assert sorted(p.name for p in target.iterdir()) == [".git", "notes.md", "x"]  # a.txt did not move in either
    assert [p.name for p in tmp_path.iterdir()] == ["clone"]  # no staging left behind
    with atomic_dir(target, in_place=True, last=("z.json",)) as staging:
        (staging / "z.json").write_text("{}")
        (staging / "notes.md").write_text("replaced by name")
    assert sorted(p.name for p in target.iterdir()) == [".git", "notes.md", "x", "z.json"]


def test_entries_move_into_a_directory_on_another_filesystem(tmp_path):
    """A mount point (a container's output volume) cannot be renamed, and entries cannot be renamed onto it."""
    shm = Path("/dev/shm")
    assert shm.is_dir() and os.stat(shm).st_dev != os.stat(tmp_path).st_dev, "needs two filesystems (tmpfs)"
    staging = Path(__import__("tempfile").mkdtemp(dir=shm))
    (staging / "model.bin").write_bytes(b"w" * 1000)
    (staging / "runs").mkdir()
    (staging / "runs" / "ev").write_text("e")
    target = tmp_path / "volume"
    target.mkdir()
    _move_entries_in(staging, target, last=())
    assert sorted(p.name for p in target.iterdir()) == ["model.bin", "runs"] and not staging.exists()
    assert (target / "runs" / "ev").read_text() == "e"


# --- save_pretrained into a Hub clone ----------------------------------------------------------------------------

@pytest.fixture()
def head(tmp_path):
    from heads import AutoHeadForSequenceClassification

    source = make_checkpoint("bert", tmp_path / "src", with_classifier=True)
    return AutoHeadForSequenceClassification.from_pretrained(str(source), max_length=16)


def test_save_pretrained_into_a_hub_clone_replaces_only_the_files_it_writes(head, tmp_path):
    clone = tmp_path / "clone"
    head.save_pretrained(clone)
    (clone / ".git").mkdir()
    (clone / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (clone / "NOTES.md").write_text("my notes\n")
    (clone / "pytorch_model.bin").write_bytes(b"an upstream file the loader does not prefer")
    mine = {k: v for k, v in digest(clone).items() if k.startswith((".git", "NOTES", "pytorch"))}
    inode = clone.stat().st_ino
    with __import__("torch").no_grad():
        next(head.model.parameters()).add_(1.0)
    head.save_pretrained(clone)
    after = digest(clone)
    assert {k: after[k] for k in mine} == mine and clone.stat().st_ino == inode
    from heads import AutoHeadForSequenceClassification

    again = AutoHeadForSequenceClassification.from_pretrained(str(clone), max_length=16)
    assert all(bool((a == b).all()) for a, b in zip(again.model.parameters(), head.model.parameters()))


def test_save_pretrained_refuses_a_folder_whose_config_json_is_not_a_models(head, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.json").write_text('{"app": "my web app"}\n')
    (project / "main.py").write_text("print('hello')\n")
    before = digest(project)
    with pytest.raises(FileExistsError, match=r"not a model directory \(no config.json naming a model_type\)"):
        head.save_pretrained(project)
    assert digest(project) == before and sorted(p.name for p in tmp_path.iterdir()) == ["project", "src"]


def test_save_pretrained_refuses_a_stale_weight_file_that_would_shadow_the_new_one(head, tmp_path):
    clone = tmp_path / "clone"
    head.save_pretrained(clone)
    (clone / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    before = digest(clone)
    with pytest.raises(FileExistsError, match=r"model.safetensors.index.json was not rewritten by this save"):
        head.save_pretrained(clone)
    assert digest(clone) == before


# --- ownership records ---------------------------------------------------------------------------------------

def test_an_eval_result_named_metrics_json_does_not_make_a_folder_flodl_hfs(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps({"generator": "flodl-hf", "kind": "eval"}))
    assert not owns_dir(tmp_path)
    (tmp_path / "metrics.json").write_text(json.dumps({"generator": "flodl-hf", "accuracy": 0.5}))
    assert owns_dir(tmp_path)  # a run's metrics.json from before markers existed


def test_a_users_runs_dir_in_the_checkpoint_dir_survives_later_runs(inputs, tmp_path):
    exp = tmp_path / "exp"
    (exp / "runs").mkdir(parents=True)
    (exp / "runs" / "events.user").write_text("my tensorboard logs")
    (exp / "notes.txt").write_text("notes")
    before = digest(exp)
    first = flodl(tmp_path, *train_argv(inputs, "--output-dir", "out1", "--checkpoint-dir", "exp"))
    assert first.returncode == 0, first.stderr[-2000:]
    assert digest(exp) == before  # nothing of ours left, not even the marker
    second = flodl(tmp_path, *train_argv(inputs, "--output-dir", "out2", "--checkpoint-dir", "exp",
                                         "--checkpoint-every", "1", "--keep-checkpoint", "--overwrite"))
    assert second.returncode == 0, second.stderr[-2000:]
    marker = read_marker(exp)
    assert marker is not None and "runs" not in marker["entries"]
    third = flodl(tmp_path, *train_argv(inputs, "--output-dir", "out3", "--checkpoint-dir", "exp", "--overwrite"))
    assert third.returncode == 0, third.stderr[-2000:]
    assert {k: v for k, v in digest(exp).items() if k in before} == before


def test_train_fills_a_users_empty_output_dir_in_place_and_overwrites_only_its_own(inputs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o2770)
    inode = out.stat().st_ino
    first = flodl(tmp_path, *train_argv(inputs, "--output-dir", "out"))
    assert first.returncode == 0, first.stderr[-2000:]
    assert out.stat().st_ino == inode and stat.S_IMODE(out.stat().st_mode) == 0o2770
    marker = read_marker(out)
    assert marker["created"] is False and "model.safetensors" in marker["entries"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging or old copies left
    second = flodl(tmp_path, *train_argv(inputs, "--output-dir", "out", "--overwrite", "--seed", "1"))
    assert second.returncode == 0, second.stderr[-2000:]
    assert out.stat().st_ino == inode and stat.S_IMODE(out.stat().st_mode) == 0o2770
    assert read_marker(out)["created"] is False and (out / MARKER).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
