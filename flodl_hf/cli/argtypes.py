"""Argument types of the ``flodl-hf`` command line: each parses one option's text or raises
``argparse.ArgumentTypeError`` naming the value and what is accepted (argparse turns that into one usage line).

It exists apart from ``flodl_hf.cli.parser`` so that the parser module stays about building the commands.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

__all__ = ["cap", "int_at_least", "positive_float", "fraction", "speed_hint", "overhead", "seed", "name_list",
           "non_negative_float", "json_object"]


def cap(text: str) -> Any:
    """``--max-micro-batch``: an integer >= 1, or ``auto``."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (nor 'auto')") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is too small: use an integer >= 1, or auto")
    return value


def int_at_least(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is too small: use an integer >= {minimum}")
        return value

    parse.__name__ = "integer"
    return parse


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return value


def fraction(text: str) -> float:
    value = _number(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text} must be a fraction in [0, 1), e.g. 0.1")
    return value


def speed_hint(text: str) -> tuple[int, float]:
    rank, sep, ratio = text.partition(":")
    try:
        slow, value = int(rank), float(ratio)
    except ValueError:
        slow, value = -1, float("nan")
    if not sep or slow < 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not RANK:RATIO, e.g. 1:2.5 (rank 1 is 2.5x slower)")
    if value < 1.0:
        raise argparse.ArgumentTypeError(f"ratio {value:g} in {text!r} must be >= 1 (how many times faster the other "
                                         "ranks are than RANK); to say a rank is faster, name the slower rank")
    return slow, value


def overhead(text: str) -> float:
    value = _number(text)
    if not 0.01 <= value <= 0.5:
        raise argparse.ArgumentTypeError(f"{text} is out of range: use a fraction of compute time in [0.01, 0.5], "
                                         "e.g. 0.1")
    return value


SEED_MAX = 2**63 - 1


def seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer, e.g. 0") from None
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"{text[:30]} is out of range: use an integer from 0 to 2**63-1, e.g. 0")
    return value


def name_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",")]
    if not names or any(not name for name in names):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of names, e.g. neg,neu,pos")
    return names


def non_negative_float(example: str) -> Any:
    """``--weight-decay``, ``--max-grad-norm``: a finite number >= 0 (``example`` is named in the error)."""
    def parse(text: str) -> float:
        value = _number(text)
        if not (math.isfinite(value) and value >= 0):
            raise argparse.ArgumentTypeError(f"{text} must be a finite number >= 0, e.g. {example}")
        return value

    parse.__name__ = "number"
    return parse


def json_object(text: str) -> dict:
    """``--lr-scheduler-kwargs``: a JSON object, e.g. ``{"num_cycles": 2}``."""
    import json

    def distinct(pairs: list) -> dict:
        keys = [key for key, _ in pairs]
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        if repeated:  # json.loads would keep the last silently
            raise argparse.ArgumentTypeError(f"{text!r} gives {', '.join(map(repr, repeated))} more than once: give "
                                             "each keyword once")
        return dict(pairs)

    try:
        value = json.loads(text, object_pairs_hook=distinct)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object: write e.g. '{{\"num_cycles\": 2}}'")
    return value
