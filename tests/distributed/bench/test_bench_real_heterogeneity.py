"""flodl-hf bench on real heterogeneity: --pin-cores / --busy-core parse and validate, the busy
process is always killed, the per-window timeline and its gap accounting add up, and one short smoke run shows
pinned ranks (solo included) and no busy process left afterwards."""

from __future__ import annotations

import os

import pytest

from flodl_hf.bench import harness, main
from flodl_hf.bench.cli import build_parser, settings_from_args
from flodl_hf.bench.ranks import BusyCore, RankPool
from flodl_hf.bench.settings import BenchSettings, usable_cores
from flodl_hf.bench.timeline import gap_accounting, solo_phases, window_timeline

CORES = usable_cores()
two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores this process may run on")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --- options --------------------------------------------------------------------------------------------------
@two_cores
def test_pin_cores_and_busy_core_parse():
    args = build_parser().parse_args(["--modes", "solo,ddp,elche-setup", "--model", "bert-4l", "--device-ms", "0",
                                      "--speeds", "1,1", "--pin-cores", "--busy-core", str(CORES[1])])
    s = settings_from_args(args)
    assert s.pin_cores and s.busy_core == CORES[1] and s.rank_cores == CORES[:2]
    assert (s.model, s.device_ms) == ("bert-4l", 0.0)
    plain = settings_from_args(build_parser().parse_args(["--modes", "solo"]))
    assert (plain.pin_cores, plain.busy_core, plain.rank_cores) == (False, None, None)


@pytest.mark.parametrize("kwargs, flag", [
    (dict(busy_core=-1), "--busy-core"),
    (dict(busy_core=10_000), "--busy-core"),
    (dict(pin_cores=True, speeds=(1.0,) * 64), "--pin-cores"),
    (dict(device_ms=0.0, speeds=(1.0, 1.0), model="tiny-bert"), "--device-ms"),
])
def test_real_compute_options_are_validated(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        BenchSettings(modes=("solo", "elche-setup"), **kwargs).resolved()


def test_pin_cores_refuses_builder_modes():
    if len(CORES) < 2:
        pytest.skip("needs 2 cores")
    from flodl_hf.bench.settings import mode_availability

    if mode_availability()["builder-sync/cpu"] is not None:
        pytest.skip("builder mode unavailable here")
    with pytest.raises(ValueError, match="--modes.*--pin-cores"):
        BenchSettings(modes=("solo", "builder-sync/cpu"), pin_cores=True).resolved()


def test_cli_bad_busy_core_is_one_line_exit_2(tmp_path, capsys):
    assert main(["--busy-core", "99999", "--modes", "solo", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--busy-core 99999 is invalid" in err


# --- the busy process -----------------------------------------------------------------------------------------
@two_cores
def test_busy_core_is_pinned_and_killed_on_error():
    with pytest.raises(RuntimeError):
        with BusyCore(CORES[1]) as busy:
            pid = busy.pid
            assert pid is not None and _alive(pid)
            raise RuntimeError("boom")
    assert not _alive(pid)


class _Boom(Exception):
    pass


@two_cores
def test_harness_kills_the_busy_process_when_the_bench_fails(monkeypatch):
    seen: list[BusyCore] = []

    class Spy(BusyCore):
        def __enter__(self) -> "Spy":
            super().__enter__()
            seen.append(self)
            return self

    class Failing(RankPool):
        def run(self, *args, **kwargs):
            raise _Boom("a failure the harness does not catch")

    monkeypatch.setattr(harness, "BusyCore", Spy)
    monkeypatch.setattr(harness, "RankPool", Failing)
    with pytest.raises(_Boom):
        harness.run_bench(BenchSettings(modes=("solo",), steps=3, warmup=1, repeats=1, busy_core=CORES[1],
                                        pin_cores=True), log=lambda line: None)
    assert len(seen) == 1 and seen[0].proc is not None and seen[0].proc.returncode is not None
    assert not _alive(seen[0].pid)


# --- timeline and gap accounting ------------------------------------------------------------------------------
def _clock(rows, t0, start_step=0):
    return {"t0": t0, "start_step": start_step, "rows": rows, "windows": []}


def _row(t_in, comp, step, n, closed, opt=None):
    body = t_in + 0.001
    call = body + comp
    ret = call + step
    o0, o1 = (None, None) if opt is None else opt
    return [t_in, body, call, o0, o1, ret, ret, n, int(closed)]


def test_timeline_and_gap_accounting_add_up():
    # Two windows of 2 micro-steps; rank 0 (fast) waits for rank 1 at each window end. Times in seconds.
    r0, r1 = [], []
    t = 0.0
    for _ in range(2):
        a = _row(t, 0.10, 0.002, 20, False)
        b0 = _row(a[6], 0.10, 0.0, 20, True)
        a1 = _row(t, 0.17, 0.002, 12, False)
        b1 = _row(a1[6], 0.17, 0.0, 12, True)
        last = max(b0[2], b1[2])
        sync_end = last + 0.010
        for b in (b0, b1):
            b[3], b[4] = sync_end, sync_end + 0.005
            b[5] = b[6] = sync_end + 0.006
        r0 += [a, b0]
        r1 += [a1, b1]
        t = b0[6]
    elapsed = [t, t]
    tl = window_timeline([_clock(r0, 0.0), _clock(r1, 0.0)], elapsed)
    assert len(tl["windows"]) == 2
    w = tl["windows"][0]
    assert w["split"] == [20, 12] and w["samples"] == [40, 24] and w["micro"] == 2
    assert w["wait_ms"][1] == pytest.approx(0.0) and w["wait_ms"][0] > 100
    assert w["sync_ms"] == [pytest.approx(10.0), pytest.approx(10.0)]
    solo = [solo_phases(_clock([_row(i * 0.2, 0.16, 0.02, 32, True) for i in range(5)], 0.0), 1.0),
            solo_phases(_clock([_row(i * 0.4, 0.34, 0.02, 32, True) for i in range(3)], 0.0), 1.2)]
    g = gap_accounting(tl, solo, t)
    parts = g["parts_s"]
    assert sum(parts.values()) == pytest.approx(g["gap_s"], abs=1e-9)  # an identity, by construction
    assert parts["wait"] > 0 and parts["sync"] > 0
    counter = g["wait_counterfactuals"]
    assert counter["wait_as_run_s"] == pytest.approx(parts["wait"], rel=0.05)
    assert counter["best_constant_split"] is not None and sum(counter["best_constant_split"]) == 32


# --- smoke run ------------------------------------------------------------------------------------------------
@two_cores
def test_smoke_pinned_ranks_busy_core_and_timeline(tmp_path):
    result = harness.run_bench(BenchSettings(modes=("solo", "elche-setup"), speeds=(1.0, 1.0), device_ms=8.0,
                                             steps=10, warmup=2, repeats=1, pin_cores=True, busy_core=CORES[1],
                                             timeout_s=120.0), log=lambda line: None)
    assert result["cores"] == list(CORES[:2])
    busy = result["busy_process"]
    assert busy["core"] == CORES[1] and not _alive(busy["pid"])
    for mode in ("solo", "elche-setup"):
        run = result["rounds"][0]["runs"][mode]
        assert "error" not in run, run
        assert run["cores"] == [[CORES[0]], [CORES[1]]]  # every thread of rank r on core r, solo included
    run = result["rounds"][0]["runs"]["elche-setup"]
    windows = run["timeline"]["windows"]
    assert windows and all(len(w["compute_ms"]) == 2 and len(w["wait_ms"]) == 2 for w in windows)
    assert sum(sum(w["samples"]) for w in windows) == sum(run["per_rank_samples"])
    gap = run["gap"]
    assert sum(gap["parts_s"].values()) == pytest.approx(gap["gap_s"], abs=1e-6)
