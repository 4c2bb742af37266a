"""Extractive question-answering heads: one class per model family, and auto dispatch on ``config.model_type``.

It exists so that each family states only which :class:`heads.families.Family` it is (its transformers classes,
inputs and position limit follow from that record) while loading, windows, losses, answers and saving live once in
``heads._qa_head.QuestionAnsweringHead``; adding a seventh family is one more three-line class here. The auto class
lets a user (and the CLI) load any supported checkpoint without knowing its family.
"""

from __future__ import annotations



from ._auto import AutoHead
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


class AutoHeadForQuestionAnswering(AutoHead):
    """Dispatch to the QA head class of a checkpoint's or config's ``model_type``. Not instantiable."""

    head_classes = QA_HEAD_CLASSES
    replica_call = ".on_device(config, 2, device)"
