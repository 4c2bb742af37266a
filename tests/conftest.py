"""Shared pytest fixtures (fixtures only: builders live in tiny_models.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator

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
