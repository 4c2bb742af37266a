"""The Hugging Face Hub side of a head: the ``from_pretrained`` keywords transformers users pass, and ``push_to_hub``.

It exists so that ``revision``, ``dtype``, ``local_files_only``, ``cache_dir`` and ``token`` are checked once and
reach transformers' ``from_pretrained`` of the config, the model and the tokenizer alike, and so that
``trust_remote_code=True`` is refused with the reason: a head wraps the known transformers class of one of six
families, and every device's replica is rebuilt from that class (``on_device``), which code fetched from a
repository cannot guarantee. Pushing saves the head to a temporary directory with a model card and sends it through
:mod:`flodl_hf.export.hub`, whose operation list is testable offline.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch

__all__ = ["LoadOptions", "load_options", "write_push_dir", "push_head", "DTYPE_NAMES"]

DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
"""``dtype`` strings accepted besides torch dtypes and ``"auto"``."""


@dataclass(frozen=True)
class LoadOptions:
    """Checked ``from_pretrained`` keywords. ``dtype`` None means float32 (fp32 master weights for training)."""

    revision: Optional[str] = None
    cache_dir: Optional[str] = None
    local_files_only: bool = False
    token: Optional[Union[str, bool]] = None
    dtype: Optional[Union[torch.dtype, str]] = None

    def hub_kwargs(self) -> dict[str, Any]:
        """The keywords for transformers' ``from_pretrained`` of a config or tokenizer (only those given)."""
        kwargs: dict[str, Any] = {}
        if self.revision is not None:
            kwargs["revision"] = self.revision
        if self.cache_dir is not None:
            kwargs["cache_dir"] = self.cache_dir
        if self.local_files_only:
            kwargs["local_files_only"] = True
        if self.token is not None:
            kwargs["token"] = self.token
        return kwargs

    def model_dtype(self) -> Union[torch.dtype, str]:
        """The ``dtype`` for the model's ``from_pretrained``."""
        return torch.float32 if self.dtype is None else self.dtype


def _check_dtype(dtype: Any, name: str) -> Optional[Union[torch.dtype, str]]:
    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPE_NAMES:
        return DTYPE_NAMES[dtype.removeprefix("torch.")]
    raise ValueError(
        f"{name}={dtype!r} is invalid: use a torch dtype (torch.float16, torch.bfloat16, torch.float32), one of "
        f"{', '.join(map(repr, DTYPE_NAMES))}, or 'auto' (the checkpoint's own dtype)"
    )


def load_options(
    *,
    revision: Optional[str] = None,
    dtype: Any = None,
    torch_dtype: Any = None,
    local_files_only: bool = False,
    cache_dir: Optional[Union[str, os.PathLike]] = None,
    token: Optional[Union[str, bool]] = None,
    trust_remote_code: Optional[bool] = None,
) -> LoadOptions:
    """Check the transformers-style keywords of ``from_pretrained``; ValueError names the bad one and the fix.

    ``torch_dtype`` is transformers 4's name for ``dtype`` (transformers 5 still accepts it, with a warning).
    """
    if trust_remote_code:
        raise ValueError(
            "trust_remote_code=True is not supported: flodl-hf heads wrap the transformers classes of six known "
            "families (bert, distilbert, roberta, albert, xlm-roberta, deberta-v2), and each device's replica is "
            "rebuilt from that class, which code downloaded from a repository cannot guarantee. Use a checkpoint "
            "of a supported family, or train custom-code models with transformers' Trainer"
        )
    if trust_remote_code not in (None, False):
        raise ValueError(f"trust_remote_code={trust_remote_code!r} is invalid: use False (or leave it out)")
    dtype, torch_dtype = _check_dtype(dtype, "dtype"), _check_dtype(torch_dtype, "torch_dtype")
    if dtype is not None and torch_dtype is not None and dtype != torch_dtype:
        raise ValueError(f"dtype={dtype!r} and torch_dtype={torch_dtype!r} disagree: pass only dtype")
    if revision is not None and (not isinstance(revision, str) or not revision):
        raise ValueError(f"revision={revision!r} is invalid: give a branch, tag or commit hash string")
    if not isinstance(local_files_only, bool):
        raise ValueError(f"local_files_only={local_files_only!r} is invalid: use True or False")
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise ValueError(f"cache_dir={cache_dir!r} is invalid: give a directory path")
    if token is not None and not isinstance(token, (str, bool)):
        raise ValueError(f"token={token!r} is invalid: give a Hub token string, True (your login) or None")
    return LoadOptions(
        revision=revision,
        cache_dir=None if cache_dir is None else os.fspath(cache_dir),
        local_files_only=local_files_only,
        token=token,
        dtype=dtype if dtype is not None else torch_dtype,
    )


def write_push_dir(head: Any, directory: Union[str, os.PathLike], *, name: str, card: Any = None) -> Path:
    """Write what ``push_to_hub`` uploads into ``directory``: ``head.save_pretrained`` plus a model card
    (``card``, a :class:`flodl_hf.export.cards.CardInfo`, for the full card; None: a short card without scores)."""
    from flodl_hf.export.cards import write_basic_card, write_model_card

    if head.tokenizer is None:
        raise ValueError(
            "this head has no tokenizer, so the pushed model could not be used: set head.tokenizer = "
            "AutoTokenizer.from_pretrained(...) first"
        )
    out = head.save_pretrained(directory)
    if card is not None:
        write_model_card(card, out)
    else:
        write_basic_card(
            out,
            model_name=name,
            labels=head.labels(),
            model_type=str(getattr(head.config(), "model_type", "")) or None,
            max_length=head.max_length,
            pipeline_tag=getattr(head, "task", "") or "text-classification",
        )
    return out


def push_head(
    head: Any,
    repo_id: str,
    *,
    card: Any = None,
    token: Optional[str] = None,
    private: Optional[bool] = None,
    revision: Optional[str] = None,
    commit_message: str = "Upload text classifier trained with flodl-hf",
    create_pr: bool = False,
) -> Any:
    """Write ``head`` to a temporary directory (:func:`write_push_dir`) and push it with
    :func:`flodl_hf.export.hub.push_output_dir`; the offline and token checks run before anything is written."""
    from flodl_hf.export.hub import check_push_access, check_repo_id, push_output_dir

    check_repo_id(repo_id)
    check_push_access(repo_id, token)
    with tempfile.TemporaryDirectory(prefix="flodl-hf-push-") as tmp:
        out = write_push_dir(head, Path(tmp) / "model", name=repo_id.split("/")[-1], card=card)
        return push_output_dir(
            out, repo_id, token=token, private=private, revision=revision, commit_message=commit_message,
            create_pr=create_pr,
        )
