"""DeBERTa-v2/v3 heads: the family definition for ``model_type == "deberta-v2"``.

It exists to state only what differs from the shared head: DeBERTa's pooler (``pooler.dense``) belongs to the task
head, not to the encoder, so a base checkpoint lacks it and it is initialised fresh with the classifier. Positions
are relative, so the input length is bounded only by ``max_position_embeddings`` as configured.
"""

from __future__ import annotations

from ._base import SequenceClassificationHead, TransformersClass
from ._io import HeadKeys

__all__ = ["DebertaV2ForSequenceClassification"]


class DebertaV2ForSequenceClassification(SequenceClassificationHead):
    """Task head around ``transformers.DebertaV2ForSequenceClassification``."""

    model_type = "deberta-v2"
    config_class = TransformersClass("DebertaV2Config")
    model_class = TransformersClass("DebertaV2ForSequenceClassification")
    input_names = ("input_ids", "attention_mask", "token_type_ids")
    head_keys = HeadKeys(
        head=("pooler.dense.weight", "pooler.dense.bias", "classifier.weight", "classifier.bias"),
        optional=(),
        classifier="classifier.weight",
    )
