"""XLM-RoBERTa heads: the family definition for ``model_type == "xlm-roberta"``.

It exists because XLM-RoBERTa has its own transformers classes and ``model_type`` even though its layout is
RoBERTa's; it reuses the RoBERTa key layout and position limit.
"""

from __future__ import annotations

from typing import Any, Optional

from ._base import SequenceClassificationHead, TransformersClass
from .roberta import ROBERTA_HEAD_KEYS, roberta_max_positions

__all__ = ["XLMRobertaForSequenceClassification"]


class XLMRobertaForSequenceClassification(SequenceClassificationHead):
    """Task head around ``transformers.XLMRobertaForSequenceClassification``."""

    model_type = "xlm-roberta"
    config_class = TransformersClass("XLMRobertaConfig")
    model_class = TransformersClass("XLMRobertaForSequenceClassification")
    input_names = ("input_ids", "attention_mask")
    head_keys = ROBERTA_HEAD_KEYS

    @classmethod
    def max_positions(cls, config: Any) -> Optional[int]:
        return roberta_max_positions(config)
