"""flodl_hf.export: verify_model_dir (keys, labels, logits vs a head), export_model_dir; atomic output dirs
(flodl_hf.files.ownership.staged_output_dir)."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import make_checkpoint

from flodl_hf.export import export_model_dir, verify_model_dir
from flodl_hf.files.ownership import check_output_dir, owns_dir, staged_output_dir

SENTENCES = ["the movie was good", "the plot was awful", "this book is fine"]


class TransformersHead:
    """The smallest head-shaped loader (encode / forward / eval) for testing verify without ``heads``."""

    def __init__(self, path, nudge=0.0):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.model = AutoModelForSequenceClassification.from_pretrained(path).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if nudge:
            with torch.no_grad():
                self.model.classifier.bias.add_(nudge)

    def eval(self):
        self.model.eval()
        return self

    def encode(self, texts, text_pairs=None):
        return self.tokenizer(texts, text_pairs, padding="max_length", truncation=True, max_length=32,
                              return_tensors="pt")

    def forward(self, enc):
        return self.model(**enc).logits


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = make_checkpoint("bert", tmp_path_factory.mktemp("ckpt") / "tiny", with_classifier=True, num_labels=3)
    config = json.loads((path / "config.json").read_text())
    config["id2label"] = {"0": "neg", "1": "neu", "2": "pos"}
    config["label2id"] = {"neg": 0, "neu": 1, "pos": 2}
    (path / "config.json").write_text(json.dumps(config))
    _set_model_max_length(path, 32)
    return path


def _set_model_max_length(path, value):
    """What a flodl-hf save does: the tokenizer states the length the model was trained with."""
    data = json.loads((path / "tokenizer_config.json").read_text())
    data["model_max_length"] = value
    (path / "tokenizer_config.json").write_text(json.dumps(data))


def test_verify_passes_with_zero_difference(checkpoint):
    report = verify_model_dir(checkpoint, head_loader=TransformersHead, sentences=SENTENCES)
    assert report.ok, report.summary()
    assert report.missing_keys == [] and report.unexpected_keys == [] and report.mismatched_keys == []
    assert report.max_abs_diff == 0.0 and report.tokens_match is True
    assert report.labels == ["neg", "neu", "pos"] and report.num_labels == 3 and report.model_type == "bert"
    assert report.summary().startswith("OK: ")
    assert report.to_dict()["ok"] is True


def test_verify_without_head_checks_loading_only(checkpoint):
    report = verify_model_dir(checkpoint)
    assert report.ok and report.max_abs_diff is None and report.tokens_match is None


def test_verify_fails_on_logit_difference(checkpoint):
    report = verify_model_dir(checkpoint, head_loader=lambda p: TransformersHead(p, nudge=1e-3))
    assert not report.ok
    assert report.max_abs_diff == pytest.approx(1e-3, rel=1e-2)
    assert "logits differ by up to 0.001" in report.summary()


def _tampered(checkpoint, tmp_path, edit):
    import shutil

    out = tmp_path / "tampered"
    shutil.copytree(checkpoint, out)
    weights = load_file(str(out / "model.safetensors"))
    edit(weights)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_verify_fails_clearly_on_a_missing_key(checkpoint, tmp_path):
    path = _tampered(checkpoint, tmp_path, lambda w: w.pop("classifier.weight"))
    report = verify_model_dir(path, head_loader=TransformersHead)
    assert not report.ok
    assert "classifier.weight" in report.missing_keys
    assert "1 missing key(s), freshly initialised by transformers: classifier.weight" in report.summary()


def test_verify_fails_clearly_on_an_unexpected_key(checkpoint, tmp_path):
    path = _tampered(checkpoint, tmp_path, lambda w: w.__setitem__("extra_head.weight", torch.zeros(2)))
    report = verify_model_dir(path)
    assert not report.ok
    assert report.unexpected_keys == ["extra_head.weight"]
    assert "unexpected key(s) ignored by transformers: extra_head.weight" in report.summary()


def test_verify_reports_wrong_shapes_and_unloadable_dirs(checkpoint, tmp_path):
    path = _tampered(checkpoint, tmp_path, lambda w: w.__setitem__("classifier.bias", torch.zeros(5)))
    report = verify_model_dir(path)
    assert not report.ok and any("classifier" in p for p in report.problems)
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        verify_model_dir(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        verify_model_dir(tmp_path / "empty")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    report = verify_model_dir(broken)
    assert not report.ok and "transformers could not load it" in report.problems[0]


def test_export_resaves_and_verifies(checkpoint, tmp_path):
    (checkpoint / "README.md").write_text("---\nlibrary_name: flodl-hf\n---\n# card\n")
    out = export_model_dir(checkpoint, tmp_path / "exported")
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert (out / "README.md").read_text().endswith("# card\n")
    assert verify_model_dir(out, head_loader=TransformersHead).ok
    with pytest.raises(ValueError, match="is the model directory itself"):
        export_model_dir(checkpoint, checkpoint)
    with pytest.raises(FileNotFoundError):
        export_model_dir(tmp_path / "nope", tmp_path / "x")


# --- output directories -------------------------------------------------------------------------------------

def _mark(path):
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.json").write_text(json.dumps({"generator": "flodl-hf"}))


def test_staged_output_dir_is_atomic(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with staged_output_dir(target) as staging:
            (staging / "half.bin").write_text("x")
            raise RuntimeError("interrupted")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    with staged_output_dir(target) as staging:
        _mark(staging)
    assert owns_dir(target) and list(tmp_path.iterdir()) == [target]
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o777 & ~mask  # not mkdtemp's 0700
    assert stat.S_IMODE((target / "metrics.json").stat().st_mode) == 0o666 & ~mask


def test_output_dir_rules(tmp_path):
    (tmp_path / "empty").mkdir()
    check_output_dir(tmp_path / "empty", overwrite=False)  # an empty dir is fine
    with staged_output_dir(tmp_path / "empty") as staging:
        _mark(staging)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(ValueError, match="not empty and was not written by flodl-hf"):
        check_output_dir(foreign, overwrite=True)
    (foreign / "metrics.json").write_text('{"accuracy": 1}')  # someone else's metrics.json
    with pytest.raises(ValueError, match="not written by flodl-hf"):
        check_output_dir(foreign, overwrite=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="exists and is a file"):
        check_output_dir(tmp_path / "file", overwrite=True)
    previous = tmp_path / "previous"
    _mark(previous)
    (previous / "old.txt").write_text("old")
    with pytest.raises(ValueError, match="already holds a flodl-hf result: pass --overwrite"):
        check_output_dir(previous, overwrite=False)
    # An output written before markers existed cannot say what it held: a name no run writes may be a user's.
    with pytest.raises(ValueError, match=r"holds files flodl-hf did not write \(old.txt\)"):
        check_output_dir(previous, overwrite=True)
    (previous / "old.txt").unlink()
    (previous / "README.md").write_text("card")  # what a run writes is accounted for
    with staged_output_dir(previous, overwrite=True) as staging:
        _mark(staging)
        (staging / "new.txt").write_text("new")
    assert sorted(p.name for p in previous.iterdir()) == [".flodl-hf.json", "metrics.json", "new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "file", "foreign", "previous"]


def test_export_refuses_a_checkpoint_without_classifier(tmp_path):
    base = make_checkpoint("bert", tmp_path / "base", with_classifier=False)
    with pytest.raises(ValueError, match=r"lacks weights for 2 key\(s\) \(classifier.bias, classifier.weight\)"):
        export_model_dir(base, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --- long texts, pairs and the saved max_length ------------------------------------------------------------------

def test_verify_checks_long_texts_and_pairs(checkpoint):
    report = verify_model_dir(checkpoint, head_loader=TransformersHead)
    assert report.ok, report.summary()
    assert report.checks == ["sentences", "long texts (2x, 5x model_max_length)", "sentence pairs",
                             "long sentence pairs"]
    assert report.to_dict()["checks"] == report.checks and "long texts" in report.summary()


def test_verify_catches_a_head_that_truncates_differently(checkpoint):
    class Truncates16(TransformersHead):
        max_length = 16

        def encode(self, texts, text_pairs=None):
            return self.tokenizer(texts, text_pairs, padding=True, truncation=True, max_length=16,
                                  return_tensors="pt")

    short_only = verify_model_dir(checkpoint, head_loader=Truncates16, long_texts=False, pairs=False)
    assert short_only.ok  # four short sentences cannot see the difference
    report = verify_model_dir(checkpoint, head_loader=Truncates16)
    assert not report.ok and report.tokens_match is False
    assert any(p.startswith("long texts") and "max_length=16" in p for p in report.problems), report.problems


def test_verify_requires_a_model_max_length(tmp_path):
    path = make_checkpoint("bert", tmp_path / "raw", with_classifier=True)
    report = verify_model_dir(path)
    assert not report.ok and "no model_max_length" in report.problems[0]
    assert verify_model_dir(path, long_texts=False).ok


def test_export_saves_the_trained_max_length(checkpoint, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    source = shutil.copytree(checkpoint, tmp_path / "trained")
    (source / "metrics.json").write_text(json.dumps({"settings": {"max_length": 24}}))
    (source / "README.md").write_text("---\nlibrary_name: flodl-hf\ntags:\n- text-classification\n---\n# card\n")
    out = export_model_dir(source, tmp_path / "exported")
    assert AutoTokenizer.from_pretrained(out).model_max_length == 24
    text = (out / "README.md").read_text()
    assert "library_name: transformers" in text and "- flodl-hf" in text and text.rstrip().endswith("# card")
    again = export_model_dir(source, tmp_path / "exported2", max_length=20)
    assert AutoTokenizer.from_pretrained(again).model_max_length == 20
    with pytest.raises(ValueError, match="max_length=1 is invalid"):
        export_model_dir(source, tmp_path / "exported3", max_length=1)
