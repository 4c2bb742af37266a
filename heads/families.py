"""The facts of each supported model family that do not depend on the task.

It exists so that a task module (token classification, question answering, masked LM) declares a family's head
from one record instead of repeating what the family is: its ``model_type``, the prefix of its transformers class
names, the attribute (and state-dict prefix) of its encoder, the inputs its model takes and how many positions it
can embed. Adding a seventh family means one record here and one short declaration per task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from .roberta import roberta_max_positions

__all__ = ["Family", "FAMILIES", "family_of", "default_max_positions"]


def default_max_positions(config: Any) -> Optional[int]:
    """The longest input of an absolute-position embedding (None: unbounded)."""
    return getattr(config, "max_position_embeddings", None)


@dataclass(frozen=True)
class Family:
    """One model family: ``model_type``, class-name ``prefix`` (``"Bert"`` -> ``BertForMaskedLM``), the encoder
    attribute ``base`` (``model.bert``; also the state-dict prefix of a full checkpoint), the tokenizer outputs the
    model takes, and the usable positions of a config."""

    model_type: str
    prefix: str
    base: str
    input_names: tuple[str, ...]
    max_positions: Callable[[Any], Optional[int]] = default_max_positions

    def transformers_name(self, task_suffix: str) -> str:
        """The transformers class name for a task, e.g. ``"ForTokenClassification"`` -> ``BertForTokenClassification``."""
        return f"{self.prefix}{task_suffix}"


_WITH_TYPES = ("input_ids", "attention_mask", "token_type_ids")
_WITHOUT_TYPES = ("input_ids", "attention_mask")

FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (
        Family("bert", "Bert", "bert", _WITH_TYPES),
        Family("distilbert", "DistilBert", "distilbert", _WITHOUT_TYPES),
        Family("roberta", "Roberta", "roberta", _WITHOUT_TYPES, roberta_max_positions),
        Family("albert", "Albert", "albert", _WITH_TYPES),
        Family("xlm-roberta", "XLMRoberta", "roberta", _WITHOUT_TYPES, roberta_max_positions),
        Family("deberta-v2", "DebertaV2", "deberta", _WITH_TYPES),
    )
}
"""``model_type`` -> :class:`Family`, in the order docs/heads.md lists them."""


def family_of(model_type: Any) -> Family:
    """The family record of ``model_type``; ValueError listing the supported types otherwise."""
    try:
        return FAMILIES[model_type]
    except (KeyError, TypeError):
        raise ValueError(
            f"model_type {model_type!r} is not supported: supported model types are {', '.join(FAMILIES)}"
        ) from None
