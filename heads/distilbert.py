"""DistilBERT heads: the family definition for ``model_type == "distilbert"``.

It exists to state only what differs from the shared head: DistilBERT takes no ``token_type_ids``, and its
classifier is two layers (``pre_classifier`` then ``classifier``), both fresh when loading a base checkpoint.
"""

from __future__ import annotations

from ._base import SequenceClassificationHead, TransformersClass
from ._io import HeadKeys

__all__ = ["DistilBertForSequenceClassification"]


class DistilBertForSequenceClassification(SequenceClassificationHead):
    """Task head around ``transformers.DistilBertForSequenceClassification``."""

    model_type = "distilbert"
    config_class = TransformersClass("DistilBertConfig")
    model_class = TransformersClass("DistilBertForSequenceClassification")
    input_names = ("input_ids", "attention_mask")
    head_keys = HeadKeys(
        head=("pre_classifier.weight", "pre_classifier.bias", "classifier.weight", "classifier.bias"),
        optional=(),
        classifier="classifier.weight",
    )
