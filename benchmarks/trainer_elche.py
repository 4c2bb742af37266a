"""`ElCheTrainer` against plain `transformers.Trainer` (DDP), the same script, 2 gloo CPU ranks.

    python benchmarks/trainer_elche.py [--rounds 3] [--steps 25] [--output DIR]          # modelled speeds
    python benchmarks/trainer_elche.py --real [--rounds 3] [--steps 25] [--output DIR]   # real compute, one busy core
    python benchmarks/trainer_elche.py --real --idle [--rounds 5] [--output DIR]          # real compute, equal cores

Why it exists: `ElCheTrainer` claims that a Trainer user who swaps the class name gets the throughput of their
devices' *sum* instead of W times the slowest one. The claim needs both trainers run from one script (the only
difference: the class, plus ``elche=`` which plain Trainer does not take), on the same rows, model, arguments and
global batch, on the same machine at the same time. Each round runs both, each under its own ``torchrun
--standalone --nproc-per-node 2`` (fresh processes, no shared warm state), in alternating order.

The job: a small BERT built from a config (default 2 layers, hidden 128, vocabulary 2048; seeded, no Hub
download) for 2-class sequence classification on random token ids of fixed length (default 64), per-device batch
``B`` on both (plain Trainer: ``B`` per rank through its DistributedSampler; ElCheTrainer: El Che's uneven split of
the same global ``2 B``), ``max_steps`` optimizer steps, AdamW, no gradient accumulation, fp32, one torch thread per
rank (``OMP_NUM_THREADS=1``). Plain Trainer gets ``ddp_find_unused_parameters=False`` (its default would add a graph
walk each step; the stronger baseline). ElCheTrainer gets no hint: it measures the split itself. (Plain Trainer's
logged loss is 2x ElCheTrainer's: Trainer scales by the world size for DDP when the model ignores
``num_items_in_batch``; irrelevant for throughput.)

Two modes:

* **Modelled speeds** (default): the bench's device model (``flodl_hf.bench.device_model.DeviceModel``), a forward
  pre-hook sleeping ``samples x ms_per_sample / speed`` before every forward, on both trainers alike; the speed
  cases 1.0/0.4 and 1.0/1.0. The sleep (default 20 ms/sample) dominates the model's real compute (about 4
  ms/sample on one idle core of a 2-core machine). Targets: ElCheTrainer >= 1.4x plain Trainer's samples/s at
  1.0/0.4, >= 0.97x at equal speeds.
* **Real compute** (``--real``, default batch 32 per device): no sleep; rank r pinned to core r
  (``os.sched_setaffinity`` at the rank's start; the first two cores this process may use) and a ``while True:
  pass`` process pinned to rank 1's core while each job runs, so rank 1 gets about half a core. Target >= 1.3x.
  Needs 2 otherwise idle cores: on a machine running other work the scheduler moves that work onto core 0 and both
  ranks end up about equally slow (El Che then rightly measures an even split). With ``--idle`` no busy process
  runs: two equal idle cores, where the only difference between the trainers is how the gradient reduction meets
  the backward pass (DDP overlaps its buckets with it). Target >= 1.00x.

Timing: on rank 0 a callback records the time at every ``on_step_end``; samples/s = (steps - warmup) x global
batch / (time of the last step's end - time of step ``warmup``'s end). Process start, model build, El Che's
first windows (it starts from an equal split) are excluded. Diagnostics per job, means over the timed steps: each
rank's samples per step and *own compute* per step (from the forward's start, modelled sleep included, to the
gradient of the word embeddings, the last one backward produces; DDP's bucket all-reduces run meanwhile,
ElCheTrainer's reduction after), the step's time, and the *rest* = step - the larger own compute (gradient
reduction not hidden in backward, waiting, optimizer, Trainer's loop, data); for ElCheTrainer also El Che's
measured ms/sample per rank and the ``elche_share_r`` / ``elche_sync_share`` Trainer logged. Output: a table on
stdout (per round and median), and table.md + results.json (every step's time and split) with ``--output``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
JOBS = ("Trainer-DDP", "ElCheTrainer")
MODELLED_CASES = ((1.0, 0.4), (1.0, 1.0))
TARGETS = {"1.0/0.4": 1.5, "1.0/1.0": 0.97, "real": 1.4, "real-idle": 1.0}


# -- the Trainer script (one per rank, under torchrun) ---------------------------------------------------------------
def rank_main(spec: dict) -> None:
    """The same Trainer script for both jobs; ``spec["job"]`` picks the class."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    rank = int(os.environ.get("RANK", "0"))
    if spec["cores"]:
        os.sched_setaffinity(0, {spec["cores"][local_rank]})  # before torch starts its threads
    import torch
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from flodl_hf.bench.device_model import REFERENCE_BATCH, DeviceModel, batch_size_of

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_device, steps, seq = spec["per_device"], spec["steps"], spec["seq_len"]
    out = Path(spec["out"])

    g = torch.Generator().manual_seed(spec["seed"])
    n = steps * per_device * world
    ids = torch.randint(1, spec["vocab"], (n, seq), generator=g)
    labels = torch.randint(0, 2, (n,), generator=g)

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": ids[i], "attention_mask": torch.ones(seq, dtype=torch.long), "labels": labels[i]}

    torch.manual_seed(spec["seed"])
    hidden = spec["hidden"]
    model = BertForSequenceClassification(BertConfig(
        vocab_size=spec["vocab"], hidden_size=hidden, num_hidden_layers=spec["layers"],
        num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden, max_position_embeddings=max(seq, 64),
        num_labels=2))
    # This rank's own compute per micro-batch, both trainers alike: from the forward's start (before the modelled
    # sleep) to the gradient of the first layer's embedding (the last one backward produces); DDP's bucket
    # all-reduces run asynchronously meanwhile, ElCheTrainer's reduction comes after it.
    seen, own, started = [0], [], [0.0]

    def count(module: Any, args: tuple, kwargs: dict) -> None:
        seen[0] += batch_size_of(args, kwargs) or 0
        started[0] = time.perf_counter()

    def backward_done(param: Any) -> None:
        own.append(time.perf_counter() - started[0])

    model.register_forward_pre_hook(count, with_kwargs=True)
    model.bert.embeddings.word_embeddings.weight.register_post_accumulate_grad_hook(backward_done)
    speed = spec["speeds"][rank]
    device = DeviceModel(spec["ms_per_sample"] * REFERENCE_BATCH, speed)
    device.attach(model)  # after `count`, so the sleep is inside the own-compute interval; 0 ms: no hook

    class Clock(TrainerCallback):
        """Step-end times (for samples/s), this rank's samples and time from step begin to the optimizer per step,
        El Che's split and measured ms/sample."""

        def __init__(self) -> None:
            self.ends: list[float] = []
            self.samples: list[int] = []
            self.compute_s: list[float] = []
            self.sizes: list[Any] = []
            self.ms_per_sample: list[Any] = []
            self.trainer: Any = None
            self._begin = 0.0
            self._seen = 0

        def on_step_begin(self, args, state, control, **kwargs):
            self._begin, self._seen = time.perf_counter(), seen[0]

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.compute_s.append(time.perf_counter() - self._begin)
            self.samples.append(seen[0] - self._seen)

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())
            self.sizes.append(getattr(self.trainer, "elche_batch_sizes", None))
            elche = getattr(self.trainer, "elche", None)
            self.ms_per_sample.append(None if elche is None else [
                None if m is None else round(m, 3) for m in elche.ms_per_unit])

    clock = Clock()
    args = TrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=per_device, gradient_accumulation_steps=1,
        max_steps=steps, learning_rate=5e-5, weight_decay=0.0, lr_scheduler_type="linear", warmup_steps=0,
        max_grad_norm=1.0, optim="adamw_torch", seed=spec["seed"], save_strategy="no", eval_strategy="no",
        logging_strategy="steps", logging_steps=spec["logging_steps"], report_to=[], use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, ddp_find_unused_parameters=False)
    common = dict(model=model, args=args, train_dataset=Rows(), callbacks=[clock])
    if spec["job"] == "ElCheTrainer":
        from flodl_hf.integrations import ElCheArguments, ElCheTrainer

        trainer = ElCheTrainer(elche=ElCheArguments(), **common)
    else:
        trainer = Trainer(**common)
    clock.trainer = trainer
    trainer.train()
    w = spec["warmup"]
    mine = {
        "rank": rank, "speed": speed, "modelled_s": round(device.slept_s, 3),
        "samples_per_step": statistics.mean(clock.samples[w:]),
        "own_ms_per_step": 1000 * statistics.mean(own[w:]),
        "to_optimizer_ms_per_step": 1000 * statistics.mean(clock.compute_s[w:]),
        "samples_by_step": clock.samples,
    }
    (out / f"rank_{rank}.json").write_text(json.dumps(mine))
    if torch.distributed.is_initialized():  # without it, gloo's threads sometimes abort the process at exit
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    if rank == 0:
        timed = clock.ends[w - 1:]  # from the end of step `warmup` to the end of the last step
        global_batch = per_device * world
        seconds = timed[-1] - timed[0]
        logs = [{k: v for k, v in entry.items() if k.startswith("elche_") or k in ("step", "loss")}
                for entry in trainer.state.log_history if "loss" in entry]
        (out / "result.json").write_text(json.dumps({
            "timed_steps": len(timed) - 1, "timed_s": seconds,
            "samples_per_s": (len(timed) - 1) * global_batch / seconds,
            "s_per_step": [round(b - a, 4) for a, b in zip(clock.ends, clock.ends[1:])],
            "elche_batch_sizes": clock.sizes, "elche_ms_per_sample": clock.ms_per_sample, "logs": logs,
        }))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # results are written; skip interpreter teardown, where gloo's threads sometimes abort the process


# -- the parent: rounds of both jobs ---------------------------------------------------------------------------------
def _env() -> dict:
    env = dict(os.environ)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "FLODL_HF_DEVICES"):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    return env


def _cores() -> list[int]:
    """The two cores ``--real`` pins rank 0 and rank 1 to (the first two this process may run on)."""
    return sorted(os.sched_getaffinity(0))[:2]


def run_job(job: str, speeds: tuple[float, float], args: argparse.Namespace, out: Path) -> dict:
    """One job under ``torchrun --standalone --nproc-per-node 2``; returns rank 0's figures plus every rank's."""
    out.mkdir(parents=True, exist_ok=True)
    spec = {
        "job": job, "speeds": list(speeds), "ms_per_sample": 0.0 if args.real else args.ms_per_sample,
        "cores": _cores() if args.real else None, "per_device": args.per_device, "steps": args.steps,
        "warmup": args.warmup, "seq_len": args.seq_len, "layers": args.layers, "hidden": args.hidden,
        "vocab": args.vocab, "seed": args.seed, "logging_steps": args.logging_steps, "out": str(out),
    }
    # --standalone: torchrun picks a free port itself (no race with other processes for a port chosen here)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(Path(__file__).resolve()), "--rank-spec", json.dumps(spec)]
    busy = None
    if args.real and not args.idle:  # a competing process on rank 1's core for the job's whole duration
        busy = subprocess.Popen([sys.executable, "-c",
                                 f"import os\nos.sched_setaffinity(0, {{{_cores()[1]}}})\nwhile True:\n    pass"])
    try:
        proc = subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=args.job_timeout)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"{job} failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    got = json.loads((out / "result.json").read_text())
    got["ranks"] = [json.loads((out / f"rank_{r}.json").read_text()) for r in range(2)]
    return got


def _case_name(speeds: tuple[float, float] | None, idle: bool = False) -> str:
    if speeds is None:
        return "real-idle" if idle else "real"
    return f"{speeds[0]:.1f}/{speeds[1]:.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--real", action="store_true", help="real compute: rank r pinned to core r, a busy process on "
                   "core 1, no modelled sleep")
    p.add_argument("--idle", action="store_true", help="with --real: no busy process (two equal idle cores)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=25, help="optimizer steps per job (max_steps)")
    p.add_argument("--warmup", type=int, default=5, help="steps before the timed region")
    p.add_argument("--per-device", type=int, default=None,
                   help="per_device_train_batch_size (default 16 modelled, 32 --real)")
    p.add_argument("--case", action="append", choices=[_case_name(c) for c in MODELLED_CASES], default=None,
                   help="modelled speed case to run (repeatable; default both)")
    p.add_argument("--ms-per-sample", type=float, default=20.0, help="modelled ms per sample at speed 1.0")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--logging-steps", type=int, default=5)
    p.add_argument("--job-timeout", type=float, default=600.0, help="seconds one torchrun job may take")
    p.add_argument("--output", default=None, help="directory for table.md and results.json")
    p.add_argument("--rank-spec", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank_spec:
        rank_main(json.loads(args.rank_spec))
        return 0
    if args.per_device is None:
        args.per_device = 32 if args.real else 16
    if args.warmup < 1 or args.steps < args.warmup + 1:
        p.error(f"--steps {args.steps} --warmup {args.warmup}: use --warmup >= 1 and --steps > --warmup")
    if args.real and len(_cores()) < 2:
        p.error("--real pins the ranks to 2 cores: this process may run on fewer")
    if args.idle and not args.real:
        p.error("--idle is a --real setting: pass --real --idle")
    cases: list[tuple[float, float] | None] = [None] if args.real else [
        c for c in MODELLED_CASES if args.case is None or _case_name(c) in args.case]
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="flodl-hf-trainer-elche-") as tmp:
        for r in range(args.rounds):
            for c, speeds in enumerate(cases):
                name = _case_name(speeds, args.idle)
                order = list(JOBS) if (r + c) % 2 == 0 else list(reversed(JOBS))
                got: dict[str, Any] = {"round": r, "case": name, "order": order}
                for job in order:
                    got[job] = run_job(job, speeds or (1.0, 1.0), args, Path(tmp) / f"{r}-{c}-{job}")
                got["ratio"] = got["ElCheTrainer"]["samples_per_s"] / got["Trainer-DDP"]["samples_per_s"]
                rounds.append(got)
                print(_round_line(got), flush=True)
    table = _table(rounds, cases, args)
    print(table)
    if args.output:
        out = Path(args.output)
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(table + "\n")
        (out / "results.json").write_text(json.dumps({"args": vars(args), "rounds": rounds}, indent=1))
    return 0


def _split(job: dict) -> str:
    return "/".join(f"{rk['samples_per_step']:.1f}" for rk in job["ranks"])


def _own(job: dict) -> str:
    return "/".join(f"{rk['own_ms_per_step']:.0f}" for rk in job["ranks"])


def _sync_share(job: dict) -> float | None:
    """The mean ``elche_sync_share`` ElCheTrainer logged (the gradient reduction's share of a window's time)."""
    got = [e["elche_sync_share"] for e in job["logs"] if "elche_sync_share" in e]
    return statistics.mean(got) if got else None


def _step_ms(job: dict) -> float:
    return 1000 * job["timed_s"] / job["timed_steps"]


def _job_line(name: str, job: dict) -> str:
    """samples/s; per rank samples and own compute (ms) per step; the step's time; what is left over (sync, optimizer,
    Trainer's loop, data)."""
    step = _step_ms(job)
    rest = step - max(rk["own_ms_per_step"] for rk in job["ranks"])
    return (f"{name} {job['samples_per_s']:.1f} samples/s (split {_split(job)}, own compute ms {_own(job)}, step "
            f"{step:.0f} ms, rest {rest:.0f} ms)")


def _round_line(got: dict) -> str:
    el = got["ElCheTrainer"]
    shares = [e for e in el["logs"] if "elche_share_0" in e]
    last = shares[-1] if shares else {}
    ms = el["elche_ms_per_sample"][-1] if el.get("elche_ms_per_sample") else None
    return (f"round {got['round']} {got['case']}: {_job_line('Trainer-DDP', got['Trainer-DDP'])} | "
            f"{_job_line('ElCheTrainer', el)}, logged shares {last.get('elche_share_0')}/{last.get('elche_share_1')}"
            f", sync share {last.get('elche_sync_share')}, El Che ms/sample {ms} | ratio {got['ratio']:.3f}")


def _table(rounds: list[dict], cases: list, args: argparse.Namespace) -> str:
    mode = ("real compute: rank r pinned to core r" + ("" if args.idle else ", a busy process on core 1")
            if args.real else
            f"modelled speeds: {args.ms_per_sample:g} ms/sample at speed 1.0 (forward pre-hook sleep)")
    lines = [
        f"2 gloo CPU ranks (torchrun), BERT {args.layers} layers hidden {args.hidden} vocab {args.vocab}, seq len "
        f"{args.seq_len}, per-device batch {args.per_device} (global {2 * args.per_device}), {args.steps} steps, "
        f"timed after {args.warmup}; {mode}; {len(rounds) // len(cases)} alternating rounds",
        "",
        "| speeds | round | Trainer-DDP samples/s | ElCheTrainer samples/s | ElCheTrainer split (samples/step) | "
        "ElCheTrainer own compute ms r0/r1 | step ms DDP / ElChe | ElCheTrainer sync share | ratio | target |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for speeds in cases:
        name = _case_name(speeds, args.idle)
        mine = [g for g in rounds if g["case"] == name]
        for g in mine:
            lines.append(f"| {name} | {g['round']} | {g['Trainer-DDP']['samples_per_s']:.1f} | "
                         f"{g['ElCheTrainer']['samples_per_s']:.1f} | {_split(g['ElCheTrainer'])} | "
                         f"{_own(g['ElCheTrainer'])} | {_step_ms(g['Trainer-DDP']):.0f} / "
                         f"{_step_ms(g['ElCheTrainer']):.0f} | {_sync_share(g['ElCheTrainer']) or 0:.3f} | "
                         f"{g['ratio']:.3f} | |")
        med = statistics.median(g["ratio"] for g in mine)
        lines.append(
            f"| **{name}** | median | {statistics.median(g['Trainer-DDP']['samples_per_s'] for g in mine):.1f} | "
            f"{statistics.median(g['ElCheTrainer']['samples_per_s'] for g in mine):.1f} | | | | "
            f"{statistics.median(_sync_share(g['ElCheTrainer']) or 0 for g in mine):.3f} | **{med:.3f}** | "
            f">= {TARGETS[name]} {'met' if med >= TARGETS[name] else 'MISSED'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
