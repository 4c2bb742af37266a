"""Pushing a model directory to the Hugging Face Hub: plan the upload offline, then send it through huggingface_hub.

It exists so that what a push would upload can be decided, checked and tested without a network:
:func:`plan_push` checks the directory (config, weights, tokenizer, a valid model card) and returns the exact
``huggingface_hub.CommitOperationAdd`` list; :func:`push_output_dir` refuses clearly when the Hub cannot be
reached (``HF_HUB_OFFLINE``) or no token is available, then calls ``HfApi.create_repo`` and ``HfApi.create_commit``
with that same list. Heads push through here too (``head.push_to_hub`` saves to a temporary directory first).
This module never imports ``heads``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Union

from ..files.ownership import MARKER

__all__ = ["plan_push", "push_output_dir", "check_push_access", "check_repo_id", "hub_offline", "SKIPPED_FILES"]

SKIPPED_FILES = (MARKER,)
"""Files of an output directory that stay local (flodl-hf's ownership marker)."""
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
              "sentencepiece.bpe.model", "spm.model")


def check_repo_id(repo_id: Any) -> str:
    """``repo_id`` if it is a valid Hub model id (``name`` or ``owner/name``), else ValueError with the fix."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(repo_id, str) or not repo_id:
        raise ValueError(f"repo_id={repo_id!r} is invalid: give a Hub id such as 'your-name/my-classifier'")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise ValueError(f"repo_id={repo_id!r} is not a valid Hub id ({exc}): use 'owner/name' with letters, "
                         "digits, '-', '_' and '.'") from None
    return repo_id


def plan_push(path: Union[str, Path]) -> list:
    """The ``CommitOperationAdd`` list that pushing ``path`` would send, sorted by path in the repository.

    Needs no network. Refuses (ValueError / FileNotFoundError) a directory without config.json, weights, tokenizer
    files or a model card (README.md), and a card that :func:`flodl_hf.export.cards.check_model_card` rejects. Every file
    under ``path`` is uploaded except :data:`SKIPPED_FILES`.
    """
    from huggingface_hub import CommitOperationAdd

    from .cards import check_model_card

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model directory not found: {path}")
    needs = {"config.json": ("config.json",), "a weights file": _WEIGHTS, "tokenizer files": _TOKENIZER,
             "a model card (README.md)": ("README.md",)}
    missing = [what for what, names in needs.items() if not any((path / name).is_file() for name in names)]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}: push a directory written by flodl-hf train / export "
                         "(or head.push_to_hub, which writes all of them)")
    check_model_card(path / "README.md", scores=False)
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name not in SKIPPED_FILES)
    return [CommitOperationAdd(path_in_repo=p.relative_to(path).as_posix(), path_or_fileobj=str(p)) for p in files]


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set (now, or when huggingface_hub was imported)."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE", "")
    return bool(constants.HF_HUB_OFFLINE) or value.strip().upper() in ("1", "ON", "YES", "TRUE")


def check_push_access(repo_id: str, token: Optional[str] = None) -> str:
    """The token to push with; ValueError when ``HF_HUB_OFFLINE`` is set or no token is given or saved."""
    from huggingface_hub import get_token

    if hub_offline():
        raise ValueError(f"cannot push to {repo_id!r}: HF_HUB_OFFLINE is set, so the Hub may not be contacted; "
                         "unset HF_HUB_OFFLINE on a machine with network access and push again")
    if token is not None and (not isinstance(token, str) or not token):
        raise ValueError(f"token={token!r} is invalid: give a Hub access token string, or None to use your login")
    token = token or get_token()
    if not token:
        raise ValueError(f"cannot push to {repo_id!r}: no Hugging Face token. Pass token='hf_...', set HF_TOKEN, "
                         "or run `hf auth login` (the token needs write access)")
    return token


def push_output_dir(path: Union[str, Path], repo_id: str, *, token: Optional[str] = None,
                    private: Optional[bool] = None, revision: Optional[str] = None,
                    commit_message: str = "Upload text classifier trained with flodl-hf",
                    create_pr: bool = False) -> Any:
    """Upload a model directory (model, tokenizer, card and everything else :func:`plan_push` lists) to ``repo_id``.

    Creates the repository when it does not exist (``private`` as given), then sends one commit. ``token``:
    a Hub token; None uses the saved login or ``HF_TOKEN``. Everything is checked before any request: an invalid
    directory or repo id, ``HF_HUB_OFFLINE=1`` and a missing token each raise ValueError saying what to do.
    Returns huggingface_hub's ``CommitInfo``.
    """
    from huggingface_hub import HfApi

    repo_id = check_repo_id(repo_id)
    operations = plan_push(path)
    token = check_push_access(repo_id, token)
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
    return api.create_commit(repo_id, operations, commit_message=commit_message, revision=revision,
                             create_pr=create_pr, repo_type="model")
