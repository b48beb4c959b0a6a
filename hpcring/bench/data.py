"""What the bench measures and what must come out: the sizes, verifiable inputs, exact results, bytes.

With ``-c 1`` (the default) inputs are small integers whose reduction is exact in every
dtype and summation order, so every element can be compared exactly; what is gathered or
broadcast is a row of small integers that differs from rank to rank, so a row in the wrong
place or from the wrong root is seen. Nothing here talks to MPI: each rank computes the same
expectations alone.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import algorithms
from ..ops import is_bfloat16


def expected_bytes_sent(
    algorithm: str,
    nbytes: int,
    size: int,
    rank: int,
    itemsize: int = 1,
    per_node: int = 1,
    *,
    collective: str = algorithms.ALLREDUCE,
    root: int | None = None,
) -> int | None:
    """Bytes rank ``rank`` of ``size`` should hand to MPI for one ``collective`` whose input is
    ``nbytes`` on each rank (an all-gather's: one rank's row; a broadcast's: from ``root``).

    Each algorithm module states its own formula (`hpcring.algorithms.bytes_sent`): naive
    (G-1)·N; ps (G-1)·N at the root (its Bcast), N elsewhere (its Gather row); ring
    2(G-1)/G·N, exactly from the segment bounds, so when G does not divide the count a
    rank sends up to a couple of elements more or less; rabenseifner 2(G-1)/G·N plus the
    fold; hierarchical a ring of ``per_node`` ranks plus a ring across nodes on one shard;
    mpi None, MPI's own traffic is not visible. The other collectives' formulas are their
    modules' too (the ring's reduce-scatter (G-1)/G·N, its all-gather (G-1)·n of an n-element
    row, its broadcast n on every rank but the chain's tail, ...).
    """
    count = nbytes // itemsize
    return algorithms.bytes_sent(
        algorithm, count, itemsize, size, rank, per_node, collective=collective, root=root
    )


def sweep(minbytes: int, maxbytes: int, stepfactor: float, itemsize: int) -> list[int]:
    """Message sizes in bytes, minbytes * stepfactor**k up to maxbytes, whole elements, no repeats.

    ``itemsize`` is the granule sizes are rounded down to: an element's bytes, or, for an
    all-gather, G elements' (nccl-tests' size is then the gathered output).

    maxbytes itself is always the last size (``-b 1K -e 1M -f 8`` ends at 1M, not at 512K):
    what a user names as the largest message is measured.
    """
    sizes: list[int] = []
    nbytes = float(minbytes)
    while nbytes <= maxbytes * (1 + 1e-12):
        rounded = int(nbytes) // itemsize * itemsize
        if rounded > 0 and (not sizes or rounded > sizes[-1]):
            sizes.append(rounded)
        nbytes = nbytes * stepfactor if nbytes > 0 else 1.0
    last = maxbytes // itemsize * itemsize
    if sizes and last > sizes[-1]:
        sizes.append(last)
    return sizes


# ---------------------------------------------------------------------------------------
# Verifiable data: small integers from (rank, index), periodic in the index.

PERIOD = 60  # lcm of the residues used below, so a table of PERIOD values describes every index
BFLOAT16_RANKS = 128  # ranks whose +-2 a bfloat16 sum can take in any order and stay exact


def _value(op: str, dtype: np.dtype, rank: int, index: int) -> complex:
    """Rank ``rank``'s input at ``index``: integers small enough that any summation order is exact.

    Sums stay within +-2G (exact in float16 up to G = 1024), products are +-1 or +-2.
    bfloat16 holds integers exactly only to 256: ranks from BFLOAT16_RANKS on give zeros.
    """
    if op == "prod":
        value = -1 if (rank + index) % 3 == 0 else 1
        return value * (2 if rank == 0 and index % 4 == 1 else 1)
    if is_bfloat16(dtype) and rank >= BFLOAT16_RANKS:
        return 0
    value = (rank + index) % 5 - 2
    if dtype.kind == "c":
        return complex(value, (2 * rank + index) % 3 - 1)
    return value


def _reduce_exact(op: str, values: list[complex]) -> complex:
    if op in ("sum", "mean"):
        return sum(values)
    if op == "prod":
        return math.prod(values)
    real = [v.real for v in values]  # max/min never see complex (refused by the op)
    return max(real) if op == "max" else min(real)


def verifiable_input(xp: Any, count: int, dtype: np.dtype, op: str, rank: int) -> Any:
    """Rank ``rank``'s input of ``count`` elements, on the array module ``xp``."""
    period = np.array([_value(op, dtype, rank, i) for i in range(PERIOD)]).astype(dtype)
    return xp.asarray(np.resize(period, count))


def expected_result(xp: Any, count: int, dtype: np.dtype, op: str, size: int) -> Any:
    """The exact reduction over ``size`` ranks, rounded once to ``dtype`` (mean: divided as the API does)."""
    exact = [_reduce_exact(op, [_value(op, dtype, r, i) for r in range(size)]) for i in range(PERIOD)]
    if dtype.kind != "c":
        exact = [v.real for v in exact]
    period = xp.asarray(np.array(exact).astype(dtype))
    if op == "mean" and size > 1:
        xp.true_divide(period, size, out=period)  # the very operation hpcring.allreduce does
    return period[xp.arange(count) % PERIOD]


# What is gathered or broadcast: no reduction, so any value the dtype holds exactly will do;
# rank r's row is row 0 shifted by 7r (mod ROW_PERIOD, a prime), so rows differ for fewer
# than ROW_PERIOD ranks and a row out of place is seen. |value| <= 125: exact even in bfloat16.
ROW_PERIOD = 251


def row_input(xp: Any, count: int, dtype: np.dtype, rank: int) -> Any:
    """Rank ``rank``'s row of ``count`` elements, on the array module ``xp``."""
    index = (np.arange(ROW_PERIOD) + 7 * rank) % ROW_PERIOD - ROW_PERIOD // 2
    values = index + 1j * (index % 3 - 1) if np.dtype(dtype).kind == "c" else index
    return xp.asarray(np.resize(values.astype(dtype), count))


def gathered_rows(xp: Any, count: int, dtype: np.dtype, size: int) -> Any:
    """Every rank's row in rank order: what an all-gather over ``size`` ranks gives, shape (G, count)."""
    return xp.stack([row_input(xp, count, dtype, r) for r in range(size)])
