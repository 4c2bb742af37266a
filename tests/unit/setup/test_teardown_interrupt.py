"""A Ctrl-C while the ranks tear down (rule 5 of the third hostile round): the exit hook ends in one line, never an atexit
traceback, and still reaps the child ranks. The hook's own steps are replaced here; torch is not."""

from __future__ import annotations

import pytest

from flodl_hf.distributed import context


@pytest.mark.parametrize("failure, line", [(KeyboardInterrupt(), "flodl-hf: interrupted while shutting down"),
                                           (RuntimeError("rank 1 failed"), "flodl-hf: error: rank 1 failed")])
def test_the_exit_hook_reports_in_one_line_and_reaps(monkeypatch, capsys, failure, line):
    reaped = []

    def close() -> None:
        raise failure

    monkeypatch.setattr(context, "close_open_runtimes", close)
    monkeypatch.setattr(context.launch, "reap_children", lambda: reaped.append(1))
    context.shutdown_at_exit()  # returns: nothing reaches the interpreter's atexit handler
    err = capsys.readouterr().err
    assert err.splitlines() == [line] and "Traceback" not in err
    assert reaped


def test_a_second_ctrl_c_while_reaping_exits_quietly(monkeypatch, capsys):
    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(context, "close_open_runtimes", interrupted)
    monkeypatch.setattr(context.launch, "reap_children", interrupted)
    context.shutdown_at_exit()
    assert capsys.readouterr().err.splitlines() == ["flodl-hf: interrupted while shutting down"]
