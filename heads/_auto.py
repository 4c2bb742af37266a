"""AutoHead: dispatch on ``config.model_type`` to a task's family head class, written once for every task.

It exists because each task (text classification, token classification, QA, masked LM) needs the same auto class:
load any supported checkpoint without knowing its family, build a fresh head or a replica from a config, and fail
at once, listing what is supported, for an unsupported model instead of deep inside transformers. A task's auto
class only names its ``head_classes`` (``model_type`` -> family class) and how ``on_device`` is called.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional, Sequence, Union

import torch

from ._hub import load_options
from ._io import PathLike, load_config

__all__ = ["AutoHead"]

_OPTION_NAMES = ("revision", "dtype", "torch_dtype", "local_files_only", "cache_dir", "token", "trust_remote_code")
"""``from_pretrained`` keywords that reach the config loading too."""


class AutoHead:
    """Dispatch to the family class of a checkpoint's or config's ``model_type``. Not instantiable."""

    head_classes: ClassVar[dict[str, Any]] = {}
    """``model_type`` -> the task's family head class."""
    replica_call: ClassVar[str] = ".on_device(config, n, device)"
    """How ``on_device`` is called for this task (named in the not-instantiable error)."""

    def __init__(self) -> None:
        name = type(self).__name__
        raise TypeError(f"{name} is not instantiable: use {name}.from_pretrained(path) or {self.replica_call}")

    @classmethod
    def head_class(cls, model_type: str) -> Any:
        """The head class for ``model_type``; ValueError listing the supported types otherwise."""
        try:
            return cls.head_classes[model_type]
        except (KeyError, TypeError):
            raise ValueError(
                f"model_type {model_type!r} is not supported: supported model types are "
                f"{', '.join(cls.head_classes)}"
            ) from None

    @classmethod
    def from_pretrained(cls, path_or_id: PathLike, **kwargs: Any) -> Any:
        """Load with the family class named by the checkpoint's config.json (same keywords as the families',
        including transformers' ``revision``, ``dtype``, ``local_files_only``, ``cache_dir`` and ``token``)."""
        options = load_options(**{k: kwargs[k] for k in _OPTION_NAMES if k in kwargs})
        config = load_config(path_or_id, cls.head_class, options.hub_kwargs())  # raises for an unsupported type
        return cls.head_class(config.model_type).from_pretrained(path_or_id, **kwargs)

    @classmethod
    def from_config(cls, config: Any, num_labels: Optional[int] = None, tokenizer: Any = None, **kwargs: Any) -> Any:
        """A fresh head of ``config.model_type``."""
        return cls.head_class(getattr(config, "model_type", None)).from_config(config, num_labels, tokenizer,
                                                                               **kwargs)

    @classmethod
    def on_device(cls, config: Any, num_labels: Optional[int], device: Union[torch.device, str]) -> Any:
        """The replica factory for ``Trainer.setup_head``, for any supported family."""
        return cls.head_class(getattr(config, "model_type", None)).on_device(config, num_labels, device)

    @classmethod
    def supported_model_types(cls) -> Sequence[str]:
        """Every ``config.model_type`` this task has a head for."""
        return tuple(cls.head_classes)
