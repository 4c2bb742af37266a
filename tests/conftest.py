"""Shared pytest fixtures (builders live in tiny_models.py) and the suite's tiers.

The tiers are folders, by kind of test, not by measured time, each with its marker set here:
``tests/unit/`` (no process started), ``tests/distributed/`` (real gloo ranks: the rank pool, spawned ranks,
torchrun, builder workers) and ``tests/e2e/`` (the command line, the docs, the examples, the benchmarks and the
scripts as a user runs them). Inside each, one folder per package. A unit-tier test that starts a process fails,
naming the tier it belongs to (``no_process_started``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

from tiny_models import make_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory ``tiny_checkpoint(family, with_classifier=False, num_labels=2) -> Path``.

    Checkpoints are written once per session (seed 0) and shared: treat them as read-only, and copy one
    (``shutil.copytree``) before damaging it in a test.
    """
    cache: dict[tuple[str, bool, int], Path] = {}

    def get(family: str, with_classifier: bool = False, num_labels: int = 2) -> Path:
        key = (family, with_classifier, num_labels)
        if key not in cache:
            name = f"{family}-{'cls' if with_classifier else 'base'}-{num_labels}"
            cache[key] = make_checkpoint(
                family, tmp_path_factory.mktemp(name), with_classifier=with_classifier, num_labels=num_labels
            )
        return cache[key]

    return get


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Run the test with one torch intra-op thread (restored afterwards).

    Tiny models gain nothing from threads, and on a 2-core machine shared with other test processes the
    default thread pool oversubscribes the cores and runs ~3x slower. Opt in per module with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    """
    with _one_torch_thread():
        yield


@pytest.fixture(scope="module")
def single_thread_module() -> Iterator[None]:
    """One torch intra-op thread for a whole module (restored afterwards), for modules whose module-scoped
    fixtures train too. Opt in per module with ``pytestmark = pytest.mark.usefixtures("single_thread_module")``."""
    with _one_torch_thread():
        yield


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the persistent gloo ranks (``rank_pool``) and the warm interpreter (``warm_python``) with the
    session."""
    from rank_pool import close_pools
    from warm_python import close_session

    close_pools()
    close_session()


TIERS = ("unit", "distributed", "e2e")
_TESTS = Path(__file__).resolve().parent


def tier_of(path: Path) -> str:
    """The tier a test file belongs to: the first folder under ``tests/``."""
    parts = Path(path).resolve().relative_to(_TESTS).parts
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets its tier's marker (``-m unit``, ``-m distributed``, ``-m e2e``)."""
    for item in items:
        tier = tier_of(item.path)
        if tier:
            item.add_marker(getattr(pytest.mark, tier))


class ProcessStarted(AssertionError):
    """A unit-tier test started a process."""


@contextlib.contextmanager
def no_process_started(where: str) -> Iterator[None]:
    """Fail whatever starts a process (subprocess, multiprocessing, a fork or a spawn) while the block runs."""
    import _posixsubprocess
    import multiprocessing.process

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise ProcessStarted(f"{where} started a process: a unit-tier test starts none; move it to "
                             "tests/distributed/ (ranks) or tests/e2e/ (a command, a script, a fresh interpreter)")

    saved = [(_posixsubprocess, "fork_exec"), (os, "fork"), (os, "posix_spawn"), (os, "posix_spawnp"),
             (os, "system"), (multiprocessing.process.BaseProcess, "start"), (subprocess.Popen, "__init__")]
    originals = [(owner, name, getattr(owner, name)) for owner, name in saved if hasattr(owner, name)]
    for owner, name, _ in originals:
        setattr(owner, name, refuse)
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    """Unit-tier tests run, set-up and teardown included, with process starts refused."""
    if tier_of(item.path) == "unit":
        with no_process_started(item.nodeid):
            yield
    else:
        yield
