"""Property-based tests: random shapes, dtypes, ops, algorithms and communicators against MPI.Allreduce.

Hypothesis runs derandomized, so every rank draws the same examples in the same order;
every verdict (including an unexpected exception) is agreed across ranks before it is
asserted, so all ranks fail, shrink and stop together and none is left waiting.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import everywhere, identical_everywhere
from mpi4py import MPI

import hpcring
from hpcring.ops import BFLOAT16, DTYPES, OPS, kind

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
COMMS = {
    "world": WORLD,
    "self": MPI.COMM_SELF,
    "split": WORLD.Split(WORLD.rank % 2, WORLD.rank),  # interleaved halves: not rank-contiguous
    "reversed": WORLD.Split(0, WORLD.size - WORLD.rank),  # the same ranks, in reverse order
}

cases = st.fixed_dictionaries(
    {
        "shape": st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple)
        | st.integers(0, 5000).map(lambda n: (n,)),
        "dtype": st.sampled_from([d.name for d in DTYPES]),
        "op": st.sampled_from(list(OPS)),
        "algorithm": st.sampled_from(list(hpcring.ALGORITHMS)),
        "comm": st.sampled_from(list(COMMS)),
        "in_place": st.booleans(),
        "seed": st.integers(0, 2**31 - 1),
    }
)


def local_input(case: dict, rank: int) -> np.ndarray:
    """Small integers (so any order of reduction is exact), different on every rank."""
    rng = np.random.default_rng([case["seed"], rank])
    dtype = np.dtype(case["dtype"])
    low, high = (1, 3) if case["op"] == "prod" else (-20, 21)
    values = rng.integers(low, high, size=case["shape"])
    if dtype.kind == "c":
        values = values + 1j * rng.integers(low, high, size=case["shape"])
    return np.asarray(values).astype(dtype)


@settings(derandomize=True, database=None, deadline=None, max_examples=60, print_blob=False)
@given(case=cases)
def test_matches_mpi_allreduce(case: dict) -> None:
    comm = COMMS[case["comm"]]
    dtype = np.dtype(case["dtype"])
    x = local_input(case, comm.rank)
    original = x.copy()
    reference = np.empty_like(x)
    if kind(dtype) not in OPS[case["op"]].kinds:
        verdict = "refused"
        try:
            hpcring.allreduce(x, op=case["op"], algorithm=case["algorithm"], comm=comm)
        except TypeError:
            verdict = "ok"
        assert everywhere(WORLD, verdict == "ok" and np.array_equal(x, original)), case
        return
    if dtype == BFLOAT16:  # MPI has no bfloat16: reduce in float32 (exact for these integers), round
        wide = np.empty(x.shape, dtype=np.float32)
        comm.Allreduce(x.astype(np.float32), wide, OPS[case["op"]].mpi_op())
        reference[...] = wide
    else:
        comm.Allreduce(x, reference, OPS[case["op"]].mpi_op())
    if case["op"] == "mean":
        np.true_divide(reference, comm.size, out=reference)
    out = None if case["in_place"] else np.empty_like(x)
    result = np.empty(0)
    try:
        result = hpcring.allreduce(x, op=case["op"], algorithm=case["algorithm"], comm=comm, out=out)
        ok = np.array_equal(result, reference) and (case["in_place"] or np.array_equal(x, original))
    except Exception:  # agreed below, so one rank's surprise cannot strand the others
        ok = False
    same = identical_everywhere(comm, result)
    assert everywhere(WORLD, ok and same), case
