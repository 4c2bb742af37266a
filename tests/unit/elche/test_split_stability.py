"""El Che's setup-mode split under real machines' timing: one slow window must not move it, a real change must.

Measured on the 2-core machine: on two equal, idle CPU ranks the same command ended with splits
[6, 2], [7, 1] and [3, 5] of 8, and with dropout each split trains another model. The cause is a window slowed by
something else (a collection, another process): the surprise-adaptive EMA took most of it, the split moved, and
where per-micro-batch costs dominate the split barely drifts back. The checks here feed El Che modelled windows
with such spikes; the speed model is the simplest one (time = fixed + per-sample cost, per rank).
"""

from __future__ import annotations

import random

from flodl_hf.elche.scheduler import ElChe


def _windows(che: ElChe, n: int, cost, rng: random.Random, spike_p: float = 0.0) -> list[list[int]]:
    splits = []
    for _ in range(n):
        sizes = che.batch_sizes()
        wall = [cost(r, b) * (1 + rng.gauss(0, 0.05)) * (3.0 if rng.random() < spike_p else 1.0)
                for r, b in enumerate(sizes)]
        che.report(wall, sizes, 1.0)
        splits.append(che.batch_sizes())
    return splits


def test_one_slow_window_does_not_move_the_split():
    che = ElChe(2, batch_size=16)
    for _ in range(5):
        che.report([160.0, 160.0], [16, 16], 1.0)
    assert che.batch_sizes() == [16, 16]
    che.report([160.0, 480.0], [16, 16], 1.0)  # rank 1 three times slower for one window only
    assert che.batch_sizes() == [16, 16]
    for _ in range(3):
        che.report([160.0, 160.0], [16, 16], 1.0)
    assert che.batch_sizes() == [16, 16]


def test_a_lasting_change_is_followed_within_three_windows():
    che = ElChe(2, batch_size=16)
    for _ in range(5):
        che.report([160.0, 160.0], [16, 16], 1.0)
    seen = []
    for _ in range(4):  # rank 1 is now half as fast, for good
        sizes = che.batch_sizes()
        che.report([10.0 * sizes[0], 20.0 * sizes[1]], sizes, 1.0)
        seen.append(che.batch_sizes())
    assert seen[2] in ([21, 11], [22, 10]), seen  # the ideal is 21.3 / 10.7


def test_spikes_do_not_make_the_split_wander():
    """Equal ranks, 5 % Gaussian timing noise and a 3x slower window 5 % of the time, 20 seeded runs of 160
    windows. Before the fix: 57 split changes per run on average and a mean distance of 1.6 samples from the equal
    split (proportional costs); 37 changes and 5.0 samples where a fixed per-micro-batch cost dominates."""
    for cost, most_moves, most_dev in ((lambda r, b: 10.0 * b, 15, 0.6), (lambda r, b: 10.0 + 0.2 * b, 12, 3.0)):
        moves = dev = 0.0
        for seed in range(20):
            rng = random.Random(seed)
            splits = _windows(ElChe(2, batch_size=16), 160, cost, rng, spike_p=0.05)
            moves += sum(a != b for a, b in zip(splits, splits[1:])) / 20
            dev += sum(abs(s[0] - 16) for s in splits) / len(splits) / 20
        assert moves < most_moves and dev < most_dev, (moves, dev)


def test_state_round_trip_keeps_the_recent_windows():
    che = ElChe(2, batch_size=16)
    rng = random.Random(0)
    _windows(che, 7, lambda r, b: 10.0 * b * (2.0 if r else 1.0), rng)
    copy = ElChe(2, batch_size=16)
    copy.load_state_dict(che.state_dict())
    rng_a, rng_b = random.Random(1), random.Random(1)
    assert _windows(che, 6, lambda r, b: 10.0 * b, rng_a, 0.3) == _windows(copy, 6, lambda r, b: 10.0 * b, rng_b, 0.3)
