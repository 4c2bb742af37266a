"""The epoch partition: same permutation everywhere, disjoint complete steps, a padded final step."""

from __future__ import annotations

import pytest

from flodl_hf.elche.partition import epoch_permutation, rank_slice, steps_per_epoch


def test_permutation_is_seeded_and_identical():
    assert epoch_permutation(50, 3).tolist() == epoch_permutation(50, 3).tolist()
    assert epoch_permutation(50, 3).tolist() != epoch_permutation(50, 4).tolist()
    assert sorted(epoch_permutation(50, 3).tolist()) == list(range(50))


def test_steps_per_epoch():
    assert steps_per_epoch(100, 32) == 3
    assert steps_per_epoch(100, 32, drop_last=False) == 4
    with pytest.raises(ValueError, match="global batch=0"):
        steps_per_epoch(10, 0)


def test_full_steps_are_disjoint_and_follow_the_sizes():
    perm = epoch_permutation(64, 0)
    sizes = [20, 9, 3]
    taken = []
    for step in range(2):
        for rank in range(3):
            idx, pad = rank_slice(perm, step, 32, sizes, rank)
            assert len(idx) == sizes[rank] and pad == 0
            taken += idx
    assert taken == perm.tolist()  # consecutive, in rank order: disjoint and complete


def test_final_partial_step_is_shared_in_proportion_and_padded():
    perm = epoch_permutation(70, 1)  # 2 full steps of 32, then 6 samples left
    parts = [rank_slice(perm, 2, 32, [20, 9, 3], r) for r in range(3)]
    real = [idx[: len(idx) - pad] for idx, pad in parts]
    assert [len(r) for r in real] == [4, 2, 0]  # 6 * [20, 9, 3] / 32 by largest remainder
    assert sorted(i for r in real for i in r) == sorted(perm[64:].tolist())
    assert parts[2] == (perm[:1].tolist(), 1)  # an empty rank still runs the step, on one padding sample


def test_sizes_must_sum_to_the_global_batch():
    with pytest.raises(ValueError, match="sum to 31, not the global batch 32"):
        rank_slice(epoch_permutation(64, 0), 0, 32, [20, 8, 3], 0)
