"""Plans: one per (channel, dtype, count, algorithm, in place), bounded; warm calls allocate nothing large."""

from __future__ import annotations

import gc
import tracemalloc
import weakref

import numpy as np
import pytest
from helpers import everywhere
from mpi4py import MPI

import hpcring
from hpcring import config
from hpcring.arrays import adapter_for
from hpcring.channel import Channel
from hpcring.comm import channel_for

WORLD = MPI.COMM_WORLD


def test_plan_cache_is_bounded_lru() -> None:
    ch = Channel(MPI.COMM_SELF, adapter_for(np.empty(0)))
    built = []
    for key in range(Channel.SCHEDULES):
        ch.schedule((key,), lambda key=key: built.append(key) or key)
    assert ch.schedule((0,), lambda: built.append("again")) == 0  # a hit; 0 is now the most recent
    ch.schedule(("new",), lambda: "new")  # evicts the least recently used: key 1
    assert len(ch._schedules) == Channel.SCHEDULES and (1,) not in ch._schedules and (0,) in ch._schedules
    assert built == list(range(Channel.SCHEDULES))


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm,chunk_bytes", [("ring", ""), ("ring", "16384"), ("rabenseifner", "")])
@pytest.mark.parametrize("in_place", [True, False])
def test_warm_call_allocates_nothing_large(
    monkeypatch: pytest.MonkeyPatch,
    fresh_world: MPI.Intracomm,
    algorithm: str,
    chunk_bytes: str,
    in_place: bool,
) -> None:
    """tracemalloc sees NumPy's buffers: a warm call's peak stays far below the 1 MiB payload.

    16 KiB chunks make the ring take its pipelined path (16 chunks per segment at 4 ranks).
    """
    monkeypatch.setenv("HPCRING_CHUNK_BYTES", chunk_bytes)
    config.reload()
    x = np.ones(1 << 18, dtype=np.float32)
    out = None if in_place else np.empty_like(x)
    for _ in range(2):  # cold: builds the plan and the scratch
        hpcring.allreduce(x, algorithm=algorithm, out=out, op="max", comm=fresh_world)
    tracemalloc.start()
    hpcring.allreduce(x, algorithm=algorithm, out=out, op="max", comm=fresh_world)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert everywhere(WORLD, peak < 64 << 10), f"warm call peaked at {peak} bytes"


@pytest.mark.mpi
@pytest.mark.parametrize("calls", [1, 4])
def test_plans_go_with_the_communicator(calls: int) -> None:
    """The Channel (and its plans and scratch) lives in the communicator's attribute: Free drops it,
    also once the compiled core runs its calls (4 calls: a program from the second, a warm call in
    C from the third), whose C objects and the channel or the engine's call hold each other."""
    comm = WORLD.Dup()
    x = np.ones(1000)
    for _ in range(calls):
        hpcring.allreduce(x, comm=comm, algorithm="ring")
    channel = weakref.ref(channel_for(comm, adapter_for(x)))
    built = channel() is not None and len(channel()._schedules) == (WORLD.size > 1)
    comm.Free()
    gc.collect()
    assert everywhere(WORLD, built and channel() is None)
