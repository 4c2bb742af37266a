"""ALBERT heads: the family definition for ``model_type == "albert"``.

It exists to state only what differs from the shared head: ALBERT takes ``token_type_ids``, shares its layer
weights across depth (one set of encoder keys whatever ``num_hidden_layers``) and has a pooler that a masked-LM
checkpoint may lack (then initialised fresh).
"""

from __future__ import annotations

from ._base import SequenceClassificationHead, TransformersClass
from ._io import HeadKeys

__all__ = ["AlbertForSequenceClassification"]


class AlbertForSequenceClassification(SequenceClassificationHead):
    """Task head around ``transformers.AlbertForSequenceClassification``."""

    model_type = "albert"
    config_class = TransformersClass("AlbertConfig")
    model_class = TransformersClass("AlbertForSequenceClassification")
    input_names = ("input_ids", "attention_mask", "token_type_ids")
    head_keys = HeadKeys(
        head=("classifier.weight", "classifier.bias"),
        optional=("albert.pooler.weight", "albert.pooler.bias"),
        classifier="classifier.weight",
    )
