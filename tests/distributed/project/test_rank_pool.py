"""The rank pool keeps its word: ranks persist across tests, a test's failure stays its own, and a test that leaves
state behind fails and never reaches the next test. The reference is a fresh interpreter (``spawn_ranks``)."""

from __future__ import annotations

import os
import time

import pytest
import torch

from dist_helpers import spawn_ranks, values
from rank_pool import RankPool


@pytest.fixture(scope="module")
def pool():
    ranks = RankPool(2)  # the module's own pool: its tests kill and rebuild it on purpose
    yield ranks
    ranks.close()


def _sum_of_ranks(rank: int, world: int, extra: int) -> dict:
    import torch.distributed as dist

    dist.init_process_group("gloo")  # the launcher environment the pool set, as under torchrun
    t = torch.tensor([float(rank + extra)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return {"pid": os.getpid(), "sum": float(t), "rank": int(os.environ["RANK"]), "world": world}


def test_ranks_persist_and_each_test_gets_a_fresh_group(pool):
    first = values(pool.run(_sum_of_ranks, 10))
    starts = pool.starts
    second = values(pool.run(_sum_of_ranks, 20))
    assert [o["sum"] for o in first] == [21.0, 21.0] and [o["sum"] for o in second] == [41.0, 41.0]
    assert [o["rank"] for o in first] == [0, 1] and {o["world"] for o in first} == {2}
    assert [o["pid"] for o in first] == [o["pid"] for o in second] == pool.pids and pool.starts == starts


def _unseeded_draw(rank: int, world: int) -> tuple[int, list[float]]:
    return torch.initial_seed(), torch.rand(3).tolist()


def test_the_default_generator_is_seeded_anew_as_in_a_fresh_interpreter(pool):
    fresh = values(spawn_ranks(_unseeded_draw, 2))
    first, second = values(pool.run(_unseeded_draw)), values(pool.run(_unseeded_draw))
    seeds = {draw[0] for draw in fresh + first + second}
    assert len(seeds) == 6, seeds  # every rank of every test its own seed, as every fresh interpreter
    assert torch.rand(3, generator=torch.Generator().manual_seed(first[0][0])).tolist() == first[0][1]


def _raise_on_rank_1(rank: int, world: int) -> str:
    if rank == 1:
        raise ValueError("boom on rank 1")
    return "done"


def test_an_exception_comes_back_as_its_traceback_and_the_ranks_stay(pool):
    values(pool.run(_sum_of_ranks, 0))
    pids, starts = pool.pids, pool.starts
    results = pool.run(_raise_on_rank_1)
    assert results[0] == ("ok", "done")
    assert results[1][0] == "error" and "ValueError: boom on rank 1" in results[1][1]
    assert "Traceback" in results[1][1] and "_raise_on_rank_1" in results[1][1]
    assert values(pool.run(_sum_of_ranks, 0))[0]["sum"] == 1.0 and pool.pids == pids and pool.starts == starts


LEAKS = {"environment": "ROGUE_SETTING", "module hook": "global module hooks", "dtype": "default dtype",
         "threads": "torch threads", "grad mode": "grad mode", "working directory": "working directory",
         "thread": "threads still running ['rogue']"}


def _leak(rank: int, world: int) -> None:
    import threading

    os.environ["ROGUE_SETTING"] = "1"
    torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(2)
    torch.set_grad_enabled(False)
    os.chdir("/")
    threading.Thread(target=time.sleep, args=(30,), daemon=True, name="rogue").start()


def _clean_view(rank: int, world: int) -> dict:
    import threading

    import torch.distributed as dist

    return {"env": "ROGUE_SETTING" in os.environ, "hooks": len(torch.nn.modules.module._global_forward_hooks),
            "dtype": torch.get_default_dtype(), "threads": torch.get_num_threads(), "grad": torch.is_grad_enabled(),
            "cwd": os.getcwd(), "group": dist.is_initialized(),
            "rogue": any(t.name == "rogue" for t in threading.enumerate())}


def test_a_test_that_leaves_state_behind_fails_and_the_next_one_starts_clean(pool):
    clean = values(pool.run(_clean_view))
    starts = pool.starts
    with pytest.raises(AssertionError, match="left state behind") as failure:
        pool.run(_leak)
    for what, named in LEAKS.items():
        assert named in str(failure.value), what
    assert values(pool.run(_clean_view)) == clean and pool.starts == starts + 1  # new ranks, as the first started


def _exit_on_rank_1(rank: int, world: int) -> str:
    if rank == 1:
        os._exit(3)
    return "done"


def test_a_rank_that_dies_fails_its_test_and_the_pool_is_rebuilt(pool):
    values(pool.run(_sum_of_ranks, 0))
    starts = pool.starts
    results = pool.run(_exit_on_rank_1)
    assert results == [("ok", "done"), ("missing", 3)]
    assert values(pool.run(_sum_of_ranks, 0))[0]["sum"] == 1.0 and pool.starts == starts + 1


def _hang_on_rank_0(rank: int, world: int) -> str:
    if rank == 0:
        time.sleep(600)
    return "done"


def test_a_rank_that_hangs_fails_its_test_within_the_bound_and_the_pool_is_rebuilt(pool):
    values(pool.run(_sum_of_ranks, 0))
    starts, start = pool.starts, time.monotonic()
    with pytest.raises(AssertionError, match=r"ranks \[0\] did not finish within 3 s \(hang\)"):
        pool.run(_hang_on_rank_0, timeout=3)
    assert time.monotonic() - start < 15
    assert values(pool.run(_sum_of_ranks, 0))[0]["sum"] == 1.0 and pool.starts == starts + 1


def _env_value(rank: int, world: int) -> str:
    return os.environ.get("POOL_TEST_SETTING", "unset")


def test_an_environment_given_to_a_test_is_its_own(pool):
    values(pool.run(_env_value))
    starts = pool.starts
    assert values(pool.run(_env_value, env={"POOL_TEST_SETTING": "on"})) == ["on", "on"]
    assert values(pool.run(_env_value)) == ["unset", "unset"] and pool.starts == starts
