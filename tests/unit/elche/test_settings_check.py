"""El Che's user settings have one check: ``DdpConfig`` and ``ElCheArguments`` accept and refuse the same speed
hints and pinned splits, with the same words after the name the user gave them under.

Shown failing once: with the checks each surface had before, a boolean rank (``(True, 2.0)``) and a boolean ratio
were accepted by ``ElCheArguments`` and refused by ``DdpConfig``, a boolean size (``[True, 3]``) the other way round,
and no refusal of one was worded as the other's.
"""

from __future__ import annotations

import random

import pytest

from flodl_hf.config import DdpConfig
from flodl_hf.integrations import ElCheArguments

HINTS = [(1, 2.5), [0, 1], (2, 1), (0, 0.5), 2.0, (1, float("inf")), (1, float("nan")), (True, 2.0), (1, True),
         (-1, 2.0), ("1", 2.0), (1, "2"), (1, 2.0, 3), (), None]
SIZES = [[12, 4], (3, 3, 2), [4, 0], [True, 3], [], [2.0, 2], "44", [1], [-1, 5], None]


def _outcome(make, prefix: str):
    try:
        made = make()
    except ValueError as exc:
        text = str(exc)
        assert text.startswith(prefix) and "\n" not in text, text
        return "refused", text[len(prefix):]
    return "accepted", made


def _random_hint(rng: random.Random):
    rank = rng.choice([0, 1, 3, -2, True, 1.0, "0"])
    ratio = rng.choice([1, 1.0, 2.5, 0.99, 1e308, float("inf"), -3, False, "2"])
    return rng.choice([(rank, ratio), [rank, ratio], (rank,), (rank, ratio, ratio)])


@pytest.mark.parametrize("hint", HINTS + [_random_hint(random.Random(seed)) for seed in range(40)], ids=repr)
def test_a_speed_hint_is_judged_alike(hint):
    ours = _outcome(lambda: DdpConfig(speed_hint=hint).speed_hint, "DdpConfig.")
    theirs = _outcome(lambda: ElCheArguments(speed_hint=hint).speed_hint, "ElCheArguments.")
    assert ours == theirs, (ours, theirs)


@pytest.mark.parametrize("sizes", SIZES, ids=repr)
def test_a_pinned_split_is_judged_alike(sizes):
    ours = _outcome(lambda: DdpConfig(batch_sizes=sizes).batch_sizes, "DdpConfig.")
    theirs = _outcome(lambda: ElCheArguments(batch_sizes=sizes).batch_sizes, "ElCheArguments.")
    assert ours == theirs, (ours, theirs)
