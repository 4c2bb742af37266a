"""``flodl-hf train`` on long runs: checkpoints and exact resume, Ctrl-C (in-process and a real SIGINT to a
subprocess), NaN loss, periodic evaluation, early stopping, TensorBoard, and the ``bench`` hand-off."""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from tiny_models import toy_task

from flodl_hf import cli
from flodl_hf.checkpoint.graph_state import ResumeError
from flodl_hf.job.interrupt import GracefulInterrupt
from flodl_hf.job import outputs
from flodl_hf.job.checkpoints import check_plan
from flodl_hf.job.loop import TrainingInterrupted
from flodl_hf.job.run import run_train
from flodl_hf.job.schedule import LinearSchedule
from flodl_hf.files.ownership import write_marker
from heads import AutoHeadForSequenceClassification
from warm_python import python_command

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.usefixtures("single_thread_module")  # one torch thread




@pytest.fixture(scope="module")
def work(tiny_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    with (root / "toy.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["review", "sentiment"])
        for text, label in toy_task(200, seed=0):
            writer.writerow([text, "positive" if label else "negative"])
    return root, tiny_checkpoint("bert")


def run_args(work, epochs: int = 6) -> list[str]:
    """120 optimizer steps (20 per epoch) with dropout, a warmup schedule and evaluation every 7 steps."""
    root, model = work
    return ["train", "--model", str(model), "--data", str(root / "toy.csv"), "--text-column", "review",
            "--label-column", "sentiment", "--batch-size", "8", "--epochs", str(epochs), "--train-rows", "160",
            "--eval-rows", "40", "--lr", "2e-3", "--max-length", "16", "--warmup-ratio", "0.1", "--eval-every", "7",
            "--no-progress"]


@pytest.fixture(scope="module")
def uninterrupted(work):
    out = work[0] / "full"
    assert cli.main([*run_args(work), "--output-dir", str(out)]) == 0
    return json.loads((out / "metrics.json").read_text())


def leftovers(directory: Path, name: str) -> list[str]:
    """Staging or partial files of output ``name`` left in ``directory``."""
    return [p.name for p in directory.iterdir() if p.name.startswith(f".{name}.")]


def test_interrupted_then_resumed_run_reproduces_every_loss(work, uninterrupted, tmp_path):
    out = tmp_path / "out"
    settings = cli.settings_from_args(cli.build_parser().parse_args(
        [*run_args(work), "--output-dir", str(out), "--checkpoint-every", "3"]))

    def log(line: str) -> None:
        if "checkpoint at step 3 " in line:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C right after the first checkpoint

    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(TrainingInterrupted) as stopped:
        run_train(settings, AutoHeadForSequenceClassification, log=log)
    assert signal.getsignal(signal.SIGINT) is handler  # installed only for the loop, then restored
    checkpoint_dir = tmp_path / "out.checkpoint"
    assert stopped.value.step == 4 and stopped.value.checkpoint_dir == checkpoint_dir  # finished the step
    assert (checkpoint_dir / "checkpoint.json").is_file()
    assert not out.exists() and not leftovers(tmp_path, "out")

    assert cli.main([*run_args(work), "--output-dir", str(out), "--resume", str(checkpoint_dir)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train_loss"] == uninterrupted["train_loss"]  # exactly, float for float
    assert len(metrics["train_loss"]) == metrics["steps"] == 120
    assert metrics["eval_history"] == uninterrupted["eval_history"]
    assert metrics["accuracy"] == uninterrupted["accuracy"]
    assert [r["step"] for r in metrics["resumed"]] == [4]
    assert not checkpoint_dir.exists()  # removed once the output directory is written
    card = ModelCard.load(out / "README.md")
    assert "| resumed | yes, from step 4 (checkpoint, 1 -> 1 device(s)) |" in card.text
    assert metrics["resumed"][0]["world_size_before"] == metrics["resumed"][0]["world_size_after"] == 1


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def _interrupt_subprocess(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """Start ``python -m flodl_hf`` with ``argv``, send one SIGINT once it reports a checkpoint, wait."""
    proc = subprocess.Popen(python_command("-m", "flodl_hf") + [*argv], cwd=cwd, env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = []
    for line in proc.stdout:  # a progress line tells us a first optimizer step is done
        seen.append(line)
        if "checkpoint at step" in line:
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=240)
    return proc.returncode, "".join(seen) + out, err


def test_ctrl_c_on_a_real_process_checkpoints_and_prints_the_resume_command(work, uninterrupted, tmp_path):
    out = tmp_path / "out"
    code, _, stderr = _interrupt_subprocess([*run_args(work), "--output-dir", str(out), "--checkpoint-every", "2"],
                                            tmp_path)
    assert code == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    resume_lines = [line for line in stderr.splitlines() if "Resume with:" in line]
    assert len(resume_lines) == 1 and resume_lines[0].startswith("flodl-hf: interrupted at step "), stderr
    assert not out.exists() and not leftovers(tmp_path, "out")  # no partial output
    argv = shlex.split(resume_lines[0].split("Resume with: ", 1)[1])
    assert argv[:2] == ["flodl-hf", "train"] and argv[-2:] == ["--resume", str(tmp_path / "out.checkpoint")]
    assert cli.main(argv[1:]) == 0  # exactly the printed command
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train_loss"] == uninterrupted["train_loss"]
    assert metrics["resumed"][0]["step"] >= 2


def test_first_sigint_requests_a_stop_second_aborts_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGINT)
    with GracefulInterrupt() as stop:
        assert signal.getsignal(signal.SIGINT) is not before
        signal.raise_signal(signal.SIGINT)
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before
    results = []
    thread = threading.Thread(target=lambda: results.append(GracefulInterrupt().__enter__()._installed))
    thread.start()
    thread.join()
    assert results == [False]  # outside the main thread: nothing installed, Ctrl-C keeps its meaning


def small_args(work, out: Path, *extra: str) -> list[str]:
    root, model = work
    return ["train", "--model", str(model), "--data", str(root / "toy.csv"), "--text-column", "review",
            "--label-column", "sentiment", "--batch-size", "8", "--train-rows", "80", "--eval-rows", "40",
            "--lr", "2e-3", "--max-length", "16", "--no-progress", "--output-dir", str(out), *extra]


def error_line(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("flodl-hf: error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_nan_loss_stops_with_exit_1_and_keeps_the_last_checkpoint(work, tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(small_args(work, out, "--lr", "1e6", "--checkpoint-every", "1"))
    line = error_line(capsys.readouterr().err)
    assert code == 1
    assert "the training loss became nan at step 2 (epoch 1)" in line and "lower --lr" in line
    assert "the last checkpoint, from before it (step 1)" in line
    assert (tmp_path / "out.checkpoint" / "checkpoint.json").is_file()
    assert not out.exists() and not leftovers(tmp_path, "out")


def test_eval_every_and_early_stopping(work, tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(small_args(work, out, "--epochs", "4", "--eval-every", "1", "--early-stopping-patience", "1"))
    stdout = capsys.readouterr().out
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    history = metrics["eval_history"]
    assert metrics["stop_reason"].startswith("early stopping: held-out accuracy did not improve for 1 evaluations")
    assert metrics["steps_run"] == history[-1]["step"] < metrics["steps"] == 40
    assert [h["step"] for h in history] == list(range(1, len(history) + 1))
    best = max(h["accuracy"] for h in history[:-1])
    assert history[-1]["accuracy"] <= best == metrics["best_eval"]["value"]
    assert metrics["best_eval"]["metric"] == "accuracy" and metrics["accuracy"] >= history[-1]["accuracy"]
    assert "early stopping" in stdout
    card = ModelCard.load(out / "README.md").text
    assert "| stopped | early stopping" in card and "| evaluation | every 1 optimizer steps" in card
    assert f"| steps | {metrics['steps_run']} of 40 |" in card


def test_tensorboard_scalars_are_written_to_runs(work, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    assert cli.main(small_args(work, out, "--report-to", "tensorboard", "--eval-every", "4")) == 0
    events = EventAccumulator(str(out / "runs"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"train/loss", "train/learning_rate", "train/grad_norm", "eval/accuracy",
                                             "eval/macro_f1", "eval/loss"}
    metrics = json.loads((out / "metrics.json").read_text())
    losses = events.Scalars("train/loss")
    assert [e.step for e in losses] == list(range(1, 11))
    assert [e.value for e in losses] == pytest.approx(metrics["train_loss"])
    # the scheduler at work: Trainer's default linear decay from 2e-3 over the 10 steps, each batch's LR
    assert [e.value for e in events.Scalars("train/learning_rate")] == pytest.approx([2e-3 * (10 - k) / 10
                                                                                      for k in range(10)])
    norms = events.Scalars("train/grad_norm")  # before clipping (max norm 1.0, the default)
    assert [e.step for e in norms] == list(range(1, 11)) and all(e.value > 0 for e in norms)
    assert [e.step for e in events.Scalars("eval/accuracy")] == [4, 8, 10]  # two periodic, one final
    assert not (tmp_path / "out.checkpoint").exists()


def test_tensorboard_missing_is_one_line_with_the_pip_command(work, tmp_path, capsys, monkeypatch):
    real = outputs.importlib.util.find_spec
    monkeypatch.setattr(outputs.importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    out = tmp_path / "out"
    code = cli.main(small_args(work, out, "--report-to", "tensorboard"))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "pip install tensorboard" in error_line(err)
    assert not out.exists() and not (tmp_path / "out.checkpoint").exists()


def test_a_fresh_run_refuses_an_unfinished_runs_checkpoint(work, tmp_path, capsys):
    out = tmp_path / "out"
    (tmp_path / "out.checkpoint").mkdir()
    (tmp_path / "out.checkpoint" / "checkpoint.pt").write_bytes(b"an unfinished run")
    write_marker(tmp_path / "out.checkpoint", "checkpoint", ["checkpoint.pt", "runs"])  # an unfinished flodl-hf run
    code = cli.main(small_args(work, out))
    line = error_line(capsys.readouterr().err)
    assert code == 2 and f"continue it with --resume {tmp_path / 'out.checkpoint'}" in line and "--overwrite" in line
    assert cli.main(small_args(work, out, "--overwrite")) == 0
    assert out.is_dir() and not (tmp_path / "out.checkpoint").exists()


def test_keep_checkpoint_and_a_changed_plan_is_refused(work, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(small_args(work, out, "--checkpoint-every", "5", "--keep-checkpoint")) == 0
    checkpoint_dir = tmp_path / "out.checkpoint"
    assert (checkpoint_dir / "checkpoint.json").is_file()
    capsys.readouterr()
    code = cli.main(small_args(work, tmp_path / "again", "--resume", str(checkpoint_dir), "--max-length", "12"))
    line = error_line(capsys.readouterr().err)
    assert code == 2
    assert f"cannot resume from {checkpoint_dir}: it was written with --max-length 16 but this run has 12" in line
    assert not (tmp_path / "again").exists()


def test_check_plan_names_the_setting_that_changed():
    plan = {"model": "/m", "data": "/d", "text_column": "text", "label_column": "label", "labels": ["a", "b"],
            "seed": 0, "train_rows": 100, "eval_rows": None, "max_length": 64, "batch_size": 16, "world_size": 2,
            "epochs": 1, "warmup_ratio": None, "precision": "fp32", "lr": 5e-5, "lr_scheduler_type": "linear",
            "weight_decay": 0.0, "max_grad_norm": 1.0}
    check_plan(plan, dict(plan, lr=1e-5, world_size=None), "ckpt")  # the LR may change; world size unknown yet
    check_plan(plan, dict(plan, world_size=3), "ckpt")  # so may the device count (elastic resume)
    for key, value, expected in (("batch_size", 8, "--batch-size 16 but this run has 8"),
                                 ("labels", ["a", "c"], "--labels a,b but this run has a,c"),
                                 ("model", "/other", "--model /m but this run has /other"),
                                 ("group_by_length", True, "--group-by-length False but this run has True"),
                                 ("lr_scheduler_type", "cosine", "--lr-scheduler-type linear but this run has "
                                                                 "cosine"),
                                 ("weight_decay", 0.01, "--weight-decay 0.0 but this run has 0.01"),
                                 ("max_grad_norm", None, "--max-grad-norm 1.0 but this run has 0")):
        with pytest.raises(ResumeError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            check_plan(plan, dict(plan, **{key: value}), "ckpt")
    before = {k: v for k, v in plan.items() if k not in ("lr_scheduler_type", "weight_decay", "max_grad_norm")}
    with pytest.raises(ResumeError, match="written by an earlier flodl-hf, whose LR schedule, weight decay and "
                                          "clipping were not Trainer's"):
        check_plan(before, plan, "ckpt")  # a checkpoint of the constant-LR, weight-decay-everywhere version


def test_resume_command_replaces_an_old_resume_and_quotes():
    argv = ["train", "--data", "my data.csv", "--resume", "old", "--resume=older", "--epochs", "2"]
    assert cli.resume_command(argv, Path("/tmp/x y")) == \
        "flodl-hf train --data 'my data.csv' --epochs 2 --resume '/tmp/x y'"


def test_linear_schedule_state_round_trip():
    import torch

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = LinearSchedule(optimizer, total=10, warmup_ratio=0.2)
    for _ in range(4):
        schedule.step()
    other = LinearSchedule(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), 99, 0.5)
    other.load_state_dict(schedule.state_dict())
    assert other.state_dict() == schedule.state_dict() and other.factor() == schedule.factor()
    other.set_base_lr(0.5)
    assert other.optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * schedule.factor())


def test_bench_arguments_go_to_the_bench_parser(capsys):
    code = cli.main(["bench", "--no-such-flag"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("flodl-hf bench: error: unrecognized arguments: --no-such-flag")
    assert "bench" in cli.build_parser().format_help()


def test_ctrl_c_on_two_cpu_ranks_stops_both_and_resumes(work, tmp_path):
    out = tmp_path / "out"
    argv = [*run_args(work, epochs=4), "--output-dir", str(out), "--devices", "cpu,cpu", "--checkpoint-every", "2"]
    code, _, stderr = _interrupt_subprocess(argv, tmp_path)  # SIGINT to rank 0 only: the ranks agree to stop
    assert code == 130, stderr[-3000:]
    assert "Traceback" not in stderr and stderr.count("Resume with:") == 1
    assert not out.exists()
    result = subprocess.run(python_command("-m", "flodl_hf") + [*argv, "--resume", str(tmp_path / "out.checkpoint")],
                            cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["resumed"][0]["step"] >= 2
    assert len(metrics["train_loss"]) == metrics["steps"]  # rank 0's micro-batches of the whole run
