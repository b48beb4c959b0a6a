"""Fixtures every test file gets: hpcring's config snapshot kept in step with the environment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from hpcring import config
from hpcring.arrays import available

# A test that hangs ends the run with every thread's stack (in place of pytest-timeout: why there)
pytest_plugins = ("hangs",)

# tests/run.sh --full (as helpers.FULL, which tests import: importing helpers here would start MPI)
FULL = os.environ.get("HPCRING_TEST_FULL") == "1"


ONE_COUNT = 2  # where a test marked one_count runs (more than one rank: a real collective)
# Where a test marked waits_out runs: two ranks agree in one exchange, three fold a rank into a
# two-rank exchange (an odd count, and a step more); at 4 the stall path is the same, a second more.
WAIT_OUT_COUNTS = (1, 2, 3)


def _world_size(config: pytest.Config) -> int | None:
    """The rank count under ``--with-mpi`` (pytest-mpi's), else None: a serial run starts no MPI."""
    if not config.getoption("with_mpi", False):
        return None
    from mpi4py import MPI

    return MPI.COMM_WORLD.size


def pytest_configure(config: pytest.Config) -> None:
    """Under mpiexec every rank runs the same tests: rank 0 alone lists the slowest."""
    if _world_size(config) is not None:
        from mpi4py import MPI

        if MPI.COMM_WORLD.rank:
            config.option.durations = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Cases marked ``full`` (soaks, many examples, large sizes) run only in the full run; MPI
    tests marked ``one_count`` run at ONE_COUNT ranks only, and those marked ``waits_out`` (they
    wait out a timeout) at WAIT_OUT_COUNTS, except in the full run."""
    if "cupy" not in available():
        _deselect_gpu_cases(config, items)
    if FULL:
        return
    skip = pytest.mark.skip(reason="a long case: tests/run.sh --full runs it")
    size = _world_size(config)
    elsewhere = pytest.mark.skip(reason=f"the same at any rank count: runs at {ONE_COUNT} (--full: all)")
    most = max(WAIT_OUT_COUNTS)
    fewer = pytest.mark.skip(reason=f"waits out a timeout: runs at up to {most} ranks (--full: all)")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)
        elif size is not None and size != ONE_COUNT and "one_count" in item.keywords:
            item.add_marker(elsewhere)
        elif size is not None and size not in WAIT_OUT_COUNTS and "waits_out" in item.keywords:
            item.add_marker(fewer)


def _deselect_gpu_cases(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without CuPy and a GPU, the cases marked ``gpu`` are left out rather than skipped one by
    one: the correctness matrix has a thousand, and each skip costs a test's setup on every rank.
    The header says how many and why; where a GPU is, they run."""
    gpu = [item for item in items if "gpu" in item.keywords]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if "gpu" not in item.keywords]
        config.stash[_GPU_LEFT_OUT] = len(gpu)


_GPU_LEFT_OUT = pytest.StashKey[int]()


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    left_out = config.stash.get(_GPU_LEFT_OUT, 0)
    return f"{left_out} GPU cases deselected: they need CuPy and a GPU" if left_out else None


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


@pytest.fixture
def full_path(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Grows by one for each call that takes the engine's full path (`hpcring.engine.first`), not a
    warm one: a test of the warm path counts them."""
    from hpcring import engine

    calls: list[int] = []
    real = engine.first
    monkeypatch.setattr(engine, "first", lambda *args: calls.append(1) or real(*args))
    return calls


@pytest.fixture
def python_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Grows by one for each call the engine's Python `Call` runs (full path or warm): a call the
    compiled core serves whole never enters it."""
    from hpcring import engine

    calls: list[int] = []
    real = engine.Call.__call__

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.Call, "__call__", counted)
    return calls
