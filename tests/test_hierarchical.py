"""hierarchical on one machine: the two-level path itself, with nodes forced by HPCRING_RANKS_PER_NODE.

The correctness matrix (test_allreduce.py) covers `hierarchical` on the real topology,
which on one machine is a single node: the flat fallback. Here nodes of 2 ranks are
forced, so the reduce-scatter / cross-node all-reduce / all-gather path runs at 4 ranks
(2 x 2), and 3 ranks (2 + 1, unequal) exercises the fallback. tests/multinode/ runs it
across real (emulated) hosts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
from helpers import everywhere, identical_everywhere
from mpi4py import MPI
from test_allreduce import check_sizes

import hpcring
from hpcring import config, topology
from hpcring.algorithms import bytes_sent, ring
from hpcring.arrays import adapter_for
from hpcring.arrays.numpy import NumpyAdapter
from hpcring.channel import Channel
from hpcring.comm import channel_for
from hpcring.ops import DTYPES, OPS, kind

pytestmark = pytest.mark.mpi


@pytest.fixture
def forced() -> Iterator[MPI.Intracomm]:
    """A fresh communicator whose nodes are blocks of 2 ranks (read at its first use)."""
    os.environ["HPCRING_RANKS_PER_NODE"] = "2"
    config.reload()
    comm = MPI.COMM_WORLD.Dup()
    try:
        _topology(comm)  # found here (collective), then cached with the communicator
    finally:
        del os.environ["HPCRING_RANKS_PER_NODE"]
        config.reload()
    yield comm
    comm.Free()


def _topology(comm: MPI.Intracomm) -> topology.Topology:
    return topology.of(channel_for(comm, adapter_for(np.empty(0))).comm)


def test_forced_topology_is_found(forced: MPI.Intracomm) -> None:
    topo, size = _topology(forced), forced.size
    assert everywhere(forced, topo.per_node == (2,) * (size // 2) + (1,) * (size % 2))
    assert everywhere(forced, topo.node == forced.rank // 2 and topo.local_rank == forced.rank % 2)
    assert everywhere(forced, topo.two_level == (size >= 4 and size % 2 == 0))
    assert everywhere(forced, (topo.cross is not None) == topo.two_level)


@pytest.mark.parametrize("dtype", DTYPES, ids=[d.name for d in DTYPES])
@pytest.mark.parametrize("op", list(OPS))
def test_two_level_matches_closed_form_and_mpi(forced: MPI.Intracomm, dtype: np.dtype, op: str) -> None:
    if kind(dtype) not in OPS[op].kinds:
        pytest.skip(f"{op} does not apply to {dtype}")
    check_sizes(forced, "hierarchical", dtype, op)


def test_bitwise_identical_on_rounding_floats(forced: MPI.Intracomm) -> None:
    """Inputs that round differently in every order: all ranks still get the same bits."""
    x = np.random.default_rng(forced.rank).standard_normal(100_003).astype(np.float32) * 1e3
    exact = forced.allreduce(x.astype(np.float64))
    hpcring.allreduce(x, algorithm="hierarchical", comm=forced)
    assert everywhere(forced, identical_everywhere(forced, x))
    assert everywhere(forced, np.allclose(x, exact, rtol=1e-4, atol=1e-2))


@pytest.mark.parametrize("n", [1, 5, 1001, 2**16 + 3])
def test_bytes_sent_formula_matches_the_count(forced: MPI.Intracomm, n: int) -> None:
    topo = _topology(forced)
    ch = channel_for(forced, adapter_for(np.empty(0, np.float32)))
    x = np.ones(n, np.float32)
    before = ch.bytes_sent
    hpcring.allreduce(x, algorithm="hierarchical", comm=forced)
    per_node = topo.per_node[0] if topo.two_level else 1
    want = bytes_sent("hierarchical", n, 4, forced.size, forced.rank, per_node=per_node)
    assert everywhere(forced, ch.bytes_sent - before == want), (ch.bytes_sent - before, want)


def test_warm_call_makes_no_communicator_and_free_releases_them() -> None:
    os.environ["HPCRING_RANKS_PER_NODE"] = "2"
    config.reload()
    comm = MPI.COMM_WORLD.Dup()
    try:
        _topology(comm)
    finally:
        del os.environ["HPCRING_RANKS_PER_NODE"]
        config.reload()
    x = np.ones(1000)
    hpcring.allreduce(x, algorithm="hierarchical", comm=comm)
    topo = _topology(comm)
    made = (topo.local, topo.cross)
    hpcring.allreduce(x, algorithm="hierarchical", comm=comm)
    assert everywhere(comm, _topology(comm) is topo and (topo.local, topo.cross) == made)
    comm.Free()  # frees hpcring's duplicate, whose attribute frees the sub-communicators
    assert everywhere(MPI.COMM_WORLD, topo.local is None and topo.cross is None)


def test_bad_env_is_refused() -> None:
    os.environ["HPCRING_RANKS_PER_NODE"] = "two"
    config.reload()
    try:
        with pytest.raises(ValueError, match="HPCRING_RANKS_PER_NODE"):
            topology.discover(MPI.COMM_SELF)
    finally:
        del os.environ["HPCRING_RANKS_PER_NODE"]
        config.reload()


def test_ring_across_nodes_streams_in_network_chunks(forced: MPI.Intracomm) -> None:
    """A ring that spans nodes is pipelined in NETWORK_CHUNK_BYTES pieces, with the same result."""
    ch = channel_for(forced, adapter_for(np.empty(0, np.float32)))
    n = 3 * ring.NETWORK_CHUNK_BYTES // 4 * forced.size + 5  # several chunks per segment
    x = np.random.default_rng(forced.rank).standard_normal(n).astype(np.float32)
    exact = forced.allreduce(x.astype(np.float64))
    hpcring.allreduce(x, algorithm="ring", comm=forced)
    spans = _topology(forced).nodes > 1  # 2 ranks are one node of 2
    chunk = ring.NETWORK_CHUNK_BYTES // 4 if spans else ring.UNCHUNKED
    plans = [p for key, p in ch._schedules.items() if key[0] == "ring" and key[1] == n]
    if forced.size > 1:  # one rank copies: no plan
        assert everywhere(forced, len(plans) == 1 and plans[0].chunk == chunk)
        assert everywhere(forced, plans[0].pipelined == spans)
    assert everywhere(forced, identical_everywhere(forced, x))
    assert everywhere(forced, np.allclose(x, exact, rtol=1e-4, atol=1e-3))


class _OnDevice(NumpyAdapter):
    """NumPy's adapter, as if its arrays lived on device ``device``: what a rank that switches GPUs
    (``with cupy.cuda.Device(i):``) looks like to the channels, without a GPU."""

    def __init__(self, device: int) -> None:
        self._device = device

    def current_device(self) -> int | None:
        return self._device


def test_node_channels_are_per_device(forced: MPI.Intracomm) -> None:
    """The node-local and cross-node channels are made per backend and device, as the main ones
    are: they were keyed by the backend's name only, so after a switch of GPU the second device
    reused scratch made on the first."""
    topo = _topology(forced)
    if not topo.two_level:
        pytest.skip("needs a two-level topology: 4 or more ranks, an even count")
    parent = channel_for(forced, adapter_for(np.empty(0))).comm
    first = topo.channels(Channel(parent, _OnDevice(0)))
    second = topo.channels(Channel(parent, _OnDevice(1)))
    again = topo.channels(Channel(parent, _OnDevice(0)))
    ok = again is first and second[0] is not first[0] and second[1] is not first[1]
    ok &= second[0].adapter.current_device() == 1 and first[0].adapter.current_device() == 0
    assert everywhere(forced, ok)
