"""Rule 1 of the third hostile round: a resume refuses data, a model or settings that differ from the checkpoint's
by content (``flodl_hf.job.fingerprints``), named in one line; the subprocess cases are in tests/hostile_round3.py."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from flodl_hf.checkpoint.errors import ResumeError
from flodl_hf.job.checkpoints import check_plan
from flodl_hf.job.fingerprints import FINGERPRINT_KEY, check_fingerprints, content_record, fingerprints
from flodl_hf.job.settings import TrainSettings


def _plan(tmp_path, settings=None, data="d.csv"):
    sources = SimpleNamespace(model_path=tmp_path / "m", data_path=tmp_path / data, hub_id=None)
    settings = settings or TrainSettings()
    return {"model": str(sources.model_path), "data": str(sources.data_path),
            "lr_scheduler_type": settings.lr_scheduler_type,  # a plan of this flodl-hf (an older one is refused)
            FINGERPRINT_KEY: fingerprints(settings, sources)}


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\x00" * 64)
    (tmp_path / "m" / "README.md").write_text("notes are not the model")
    (tmp_path / "d.csv").write_text("text,label\na,pos\nb,neg\n")
    return tmp_path


def test_a_same_size_edit_of_the_data_is_refused_naming_it(inputs):
    saved = _plan(inputs)
    (inputs / "d.csv").write_text("text,label\na,neg\nb,pos\n")  # same size, same rows
    with pytest.raises(ResumeError, match=r"the contents of --data d.csv changed .*SHA-256 .* then, .* now"):
        check_fingerprints(saved, _plan(inputs), "ck", {"--data": "d.csv"})


def test_the_model_is_its_config_weights_and_tokenizer_not_its_notes(inputs):
    saved = _plan(inputs)
    (inputs / "m" / "README.md").write_text("edited notes")
    check_fingerprints(saved, _plan(inputs), "ck", {})
    (inputs / "m" / "model.safetensors").write_bytes(b"\x01" + b"\x00" * 63)
    with pytest.raises(ResumeError, match=r"--model m changed .*\(model.safetensors differs"):
        check_fingerprints(saved, _plan(inputs), "ck", {"--model": "m"})
    (inputs / "m" / "model.safetensors").write_bytes(b"\x00" * 64)
    (inputs / "m" / "vocab.txt").write_text("[PAD]\n")
    with pytest.raises(ResumeError, match=r"vocab.txt is new"):
        check_fingerprints(saved, _plan(inputs), "ck", {"--model": "m"})


def test_a_moved_file_with_the_same_content_resumes_and_old_checkpoints_compare_names(inputs):
    saved = _plan(inputs)
    os.rename(inputs / "d.csv", inputs / "e.csv")
    moved = _plan(inputs, data="e.csv")
    check_plan(saved, moved, "ck")  # the name differs; both record the content, which decides
    check_fingerprints(saved, moved, "ck", {})
    old = {k: v for k, v in saved.items() if k != FINGERPRINT_KEY}
    with pytest.raises(ResumeError, match="it was written with --data"):
        check_plan(old, moved, "ck")


def test_settings_a_resume_must_repeat_and_those_it_may_change(inputs):
    saved = _plan(inputs, TrainSettings(eval_every=5))
    check_fingerprints(saved, _plan(inputs, TrainSettings(eval_every=5, lr=1e-3, checkpoint_every=2)), "ck", {})
    with pytest.raises(ResumeError, match="written with --eval-every 5 but this run has default"):
        check_fingerprints(saved, _plan(inputs), "ck", {})


def test_a_fifo_or_a_saved_dataset_directory(inputs):
    os.mkfifo(inputs / "pipe.csv")
    with pytest.raises(ValueError, match="is not a regular file"):
        content_record(inputs / "pipe.csv", "--data")
    (inputs / "dd" / "train").mkdir(parents=True)
    (inputs / "dd" / "train" / "data.arrow").write_bytes(b"rows")
    (inputs / "dd" / ".lock").write_text("x")
    (inputs / "dd" / "train" / "cache-1.arrow").write_text("x")
    assert list(content_record(inputs / "dd", "--data")) == ["train/data.arrow"]
    assert content_record(inputs / "user/dataset", "--data") is None  # a Hub id: compared by name
