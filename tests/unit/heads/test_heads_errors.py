"""Bad inputs: each raises a clear error naming the value, file or key, and the fix."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import heads
from heads import CheckpointError, CheckpointNotFoundError
from tiny_models import tiny_config, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["the movie was good", "bad", "the plot was awful"]


@pytest.fixture(scope="module")
def head():
    torch.manual_seed(0)
    return heads.BertForSequenceClassification.from_config(
        tiny_config("bert", 3), tokenizer=tiny_tokenizer("bert")
    )


@pytest.fixture
def ckpt(tiny_checkpoint, tmp_path):
    """A private copy of a base BERT checkpoint, free to damage."""
    return shutil.copytree(tiny_checkpoint("bert"), tmp_path / "ckpt")


# --- labels ---------------------------------------------------------------------------------------------------
def test_label_out_of_range(head):
    enc = head.encode(TEXTS)
    with pytest.raises(
        ValueError,
        match=r"label 3 at index 1 is out of range: valid class ids are 0\.\.2 "
        r"\(num_labels=3\), or -100",
    ):
        head.compute_loss(enc, torch.tensor([0, 3, 1]))
    with pytest.raises(ValueError, match=r"label -1 at index 2 is out of range"):
        head.compute_loss(enc, torch.tensor([0, 1, -1]))


def test_label_checked_before_the_forward_pass(head, monkeypatch):
    def no_forward(enc):
        raise AssertionError("forward ran before the label check")

    monkeypatch.setattr(head, "forward", no_forward)
    with pytest.raises(ValueError, match="out of range"):
        head.compute_loss(head.encode(TEXTS), torch.tensor([0, 7, 1]))


def test_wrong_label_shape(head):
    enc = head.encode(TEXTS)
    with pytest.raises(ValueError, match=r"labels of shape \[2\] do not match a batch of 3 texts"):
        head.compute_loss(enc, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"soft-label targets of shape \[3, 2\] do not match num_labels=3"):
        head.compute_loss(enc, torch.rand(3, 2))
    with pytest.raises(ValueError, match=r"float labels of shape \[3\] for a 3-label classifier"):
        head.compute_loss(enc, torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="multi_label_classification"):
        head.compute_loss(enc, torch.tensor([[1, 0, 1], [0, 0, 1], [1, 1, 0]]))
    with pytest.raises(ValueError, match="needs labels"):
        head.compute_loss(enc, None)


def test_wrong_label_shape_multi_label_and_regression():
    multi_config = tiny_config("distilbert", 3)
    multi_config.problem_type = "multi_label_classification"
    multi = heads.DistilBertForSequenceClassification.from_config(
        multi_config, tokenizer=tiny_tokenizer("distilbert")
    )
    enc = multi.encode(TEXTS)
    with pytest.raises(ValueError, match=r"multi-label targets must have shape \[3, 3\]"):
        multi.compute_loss(enc, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"multi-label target 2\.0 is outside \[0, 1\]"):
        multi.compute_loss(enc, torch.tensor([[0.0, 1.0, 2.0]] * 3))
    regression = heads.DistilBertForSequenceClassification.from_config(
        tiny_config("distilbert", 1), tokenizer=tiny_tokenizer("distilbert")
    )
    with pytest.raises(ValueError, match=r"regression labels of shape \[3, 2\].*shape \[3\] or \[3, 1\]"):
        regression.compute_loss(regression.encode(TEXTS), torch.rand(3, 2))


def test_collate_label_errors(head):
    with pytest.raises(ValueError, match="label at index 1 is None while other labels are set"):
        head.collate([("good", 1), ("bad", None)])
    with pytest.raises(ValueError, match=r"label 'great' at index 0 is not one of this head's labels"):
        head.collate([("good", "great")])
    with pytest.raises(ValueError, match="label vectors have different lengths"):
        head.collate([("good", [0.5, 0.5]), ("bad", [1.0, 0.0, 0.0])])
    with pytest.raises(ValueError, match="labels mix scalars and vectors"):
        head.collate([("good", 1), ("bad", [1.0, 0.0, 0.0])])


def test_labels_and_num_labels_arguments(ckpt):
    with pytest.raises(ValueError, match="num_labels=2 disagrees with the 3 names in labels"):
        heads.BertForSequenceClassification.from_pretrained(ckpt, num_labels=2, labels=["a", "b", "c"])
    with pytest.raises(ValueError, match="each name once"):
        heads.BertForSequenceClassification.from_pretrained(ckpt, labels=["a", "a"])
    with pytest.raises(ValueError, match="num_labels=0 is invalid"):
        heads.BertForSequenceClassification.from_pretrained(ckpt, num_labels=0)
    with pytest.raises(ValueError, match="problem_type='multi' is invalid"):
        heads.BertForSequenceClassification.from_pretrained(ckpt, problem_type="multi")
    with pytest.raises(ValueError, match="max_length=1 is invalid"):
        heads.BertForSequenceClassification.from_pretrained(ckpt, max_length=1)


# --- text inputs ----------------------------------------------------------------------------------------------
def test_non_text_values(head):
    with pytest.raises(ValueError, match=r"text at index 1 is int \(5\), not str"):
        head.encode(["good", 5])
    with pytest.raises(ValueError, match=r"text at index 2 is NoneType"):
        head.collate([("good", 1), ("bad", 0), (None, 1)])
    with pytest.raises(ValueError, match=r"text at index 0 is float"):
        head.collate([{"text": 1.5, "label": 0}])
    with pytest.raises(ValueError, match=r"item at index 0 has keys \['label', 'sentence'\] but no 'text'"):
        head.collate([{"sentence": "good", "label": 0}])
    with pytest.raises(ValueError, match="item at index 1 is int"):
        head.collate([("good", 1), 7])
    with pytest.raises(ValueError, match="encode got no texts"):
        head.encode([])


def test_single_string_is_refused(head):
    with pytest.raises(
        ValueError, match=r"predict takes a list of texts, got a single str: wrap it in a list"
    ):
        head.predict("the movie was good")
    with pytest.raises(ValueError, match=r"encode takes a list of texts"):
        head.encode("good")
    with pytest.raises(ValueError, match="top_k=0 is invalid"):
        head.predict(TEXTS, top_k=0)


# --- checkpoints ----------------------------------------------------------------------------------------------
def test_num_labels_mismatch_with_a_classifier_checkpoint(tiny_checkpoint):
    path = tiny_checkpoint("bert", with_classifier=True, num_labels=2)
    with pytest.raises(
        ValueError,
        match=r"num_labels=3 disagrees with the checkpoint .* has 2 labels, not 3\. Drop "
        r"num_labels/labels to use its 2 labels, or load the base model",
    ):
        heads.BertForSequenceClassification.from_pretrained(path, num_labels=3)
    roberta = tiny_checkpoint("roberta", with_classifier=True, num_labels=2)
    with pytest.raises(CheckpointError, match=r"labels \(3 names\) disagrees .*classifier\.out_proj\.weight"):
        heads.AutoHeadForSequenceClassification.from_pretrained(roberta, labels=["a", "b", "c"])


def test_unknown_model_type_in_auto(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    config["model_type"] = "t5"
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError,
        match="model_type 't5' is not supported: supported model types are bert, "
        "distilbert, roberta, albert, xlm-roberta, deberta-v2",
    ):
        heads.AutoHeadForSequenceClassification.from_pretrained(ckpt)
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        from transformers import GPT2Config

        heads.AutoHeadForSequenceClassification.on_device(GPT2Config(), 2, "cpu")
    with pytest.raises(TypeError, match="not instantiable"):
        heads.AutoHeadForSequenceClassification()


def test_family_and_model_type_mismatch(tiny_checkpoint):
    with pytest.raises(
        ValueError,
        match=r"BertForSequenceClassification handles model_type 'bert' but the "
        r"config says 'roberta': use AutoHeadForSequenceClassification",
    ):
        heads.BertForSequenceClassification.from_pretrained(tiny_checkpoint("roberta"))
    with pytest.raises(ValueError, match="use AutoHeadForSequenceClassification"):
        heads.RobertaForSequenceClassification.from_config(tiny_config("xlm-roberta"))


def test_missing_directory(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(CheckpointNotFoundError, match=f"checkpoint directory '{missing}' does not exist"):
        heads.BertForSequenceClassification.from_pretrained(missing)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        heads.AutoHeadForSequenceClassification.from_pretrained(str(missing))
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError, match="is a file, not a directory"):
        heads.AutoHeadForSequenceClassification.from_pretrained(tmp_path / "file")


def test_missing_config_json(ckpt):
    (ckpt / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=f"no config.json in '{ckpt}'"):
        heads.AutoHeadForSequenceClassification.from_pretrained(ckpt)


def test_invalid_config_json(ckpt):
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config file '.*config\.json' is not valid JSON"):
        heads.BertForSequenceClassification.from_pretrained(ckpt)


def test_missing_weights(ckpt):
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(
        FileNotFoundError, match=f"no weights file in '{ckpt}': expected one of model.safetensors"
    ):
        heads.BertForSequenceClassification.from_pretrained(ckpt)


@pytest.mark.parametrize("keep", [0.5, 0.999, 8e-5])
def test_corrupt_truncated_safetensors(ckpt, keep):
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError, match=r"weights file '.*model\.safetensors' is corrupt or truncated"):
        heads.BertForSequenceClassification.from_pretrained(ckpt)


def test_shape_mismatch_of_an_encoder_key(ckpt):
    state = load_file(str(ckpt / "model.safetensors"))
    state["encoder.layer.1.intermediate.dense.weight"] = torch.zeros(36, 32)
    save_file(state, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError,
        match=r"1 weight\(s\) in '.*model\.safetensors' do not match the shapes .*"
        r"bert\.encoder\.layer\.1\.intermediate\.dense\.weight \(checkpoint "
        r"\[36, 32\] vs model \[37, 32\]\)",
    ):
        heads.BertForSequenceClassification.from_pretrained(ckpt)


def test_missing_encoder_key(ckpt):
    state = load_file(str(ckpt / "model.safetensors"))
    del state["encoder.layer.0.attention.self.query.weight"]
    save_file(state, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError,
        match=r"lacks 1 encoder weight\(s\) that BertForSequenceClassification "
        r"needs: bert\.encoder\.layer\.0\.attention\.self\.query\.weight",
    ):
        heads.BertForSequenceClassification.from_pretrained(ckpt)


def test_partial_classifier(tiny_checkpoint, tmp_path):
    path = shutil.copytree(tiny_checkpoint("bert", with_classifier=True), tmp_path / "ckpt")
    state = load_file(str(path / "model.safetensors"))
    del state["classifier.bias"]
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"holds only part of the classifier: classifier\.bias missing"):
        heads.BertForSequenceClassification.from_pretrained(path)


def test_save_refuses_a_foreign_non_empty_directory(head, tmp_path):
    foreign = tmp_path / "my_documents"
    foreign.mkdir()
    (foreign / "thesis.txt").write_text("precious")
    with pytest.raises(
        FileExistsError,
        match=r"refusing to write into '.*my_documents': it is a non-empty directory "
        r"that is not a model directory \(no config\.json naming a model_type\)",
    ):
        head.save_pretrained(foreign)
    assert [p.name for p in foreign.iterdir()] == ["thesis.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["my_documents"]
    with pytest.raises(FileExistsError, match="it is a file"):
        head.save_pretrained(foreign / "thesis.txt")


def test_base_class_is_not_usable_directly():
    with pytest.raises(TypeError, match="shared base"):
        heads.SequenceClassificationHead(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("family", ["bert", "distilbert", "roberta"])
def test_a_tagger_checkpoint_is_not_loaded_as_a_sentence_classifier(tmp_path, family):
    """A token classifier's ``classifier.*`` has the sentence classifier's keys and shapes (bert, albert, deberta):
    it used to load silently as a text classifier. Its config names its task, so it is refused in one line."""
    torch.manual_seed(0)
    tagger = heads.AutoHeadForTokenClassification.from_config(tiny_config(family), labels=["O", "B-X"],
                                                              tokenizer=tiny_tokenizer(family))
    tagger.save_pretrained(tmp_path / "tagger")
    with pytest.raises(CheckpointError, match="ForTokenClassification checkpoint .*not a text-classification model"):
        heads.AutoHeadForSequenceClassification.from_pretrained(tmp_path / "tagger")
    tagger.model.base_model.save_pretrained(tmp_path / "encoder")  # its encoder alone is a base checkpoint
    head = heads.AutoHeadForSequenceClassification.from_pretrained(tmp_path / "encoder", num_labels=2,
                                                                   tokenizer=tiny_tokenizer(family))
    assert head.num_labels == 2
