"""``flodl-hf train --resume DIR --devices ...`` on another number of devices (2 -> 1, 1 -> 2, 3 -> 2 CPU ranks).

What is checked: the resume is accepted and recorded (``metrics.json`` ``resumed`` and the model card, with the
device counts before and after); the interrupted epoch continues at the sample the checkpoint recorded, so the
resumed run runs exactly the micro-steps that cover the rest of it once (``ceil((end - samples) / G')``) and then
whole epochs on the new devices; the loss curve covers the whole run; and the model reaches the uninterrupted run's
accuracy band. Which sample ids each rank trains on is checked at the engine level (``test_elastic_resume``): the
job trains through the same ``graph.epoch``.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import pytest
from huggingface_hub import ModelCard
from test_cli_resume import _env, _interrupt_subprocess, work  # noqa: F401 - the shared fixture and helpers

from flodl_hf import cli
from flodl_hf.job.loop import TrainingInterrupted
from flodl_hf.job.run import run_train
from heads import AutoHeadForSequenceClassification
from warm_python import python_command

pytestmark = pytest.mark.usefixtures("single_thread_module")  # one torch thread

ROWS, BATCH, EPOCHS = 160, 4, 8
# Why the accuracy band holds (its margin). The tiny BERT sits on a loss plateau near ln 2 before it learns the task,
# and when it leaves it is chaotic: any perturbation (another device count, another dropout draw, another CPU's
# floating-point path) moves it. The band therefore needs settings in which every trajectory leaves the plateau long
# before the LR decays. The old ones (lr 1e-2, 4 epochs) did not: uninterrupted runs with seeds 1-5 ended at 0.525,
# 0.975, 0.925, 0.5, 1.0, and a fresh clone's 2 -> 1 case ended at 0.725. Measured for these settings
# (lr 3e-3, 8 epochs, warmup 0.1), 8 seeds x (the uninterrupted run + the three resumes) = 32 runs: every run reached
# accuracy >= 0.975 (31 of 32 at 1.0), and the 10-step mean training loss fell below 0.3 by 55 % of the run at the
# latest (median 29 %), so a trajectory may leave the plateau about twice as late as any seen and still pass.
# What the resume must do exactly is checked without accuracy in test_elastic_exact (LR per step, optimizer state,
# sample order against a one-process reference).


def args(work, out, devices: int) -> list[str]:  # noqa: F811
    root, model = work
    argv = ["train", "--model", str(model), "--data", str(root / "toy.csv"), "--text-column", "review",
            "--label-column", "sentiment", "--batch-size", str(BATCH), "--epochs", str(EPOCHS), "--train-rows",
            str(ROWS), "--eval-rows", "40", "--lr", "3e-3", "--max-length", "16", "--warmup-ratio", "0.1",
            "--no-progress", "--output-dir", str(out)]
    # a fixed anchor of 1: one optimizer step per micro-step whatever the CPU contention (El Che's anchor grows on a
    # loaded machine, leaving too few steps for the accuracy band)
    return argv + (["--devices", ",".join(["cpu"] * devices), "--fixed-anchor", "1"] if devices > 1 else [])


@pytest.fixture(scope="module")
def reference(work):  # noqa: F811
    out = work[0] / "elastic-full"
    assert cli.main(args(work, out, 1)) == 0
    return json.loads((out / "metrics.json").read_text())


def _interrupt(work, out, devices: int) -> None:  # noqa: F811
    argv = [*args(work, out, devices), "--checkpoint-every", "2"]
    if devices == 1:
        settings = cli.settings_from_args(cli.build_parser().parse_args(argv))

        def log(line: str) -> None:
            if "checkpoint at step 44 " in line:  # early in epoch 2 of 8 (40 steps per epoch on one device)
                signal.raise_signal(signal.SIGINT)

        with pytest.raises(TrainingInterrupted):
            run_train(settings, AutoHeadForSequenceClassification, log=log)
        return
    code, _, stderr = _interrupt_subprocess(argv, out.parent)
    assert code == 130, stderr[-3000:]


def _resume(work, out, devices: int) -> str:  # noqa: F811
    argv = [*args(work, out, devices), "--resume", str(out.parent / f"{out.name}.checkpoint")]
    result = subprocess.run(python_command("-m", "flodl_hf") + [*argv], cwd=out.parent, env=_env(),
                            capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("before,after", [(2, 1), (1, 2), (3, 2)])
def test_cli_resume_on_another_device_count(work, reference, tmp_path, before, after):  # noqa: F811
    out = tmp_path / "out"
    _interrupt(work, out, before)
    stdout = _resume(work, out, after)
    found = re.search(r"(\d+) -> (\d+) device\(s\): epoch (\d+) continues at sample (\d+) of (\d+)", stdout)
    assert found, stdout
    was, now, epoch, samples, end = (int(v) for v in found.groups())
    assert (was, now) == (before, after) and 0 <= samples <= end
    metrics = json.loads((out / "metrics.json").read_text())
    record = metrics["resumed"][-1]
    assert (record["world_size_before"], record["world_size_after"]) == (before, after)
    assert record["devices_after"] == ["cpu"] * after
    assert metrics["world_size"] == after
    # the rest of the interrupted epoch once, in steps of the new global batch, then whole epochs
    global_batch = after * BATCH
    per_epoch = ROWS // global_batch
    expected = record["micro_batch"] + -(-(end - samples) // global_batch) + (EPOCHS - epoch) * per_epoch
    assert len(metrics["train_loss"]) == metrics["steps"] == metrics["steps_run"] == expected
    assert f"{before} -> {after} device(s))" in ModelCard.load(out / "README.md").text
    assert metrics["accuracy"] >= reference["accuracy"] - 0.1, (metrics["accuracy"], reference["accuracy"], record,
                                                                  [round(v, 2) for v in metrics["train_loss"]])
    assert metrics["accuracy"] >= 0.8
