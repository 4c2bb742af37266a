"""The public surface of ``heads`` and the rules its code keeps (no torch.distributed, no import side effects)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

import heads
from flodl_hf.graph import HasGraph
from heads import _inputs, _io, _losses, _save
from tiny_models import FAMILIES, tiny_config, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

HEADS_DIR = Path(heads.__file__).parent
MODULES = sorted(HEADS_DIR.glob("*.py"))


def test_public_names_are_pinned():
    assert heads.__all__ == [
        "AlbertForMaskedLM",
        "AutoHeadForMaskedLM",
        "BertForMaskedLM",
        "DebertaV2ForMaskedLM",
        "DistilBertForMaskedLM",
        "MaskedLMHead",
        "RobertaForMaskedLM",
        "XLMRobertaForMaskedLM",
        "AlbertForSequenceClassification",
        "AutoHeadForSequenceClassification",
        "BertForSequenceClassification",
        "CheckpointError",
        "CheckpointNotFoundError",
        "DebertaV2ForSequenceClassification",
        "DistilBertForSequenceClassification",
        "RobertaForSequenceClassification",
        "SUPPORTED_MODEL_TYPES",
        "SequenceClassificationHead",
        "XLMRobertaForSequenceClassification",
        "AlbertForTokenClassification",
        "AutoHeadForTokenClassification",
        "BertForTokenClassification",
        "DebertaV2ForTokenClassification",
        "DistilBertForTokenClassification",
        "RobertaForTokenClassification",
        "TokenClassificationHead",
        "XLMRobertaForTokenClassification",
        "AlbertForQuestionAnswering",
        "AutoHeadForQuestionAnswering",
        "BertForQuestionAnswering",
        "DebertaV2ForQuestionAnswering",
        "DistilBertForQuestionAnswering",
        "QuestionAnsweringHead",
        "RobertaForQuestionAnswering",
        "XLMRobertaForQuestionAnswering",
    ]
    assert all(isinstance(name, str) and hasattr(heads, name) for name in heads.__all__)
    assert heads.SUPPORTED_MODEL_TYPES == FAMILIES
    assert issubclass(heads.CheckpointError, ValueError)
    assert issubclass(heads.CheckpointNotFoundError, FileNotFoundError)


def test_no_head_code_imports_torch_distributed():
    offenders = [p.name for p in MODULES if "torch.distributed" in p.read_text(encoding="utf-8")]
    assert offenders == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_every_module_is_documented_and_small(path):
    source = path.read_text(encoding="utf-8")
    assert source.lstrip().startswith('"""'), f"{path.name} has no module docstring"
    assert len(source.splitlines()) < 400


def test_public_callables_have_type_hints():
    missing = []
    objects = [getattr(heads, name) for name in heads.__all__ if inspect.isclass(getattr(heads, name))]
    for cls in objects:
        for name, member in vars(cls).items():
            function = getattr(member, "__func__", member)
            if name.startswith("_") or not inspect.isfunction(function):
                continue
            if inspect.signature(function).return_annotation is inspect.Signature.empty:
                missing.append(f"{cls.__name__}.{name}")
    for module in (_inputs, _io, _losses, _save):
        for name in module.__all__:
            member = getattr(module, name)
            if (
                inspect.isfunction(member)
                and inspect.signature(member).return_annotation is inspect.Signature.empty
            ):
                missing.append(f"{module.__name__}.{name}")
    assert missing == []


@pytest.mark.parametrize("family", FAMILIES)
def test_declared_head_keys_match_the_transformers_layout(family):
    cls = heads.AutoHeadForSequenceClassification.head_class(family)
    model = tiny_model(family)
    keys = set(model.state_dict())
    prefix = model.base_model_prefix + "."
    assert {k for k in keys if not k.startswith(prefix)} == set(cls.head_keys.head)
    assert set(cls.head_keys.optional) <= keys
    assert cls.head_keys.classifier in cls.head_keys.head
    assert model.state_dict()[cls.head_keys.classifier].shape[0] == model.config.num_labels
    assert cls.model_class is type(model) and cls.config_class is type(tiny_config(family))
    storages = [t.untyped_storage().data_ptr() for t in model.state_dict().values()]
    assert len(storages) == len(
        set(storages)
    )  # no tied weights in these classifiers: each key saves on its own


def test_heads_are_plain_objects_with_a_graph():
    head = heads.BertForSequenceClassification.on_device(tiny_config("bert"), 2, "cpu")
    assert isinstance(head, HasGraph) and not isinstance(head, torch.nn.Module)
    assert head.graph().module is head.model
    assert head.eval() is head and not head.model.training
    assert head.train() is head and head.model.training
    assert head.to("cpu") is head and head.graph().device == torch.device("cpu")
    assert "BertForSequenceClassification(num_labels=2" in repr(head)
