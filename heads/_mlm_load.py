"""``from_pretrained``'s steps for a masked-LM head: strict weights, the tied decoder, and what a checkpoint is for.

It exists because a masked-LM head differs from a classifier in three loading facts. Its decoder weight is tied
to the word embeddings (the family's declaration, :class:`LMLayout`), so a checkpoint legitimately lacks it and
the tie must hold after loading. A base checkpoint (``BertModel``, e.g. sentence-transformers' MiniLM) has no
LM head at all: the transform and output bias start fresh (logged at WARNING) and the decoder is the word
embeddings. And a checkpoint fine-tuned for another task (a classifier, a tagger, a QA model) is refused rather
than silently losing its task head: its ``config.architectures`` says what it is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

from . import _inputs, _io, _load
from ._hub import LoadOptions
from ._io import CheckpointError, HeadKeys, PathLike

__all__ = ["LMLayout", "OTHER_TASKS", "head_keys", "check_task", "check_tie", "load_masked_lm"]

OTHER_TASKS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "ForMultipleChoice")
"""``config.architectures`` suffixes of checkpoints fine-tuned for another task (refused)."""


@dataclass(frozen=True)
class LMLayout:
    """Where a family's masked-LM head lives in the state dict.

    ``own``: the head's own weights (transform and output bias): all absent means a base checkpoint (fresh head),
    some absent a damaged one. ``decoder``: the output projection's weight, tied to ``embeddings`` (the word
    embeddings) when ``config.tie_word_embeddings`` is true (transformers' default for every family), so a
    checkpoint may lack it; empty when the head multiplies by the embeddings directly. ``aliases``: keys that
    transformers ties to one of ``own`` (the decoder's bias is the head's ``bias``) and that a checkpoint may lack.
    """

    own: tuple[str, ...]
    decoder: str
    embeddings: str
    aliases: tuple[str, ...] = ()


def head_keys(layout: LMLayout, config: Any) -> HeadKeys:
    """The :class:`HeadKeys` of ``layout`` for ``config``: an untied decoder is one of the head's own weights."""
    tied = bool(getattr(config, "tie_word_embeddings", True))
    own = layout.own + (() if tied or not layout.decoder else (layout.decoder,))
    optional = layout.aliases + ((layout.decoder,) if tied and layout.decoder else ())
    return HeadKeys(head=own, optional=optional, classifier=layout.own[0])


def check_task(config: Any, path_or_id: PathLike) -> None:
    """Refuse a checkpoint whose ``config.architectures`` names another task's head (CheckpointError)."""
    names = [str(name) for name in (getattr(config, "architectures", None) or ())]
    others = [name for name in names if name.endswith(OTHER_TASKS)]
    if others and len(others) == len(names):
        raise CheckpointError(
            f"{str(path_or_id)!r} is a {others[0]} checkpoint (config.json architectures {names}), fine-tuned for "
            "another task: a masked-LM head would drop its task head and start a fresh LM head. Load it with that "
            "task's head (e.g. AutoHeadForSequenceClassification), or give a base or masked-LM checkpoint"
        )


def check_tie(model: Any, layout: LMLayout, path_or_id: PathLike) -> None:
    """Refuse a loaded model whose decoder is not the word embeddings although its config ties them."""
    if not layout.decoder or not getattr(model.config, "tie_word_embeddings", True):
        return
    if model.get_output_embeddings().weight is not model.get_input_embeddings().weight:
        raise CheckpointError(
            f"loading {str(path_or_id)!r} left the decoder ({layout.decoder}) untied from the word embeddings "
            f"({layout.embeddings}) although config.tie_word_embeddings is true: re-save the checkpoint with "
            "transformers' save_pretrained"
        )


def load_masked_lm(
    model_class: Any,
    layout_of: Any,
    check_type: Any,
    apply_labels: Any,
    path_or_id: PathLike,
    *,
    num_labels: Optional[int],
    labels: Any,
    max_length: Optional[int],
    tokenizer: Any,
    options: LoadOptions,
) -> tuple[Any, Any, int]:
    """``(model, tokenizer, max_length)`` of a checkpoint: base (fresh LM head) or full masked-LM, strictly.

    ``layout_of(config)`` gives the family's :class:`LMLayout`. ``max_length`` None: the saved head's training
    length (the tokenizer's ``model_max_length``) for a full checkpoint, 128 for a base one.
    """
    if max_length is not None:
        max_length = _inputs.check_max_length(max_length)
    hub = options.hub_kwargs()
    config = _io.load_config(path_or_id, check_type, hub)
    apply_labels(config, num_labels, labels)
    check_task(config, path_or_id)
    layout = layout_of(config)
    result = _io.load_weights(
        model_class, path_or_id, config, head_keys(layout, config), dtype=options.model_dtype(), hub_kwargs=hub
    )
    check_tie(result.model, layout, path_or_id)
    if tokenizer is None:
        tokenizer = _io.load_tokenizer(path_or_id, hub)
    if result.fresh_head:
        tied = bool(layout.decoder) and bool(getattr(config, "tie_word_embeddings", True))
        _io.log_main(
            logging.WARNING,
            "no masked-LM head weights in %s: initialised a fresh LM head (%s)%s; fine-tune before use",
            path_or_id,
            ", ".join(k for k in result.fresh_keys if k not in layout.aliases and not (tied and k == layout.decoder)),
            f", its decoder tied to the word embeddings ({layout.embeddings})" if tied else "",
        )
    if max_length is None:
        max_length = _load.DEFAULT_MAX_LENGTH if result.fresh_head else _load.saved_max_length(tokenizer)
    return result.model, tokenizer, max_length
