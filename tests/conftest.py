"""Fixtures every test file gets: hpcring's config snapshot kept in step with the environment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from hpcring import config

# tests/run.sh --full (as helpers.FULL, which tests import: importing helpers here would start MPI)
FULL = os.environ.get("HPCRING_TEST_FULL") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Cases marked ``full`` (soaks, many examples, large sizes) run only in the full run."""
    if FULL:
        return
    skip = pytest.mark.skip(reason="a long case: tests/run.sh --full runs it")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _config_follows_environment() -> Iterator[None]:
    """Each test starts and ends with `config.current()` read from the environment as it is.

    A test that sets an HPCRING_* variable calls `config.reload()` after it; this fixture,
    set up before and torn down after ``monkeypatch``, re-reads the restored environment so
    the value does not leak into later tests.
    """
    config.reload()
    yield
    config.reload()


@pytest.fixture
def fresh_world() -> Iterator[Any]:
    """A duplicate of COMM_WORLD no hpcring call has used yet (collective), freed afterwards.

    A communicator keeps the config in force at its first use (`Channel.config`), so a test
    that runs an algorithm under changed variables runs it on this one, after `config.reload()`.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD.Dup()
    yield comm
    comm.Free()


@pytest.fixture
def routed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """For the drop-in communicator's tests: the ops of the calls hpcring took
    (`hpcring.wrap.route`'s choice; the rest went to MPI)."""
    from hpcring import wrap  # here: importing it loads MPI, which most serial tests do not want

    calls: list[str] = []
    real = wrap.route

    def spy(sendbuf: Any, recvbuf: Any, op: Any) -> Any:
        taken = real(sendbuf, recvbuf, op)
        if taken is not None:
            calls.append(taken[2])
        return taken

    monkeypatch.setattr(wrap, "route", spy)
    yield calls
