"""Setup mode against a one-process reference on hundreds of random real loops (see ``exactness_harness``).

``FLODL_HF_EXACTNESS_CASES`` sets how many cases run (default 200); ``bash scripts/soak.sh`` runs 2,000.
"""

from __future__ import annotations

import os

import pytest

from dist_helpers import run_ranks, values
from exactness_harness import check_case, make_case, run_cases_on_rank

CASES = int(os.environ.get("FLODL_HF_EXACTNESS_CASES", "200"))
SEED0 = int(os.environ.get("FLODL_HF_EXACTNESS_SEED", "0"))


def _cases_by_world() -> dict[int, list[dict]]:
    by_world: dict[int, list[dict]] = {}
    for seed in range(SEED0, SEED0 + CASES):
        case = make_case(seed)
        by_world.setdefault(case["world"], []).append(case)
    return by_world


@pytest.mark.timeout(120 + 2 * CASES)  # a soak of thousands of cases outlives the suite's per-test default
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_random_loops_match_the_one_process_reference(world):
    cases = _cases_by_world().get(world, [])
    assert cases, f"no case drew world size {world}: raise FLODL_HF_EXACTNESS_CASES"
    per_rank = values(run_ranks(run_cases_on_rank, world, cases, timeout=60 + 20 * len(cases)))
    failures = []
    for i, case in enumerate(cases):
        try:
            check_case(case, [per_rank[r][i] for r in range(world)])
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0][:600])
    assert not failures, f"{len(failures)} of {len(cases)} cases differ from the reference:\n" + "\n".join(failures)
    if world > 1:  # the overlap really ran: small-bucket cases started buckets during backward, the others never
        early = [sum(per_rank[r][i]["early"] for r in range(world)) for i in range(len(cases))]
        small = [e for c, e in zip(cases, early) if c["overlap"] and c["bucket_mb"] < 1]
        assert small and sum(small) > 0, f"no bucket was launched during backward in {len(small)} overlap cases"
        assert all(e == 0 for c, e in zip(cases, early) if not c["overlap"])


def test_the_cases_cover_what_the_contract_names():
    cases = [make_case(seed) for seed in range(SEED0, SEED0 + CASES)]
    seen = lambda key: {str(c[key]) for c in cases}  # noqa: E731
    assert seen("world") == {"1", "2", "3", "4"}
    assert seen("loss") == {"samples", "masked", "weighted", "token", "sum"}
    assert seen("optimizer") == {"sgd", "momentum", "adamw"}
    assert seen("schedule") == {"None", "linear", "cosine"}
    assert seen("drop_last") == {"True", "False"} and seen("readahead") == {"0", "1", "2", "3"}
    assert {"0.0", "0.3", "0.7", "1.0"} <= seen("mask") and {"None", "0.3"} == seen("clip")
    kinds = {e[1] for c in cases for e in c["events"]}
    assert kinds == {"freeze", "anchor", "split"}
    assert {e[2] for c in cases for e in c["events"] if e[1] == "anchor"} == set(range(1, 9))
    assert any(c["frozen_at_setup"] for c in cases) and any(c["adaptive"] for c in cases)
    assert any(c["prefetch_thread"] and c["readahead"] for c in cases)
    assert seen("overlap") == {"True", "False"} and seen("bucket_mb") == {"0.0001", "0.0002", "25.0"}
    # the loops practitioners write
    assert seen("user_schedule") == {"True", "False"} and seen("bind") == {"True", "False"}
    assert any(c["skips"] for c in cases) and any(c["continue_at"] for c in cases)
    assert {kind for c in cases for _, kind in c["evals"]} == {"before", "between"}
    assert {g for c in cases for g in c["eval_at_setup"]} == {"mix", "drop", "cls"}
    assert seen("checkpointing") == {"True", "False"} and seen("dropout") == {"0.0", "0.2"}
    assert any(c["user_schedule"] and c["schedule"] for c in cases) and seen("lora") == {"True", "False"}
