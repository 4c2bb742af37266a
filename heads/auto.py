"""AutoHeadForSequenceClassification: pick the family head from ``config.model_type``.

It exists so that a user (and the CLI) can load any supported text-classification checkpoint without knowing its
family; the dispatch itself (and the error listing what is supported) is ``heads._auto.AutoHead``, shared by every task.
"""

from __future__ import annotations



from ._auto import AutoHead
from ._base import SequenceClassificationHead
from .albert import AlbertForSequenceClassification
from .bert import BertForSequenceClassification
from .deberta_v2 import DebertaV2ForSequenceClassification
from .distilbert import DistilBertForSequenceClassification
from .roberta import RobertaForSequenceClassification
from .xlm_roberta import XLMRobertaForSequenceClassification

__all__ = ["AutoHeadForSequenceClassification", "SUPPORTED_MODEL_TYPES", "HEAD_CLASSES"]

HEAD_CLASSES: dict[str, type[SequenceClassificationHead]] = {
    cls.model_type: cls
    for cls in (
        BertForSequenceClassification,
        DistilBertForSequenceClassification,
        RobertaForSequenceClassification,
        AlbertForSequenceClassification,
        XLMRobertaForSequenceClassification,
        DebertaV2ForSequenceClassification,
    )
}
"""``model_type`` -> head class."""

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(HEAD_CLASSES)
"""Every ``config.model_type`` a head exists for."""


class AutoHeadForSequenceClassification(AutoHead):
    """Dispatch to the head class of a checkpoint's or config's ``model_type``. Not instantiable."""

    head_classes = HEAD_CLASSES
