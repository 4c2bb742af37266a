"""flodl-hf bench: the modelled device time, settings, report and output rules (fast, in-process), and one smoke
run of the harness on 2 real gloo ranks (a few seconds of modelled time; process start-up dominates)."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from flodl_hf.bench import main
from flodl_hf.bench.device_model import DeviceModel, batch_size_of
from flodl_hf.bench.harness import run_bench, summarise_round
from flodl_hf.bench.modes_builder import ChunkedDataset
from flodl_hf.bench.report import markdown_table, prepare_output
from flodl_hf.bench.settings import ALL_MODES, BenchSettings, mode_availability


# --- modelled device time -------------------------------------------------------------------------------------
def test_device_model_sleeps_per_sample_over_speed():
    dm = DeviceModel(device_ms=40.0, speed=0.4)
    assert dm.cost_s(16) == pytest.approx(0.1)
    assert dm.cost_s(8) == pytest.approx(0.05)
    model = dm.attach(torch.nn.Linear(3, 2))
    start = time.perf_counter()
    model(torch.zeros(4, 3))  # 4 samples at 2.5 ms / 0.4 = 25 ms
    assert time.perf_counter() - start >= 0.024
    assert dm.calls == 1 and dm.slept_s == pytest.approx(0.025)
    with dm.suspended():
        model(torch.zeros(4, 3))
    assert dm.calls == 1
    assert "linear" not in "".join(model.state_dict())  # a hook, not a wrapper: state dict keys unchanged
    assert list(model.state_dict()) == ["weight", "bias"]


def test_device_model_stretch_sleeps_only_what_a_slower_device_adds():
    assert DeviceModel(device_ms=100.0, speed=1.0, stretch=True).cost_s(16) == 0.0
    assert DeviceModel(device_ms=100.0, speed=0.4, stretch=True).cost_s(16) == pytest.approx(0.15)
    assert DeviceModel(device_ms=100.0, speed=0.4, stretch=True).cost_s(8) == pytest.approx(0.075)
    assert DeviceModel(device_ms=100.0, speed=0.4).cost_s(16) == pytest.approx(0.25)  # not stretching: all of it


def test_stretch_runs_every_torch_mode_alike(tmp_path):
    result = run_bench(BenchSettings(modes=("solo", "ddp", "elche-setup"), speeds=(1.0, 0.5), device_ms=20.0,
                                     stretch=True, steps=8, warmup=2, repeats=1, timeout_s=120.0),
                       log=lambda line: None)
    assert any("stretch real compute" in note for note in result["notes"])
    for mode in ("solo", "ddp", "elche-setup"):
        run = result["rounds"][0]["runs"][mode]
        assert "error" not in run, run
        fast, slow = run["modelled_s"]
        assert fast == 0.0 and slow > 0.0, (mode, run["modelled_s"])  # only the slower rank sleeps


def test_batch_size_of_finds_keyword_tensors():
    assert batch_size_of((), {"input_ids": torch.zeros(5, 7, dtype=torch.long)}) == 5
    assert batch_size_of((torch.zeros(3, 2),), {}) == 3
    assert batch_size_of((), {}) is None


@pytest.mark.parametrize("kwargs", [dict(device_ms=-1.0), dict(device_ms=40.0, speed=0.0),
                                    dict(device_ms=40.0, speed=1.5)])
def test_device_model_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        DeviceModel(**kwargs)


# --- settings -------------------------------------------------------------------------------------------------
def test_settings_defaults_depend_on_workload():
    t = BenchSettings(modes=("solo", "ddp")).resolved()
    assert (t.model, t.steps, t.repeats, t.device_ms, t.devices) == ("mlp", 60, 2, 40.0, ("cpu", "cpu"))
    a = BenchSettings(workload="accuracy", modes=("ddp", "elche-setup")).resolved()
    assert (a.model, a.steps, a.repeats) == ("tiny-bert", 200, 1)
    d = BenchSettings().resolved()
    assert d.modes and "solo" in d.modes and "elche-setup" in d.modes
    assert all(mode_availability()[m] is None for m in d.modes)


def test_settings_builder_aliases_expand():
    if mode_availability()["builder-sync/nccl"] is not None:
        pytest.skip("builder mode not available here")
    s = BenchSettings(modes=("builder-sync",)).resolved()
    assert s.modes == ("builder-sync/nccl", "builder-sync/cpu")


@pytest.mark.parametrize("kwargs,flag", [
    (dict(speeds=(1.0,)), "--speeds"),
    (dict(speeds=(1.0, 1.4)), "--speeds"),
    (dict(modes=("nope",)), "--modes"),
    (dict(steps=5, warmup=5), "--steps"),
    (dict(device_ms=0.0), "--device-ms"),
    (dict(devices=("cpu",)), "--devices"),
    (dict(target=1.5), "--target"),
    (dict(workload="speed"), "--workload"),
    (dict(sync_stretch=-0.5), "--sync-stretch"),
    (dict(max_length=2), "--max-length"),
    (dict(stretch=True, device_ms=0.0, model="minilm", speeds=(1.0, 1.0)), "--device-ms"),
    (dict(stretch=True, modes=("builder-sync/cpu",)), "--modes"),
])
def test_settings_errors_name_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        BenchSettings(**kwargs).resolved()


def test_settings_goodput_variants_and_real_minilm_compute():
    s = BenchSettings(modes=("elche-setup", "elche-throughput", "elche-anchor1"), workload="accuracy",
                      speeds=(1.0, 1.0), device_ms=0.0, model="minilm", sync_stretch=0.5, max_length=32).resolved()
    assert s.modes == ("elche-setup", "elche-throughput", "elche-anchor1") and s.device_ms == 0.0
    assert s.sync_stretch == 0.5 and s.max_length == 32


# --- figures --------------------------------------------------------------------------------------------------
def test_summarise_round_efficiency_and_time_to_target():
    runs = {
        "solo": {"samples_per_s": 560.0, "curve": [], "final_accuracy": None},
        "ddp": {"samples_per_s": 320.0, "curve": [(0, 0, 0.5), (10, 10, 0.8), (20, 20, 0.9)], "final_accuracy": 0.9},
        "elche-setup": {"samples_per_s": 540.0, "curve": [(0, 0, 0.5), (6, 10, 0.85), (12, 20, 0.91)],
                        "final_accuracy": 0.91},
        "accelerate": {"error": "boom"},
    }
    info = summarise_round(runs, target=None)
    assert info == {"ideal_samples_per_s": 560.0, "target": 0.9}
    assert runs["ddp"]["efficiency"] == pytest.approx(320 / 560)
    assert runs["elche-setup"]["time_to_target_s"] == 12
    assert runs["elche-setup"]["speedup_vs_ddp"] == pytest.approx(20 / 12)
    assert "efficiency" not in runs["accelerate"]


def test_chunked_dataset_moves_forward_only():
    ds = ChunkedDataset(list(range(10)), chunks=2)
    assert len(ds) == 5 and [ds[i] for i in range(5)] == [0, 1, 2, 3, 4]
    ds.set_epoch(1)
    assert [ds[i] for i in range(5)] == [5, 6, 7, 8, 9]
    with pytest.raises(RuntimeError):
        ds.set_epoch(0)


# --- output directory and CLI errors ----------------------------------------------------------------------------
def test_output_dir_refuses_foreign_content(tmp_path):
    assert prepare_output(tmp_path / "new").is_dir()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        prepare_output(foreign)
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.json").write_text(json.dumps({"tool": "something else"}))
    with pytest.raises(ValueError, match="not a flodl-hf bench output"):
        prepare_output(other)
    lookalike = tmp_path / "lookalike"
    lookalike.mkdir()
    (lookalike / "table.md").write_text("a user's table")  # an output name, but no bench results.json
    with pytest.raises(ValueError, match="not a flodl-hf bench output"):
        prepare_output(lookalike)
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "results.json").write_text(json.dumps({"tool": "flodl-hf bench"}))
    assert prepare_output(ours) == ours


def test_cli_usage_errors_exit_2(tmp_path, capsys):
    assert main(["--speeds", "1.0,2.0", "--output", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flodl-hf bench: error:") and "--speeds" in err and "Traceback" not in err
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "a.txt").write_text("x")
    assert main(["--modes", "solo,ddp", "--output", str(tmp_path / "busy")]) == 2
    assert main(["--bogus"]) == 2


def test_every_mode_is_listed_in_the_table():
    result = {"settings": BenchSettings(modes=("solo", "ddp")).resolved().as_dict(), "ideal_samples_per_s": 500.0,
              "modes": {"solo": {"samples_per_s": 500.0, "samples_per_s_min": 490.0, "samples_per_s_max": 510.0,
                                 "efficiency": 1.0, "per_rank_samples_per_s": [350.0, 150.0]},
                        "ddp": {"error": "RuntimeError: boom\ntrace"}},
              "rounds": [], "notes": ["builder-sync/nccl unavailable: not yet"]}
    table = markdown_table(result)
    assert "| solo | 500.0 | 490.0-510.0 | 1.000 |" in table
    assert "| ddp | failed: RuntimeError: boom |" in table
    assert "note: builder-sync/nccl unavailable" in table


# --- the harness on real ranks --------------------------------------------------------------------------------
def _check_outputs(out, modes):
    assert {p.name for p in out.iterdir()} == {"table.md", "results.json", "plot.png"}
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads((out / "results.json").read_text())
    assert result["tool"] == "flodl-hf bench" and list(result["modes"]) == list(modes)
    for mode in modes:
        m = result["modes"][mode]
        assert "error" not in m, m
        assert math.isfinite(m["samples_per_s"]) and m["samples_per_s"] > 0
        assert 0.0 < m["efficiency"] <= 1.2, (mode, m["efficiency"])
    table = (out / "table.md").read_text()
    assert all(f"| {mode} |" in table for mode in modes)
    return result


def test_smoke_run_writes_table_json_plot(tmp_path):
    out = tmp_path / "bench"
    code = main(["--modes", "solo,elche-setup", "--steps", "14", "--warmup", "4", "--device-ms", "16",
                 "--repeats", "1", "--timeout", "120", "--output", str(out)])
    assert code == 0
    result = _check_outputs(out, ("solo", "elche-setup"))
    elche = result["modes"]["elche-setup"]
    assert elche["anchor_history"] and all(abs(sum(s) - 1.0) < 1e-3 for s in elche["share_history"])
    assert all(sum(b) == 32 for b in elche["batch_size_history"])


def test_every_mode_runs(tmp_path):
    modes = tuple(m for m in ALL_MODES if mode_availability()[m] is None)
    out = tmp_path / "all"
    args = ["--modes", ",".join(modes), "--steps", "16", "--warmup", "4", "--device-ms", "16", "--repeats", "1",
            "--timeout", "300", "--output", str(out)]
    assert main(args) == 0
    _check_outputs(out, modes)


def test_accuracy_workload_records_curves(tmp_path):
    out = tmp_path / "acc"
    args = ["--workload", "accuracy", "--modes", "ddp,elche-setup", "--steps", "40", "--eval-every", "10",
            "--eval-samples", "200", "--device-ms", "8", "--timeout", "300", "--output", str(out)]
    assert main(args) == 0
    result = json.loads((out / "results.json").read_text())
    for mode in ("ddp", "elche-setup"):
        run = result["rounds"][0]["runs"][mode]
        # (training seconds, steps, accuracy): steps of W x batch samples in every mode (DDP's optimizer steps, El
        # Che's micro-steps, which its windows group into fewer optimizer steps)
        curve = run["curve"]
        assert curve[0][1] == 0 and curve[0][0] < 0.5 and curve[-1][1] == 40 and len(curve) >= 2
        assert run.get("optimizer_steps", 40) <= 40
        assert all(a[0] <= b[0] for a, b in zip(curve, curve[1:]))
        assert 0.0 <= result["modes"][mode]["final_accuracy"] <= 1.0
    assert result["modes"]["ddp"]["time_to_target_s"] is not None
