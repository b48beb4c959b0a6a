"""Each must-agree HPCRING_* variable set differently on one rank: ValueError on every rank,
naming the variable, its values and the ranks, before any data moves."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import everywhere
from mpi4py import MPI

import hpcring
from hpcring import config

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD

# A value other than the default for every variable config.py marks must-agree.
OTHER = {
    "HPCRING_CHUNK_BYTES": ("4096", "4096"),
    "HPCRING_STAGING_CHUNK_BYTES": ("65536", "65536"),
    "HPCRING_RANKS_PER_NODE": ("1", "1"),
    "HPCRING_EXCHANGE_RANKS": ("1", "1"),  # checked at the first call: it picks the agreement's road
    "HPCRING_HIERARCHICAL_INTER": ("rabenseifner", "rabenseifner"),
    "HPCRING_SHARED_MEMORY": ("0", "False"),
    "HPCRING_CUDA_AWARE": ("0", "False"),
    "HPCRING_TRACE": ("{tmp}/trace.json", "set"),
}


def test_every_must_agree_variable_is_covered() -> None:
    assert set(OTHER) == {v.name for v in config.VARIABLES if v.must_agree}


@pytest.mark.parametrize("name", sorted(OTHER))
def test_variable_differs_on_one_rank(name: str, monkeypatch, tmp_path) -> None:
    if WORLD.size == 1:
        pytest.skip("needs two ranks to disagree")
    odd = WORLD.size - 1
    value, shown = OTHER[name]
    if WORLD.rank == odd:
        monkeypatch.setenv(name, value.format(tmp=tmp_path))
    else:
        monkeypatch.delenv(name, raising=False)
    config.reload()  # a fresh communicator takes this snapshot at its first use
    comm = WORLD.Dup()
    try:
        x = np.arange(8, dtype=np.float64)
        try:
            hpcring.allreduce(x, comm=comm, algorithm="ring", timeout=10)
            message = ""
        except ValueError as error:
            message = str(error)
        ok = "disagree on settings" in message and name in message
        ok &= f"on rank {odd}" in message and shown in message
        ok &= bool((x == np.arange(8)).all())  # nothing moved
        assert everywhere(WORLD, ok), message
    finally:
        monkeypatch.undo()
        config.reload()
        comm.Free()


@pytest.mark.parametrize("where", ["one rank", "every rank"])
def test_a_bad_exchange_limit_raises_on_every_rank(where: str, monkeypatch) -> None:
    """HPCRING_EXCHANGE_RANKS out of range on one rank or on all: ValueError on every rank at the
    first call (never a stall), naming the variable; the value itself where every rank has it."""
    name = "HPCRING_EXCHANGE_RANKS"
    odd = WORLD.size - 1
    if where == "every rank" or WORLD.rank == odd:
        monkeypatch.setenv(name, "5")
    else:
        monkeypatch.delenv(name, raising=False)
    config.reload()
    comm = WORLD.Dup()
    try:
        x = np.arange(8, dtype=np.float64)
        try:
            hpcring.allreduce(x, comm=comm, timeout=10)
            message = ""
        except ValueError as error:
            message = str(error)
        if where == "every rank" or WORLD.size == 1:
            ok = message == f"{name} must be an integer from 1 to 4, got '5'"
        else:
            ok = "disagree on settings" in message and name in message
            ok &= f"not an integer from 1 to 4 on rank {odd}" in message
        ok &= bool((x == np.arange(8)).all())
        assert everywhere(WORLD, ok), message
    finally:
        monkeypatch.undo()
        config.reload()
        comm.Free()


def test_the_exchange_limit_picks_the_agreements_road(monkeypatch) -> None:
    """HPCRING_EXCHANGE_RANKS=1 sends every communicator's agreement through the collective, the
    default exchanges messages on 2 to 4 ranks: either way the checked call (Python's and the
    compiled warm call) gives MPI's sum."""
    from hpcring import engine

    for limit in (1, 4):
        monkeypatch.setenv("HPCRING_EXCHANGE_RANKS", str(limit))
        config.reload()
        comm = WORLD.Dup()
        try:
            x = np.arange(8, dtype=np.float64) + WORLD.rank
            want = np.empty_like(x)
            WORLD.Allreduce(x, want)
            for _ in range(3):  # the first call, then warm ones
                got = hpcring.allreduce(x, comm=comm, algorithm="mpi", out=np.empty_like(x))
                assert everywhere(WORLD, bool((got == want).all()))
            state = engine.known_state(comm)
            assert state.exchange_ranks == limit
            assert state.agreement.exchanging == (2 <= WORLD.size <= limit)
        finally:
            monkeypatch.undo()
            config.reload()
            comm.Free()
