"""Run every selected mode in alternating rounds and turn the ranks' raw figures into per-mode results.

Why it exists: the comparison is only fair if the modes share one procedure. Every round runs every mode once
on the same rank processes (:class:`~flodl_hf.bench.ranks.RankPool`), in table order on even rounds and
reversed on odd rounds, so slow drift of the machine (other load, thermal) cancels. Per round:

- ``solo``: rate_r = rank r's samples / its timed seconds; ideal = sum of rate_r (the same round's).
- other modes: samples/s = every rank's samples in the timed region / the longest timed region of a rank;
  efficiency = samples/s / ideal.
- accuracy workload: the target is ``--target`` or DDP's final accuracy in that round; time to target is the
  training clock (evaluation excluded) at the first evaluation reaching it; speed-up = DDP's time / the mode's.

A mode whose run fails is recorded with its error and the bench goes on with the others.

Throughput runs of the setup modes also get a per-window ``timeline`` (each rank's compute, wait, sync, split,
samples) and, next to the same round's solo run, a ``gap`` accounting of where El Che's time goes against the
ideal (:mod:`flodl_hf.bench.timeline`). ``--pin-cores`` pins rank r's process to core r for the whole bench (solo
included) and ``--busy-core N`` runs a busy process on core N around it, killed at the end, errors included.
"""

from __future__ import annotations

import platform
import sys
import time
from contextlib import nullcontext
from statistics import mean
from typing import Any, Callable, Optional

from .meter import RunSpec
from .ranks import BenchRunError, BusyCore, RankPool
from .settings import BenchSettings, mode_availability
from .timeline import gap_accounting, solo_phases, window_timeline
from .workloads import WorkloadSpec

__all__ = ["run_bench", "summarise_round"]

Log = Callable[[str], None]


def _rank_fn(mode: str) -> Callable[..., Any]:
    if mode == "solo":
        from .modes import solo_rank

        return solo_rank
    if mode == "ddp":
        from .modes import ddp_rank

        return ddp_rank
    if mode in ("elche-setup", "elche-throughput", "elche-anchor1", "elche-adascale", "setup-sync"):
        from .modes import setup_rank

        return setup_rank
    from .modes_accelerate import accelerate_rank

    return accelerate_rank


def _specs(s: BenchSettings, mode: str, round_no: int) -> tuple[RunSpec, WorkloadSpec]:
    seed = s.seed + round_no
    if s.steps is None or s.devices is None or s.device_ms is None or s.model is None:
        raise ValueError("settings must be resolved first: call BenchSettings.resolved()")
    run = RunSpec(mode=mode, workload=s.workload, speeds=tuple(s.speeds), devices=tuple(s.devices),
                  device_ms=s.device_ms, batch_size=s.batch_size, steps=s.steps, warmup=s.warmup,
                  eval_every=s.eval_every, localsgd_steps=s.localsgd_steps, timeout_s=s.timeout_s, seed=seed,
                  max_anchor=s.elche_max_anchor, sync_stretch=s.sync_stretch, stretch=s.stretch)
    work = WorkloadSpec(model=s.model, train_samples=s.steps * s.world * s.batch_size,
                        eval_samples=s.eval_samples, seed=seed, lr=s.lr, max_length=s.max_length)
    return run, work


def _summarise_run(mode: str, values: list[dict[str, Any]], throughput: bool = True) -> dict[str, Any]:
    r0 = values[0]
    out: dict[str, Any] = {"per_rank_samples": [v["samples"] for v in values],
                           "elapsed_s": max(v["elapsed_s"] for v in values),
                           "modelled_s": [v["device_model"]["modelled_s"] for v in values]}
    if all("cores" in v for v in values):
        out["cores"] = [v["cores"] for v in values]
    clocks = [v.get("step_clock") for v in values]
    if mode == "solo":
        rates = [v["samples"] / v["elapsed_s"] for v in values]
        out["per_rank_samples_per_s"] = rates
        out["samples_per_s"] = sum(rates)
        if throughput and all(clocks):
            out["phases"] = [solo_phases(c, v["elapsed_s"]) for c, v in zip(clocks, values)]
    else:
        out["samples_per_s"] = sum(v["samples"] for v in values) / out["elapsed_s"]
        if throughput and all(clocks):
            try:
                out["timeline"] = window_timeline(clocks, [v["elapsed_s"] for v in values])
            except ValueError as exc:  # a diagnostic: never fails the run it describes
                out["timeline_error"] = str(exc)
    out["curve"] = r0.get("curve", [])
    out["final_accuracy"] = r0.get("final_accuracy")
    for key in ("elche_history", "elche_describe", "optimizer_steps", "localsgd_steps", "builder"):
        if key in r0:
            out[key] = r0[key]
    return out


def _time_to(curve: list, target: float) -> Optional[float]:
    for t, _, acc in curve:
        if acc >= target - 1e-9:
            return float(t)
    return None


def summarise_round(runs: dict[str, dict[str, Any]], target: Optional[float]) -> dict[str, Any]:
    """Add efficiency, target, time to target and speed-up vs DDP to one round's per-mode runs (in place)."""
    ok = {m: r for m, r in runs.items() if "error" not in r}
    ideal = ok["solo"]["samples_per_s"] if "solo" in ok else None
    accs = {m: r["final_accuracy"] for m, r in ok.items() if r.get("final_accuracy") is not None}
    if target is None and accs:
        target = accs["ddp"] if "ddp" in accs else min(accs.values())
    for mode, r in ok.items():
        r["efficiency"] = (r["samples_per_s"] / ideal) if ideal else None
        if "timeline" in r and "phases" in ok.get("solo", {}):
            r["gap"] = gap_accounting(r["timeline"], ok["solo"]["phases"], r["elapsed_s"])
        if accs:
            r["target"] = target
            r["time_to_target_s"] = _time_to(r["curve"], target) if target is not None else None
    ddp_t = ok.get("ddp", {}).get("time_to_target_s")
    for r in ok.values():
        t = r.get("time_to_target_s")
        r["speedup_vs_ddp"] = (ddp_t / t) if (ddp_t and t) else None
    return {"ideal_samples_per_s": ideal, "target": target}


def _aggregate(rounds: list[dict[str, Any]], modes: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for mode in modes:
        runs = [rd["runs"][mode] for rd in rounds if mode in rd["runs"]]
        good = [r for r in runs if "error" not in r]
        agg: dict[str, Any] = {"runs": len(runs), "failed": len(runs) - len(good)}
        if not good:
            agg["error"] = runs[-1]["error"] if runs else "not run"
            out[mode] = agg
            continue

        def avg(key: str, rs: list = good) -> Optional[float]:
            vals = [r[key] for r in rs if r.get(key) is not None]
            return mean(vals) if vals else None

        rates = [r["samples_per_s"] for r in good]
        agg.update({"samples_per_s": mean(rates), "samples_per_s_min": min(rates), "samples_per_s_max": max(rates),
                    "efficiency": avg("efficiency"), "final_accuracy": avg("final_accuracy"),
                    "time_to_target_s": avg("time_to_target_s"), "speedup_vs_ddp": avg("speedup_vs_ddp")})
        if mode == "solo":
            per = [r["per_rank_samples_per_s"] for r in good]
            agg["per_rank_samples_per_s"] = [mean(col) for col in zip(*per)]
        history = good[-1].get("elche_history")
        if history:
            agg["anchor_history"] = [h["anchor"] for h in history]
            agg["noise_scale_history"] = [h.get("noise_scale") for h in history]
            agg["overhead_history"] = [h.get("overhead") for h in history]
            agg["share_history"] = [[round(x, 4) for x in h["shares"]] for h in history]
            agg["batch_size_history"] = [h.get("batch_sizes") for h in history]
            agg["final_plan"] = good[-1].get("elche_describe")
        out[mode] = agg
    return out


def _environment(s: BenchSettings) -> dict[str, Any]:
    import os

    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "platform": platform.platform(), "cpu_count": os.cpu_count(),
                           "devices": list(s.devices or ())}
    for name in ("transformers", "accelerate"):
        try:
            env[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - optional
            env[name] = None
    if torch.cuda.is_available():
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return env


def _log_run(log: Log, round_no: int, repeats: int, mode: str, r: dict[str, Any], wall: float) -> None:
    if "error" in r:
        log(f"[round {round_no + 1}/{repeats}] {mode}: FAILED ({r['error'].splitlines()[0]})")
        return
    extra = f", final accuracy {r['final_accuracy']:.3f}" if r.get("final_accuracy") is not None else ""
    log(f"[round {round_no + 1}/{repeats}] {mode}: {r['samples_per_s']:.1f} samples/s over "
        f"{r['elapsed_s']:.1f} s{extra} ({wall:.0f} s with setup)")


def run_bench(settings: BenchSettings, log: Optional[Log] = None) -> dict[str, Any]:
    """Run the bench described by ``settings`` (resolved here) and return the results dict (JSON-ready)."""
    s = settings.resolved()
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    modes, repeats = tuple(s.modes or ()), int(s.repeats or 1)
    available = mode_availability()
    notes = [f"{m} unavailable: {why}" for m, why in available.items() if why is not None]
    if s.sync_stretch:
        notes.append(f"setup modes: a modelled slow interconnect sleeps {s.sync_stretch:g} x a micro-batch's compute "
                     "after every synchronisation (DdpConfig.simulate_sync)")
    if s.stretch:
        notes.append(f"speeds stretch real compute: device_ms {s.device_ms:g} is this machine's measured compute per "
                     "16 samples, and a rank at speed v sleeps device_ms * b/16 * (1/v - 1) before each forward "
                     "(the fastest sleeps nothing), identically in every mode")
    elif s.device_ms:
        notes.append("speeds are modelled by one sleep per micro-batch (device_ms * b/16 / speed) in every mode; "
                     "elche-setup runs without DdpConfig.simulate_speeds")
    if any(m.startswith("builder-") for m in modes) and s.device_ms:
        notes.append("builder modes: the sleep runs at speed 1.0 and the builder's simulate_speeds stretches each "
                     "batch by 1/speed (its factories get no rank); epoch-based timing, see modes_builder.py")
    cores = s.rank_cores
    if cores is not None:
        notes.append(f"ranks pinned to cores {','.join(map(str, cores))} (rank r on the r-th), solo included")
    if s.busy_core is not None:
        notes.append(f"a busy process ran on core {s.busy_core} for the whole bench")
    rounds: list[dict[str, Any]] = []
    started = time.monotonic()
    busy_info: Optional[dict[str, Any]] = None
    busy = BusyCore(s.busy_core) if s.busy_core is not None else nullcontext()
    with busy, RankPool(s.world, cores=cores) as pool:
        if isinstance(busy, BusyCore):
            busy_info = {"core": busy.core, "pid": busy.pid}
        for round_no in range(repeats):
            order = list(modes) if round_no % 2 == 0 else list(reversed(modes))
            runs: dict[str, dict[str, Any]] = {}
            for mode in order:
                t = time.monotonic()
                run_spec, work_spec = _specs(s, mode, round_no)
                try:
                    if mode.startswith("builder-"):
                        from .modes_builder import run_builder

                        runs[mode] = run_builder(run_spec, work_spec)
                    else:
                        values = pool.run(_rank_fn(mode), run_spec, work_spec, timeout_s=s.timeout_s,
                                          distributed=mode != "solo")
                        runs[mode] = _summarise_run(mode, values, throughput=s.workload == "throughput")
                except (BenchRunError, RuntimeError, ValueError) as exc:
                    runs[mode] = {"error": f"{type(exc).__name__}: {exc}"}
                _log_run(log, round_no, repeats, mode, runs[mode], time.monotonic() - t)
            info = summarise_round(runs, s.target)
            rounds.append({"round": round_no, "order": order, "runs": runs, **info})
    ideals = [rd["ideal_samples_per_s"] for rd in rounds if rd["ideal_samples_per_s"]]
    return {"tool": "flodl-hf bench", "format": 1, "settings": s.as_dict(), "environment": _environment(s),
            "ideal_samples_per_s": mean(ideals) if ideals else None,
            "modes": _aggregate(rounds, modes), "rounds": rounds, "notes": notes,
            "cores": list(cores) if cores is not None else None, "busy_process": busy_info,
            "wall_s": round(time.monotonic() - started, 1)}
