"""ElCheTrainer checkpoints: interrupted on 2 ranks, resumed on 1, every remaining sample seen once, same model.

The first run is ended abruptly (``os._exit`` on every rank) after its step-4 checkpoint, in the middle of the second
epoch; the resume runs as one plain process with ``resume_from_checkpoint``. One process is `transformers.Trainer`:
given the checkpoint's global micro-batch as its batch, it draws the same windows the 2 ranks would have, so the
samples of the completed steps plus the resumed run's are each epoch exactly once, and the final parameters equal
an uninterrupted 2-rank run's; given another batch, it goes on as `transformers.Trainer` resuming the same checkpoint
does (equal parameters), and says how to continue the run exactly. On several ranks a resume keeps the checkpoint's
global micro-batch, or is refused in one line naming the arguments that do.
"""

from __future__ import annotations

import json
import re

import trainer_runs


CASE = {"model": "seq", "n": 40, "data_seed": 21, "init_seed": 22, "per_device": 4, "ga": 2, "epochs": 2,
        "lr": 3e-3, "warmup": 2, "wd": 0.01, "clip": 1.0, "seed": 23, "elche": {"speed_hint": [1, 3.0]},
        "save_steps": 2}
UNIT, PER_EPOCH = 8, 5  # global micro-batch, micro-batches per epoch (40 / 8)


def test_interrupted_on_two_ranks_resumed_on_one(tmp_path):
    first, second, whole = tmp_path / "first", tmp_path / "second", tmp_path / "whole"
    trainer_runs.run(dict(CASE, exit_at=4), first, 2, expect=17)
    checkpoint = first / "trainer" / "checkpoint-4"
    state = json.loads((checkpoint / "elche_trainer.json").read_text())
    assert state["global_micro_batch"] == UNIT and state["micro_batches_per_window"] == 2
    trainer_runs.run(dict(CASE, resume=str(checkpoint), per_device=UNIT), second, 0)

    # the 4 completed steps: 3 windows in epoch 0 (micro-batches 2 + 2 + 1), then micro-batches 5 and 6 in epoch 1;
    # the first run had also drawn (not applied) the next window when it ended
    before = trainer_runs.seen(first, 2)
    after = trainer_runs.seen(second, 1)[0]
    assert all(len(b) == UNIT for b in after[:-1])  # one rank now takes the whole global micro-batch
    epoch1 = [i for k in (PER_EPOCH, PER_EPOCH + 1) for rank in before for i in rank[k]] + [i for b in after for i in b]
    assert sorted(epoch1) == list(range(CASE["n"]))
    epoch0 = sorted(i for k in range(PER_EPOCH) for rank in before for i in rank[k])
    assert epoch0 == list(range(CASE["n"]))

    trainer_runs.run(CASE, whole, 2)
    diff = trainer_runs.max_diff(trainer_runs.params(second), trainer_runs.params(whole))
    assert diff < 1e-5, diff
    lr_whole = [h["learning_rate"] for h in trainer_runs.log(whole) if "learning_rate" in h]
    lr_second = [h["learning_rate"] for h in trainer_runs.log(second) if "learning_rate" in h]
    assert len(lr_whole) == 6 and lr_second == lr_whole  # the resumed history carries the first run's 4 steps
    # what Trainer reports is what the resumed process trained: the global micro-batch of 8
    state = json.loads((second / "trainer" / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["train_batch_size"] == UNIT, state["train_batch_size"]

    # another batch on one process: what transformers.Trainer does resuming the same checkpoint, and a line saying so
    ours = trainer_runs.run(dict(CASE, resume=str(checkpoint)), tmp_path / "ours", 0)
    trainer_runs.run(dict(CASE, resume=str(checkpoint), plain=True), tmp_path / "theirs", 0)
    assert "pass per_device_train_batch_size=8 and gradient_accumulation_steps=2 to continue" in ours.stdout
    ours_params, theirs_params = trainer_runs.params(tmp_path / "ours"), trainer_runs.params(tmp_path / "theirs")
    assert trainer_runs.max_diff(ours_params, theirs_params) == 0.0
    assert trainer_runs.max_diff(ours_params, trainer_runs.params(whole)) > 1e-4  # it did train another batch
    for run in ("ours", "theirs"):
        state = json.loads((tmp_path / run / "trainer" / "checkpoint-10" / "trainer_state.json").read_text())
        assert state["train_batch_size"] == CASE["per_device"], state["train_batch_size"]


def _refusal(proc) -> str:
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "ValueError: ElCheTrainer" in line]
    assert lines, proc.stderr[-3000:]
    return lines[0]


def test_a_resume_on_another_world_size_has_one_rule(tmp_path):
    """A resume on several ranks keeps the checkpoint's global micro-batch (8): 3 ranks cannot share it, another
    per_device_train_batch_size does not give it, and a pinned split must sum to it. Each is refused before any
    step in one line naming what works, and what it names works."""
    first = tmp_path / "first"
    trainer_runs.run(dict(CASE, exit_at=3), first, 2, expect=17)  # checkpoint-2 is whole by then
    resume = str(first / "trainer" / "checkpoint-2")
    on_three = trainer_runs.run(dict(CASE, resume=resume, elche={}), tmp_path / "three", 3, expect=1)
    assert "cannot share: resume it on 1, 2, 4, 8 ranks" in _refusal(on_three)
    # another per_device_train_batch_size (6 x 2), with or without a pinned split that fits it
    unpinned = _refusal(trainer_runs.run(dict(CASE, resume=resume, per_device=6), tmp_path / "unpinned", 2, expect=1))
    assert "per_device_train_batch_size=6 on 2 ranks gives 12: pass per_device_train_batch_size=4" in unpinned
    assert "batch_sizes" not in unpinned, unpinned
    pinned = dict(CASE, resume=resume, per_device=6, elche={"batch_sizes": [7, 5]})
    refused = _refusal(trainer_runs.run(pinned, tmp_path / "pinned", 2, expect=1))
    named = re.search(r"per_device_train_batch_size=(\d+) and batch_sizes=(\[[\d, ]+\])", refused)
    assert named, refused
    assert not (tmp_path / "pinned" / "log.json").exists()
    followed = dict(pinned, per_device=int(named[1]), elche={"batch_sizes": json.loads(named[2])})
    trainer_runs.run(followed, tmp_path / "followed", 2)
    seen = trainer_runs.seen(tmp_path / "followed", 2)
    assert [len(b) for b in seen[0]] == [4] * len(seen[0])  # 8 = 4 + 4 per micro-batch (40 % 8 == 0)
