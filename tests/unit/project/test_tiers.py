"""The suite's tiers hold: every test file sits in a tier folder, and a unit-tier test that starts a process fails
(the guard ``tests/conftest.py`` puts around every unit-tier test), whichever way it starts one."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TIERS, ProcessStarted, no_process_started, tier_of

TESTS = Path(__file__).resolve().parents[2]


def test_every_test_file_is_in_a_tier_folder_with_one_folder_per_package():
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 90, len(files)
    outside = [str(f.relative_to(TESTS)) for f in files if not tier_of(f)]
    assert not outside, f"test files outside tests/{{{','.join(TIERS)}}}/: {outside}"
    loose = [str(f.relative_to(TESTS)) for f in files if len(f.relative_to(TESTS).parts) != 3]
    assert not loose, f"a test file belongs in tests/TIER/PACKAGE/: {loose}"


@pytest.mark.parametrize("start", [
    lambda: subprocess.run([sys.executable, "-c", "pass"]),
    lambda: subprocess.Popen(["true"]),
    lambda: os.system("true"),
    lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    lambda: multiprocessing.get_context("fork").Process(target=print).start(),
    lambda: os.fork(),
], ids=["subprocess.run", "Popen", "os.system", "spawn", "fork context", "os.fork"])
def test_a_unit_test_that_starts_a_process_fails(start):
    with pytest.raises(ProcessStarted, match="move it to tests/distributed/ .* or tests/e2e/"):
        with no_process_started("this test"):
            start()


def test_this_test_runs_under_the_guard():
    with pytest.raises(ProcessStarted, match="test_tiers.py::test_this_test_runs_under_the_guard started a process"):
        subprocess.run(["true"])
