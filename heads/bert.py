"""BERT heads: the family definition for ``model_type == "bert"`` (BERT, MiniLM, many sentence encoders).

It exists to state only what differs from the shared head: the transformers classes, the inputs (BERT takes
``token_type_ids``) and where the classifier lives. A base ``BertModel`` checkpoint (keys without the ``bert.``
prefix) is accepted; its pooler may be missing too (masked-LM checkpoints carry none) and is then initialised fresh.
"""

from __future__ import annotations

from ._base import SequenceClassificationHead, TransformersClass
from ._io import HeadKeys

__all__ = ["BertForSequenceClassification"]


class BertForSequenceClassification(SequenceClassificationHead):
    """Task head around ``transformers.BertForSequenceClassification``."""

    model_type = "bert"
    config_class = TransformersClass("BertConfig")
    model_class = TransformersClass("BertForSequenceClassification")
    input_names = ("input_ids", "attention_mask", "token_type_ids")
    head_keys = HeadKeys(
        head=("classifier.weight", "classifier.bias"),
        optional=("bert.pooler.dense.weight", "bert.pooler.dense.bias"),
        classifier="classifier.weight",
    )
