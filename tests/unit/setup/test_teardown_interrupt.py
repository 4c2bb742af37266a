"""A Ctrl-C while the ranks tear down (rule 5 of the third hostile round): the exit hook ends in one line, never an atexit
traceback, still reaps the child ranks, and ends the process with 130 (interrupted) or 1 (failed), never 0. The
hook's own steps are replaced here, and its exit recorded instead of taken; torch is not replaced.

The program's own end, in a real process: ``tests/e2e/cli/test_program_end.py``."""

from __future__ import annotations

import pytest

from flodl_hf.distributed import context


@pytest.fixture
def exits(monkeypatch):
    codes: list[int] = []
    monkeypatch.setattr(context, "_exit", codes.append)
    return codes


@pytest.mark.parametrize("failure, line, code",
                         [(KeyboardInterrupt(), "flodl-hf: interrupted while shutting down", 130),
                          (RuntimeError("rank 1 failed"), "flodl-hf: error: rank 1 failed", 1)])
def test_the_exit_hook_reports_in_one_line_reaps_and_exits_non_zero(monkeypatch, capsys, exits, failure, line, code):
    reaped = []

    def close() -> None:
        raise failure

    monkeypatch.setattr(context, "close_open_runtimes", close)
    monkeypatch.setattr(context.launch, "reap_children", lambda: reaped.append(1))
    context.shutdown_at_exit()  # returns: nothing reaches the interpreter's atexit handler
    err = capsys.readouterr().err
    assert err.splitlines() == [line] and "Traceback" not in err
    assert reaped and exits == [code]


def test_a_clean_teardown_leaves_the_exit_code_alone(monkeypatch, exits):
    monkeypatch.setattr(context, "close_open_runtimes", lambda: None)
    context.shutdown_at_exit()
    assert exits == []


def test_a_second_ctrl_c_while_reaping_exits_quietly(monkeypatch, capsys, exits):
    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(context, "close_open_runtimes", interrupted)
    monkeypatch.setattr(context.launch, "reap_children", interrupted)
    context.shutdown_at_exit()
    assert capsys.readouterr().err.splitlines() == ["flodl-hf: interrupted while shutting down"]
    assert exits == [130]

