"""The ledger of which batches an average holds (``flodl_hf.builder.ledger``), driven with plain numbers against a
brute-force reference: seeded random message orders on both backends, late snapshots and a dead worker."""

from __future__ import annotations

import random

import pytest

from flodl_hf.builder.ledger import Ledger


def test_collective_rounds_hold_what_was_reported_before_each_ranks_round_message():
    led = Ledger(2)
    led.reported(0, (0, 0))
    led.reported(1, (0, 1))
    led.round_message(0, 0)
    led.reported(0, (1, 0))  # after rank 0's round-0 message: round 1's
    assert not led.holds_epoch(0, 0)  # rank 1's round-0 message has not arrived
    led.round_message(1, 0)
    led.close_collective(0)
    assert led.holds_epoch(0, 0) and led.ahead(0, 0) == []
    led.round_message(0, 1)
    led.round_message(1, 1)
    led.close_collective(1)
    assert led.holds_epoch(0, 1) and led.ahead(0, 1) == [[1, 0]] and led.ahead(0, 0) == []


@pytest.mark.parametrize("seed", range(60))
def test_random_cpu_rounds_match_a_brute_force_reference(seed):
    """Each rank reports batches and snapshots; round k closes with a random subset of its snapshots (the others,
    and snapshots that arrive after their round closed, are in no average); a rank may die. The reference keeps,
    per batch, the round whose average holds it (None: none will), and answers both questions at random moments
    for random closed rounds by scanning everything."""
    rng = random.Random(seed)
    world, per_epoch = rng.randint(2, 4), rng.randint(3, 8)
    led = Ledger(world)
    queue = [(e, b) for e in range(3) for b in range(per_epoch)]
    since: dict[int, list] = {r: [] for r in range(world)}
    snaps: dict[tuple[int, int], list] = {}
    held_in: dict[tuple[int, int], int | None] = {}
    k, dead = 0, set()  # k: the open round
    while queue or any(since.values()) or snaps:
        live = [r for r in range(world) if r not in dead]
        action = rng.random()
        if queue and action < 0.55:
            r = rng.choice(live)
            item = queue.pop(0)
            led.reported(r, item)
            since[r].append(item)
        elif action < 0.75:
            r = rng.choice(live)
            label = k - 1 if k and rng.random() < 0.2 else k  # a snapshot of a round that already closed: late
            if (r, label) in snaps:  # a worker snapshots once per round
                continue
            led.snapshot(r, label)
            snaps[(r, label)], since[r] = since[r], []
        elif action < 0.95 or len(live) == 1:
            part = [r for (r, kk) in snaps if kk == k and rng.random() < 0.8]
            led.close_snapshots(k, part)
            for (r, kk), items in list(snaps.items()):
                for item in items:
                    held_in[item] = k if (kk == k and r in part) else None
                del snaps[(r, kk)]
            k += 1
        else:
            r = rng.choice(live)
            dead.add(r)
            led.drop(r)
            for item in since[r]:
                held_in[item] = None
            since[r] = []
        pending = [i for v in [*since.values(), *snaps.values()] for i in v]  # in no closed round yet
        at = rng.randint(-1, k - 1)  # any closed round (or none)
        for epoch in range(3):
            expect = (not any(e <= epoch for e, _ in pending)
                      and all(rnd is None or rnd <= at for (e, _), rnd in held_in.items() if e <= epoch))
            assert led.holds_epoch(epoch, at) == expect, (seed, epoch, at)
            want = sorted([e, b] for (e, b), rnd in held_in.items() if rnd is not None and rnd <= at and e > epoch)
            assert led.ahead(epoch, at) == want, (seed, epoch, at)
