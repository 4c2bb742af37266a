"""AutoHeadForSequenceClassification: pick the family head from ``config.model_type``.

It exists so that a user (and the CLI) can load any supported checkpoint without knowing its family, and so that
an unsupported model fails at once with the list of what is supported, instead of deep inside transformers.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch

from ._base import SequenceClassificationHead
from ._hub import load_options
from ._io import PathLike, load_config
from .albert import AlbertForSequenceClassification
from .bert import BertForSequenceClassification
from .deberta_v2 import DebertaV2ForSequenceClassification
from .distilbert import DistilBertForSequenceClassification
from .roberta import RobertaForSequenceClassification
from .xlm_roberta import XLMRobertaForSequenceClassification

__all__ = ["AutoHeadForSequenceClassification", "SUPPORTED_MODEL_TYPES", "HEAD_CLASSES"]

HEAD_CLASSES: dict[str, type[SequenceClassificationHead]] = {
    cls.model_type: cls
    for cls in (
        BertForSequenceClassification,
        DistilBertForSequenceClassification,
        RobertaForSequenceClassification,
        AlbertForSequenceClassification,
        XLMRobertaForSequenceClassification,
        DebertaV2ForSequenceClassification,
    )
}
"""``model_type`` -> head class."""

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(HEAD_CLASSES)
"""Every ``config.model_type`` a head exists for."""

_OPTION_NAMES = ("revision", "dtype", "torch_dtype", "local_files_only", "cache_dir", "token", "trust_remote_code")


class AutoHeadForSequenceClassification:
    """Dispatch to the head class of a checkpoint's or config's ``model_type``. Not instantiable."""

    def __init__(self) -> None:
        raise TypeError(
            "AutoHeadForSequenceClassification is not instantiable: use "
            "AutoHeadForSequenceClassification.from_pretrained(path) or .on_device(config, n, device)"
        )

    @staticmethod
    def head_class(model_type: str) -> type[SequenceClassificationHead]:
        """The head class for ``model_type``; ValueError listing the supported types otherwise."""
        try:
            return HEAD_CLASSES[model_type]
        except (KeyError, TypeError):
            raise ValueError(
                f"model_type {model_type!r} is not supported: supported model types are "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}"
            ) from None

    @classmethod
    def from_pretrained(cls, path_or_id: PathLike, **kwargs: Any) -> SequenceClassificationHead:
        """Load with the family class named by the checkpoint's config.json (same keywords as the families',
        including transformers' ``revision``, ``dtype``, ``local_files_only``, ``cache_dir`` and ``token``)."""
        options = load_options(**{k: kwargs[k] for k in _OPTION_NAMES if k in kwargs})
        config = load_config(path_or_id, cls.head_class, options.hub_kwargs())  # raises for an unsupported type
        return cls.head_class(config.model_type).from_pretrained(path_or_id, **kwargs)

    @classmethod
    def from_config(
        cls, config: Any, num_labels: Optional[int] = None, tokenizer: Any = None, **kwargs: Any
    ) -> SequenceClassificationHead:
        """A fresh head of ``config.model_type``."""
        return cls.head_class(getattr(config, "model_type", None)).from_config(
            config, num_labels, tokenizer, **kwargs
        )

    @classmethod
    def on_device(
        cls, config: Any, num_labels: int, device: Union[torch.device, str]
    ) -> SequenceClassificationHead:
        """The replica factory for ``Trainer.setup_head``, for any supported family."""
        return cls.head_class(getattr(config, "model_type", None)).on_device(config, num_labels, device)

    @classmethod
    def supported_model_types(cls) -> Sequence[str]:
        return SUPPORTED_MODEL_TYPES
