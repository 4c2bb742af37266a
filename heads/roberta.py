"""RoBERTa heads: the family definition for ``model_type == "roberta"``.

It exists to state only what differs from the shared head: no ``token_type_ids``, a two-layer classifier
(``classifier.dense`` then ``classifier.out_proj``), and positions that start after the padding id, so the longest
input is ``max_position_embeddings - pad_token_id - 1`` tokens (512 for roberta-base).
"""

from __future__ import annotations

from typing import Any, Optional

from ._base import SequenceClassificationHead, TransformersClass
from ._io import HeadKeys

__all__ = ["RobertaForSequenceClassification", "ROBERTA_HEAD_KEYS", "roberta_max_positions"]

ROBERTA_HEAD_KEYS = HeadKeys(
    head=(
        "classifier.dense.weight",
        "classifier.dense.bias",
        "classifier.out_proj.weight",
        "classifier.out_proj.bias",
    ),
    optional=(),
    classifier="classifier.out_proj.weight",
)


def roberta_max_positions(config: Any) -> Optional[int]:
    """Usable positions of a RoBERTa-style embedding (ids start at ``pad_token_id + 1``)."""
    limit = getattr(config, "max_position_embeddings", None)
    if limit is None:
        return None
    return limit - (config.pad_token_id if config.pad_token_id is not None else 0) - 1


class RobertaForSequenceClassification(SequenceClassificationHead):
    """Task head around ``transformers.RobertaForSequenceClassification``."""

    model_type = "roberta"
    config_class = TransformersClass("RobertaConfig")
    model_class = TransformersClass("RobertaForSequenceClassification")
    input_names = ("input_ids", "attention_mask")
    head_keys = ROBERTA_HEAD_KEYS

    @classmethod
    def max_positions(cls, config: Any) -> Optional[int]:
        return roberta_max_positions(config)
