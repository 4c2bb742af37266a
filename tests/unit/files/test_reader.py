"""``flodl_hf.files.reader``: every refusal of the one reader, against real files (a FIFO, a device, a symlink
loop, an oversized file, deep JSON), each in one line naming the option and the path; sane files read as
``json.load`` reads them."""

from __future__ import annotations

import json
import os

import pytest

from flodl_hf.files.reader import RefusedFile, UnreadableJson, read_bytes, read_json, require_regular_file


def _line(excinfo: pytest.ExceptionInfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text and text.startswith("--opt: "), text
    return text


def test_a_fifo_is_refused_before_it_is_opened(tmp_path):
    os.mkfifo(tmp_path / "p.json")  # opened, it would block this test for ever
    with pytest.raises(RefusedFile) as excinfo:
        read_json(tmp_path / "p.json", "--opt")
    assert "not a regular file" in _line(excinfo)


def test_a_device_is_refused(tmp_path):
    with pytest.raises(RefusedFile) as excinfo:
        read_bytes("/dev/zero", "--opt", limit=10)
    assert "/dev/zero is not a regular file" in _line(excinfo)


def test_a_symlink_loop_is_refused(tmp_path):
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    with pytest.raises(RefusedFile) as excinfo:
        require_regular_file(tmp_path / "a", "--opt", missing_ok=True)
    assert "symlink loop" in _line(excinfo)


def test_a_file_over_its_bound_is_refused(tmp_path):
    (tmp_path / "big.json").write_text("[" + "0," * 600 + "0]")
    with pytest.raises(RefusedFile) as excinfo:
        read_json(tmp_path / "big.json", "--opt", limit=1000)
    assert "larger than 1,000 bytes" in _line(excinfo)


@pytest.mark.parametrize("levels, refused", [(64, False), (65, True), (5_000, True), (200_000, True)])
def test_json_nesting_is_bounded(tmp_path, levels, refused):
    (tmp_path / "d.json").write_text('{"a": ' * (levels - 1) + "[]" + "}" * (levels - 1))
    if refused:
        with pytest.raises(RefusedFile) as excinfo:
            read_json(tmp_path / "d.json", "--opt")
        assert "nested deeper than 64 levels" in _line(excinfo)
    else:
        assert read_json(tmp_path / "d.json", "--opt") == json.loads((tmp_path / "d.json").read_text())


def test_sane_files_read_as_json_reads_them(tmp_path):
    value = {"settings": {"max_length": 64, "names": ["neg", "pos"]}, "el_che": None, "x": [1.5, "é"]}
    (tmp_path / "m.json").write_text(json.dumps(value), encoding="utf-8")
    assert read_json(tmp_path / "m.json", "--opt") == value
    (tmp_path / "bad.json").write_bytes(b"{\xff")
    with pytest.raises(UnreadableJson) as excinfo:
        read_json(tmp_path / "bad.json", "--opt")
    assert "is not valid JSON" in _line(excinfo)
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "missing.json", "--opt")
