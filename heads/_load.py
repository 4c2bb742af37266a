"""``from_pretrained``'s steps for any family: config, labels, strict weights, tokenizer and ``max_length``.

It exists so that the order of a load is written once (check every argument, then config, then weights, then
tokenizer) and so that a saved head comes back with the ``max_length`` it trained with: unless the caller names
one, a checkpoint with classifier weights uses the tokenizer's ``model_max_length`` (which ``save_pretrained``
sets), and a base checkpoint (fresh head) uses 128.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence

from . import _inputs, _io, _losses
from ._hub import LoadOptions
from ._io import HeadKeys, PathLike

__all__ = ["load_parts", "saved_max_length", "DEFAULT_MAX_LENGTH"]

DEFAULT_MAX_LENGTH = 128
"""``max_length`` of a head whose tokenizer states no ``model_max_length`` (and of ``from_config``)."""
_NO_LIMIT = 10**8  # a model_max_length at or above this means "not set" (transformers' default is 1e30)


def saved_max_length(tokenizer: Any) -> int:
    """The tokenizer's ``model_max_length`` when it states one, else :data:`DEFAULT_MAX_LENGTH`."""
    saved = getattr(tokenizer, "model_max_length", None)
    return saved if isinstance(saved, int) and 2 <= saved < _NO_LIMIT else DEFAULT_MAX_LENGTH


def load_parts(
    model_class: Any,
    head_keys: HeadKeys,
    check_type: Callable[[str], None],
    path_or_id: PathLike,
    *,
    num_labels: Optional[int],
    labels: Optional[Sequence[str]],
    max_length: Optional[int],
    problem_type: Optional[str],
    tokenizer: Any,
    options: LoadOptions,
    apply_labels: Callable[[Any, Optional[int], Optional[Sequence[str]]], None] = _inputs.apply_labels,
) -> tuple[Any, Any, int]:
    """``(model, tokenizer, max_length)`` of a checkpoint, loaded strictly (see ``_io``)."""
    if max_length is not None:
        max_length = _inputs.check_max_length(max_length)
    if problem_type is not None and problem_type not in _losses.PROBLEM_TYPES:
        raise ValueError(
            f"problem_type={problem_type!r} is invalid: use one of {', '.join(_losses.PROBLEM_TYPES)}"
        )
    hub = options.hub_kwargs()
    config = _io.load_config(path_or_id, check_type, hub)
    apply_labels(config, num_labels, labels)
    if problem_type is not None:
        config.problem_type = problem_type
    asked = (
        f"labels ({len(labels)} names)"
        if labels is not None
        else f"num_labels={num_labels}"
        if num_labels is not None
        else None
    )
    result = _io.load_weights(
        model_class, path_or_id, config, head_keys, asked, dtype=options.model_dtype(), hub_kwargs=hub
    )
    if tokenizer is None:
        tokenizer = _io.load_tokenizer(path_or_id, hub)
    if result.fresh_head:
        _io.log_main(
            logging.WARNING,
            "no classifier weights in %s: initialised a fresh %d-label head (%s); fine-tune before use",
            path_or_id,
            config.num_labels,
            ", ".join(result.fresh_keys),
        )
    if max_length is None:  # a fine-tuned classifier's tokenizer states its training length; a base model's only
        # its architecture's limit (512 for BERT), too slow a default for fine-tuning
        max_length = DEFAULT_MAX_LENGTH if result.fresh_head else saved_max_length(tokenizer)
    return result.model, tokenizer, max_length
