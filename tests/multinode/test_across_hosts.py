"""hierarchical and ring across emulated hosts: run inside the cluster by tests/multinode/run.sh.

A compact subset of the correctness matrix (test_allreduce.py): dtypes, ops and sizes
(odd ones included), in and out of place, each result compared with the closed form and
with MPI.Allreduce and bitwise identical on every rank; the topology hpcring finds must
be the one the cluster was brought up with (HPCRING_CLUSTER_HOSTS x HPCRING_CLUSTER_PER_HOST).
Outside the cluster these tests skip: they need ranks on several hosts.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import everywhere, identical_everywhere
from mpi4py import MPI
from test_allreduce import check_sizes

import hpcring
from hpcring import topology
from hpcring.algorithms import bytes_sent
from hpcring.arrays import adapter_for
from hpcring.comm import channel_for

HOSTS = int(os.environ.get("HPCRING_CLUSTER_HOSTS", "0"))
PER_HOST = int(os.environ.get("HPCRING_CLUSTER_PER_HOST", "0"))
BLOCKS = os.environ.get("HPCRING_CLUSTER_MAP", "slot") == "slot"  # ranks placed host by host

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not HOSTS, reason="runs inside the emulated cluster: bash tests/multinode/run.sh"),
]
WORLD = MPI.COMM_WORLD


def _topology() -> topology.Topology:
    return topology.of(channel_for(WORLD, adapter_for(np.empty(0))).comm)


def test_topology_is_the_cluster() -> None:
    topo = _topology()
    names = WORLD.allgather(MPI.Get_processor_name())
    assert everywhere(WORLD, topo.per_node == (PER_HOST,) * HOSTS), topo.describe()
    assert everywhere(WORLD, topo.two_level and topo.cross is not None)
    assert everywhere(WORLD, len(set(names)) == HOSTS)
    same_node = [r for r in range(WORLD.size) if names[r] == names[WORLD.rank]]
    assert everywhere(WORLD, sorted(same_node) == sorted(r for r in topo.order if r in same_node))
    # The flat ring visits the ranks of one host one after another: it crosses hosts H times.
    host_of = [names[r] for r in topo.order]
    assert everywhere(WORLD, sum(host_of[i] != host_of[i - 1] for i in range(len(host_of))) == HOSTS)
    assert everywhere(WORLD, (topo.ring is None) == BLOCKS)


CASES = [
    ("float32", "sum"),
    ("float64", "mean"),
    ("int32", "max"),
    ("int64", "prod"),
    ("complex64", "sum"),
    ("float16", "min"),
]


@pytest.mark.parametrize("algorithm", ["hierarchical", "ring"])
@pytest.mark.parametrize(("dtype", "op"), CASES, ids=[f"{d}-{o}" for d, o in CASES])
def test_matrix_across_hosts(algorithm: str, dtype: str, op: str) -> None:
    check_sizes(WORLD, algorithm, np.dtype(dtype), op)


@pytest.mark.parametrize("algorithm", ["hierarchical", "ring"])
def test_rounding_floats_identical_on_every_host(algorithm: str) -> None:
    x = np.random.default_rng(WORLD.rank).standard_normal(100_003).astype(np.float32) * 1e3
    exact = WORLD.allreduce(x.astype(np.float64))
    hpcring.allreduce(x, algorithm=algorithm)
    assert everywhere(WORLD, identical_everywhere(WORLD, x))
    assert everywhere(WORLD, np.allclose(x, exact, rtol=1e-4, atol=1e-2))


@pytest.mark.parametrize("algorithm", ["hierarchical", "ring"])
@pytest.mark.parametrize("n", [5, 1001, 1 << 20])
def test_bytes_sent_formula_matches_the_count(algorithm: str, n: int) -> None:
    """The formula at this rank's place in the node order, whatever the placement; the 4 MiB
    case also puts a few MB through every host's shaped link (run.sh checks tc)."""
    ch = channel_for(WORLD, adapter_for(np.empty(0, np.float32)))
    x = np.ones(n, np.float32)
    before = ch.bytes_sent
    hpcring.allreduce(x, algorithm=algorithm)
    place = topology.of(ch.comm).order.index(WORLD.rank)
    want = bytes_sent(algorithm, n, 4, WORLD.size, place, per_node=PER_HOST)
    assert everywhere(WORLD, ch.bytes_sent - before == want), (ch.bytes_sent - before, want)
    assert everywhere(WORLD, np.all(x == WORLD.size))


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("algorithm", ["hierarchical", "ring"])
def test_wire_bfloat16_across_hosts(algorithm: str, in_place: bool) -> None:
    """wire="bfloat16": identical on every host, within the stated bound of the float64 sum, and
    half the bytes of float32 across hosts by the formula (the Channel counts what travels;
    hierarchical sends float32 inside a host)."""
    from hpcring import wire

    ch = channel_for(WORLD, adapter_for(np.empty(0, np.float32)))
    place = topology.of(ch.comm).order.index(WORLD.rank)
    for n in (7, 100_003):
        x = np.random.default_rng(WORLD.rank).standard_normal(n).astype(np.float32)
        kept = x.copy()
        exact, magnitude = np.empty(n), np.empty(n)
        WORLD.Allreduce(x.astype(np.float64), exact)
        WORLD.Allreduce(np.abs(x).astype(np.float64), magnitude)
        before = ch.bytes_sent
        out = hpcring.allreduce(
            x, algorithm=algorithm, wire="bfloat16", out=None if in_place else np.empty_like(x)
        )
        sent = ch.bytes_sent - before
        assert everywhere(WORLD, in_place or np.array_equal(x, kept))
        assert everywhere(WORLD, identical_everywhere(WORLD, out))
        bound = wire.error_bound(algorithm, WORLD.size, "bfloat16", 2.0**-24, per_node=PER_HOST)
        assert everywhere(WORLD, bool((np.abs(out - exact) <= bound * magnitude).all()))
        want = wire.bytes_sent(algorithm, n, 4, wire.WIRES["bfloat16"], WORLD.size, place, per_node=PER_HOST)
        assert everywhere(WORLD, sent == want), (sent, want)
