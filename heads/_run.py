"""Running a head's model the two ways users expect: like a transformers model, and as a predictor.

It exists to keep ``SequenceClassificationHead`` short while giving both habits one implementation:
:func:`call_output` is ``head(**enc)`` (a transformers ``SequenceClassifierOutput``, with the head's checked loss
when labels are given) and :func:`predict_all` is ``head.predict`` (ranked labels per text or per sentence pair, in
eval mode without gradients, restoring every module's mode afterwards).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Sequence

import torch

from . import _encode, _inputs

__all__ = ["call_output", "predict_all", "CALL_INPUTS"]

CALL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
"""Tokenizer outputs ``head(**enc)`` accepts (those the family's model does not take are dropped)."""


def call_output(head: Any, enc: Optional[Mapping[str, Any]], labels: Any, inputs: dict[str, Any]) -> Any:
    """``SequenceClassifierOutput(logits=..., loss=...)`` for ``head(enc)`` or ``head(**inputs)``."""
    from transformers.modeling_outputs import SequenceClassifierOutput

    if enc is not None and inputs:
        raise ValueError(
            f"got an encoding and keyword inputs {sorted(inputs)}: call head(**enc) or head(enc), not both"
        )
    if enc is not None and not isinstance(enc, Mapping):
        raise ValueError(
            f"head(...) got a {type(enc).__name__}: pass the dict that encode()/collate() returns, as head(enc) "
            "or head(**enc)"
        )
    batch = dict(enc) if enc is not None else dict(inputs)
    if labels is None:
        labels = batch.get("labels")
    unknown = sorted(set(batch) - set(CALL_INPUTS) - set(head.input_names) - {"labels"})
    if unknown:
        raise ValueError(
            f"unknown model inputs {unknown}: a {type(head).__name__} takes {', '.join(head.input_names)} "
            "(and labels); pass what encode()/collate() or the tokenizer returns"
        )
    batch.pop("labels", None)
    if labels is None:
        return SequenceClassifierOutput(logits=head.forward(batch))
    loss, logits = head._loss_and_logits(batch, labels)
    return SequenceClassifierOutput(loss=loss, logits=logits)


def predict_all(
    head: Any, texts: Sequence[str], text_pairs: Any, top_k: Optional[int], batch_size: int
) -> list[list[tuple[str, float]]]:
    """What ``head.predict`` returns (see its docstring); every argument is checked here."""
    texts = _inputs.check_texts(texts, "predict")
    if isinstance(text_pairs, int):
        raise ValueError(
            f"predict's second argument is text_pairs, got {text_pairs!r}: pass top_k={text_pairs} by keyword"
        )
    pairs = _inputs.check_pairs(texts, text_pairs, "predict")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise ValueError(f"top_k={top_k!r} is invalid: use an integer >= 1, or None for every label")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is invalid: use an integer >= 1")
    names, problem = head.labels(), head.problem_type
    module = head.graph().module
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    results: list[list[tuple[str, float]]] = []
    try:
        with torch.no_grad():
            for start in range(0, len(texts), batch_size):
                chunk = None if pairs is None else pairs[start : start + batch_size]
                logits = head.forward(head.encode(texts[start : start + batch_size], chunk)).float().cpu()
                results.extend(_encode.rank(row, names, problem, top_k) for row in logits)
    finally:
        for m, training in modes:
            m.training = training
    return results
