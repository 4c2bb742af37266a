"""The fourth round of hostile input, run by ``tests/e2e/cli/test_hostile_inputs.py`` beside the earlier tables:
files that are not regular or not sane (docs/bad-input.md, rule 6: one reader for every file the tools read).

It exists apart from the earlier tables so that each stays a readable catalogue. Rows are the same ``Case``; rows
marked ``(kept back)`` are variants not looked at while fixing: they check that the rule, not the example, was
fixed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

from hostile_cases import Case, text
from hostile_round3 import BLOCKS, fifo

__all__ = ["CASES4"]

CASES4: list[Case] = []


def case(id: str, argv, needles=(), code: int = 2, setup=None, owned=(), process: str = "") -> None:
    CASES4.append(Case(id, tuple(argv), tuple(needles), code, setup, tuple(owned), process))


def deep(path: str, levels: int = 200_000) -> Callable[[Path], None]:
    """A JSON file nested ``levels`` deep."""
    def plant(root: Path) -> None:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("[" * levels + "]" * levels, encoding="utf-8")
    return plant


def loop(path: str) -> Callable[[Path], None]:
    """A symlink loop: ``path`` -> ``path``.b -> ``path``."""
    def plant(root: Path) -> None:
        os.symlink(f"{path}.b", root / path)
        os.symlink(path, root / f"{path}.b")
    return plant


def trained_with(path: str, plant: Callable[[Path], None]) -> Callable[[Path], None]:
    """A copy of the trained model in ``path``, its metrics.json replaced by what ``plant`` puts there."""
    def setup(root: Path) -> None:
        shutil.copytree(os.environ["HOSTILE_TRAINED"], root / path)
        (root / path / "metrics.json").unlink(missing_ok=True)
        plant(root)
    return setup


TRAIN = ("train", "--model", "{base}", "--data", "{data}", "--output-dir", "out", "--no-progress")
case("a FIFO as --replay-plan", [*TRAIN, "--replay-plan", "p.json"], ("--replay-plan", "not a regular file"),
     setup=fifo("p.json"), process=BLOCKS)
case("/dev/zero as --replay-plan", [*TRAIN, "--replay-plan", "/dev/zero"], ("--replay-plan", "not a regular file"))
case("a --replay-plan nested 200,000 levels deep", [*TRAIN, "--replay-plan", "p.json"],
     ("--replay-plan", "nested deeper than 64 levels"), setup=deep("p.json"))
case("a symlink loop as --replay-plan (kept back)", [*TRAIN, "--replay-plan", "p.json"],
     ("--replay-plan", "symlink loop"), setup=loop("p.json"))
case("a --replay-plan directory whose metrics.json is nested deep (kept back)", [*TRAIN, "--replay-plan", "run"],
     ("--replay-plan", "nested deeper"), setup=deep("run/metrics.json", 5_000))
case("a FIFO as the model's metrics.json under eval", ["eval", "--model", "m", "--data", "{data}"],
     ("--model", "not a regular file"), setup=trained_with("m", fifo("m/metrics.json")), process=BLOCKS)
case("a FIFO as the model's metrics.json under predict", ["predict", "--model", "m", "good"],
     ("--model", "not a regular file"), setup=trained_with("m", fifo("m/metrics.json")), process=BLOCKS)
case("a metrics.json nested 200,000 levels deep under predict", ["predict", "--model", "m", "good"],
     ("--model", "nested deeper than 64 levels"), setup=trained_with("m", deep("m/metrics.json")))
case("a metrics.json nested deep under eval (kept back)", ["eval", "--model", "m", "--data", "{data}"],
     ("--model", "nested deeper"), setup=trained_with("m", deep("m/metrics.json", 3_000)))
case("a symlink loop as --data", ["train", "--model", "{base}", "--data", "d.csv", "--output-dir", "out"],
     ("--data", "symlink loop"), setup=loop("d.csv"))
case("a symlink loop as --eval-data (kept back)", [*TRAIN, "--eval-data", "e.csv"], ("--eval-data", "symlink loop"),
     setup=loop("e.csv"))
case("a symlink loop as eval --data (kept back)", ["eval", "--model", "{trained}", "--data", "d.csv"],
     ("--data", "symlink loop"), setup=loop("d.csv"))

# --- rule 7: every number checked before the model loads (the LR schedule at every step it will take) -----------

SCHEDULED = (*TRAIN, "--batch-size", "8")


def kwargs(schedule: str, text: str, *extra: str) -> list[str]:
    """A train command line with that schedule and keywords (braces doubled: the runner formats each argument)."""
    text = text.replace("{", "{{").replace("}", "}}")
    return [*SCHEDULED, "--lr-scheduler-type", schedule, "--lr-scheduler-kwargs", text, *extra]


case("a NaN num_cycles", kwargs("cosine", '{"num_cycles": NaN}'), ("num_cycles=NaN", "finite number > 0"))
case("a negative lr_end", kwargs("polynomial", '{"lr_end": -0.001}'), ("lr_end=-0.001", ">= 0 below --lr"))
case("a min_lr_rate of a million", kwargs("cosine_with_min_lr", '{"min_lr_rate": 1e6}'),
     ("min_lr_rate=1000000.0", "[0, 1]"))
case("a warmup longer than the run", [*SCHEDULED, "--warmup-steps", "100000000000000000000000"],
     ("--warmup-steps", "longer than the run's"))
case("a negative num_decay_steps", kwargs("warmup_stable_decay", '{"num_decay_steps": -5}'),
     ("num_decay_steps=-5", "integer >= 1"))
case("a negative min_lr_rate", kwargs("cosine_with_min_lr", '{"min_lr_rate": -3}'), ("min_lr_rate=-3",))
case("a keyword given twice", kwargs("cosine", '{"num_cycles": 0.5, "num_cycles": 3}'),
     ("--lr-scheduler-kwargs", "'num_cycles' more than once"))
case("last_epoch in the kwargs", kwargs("cosine", '{"last_epoch": 3}'),
     ("'last_epoch' is not a keyword of --lr-scheduler-type cosine",))
case("a NaN power", kwargs("polynomial", '{"power": NaN}'), ("power=NaN",))
case("a weight decay of 1e308", [*SCHEDULED, "--weight-decay", "1e308"], ("--weight-decay", "below 1 / lr"))
case("an infinite num_cycles (kept back)", kwargs("cosine_with_restarts", '{"num_cycles": Infinity}'),
     ("num_cycles=Infinity",))
case("a timescale of 0 (kept back)", kwargs("inverse_sqrt", '{"timescale": 0}'), ("timescale=0", "integer >= 1"))
case("a min_lr above --lr (kept back)", kwargs("cosine_with_min_lr", '{"min_lr": 1.0}'), ("min_lr=1.0",))
case("a negative num_stable_steps (kept back)", kwargs("warmup_stable_decay",
                                                       '{"num_decay_steps": 2, "num_stable_steps": -1}'),
     ("num_stable_steps=-1",))
case("an unknown decay_type (kept back)", kwargs("warmup_stable_decay", '{"num_decay_steps": 2, "decay_type": "exp"}'),
     ("decay_type=\"exp\"", "one of linear, cosine, 1-sqrt"))
case("a zero power (kept back)", kwargs("polynomial", '{"power": 0}'), ("power=0",))
case("a keyword given twice among others (kept back)",
     kwargs("polynomial", '{"power": 1.0, "lr_end": 0.0, "power": 2.0}'), ("'power' more than once",))


def plan_file(path: str, world: int = 2, batch: int = 8, split: list | None = None) -> Callable[[Path], None]:
    """A metrics.json recording an El Che plan of ``world`` devices at ``--batch-size batch`` (its one split)."""
    split = split if split is not None else [batch + 1] + [batch] * (world - 2) + [batch - 1]
    plan = {"format": 1, "world": world, "batch_size": batch, "anchors": [[0, 1]], "splits": [[0, split]]}
    return text(path, json.dumps({"el_che": {"plan": plan}}))


REPLAY = (*TRAIN, "--batch-size", "8", "--replay-plan", "m.json")
case("a 2-device --replay-plan on 3 devices", [*REPLAY, "--devices", "cpu,cpu,cpu"],
     ("--replay-plan m.json was recorded on 2 device(s) with --batch-size 8", "this run has 3 device(s)",
      "replay it on 2 devices (--devices)"), setup=plan_file("m.json"))
case("a --replay-plan with another --batch-size", [*TRAIN, "--batch-size", "4", "--replay-plan", "m.json",
                                                   "--devices", "cpu,cpu"],
     ("with --batch-size 4", "with --batch-size 8, or drop --replay-plan"), setup=plan_file("m.json"))
case("a hand-edited split [0, 16] in --replay-plan", [*REPLAY, "--devices", "cpu,cpu"],
     ("--replay-plan m.json is not a recorded El Che plan", "split [0, 16] is not 2 sizes >= 1"),
     setup=plan_file("m.json", split=[0, 16]))
case("a 2-device --replay-plan on one device", REPLAY, ("recorded on 2 device(s)", "this run has 1 device(s)"),
     setup=plan_file("m.json"))
case("a 3-device --replay-plan on 2 devices (kept back)", [*REPLAY, "--devices", "cpu,cpu"],
     ("recorded on 3 device(s)", "this run has 2 device(s) (cpu,cpu)"), setup=plan_file("m.json", world=3))
case("a split that does not sum to the batch in --replay-plan (kept back)", [*REPLAY, "--devices", "cpu,cpu"],
     ("split [9, 9] is not 2 sizes >= 1 summing to 2 x 8",), setup=plan_file("m.json", split=[9, 9]))
case("a split of true and 15 in --replay-plan (kept back)", [*REPLAY, "--devices", "cpu,cpu"],
     ("split [true, 15]",), setup=plan_file("m.json", split=[True, 15]))

# The command line speaks options (docs/bad-input.md, rule 9): the settings' refusals name Python fields, respelled
# once where flodl-hf prints them (flodl_hf.cli.spelling); every row of the suite checks that no field is left.
case("an unknown --lr-scheduler-type", [*TRAIN, "--lr-scheduler-type", "cosinus"],
     ("--lr-scheduler-type cosinus is invalid",))
case("--devices mixing CUDA and CPU", [*TRAIN, "--devices", "cuda:0,cpu"], ("--devices cuda:0,cpu mix cpu and cuda",))
case("--devices naming mps beside a CPU (kept back)", [*TRAIN, "--devices", "cpu,mps"],
     ("--devices cpu,mps include 'mps'", "use --devices mps"))
case("an unknown device in --devices (kept back)", [*TRAIN, "--devices", "cpu,tpu"],
     ("unknown device 'tpu'", "--devices cpu,cpu"))
case("--overhead-target without a longer window (kept back)", [*TRAIN, "--overhead-target", "0.2"],
     ("--overhead-target 0.2 is invalid", "--max-anchor N"))
