"""Extractive question-answering heads: one class per model family, and auto dispatch on ``config.model_type``.

It exists so that each family states only which :class:`heads.families.Family` it is (its transformers classes,
inputs and position limit follow from that record) while loading, windows, losses, answers and saving live once in
``heads._qa_head.QuestionAnsweringHead``; adding a seventh family is one more three-line class here. The auto class
lets a user (and the CLI) load any supported checkpoint without knowing its family.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch

from . import _hub
from ._io import PathLike, load_config
from ._qa_head import QA_HEAD_KEYS, QuestionAnsweringHead
from .families import FAMILIES

__all__ = [
    "QuestionAnsweringHead",
    "QA_HEAD_KEYS",
    "BertForQuestionAnswering",
    "DistilBertForQuestionAnswering",
    "RobertaForQuestionAnswering",
    "AlbertForQuestionAnswering",
    "XLMRobertaForQuestionAnswering",
    "DebertaV2ForQuestionAnswering",
    "AutoHeadForQuestionAnswering",
    "QA_HEAD_CLASSES",
]


class BertForQuestionAnswering(QuestionAnsweringHead):
    """QA head around ``transformers.BertForQuestionAnswering``."""

    family = FAMILIES["bert"]


class DistilBertForQuestionAnswering(QuestionAnsweringHead):
    """QA head around ``transformers.DistilBertForQuestionAnswering``."""

    family = FAMILIES["distilbert"]


class RobertaForQuestionAnswering(QuestionAnsweringHead):
    """QA head around ``transformers.RobertaForQuestionAnswering``."""

    family = FAMILIES["roberta"]


class AlbertForQuestionAnswering(QuestionAnsweringHead):
    """QA head around ``transformers.AlbertForQuestionAnswering``."""

    family = FAMILIES["albert"]


class XLMRobertaForQuestionAnswering(QuestionAnsweringHead):
    """QA head around ``transformers.XLMRobertaForQuestionAnswering``."""

    family = FAMILIES["xlm-roberta"]


class DebertaV2ForQuestionAnswering(QuestionAnsweringHead):
    """QA head around ``transformers.DebertaV2ForQuestionAnswering``."""

    family = FAMILIES["deberta-v2"]


QA_HEAD_CLASSES: dict[str, type[QuestionAnsweringHead]] = {
    cls.model_type: cls
    for cls in (
        BertForQuestionAnswering,
        DistilBertForQuestionAnswering,
        RobertaForQuestionAnswering,
        AlbertForQuestionAnswering,
        XLMRobertaForQuestionAnswering,
        DebertaV2ForQuestionAnswering,
    )
}
"""``model_type`` -> QA head class."""

_OPTION_NAMES = ("revision", "dtype", "torch_dtype", "local_files_only", "cache_dir", "token", "trust_remote_code")


class AutoHeadForQuestionAnswering:
    """Dispatch to the QA head class of a checkpoint's or config's ``model_type``. Not instantiable."""

    def __init__(self) -> None:
        raise TypeError(
            "AutoHeadForQuestionAnswering is not instantiable: use AutoHeadForQuestionAnswering.from_pretrained(path) "
            "or .on_device(config, 2, device)"
        )

    @staticmethod
    def head_class(model_type: str) -> type[QuestionAnsweringHead]:
        """The QA head class for ``model_type``; ValueError listing the supported types otherwise."""
        try:
            return QA_HEAD_CLASSES[model_type]
        except (KeyError, TypeError):
            raise ValueError(
                f"model_type {model_type!r} is not supported: supported model types are {', '.join(QA_HEAD_CLASSES)}"
            ) from None

    @classmethod
    def from_pretrained(cls, path_or_id: PathLike, **kwargs: Any) -> QuestionAnsweringHead:
        """Load with the family class named by the checkpoint's config.json (same keywords as the families')."""
        options = _hub.load_options(**{k: kwargs[k] for k in _OPTION_NAMES if k in kwargs})
        config = load_config(path_or_id, cls.head_class, options.hub_kwargs())  # raises for an unsupported type
        return cls.head_class(config.model_type).from_pretrained(path_or_id, **kwargs)

    @classmethod
    def from_config(cls, config: Any, num_labels: Optional[int] = None, tokenizer: Any = None,
                    **kwargs: Any) -> QuestionAnsweringHead:
        """A fresh QA head of ``config.model_type``."""
        return cls.head_class(getattr(config, "model_type", None)).from_config(config, num_labels, tokenizer,
                                                                               **kwargs)

    @classmethod
    def on_device(cls, config: Any, num_labels: Optional[int],
                  device: Union[torch.device, str]) -> QuestionAnsweringHead:
        """The replica factory for ``Trainer.setup_head``, for any supported family (``num_labels``: 2 or None)."""
        return cls.head_class(getattr(config, "model_type", None)).on_device(config, num_labels, device)

    @classmethod
    def supported_model_types(cls) -> Sequence[str]:
        return tuple(QA_HEAD_CLASSES)

