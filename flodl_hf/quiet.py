"""Silence transformers' and huggingface_hub's loading reports and progress bars for a block, then restore them.

It exists because flodl-hf replaces those reports with its own strict checks (missing / unexpected keys are
errors, not log lines) and must not leave the user's logging settings changed.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

__all__ = ["quiet_transformers"]


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' own loading report and progress bars for the duration (restored afterwards).

    Loaders replace that report with strict checks and one log line of their own.
    """
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hub_bars_off = hub_utils.are_progress_bars_disabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        if hub_bars_off:
            hub_utils.disable_progress_bars()
        else:
            hub_utils.enable_progress_bars()
