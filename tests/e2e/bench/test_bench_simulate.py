"""flodl-hf bench --simulate: the ring cost formula, the model's limits, determinism, calibration and the CLI.

Fast and deterministic: the simulator is pure Python (no process, no torch), every run is seeded.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from flodl_hf.bench import main as bench_main
from flodl_hf.bench.simulate import (CPU_BENCH, SimSettings, calibrate, fleet_speeds, ideal_rate, ring_allreduce_ms,
                                     simulate, simulate_one)
from flodl_hf.bench.simulate_cli import parse_fleet

QUIET = SimSettings(noise=0.0, sync_noise=0.0, steps=40, warmup=5)


def test_ring_allreduce_formula() -> None:
    assert ring_allreduce_ms(1, 91.0, 25.0, 10.0) == 0.0
    # N=2: 2*1/2 * 91e6 B / 25e9 B/s = 3.64 ms, plus 2 hops * 10 µs
    assert ring_allreduce_ms(2, 91.0, 25.0, 10.0) == pytest.approx(3.64 + 0.02)
    # N=64 across nodes: 2*63/64 * 91e6 / 12.5e9 s + 126 * 10 µs
    assert ring_allreduce_ms(64, 91.0, 12.5, 10.0) == pytest.approx(2 * 63 / 64 * 7.28 + 1.26)
    # bandwidth term tends to 2 * bytes / bandwidth; latency term grows linearly
    assert ring_allreduce_ms(10_000, 1.0, 1.0, 0.0) == pytest.approx(2.0, rel=1e-3)
    assert ring_allreduce_ms(5, 0.0, 1.0, 100.0) == pytest.approx(0.8)


def test_simulate_one_uses_intra_then_inter_node_bandwidth() -> None:
    s = replace(QUIET, ranks_per_node=4).resolved()
    assert simulate_one([1.0] * 4, s)["bandwidth_gbps"] == s.bandwidth_gbps
    assert simulate_one([1.0] * 8, s)["bandwidth_gbps"] == s.inter_bandwidth_gbps


def test_one_rank_is_the_ideal() -> None:
    row = simulate_one([0.7], QUIET.resolved())
    assert row["allreduce_ms"] == 0.0
    assert row["elche_efficiency"] == pytest.approx(1.0, abs=1e-12)
    assert row["ddp_efficiency"] == pytest.approx(1.0, abs=1e-12)


def test_equal_speeds_without_noise_el_che_equals_ddp() -> None:
    s = replace(QUIET, model_mb=1.0).resolved()  # sync well under El Che's overhead target: anchor stays 1
    for n in (2, 8, 32):
        row = simulate_one([1.0] * n, s)
        assert row["final_anchor"] == 1 and row["final_batch_sizes"] in (None, [16] * n)
        assert row["elche_samples_per_s"] == pytest.approx(row["ddp_samples_per_s"], rel=1e-12)
        assert row["ddp_theory"] == 1.0 and row["elche_vs_ddp"] == pytest.approx(1.0, rel=1e-12)


def test_fast_rank_share_approaches_speed_proportions() -> None:
    s = replace(QUIET, overhead_ms=0.0, batch_size=64, model_mb=1.0).resolved()
    row = simulate_one([1.0, 0.25], s)
    assert row["final_batch_sizes"] == [102, 26]  # 128 * 0.8 = 102.4
    assert row["fast_share"] == pytest.approx(0.8, abs=1 / 128)
    noisy = replace(s, noise=0.05, sync_noise=0.2, steps=120).resolved()
    for n in (8, 64):
        row = simulate_one(fleet_speeds(n, (("new", 1.0, 1), ("old", 0.5, 1))), noisy)
        assert row["fast_share"] == pytest.approx(2 / 3, abs=0.02)


def test_el_che_beats_ddp_on_mixed_speeds_and_stays_below_ideal() -> None:
    result = simulate(replace(SimSettings(), ranks=(8, 64), steps=60))
    for row in result["rows"]:
        assert row["ddp_efficiency"] < row["elche_efficiency"] < 1.0
        assert row["ddp_efficiency"] <= row["ddp_theory"] + 0.01


def test_determinism_with_a_seed() -> None:
    s = replace(SimSettings(), ranks=(2, 16), steps=40)
    a, b = simulate(s), simulate(s)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    c = simulate(replace(s, seed=1))
    assert c["rows"][1]["elche_samples_per_s"] != a["rows"][1]["elche_samples_per_s"]


def test_fleet_counts_and_fractions() -> None:
    assert fleet_speeds(4, (("a", 1.0, 0.5), ("b", 0.5, 0.5))) == [1.0, 1.0, 0.5, 0.5]
    assert fleet_speeds(8, (("a", 1.0, 3), ("b", 0.5, 1))) == [1.0] * 6 + [0.5] * 2
    assert fleet_speeds(3, (("a", 1.0, 1), ("b", 0.5, 1))) == [1.0, 1.0, 0.5]
    assert parse_fleet("h100:1.0,a100:0.5:3") == (("h100", 1.0, 1.0), ("a100", 0.5, 3.0))
    ideal = ideal_rate([1.0, 0.5], QUIET)
    assert ideal == pytest.approx(16 / 41.8 + 16 / 81.8)


def test_calibration_within_five_percent_of_measured() -> None:
    for row in calibrate(replace(CPU_BENCH, steps=120)):
        assert abs(row["elche_error"]) < 0.05, row
        assert abs(row["ddp_error"]) < 0.05, row


@pytest.mark.parametrize("bad", [["--ranks", "0"], ["--fleet", "h100"], ["--noise", "-1"], ["--steps", "3"],
                                 ["--speeds", "1,0"], ["--bogus"],
                                 ["--speeds", "inf,1"], ["--speeds", "nan,1"], ["--fleet", "a:inf,b:1"]])
def test_cli_usage_errors_exit_2(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["--simulate", *bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flodl-hf bench --simulate: error:") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "(('" not in err, err  # one line, no Python tuple


def test_an_output_under_a_file_is_refused_before_the_run(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("a user's file\n")
    assert bench_main(["--simulate", "--output", str(tmp_path / "afile" / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flodl-hf bench --simulate: error: --output ") and "cannot be created (Not a directory)" \
        in err and len(err.strip().splitlines()) == 1, err
    assert (tmp_path / "afile").read_text() == "a user's file\n"


def test_cli_runs_and_writes_its_files(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    code = ("import sys; from flodl_hf.cli import main; rc = main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'the simulator imported torch'; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, "bench", "--simulate", "--ranks", "2,4", "--steps", "30",
                           "--output", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "El Che / ideal" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["plot.png", "results.json", "table.md"]
    result = json.loads((out / "results.json").read_text())
    assert result["tool"] == "flodl-hf bench" and [r["ranks"] for r in result["rows"]] == [2, 4]
    assert all(math.isfinite(r["elche_efficiency"]) for r in result["rows"])
    # the same directory is accepted again (a previous bench output)
    assert bench_main(["--simulate", "--ranks", "2", "--steps", "30", "--output", str(out)]) == 0
