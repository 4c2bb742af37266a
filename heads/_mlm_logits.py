"""Masked-LM logits at the masked positions only: what ``compute_loss`` needs, at a fraction of the memory.

It exists because a masked LM's full logits are ``[B, T, vocab]``: for the packaged MiniLM (30,522 tokens) a batch
of 32 texts of 128 tokens holds 0.5 GB of float32 logits, and as much again for their gradient, while the loss
reads only the ~15 % masked rows. Here the encoder runs on the whole batch and the LM head on the masked rows
only; the loss is the same cross-entropy (the LM heads act on each position independently). Each family declares
how its LM head is applied (:func:`module_lm`, or its own function below). The shortcut bypasses the model's
own ``forward``, so it is used only on the bare transformers model without forward hooks; a wrapped or hooked
module (DDP, a timing hook) gets the full forward pass.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["LMFunction", "module_lm", "distilbert_lm", "deberta_v2_lm", "is_plain", "masked_logits"]

LMFunction = Callable[[Any, torch.Tensor], torch.Tensor]
"""``(model, hidden [N, H]) -> logits [N, vocab]``: a family's LM head applied to selected hidden states."""


def module_lm(name: str) -> LMFunction:
    """The LM head that is one submodule of the model (``model.cls``, ``model.lm_head``, ``model.predictions``)."""

    def apply(model: Any, hidden: torch.Tensor) -> torch.Tensor:
        return getattr(model, name)(hidden)

    apply.__name__ = f"{name}_lm"
    return apply


def distilbert_lm(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """DistilBERT's LM head, written inline in ``DistilBertForMaskedLM.forward``."""
    return model.vocab_projector(model.vocab_layer_norm(model.activation(model.vocab_transform(hidden))))


def deberta_v2_lm(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """DeBERTa-v2's LM head: ``cls`` (legacy layout) or ``lm_predictions`` times the word embeddings."""
    if model.legacy:
        return model.cls(hidden)
    return model.lm_predictions(hidden, model.deberta.embeddings.word_embeddings)


def is_plain(module: Any, model_class: Any) -> bool:
    """True for a bare ``model_class`` instance without forward hooks (the shortcut is then exact)."""
    return (
        isinstance(module, model_class)
        and not module._forward_hooks
        and not module._forward_pre_hooks
        and not getattr(module, "_forward_hooks_with_kwargs", None)
    )


def masked_logits(model: Any, base: str, lm: LMFunction, enc: dict[str, torch.Tensor],
                  selected: torch.Tensor) -> torch.Tensor:
    """Logits ``[N, vocab]`` of the ``N`` positions where ``selected`` ``[B, T]`` is true, in row-major order."""
    hidden = getattr(model, base)(**enc)[0]
    return lm(model, hidden[selected])
