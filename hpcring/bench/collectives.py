"""What the bench knows of each collective: nccl-tests' small contract per collective.

The driver (`hpcring.bench.cli`, `hpcring.bench.measure`) is written once; a collective is
described here by what differs, as each nccl-tests collective supplies four functions (bytes
moved, init data, bandwidth factor, run):

- what a row's size counts (nccl-tests' size: the whole buffer) and each rank's input of it;
- the verifiable data each rank passes in and the result it must hold afterwards, exactly;
- the buffers of a call in place or out of place, and the hpcring front end that is timed;
- the bare library call on the same buffers, as a user of mpi4py writes it (`BareCall`);
- nccl-tests' busbw factor, which `hpcring.units` holds, by the collective's name.

Nothing here names an algorithm: the algorithms of a collective are its table in
`hpcring.algorithms`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

import hpcring  # the public names users call: hpcring.allreduce is behind the compiled front door

from .. import algorithms, collectives
from ..algorithms import ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, REDUCE_SCATTER
from ..partition import segment_bounds
from ..units import busbw_formula, collective_title
from .data import expected_result, gathered_rows, row_input, verifiable_input


@dataclass(frozen=True)
class Buffers:
    """One rank's buffers of a row: what it passes in, where hpcring's result goes, what is checked."""

    x: Any  # the input (in place: a view of ``out``, or ``out`` a view of it)
    out: Any  # hpcring's output (``x`` itself where the collective works in place)
    result: Any  # the view of the output that must equal the expected result


@dataclass(frozen=True)
class BareCall:
    """The bare library call of a row, on the buffers as MPI takes them.

    ``send`` is an array, MPI.IN_PLACE or None (a broadcast has one buffer); ``recv`` the buffer
    MPI writes; ``result`` the view of ``recv`` that holds this rank's result (MPI_IN_PLACE puts
    a reduce-scatter's part at the front); ``call(send, recv, mpi_op)`` the call itself, given the
    same buffers or their host copies or their words (`hpcring.bench.measure.bare_call`)."""

    send: Any
    recv: Any
    result: Any
    call: Callable[[Any, Any, Any], None]


class Collective:
    """One collective as the bench runs it; the subclasses say what differs (module docstring)."""

    name: str  # hpcring's name, the algorithm table's key
    bare: str  # the bare row's name: MPI's function, never a name `-a` accepts
    mpi4py: str  # how the header names the bare call
    reduces: bool = True  # takes an op (nccl-tests' redop; "none" otherwise)
    rewrites_input: bool = True  # in place, the call overwrites x: each call starts from the input again
    in_place_tables: bool = False  # auto keeps tables in place apart (`hpcring.algorithms.tuning`)
    rooted: bool = False  # has a root (what each rank sends depends on it)
    in_place_only: bool = False  # has no out-of-place form (--in-place means nothing)
    out_of_place_only: bool = False  # has no in-place form (--in-place is refused)
    size_is: str | None = None  # what a row's size counts, where more than "the buffer"
    options: tuple[str, ...] = ()  # the front end's options the bench has rows for (--wire, ...)
    uneven: bool = False  # the all-to-all's uneven form (--uneven): send_splits=, MPI_Alltoallv

    @property
    def title(self) -> str:
        """For people, in nccl-tests' spelling: "all-reduce"."""
        return collective_title(self.name)

    @property
    def busbw_formula(self) -> str:
        return busbw_formula(self.name)

    def placement(self, in_place: bool) -> str:
        """How the header describes the buffers of a row."""
        if in_place:
            return "in place, input rewritten before each call (untimed)"
        return "out-of-place (out=), input constant across iterations"

    def granule(self, itemsize: int, size: int) -> int:
        """The sizes swept are whole multiples of this many bytes."""
        return itemsize

    def count(self, nbytes: int, size: int, itemsize: int) -> int:
        """Elements of each rank's input in a row of ``nbytes``."""
        return nbytes // itemsize

    def inputs(self, xp: Any, count: int, dtype: np.dtype, op: str, rank: int, root: int) -> Any:
        """Rank ``rank``'s verifiable input of ``count`` elements."""
        return verifiable_input(xp, count, dtype, op, rank)

    def expected(self, xp: Any, count: int, dtype: np.dtype, op: str, size: int, rank: int, root: int) -> Any:
        """What rank ``rank`` must hold afterwards, exactly."""
        raise NotImplementedError

    def buffers(self, xp: Any, x: Any, in_place: bool, rank: int, size: int) -> Buffers:
        """The buffers of a call of ``x`` in place or out of place."""
        raise NotImplementedError

    def caller(
        self, b: Buffers, algorithm: str, comm: Any, op: str, check: bool, root: int, **options: Any
    ) -> Callable[[], Any]:
        """The hpcring front end's call on ``b``, made once per row (``options``: the all-reduce's
        reproducible= and wire=): every argument bound with its keyword, as a user's code names
        them, so that a timed call pays no more of the bench's Python than the bare row's does
        (a call through ``**options``, even empty, cost 0.3-0.6 us more)."""
        raise NotImplementedError

    def bare_call(self, comm: Any, b: Buffers, in_place: bool, root: int) -> BareCall:
        """The library's own collective on ``b``'s memory, nothing of hpcring between."""
        raise NotImplementedError

    def bytes_sent(self, algorithm: str, count: int, itemsize: int, size: int, rank: int) -> int | None:
        """What rank ``rank`` hands to MPI in one call, where the algorithms' formulas (which
        count from each rank's input alone) do not say it; None: theirs apply."""
        return None


class AllReduce(Collective):
    name, bare, mpi4py = ALLREDUCE, "MPI_Allreduce", "comm.Allreduce"
    in_place_tables = True
    options = ("reproducible", "wire")

    def expected(self, xp: Any, count: int, dtype: np.dtype, op: str, size: int, rank: int, root: int) -> Any:
        return expected_result(xp, count, dtype, op, size)

    def buffers(self, xp: Any, x: Any, in_place: bool, rank: int, size: int) -> Buffers:
        out = x if in_place else xp.empty_like(x)
        return Buffers(x, out, out)

    def caller(
        self, b: Buffers, algorithm: str, comm: Any, op: str, check: bool, root: int, **options: Any
    ) -> Callable[[], Any]:
        x, out = b.x, b.out
        if options:
            given = {"op": op, "algorithm": algorithm, "comm": comm, "out": out, "check": check}
            return functools.partial(hpcring.allreduce, x, **given, **options)
        return lambda: hpcring.allreduce(x, op=op, algorithm=algorithm, comm=comm, out=out, check=check)

    def bare_call(self, comm: Any, b: Buffers, in_place: bool, root: int) -> BareCall:
        send = MPI.IN_PLACE if in_place else b.x
        return BareCall(send, b.out, b.out, lambda send, recv, op: comm.Allreduce(send, recv, op))


class ReduceScatter(Collective):
    name, bare = REDUCE_SCATTER, "MPI_Reduce_scatter"
    mpi4py = (
        "comm.Reduce_scatter_block (where the parts are unequal: comm.Reduce_scatter with "
        "numpy.array_split's counts)"
    )
    size_is = "the whole buffer, each rank's input (G parts, numpy.array_split's), as nccl-tests"

    def placement(self, in_place: bool) -> str:
        if in_place:
            return "in place (out= this rank's part of x), input rewritten before each call (untimed)"
        return super().placement(in_place)

    def expected(self, xp: Any, count: int, dtype: np.dtype, op: str, size: int, rank: int, root: int) -> Any:
        start, stop = segment_bounds(count, size)[rank]
        return expected_result(xp, count, dtype, op, size)[start:stop]

    def buffers(self, xp: Any, x: Any, in_place: bool, rank: int, size: int) -> Buffers:
        start, stop = segment_bounds(x.size, size)[rank]
        out = x[start:stop] if in_place else xp.empty(stop - start, dtype=x.dtype)  # in place: its own part
        return Buffers(x, out, out)

    def caller(
        self, b: Buffers, algorithm: str, comm: Any, op: str, check: bool, root: int, **options: Any
    ) -> Callable[[], Any]:
        x, out = b.x, b.out
        return lambda: hpcring.reduce_scatter(x, op=op, algorithm=algorithm, comm=comm, out=out, check=check)

    def bare_call(self, comm: Any, b: Buffers, in_place: bool, root: int) -> BareCall:
        counts = [stop - start for start, stop in segment_bounds(b.x.size, comm.Get_size())]
        mine = counts[comm.Get_rank()]

        def call(send: Any, recv: Any, op: Any) -> None:
            if len(set(counts)) == 1:
                comm.Reduce_scatter_block(send, recv, op)
            else:
                comm.Reduce_scatter(send, recv, counts, op)

        if in_place:  # MPI_IN_PLACE: the input in recv, this rank's part lands at its front
            return BareCall(MPI.IN_PLACE, b.x, b.x[:mine], call)
        return BareCall(b.x, b.out, b.out, call)


class AllGather(Collective):
    name, bare, mpi4py = ALLGATHER, "MPI_Allgather", "comm.Allgather"
    reduces, rewrites_input = False, False
    size_is = "the whole buffer, the gathered output (G inputs), as nccl-tests"

    def granule(self, itemsize: int, size: int) -> int:
        return itemsize * size  # G whole inputs

    def placement(self, in_place: bool) -> str:
        return "in place (x is this rank's row of out=)" if in_place else super().placement(in_place)

    def count(self, nbytes: int, size: int, itemsize: int) -> int:
        return nbytes // itemsize // size

    def inputs(self, xp: Any, count: int, dtype: np.dtype, op: str, rank: int, root: int) -> Any:
        return row_input(xp, count, dtype, rank)

    def expected(self, xp: Any, count: int, dtype: np.dtype, op: str, size: int, rank: int, root: int) -> Any:
        return gathered_rows(xp, count, dtype, size)

    def buffers(self, xp: Any, x: Any, in_place: bool, rank: int, size: int) -> Buffers:
        out = xp.empty((size, x.size), dtype=x.dtype)
        if in_place:  # x is this rank's row of the output
            out[rank] = x
            x = out[rank]
        return Buffers(x, out, out)

    def caller(
        self, b: Buffers, algorithm: str, comm: Any, op: str, check: bool, root: int, **options: Any
    ) -> Callable[[], Any]:
        x, out = b.x, b.out
        return lambda: hpcring.allgather(x, algorithm=algorithm, comm=comm, out=out, check=check)

    def bare_call(self, comm: Any, b: Buffers, in_place: bool, root: int) -> BareCall:
        send = MPI.IN_PLACE if in_place else b.x
        return BareCall(send, b.out, b.out, lambda send, recv, op: comm.Allgather(send, recv))


class Broadcast(Collective):
    name, bare, mpi4py = BROADCAST, "MPI_Bcast", "comm.Bcast"
    reduces, rewrites_input, rooted, in_place_only = False, False, True, True
    size_is = "the buffer, in place on every rank"

    def placement(self, in_place: bool) -> str:
        return "in place (its only form), the root's buffer constant across iterations"

    def inputs(self, xp: Any, count: int, dtype: np.dtype, op: str, rank: int, root: int) -> Any:
        return row_input(xp, count, dtype, rank)  # a rank's own data until the root's arrives

    def expected(self, xp: Any, count: int, dtype: np.dtype, op: str, size: int, rank: int, root: int) -> Any:
        return row_input(xp, count, dtype, root)

    def buffers(self, xp: Any, x: Any, in_place: bool, rank: int, size: int) -> Buffers:
        return Buffers(x, x, x)

    def caller(
        self, b: Buffers, algorithm: str, comm: Any, op: str, check: bool, root: int, **options: Any
    ) -> Callable[[], Any]:
        x = b.x
        return lambda: hpcring.broadcast(x, root=root, algorithm=algorithm, comm=comm, check=check)

    def bare_call(self, comm: Any, b: Buffers, in_place: bool, root: int) -> BareCall:
        return BareCall(None, b.x, b.x, lambda send, recv, op: comm.Bcast(recv, root))


class AllToAll(Collective):
    name, bare, mpi4py = ALLTOALL, "MPI_Alltoall", "comm.Alltoall"
    reduces, rewrites_input, out_of_place_only = False, False, True
    size_is = "the whole buffer, each rank's input (G blocks, one for each rank), as nccl-tests"

    def granule(self, itemsize: int, size: int) -> int:
        return itemsize * size  # G whole blocks

    def placement(self, in_place: bool) -> str:
        return "out-of-place (out=, its only form), input constant across iterations"

    def inputs(self, xp: Any, count: int, dtype: np.dtype, op: str, rank: int, root: int) -> Any:
        return row_input(xp, count, dtype, rank)  # block j: the part of this rank's row for rank j

    def expected(self, xp: Any, count: int, dtype: np.dtype, op: str, size: int, rank: int, root: int) -> Any:
        m = count // size  # block i: rank i's block for this rank
        rows = [row_input(xp, count, dtype, i)[rank * m : (rank + 1) * m] for i in range(size)]
        return xp.concatenate(rows)

    def buffers(self, xp: Any, x: Any, in_place: bool, rank: int, size: int) -> Buffers:
        out = xp.empty_like(x)
        return Buffers(x, out, out)

    def caller(
        self, b: Buffers, algorithm: str, comm: Any, op: str, check: bool, root: int, **options: Any
    ) -> Callable[[], Any]:
        x, out = b.x, b.out
        return lambda: collectives.alltoall(x, algorithm=algorithm, comm=comm, out=out, check=check)

    def bare_call(self, comm: Any, b: Buffers, in_place: bool, root: int) -> BareCall:
        return BareCall(b.x, b.out, b.out, lambda send, recv, op: comm.Alltoall(send, recv))


class UnevenAllToAll(AllToAll):
    """The all-to-all with uneven blocks (--uneven): rank r sends rank j ``part[(j - r) mod G]``
    elements, where ``part`` cuts each rank's input in proportion 1 : 2 : ... : G, so every rank
    sends and receives its whole input, in blocks of G different sizes, and keeps ``part[0]``."""

    bare, mpi4py, uneven = "MPI_Alltoallv", "comm.Alltoallv", True
    size_is = "the whole buffer, each rank's input (G uneven blocks, one for each rank), as nccl-tests"

    @staticmethod
    def parts(count: int, size: int) -> list[int]:
        whole = size * (size + 1) // 2
        parts = [count * (i + 1) // whole for i in range(size)]
        parts[-1] += count - sum(parts)
        return parts

    def splits(self, count: int, size: int, rank: int) -> tuple[list[int], list[int]]:
        """(what rank ``rank`` sends each rank, what it receives from each)."""
        part = self.parts(count, size)
        return [part[(j - rank) % size] for j in range(size)], [part[(rank - i) % size] for i in range(size)]

    def expected(self, xp: Any, count: int, dtype: np.dtype, op: str, size: int, rank: int, root: int) -> Any:
        blocks = []
        for i in range(size):  # rank i's block for this rank
            sends = self.splits(count, size, i)[0]
            start = sum(sends[:rank])
            blocks.append(row_input(xp, count, dtype, i)[start : start + sends[rank]])
        return xp.concatenate(blocks)

    def caller(
        self, b: Buffers, algorithm: str, comm: Any, op: str, check: bool, root: int, **options: Any
    ) -> Callable[[], Any]:
        sends, recvs = self.splits(b.x.size, comm.Get_size(), comm.Get_rank())  # once, as the bare row's
        x, out = b.x, b.out
        return lambda: collectives.alltoall(
            x, send_splits=sends, recv_splits=recvs, algorithm=algorithm, comm=comm, out=out, check=check
        )

    def bare_call(self, comm: Any, b: Buffers, in_place: bool, root: int) -> BareCall:
        sends, recvs = self.splits(b.x.size, comm.Get_size(), comm.Get_rank())
        return BareCall(
            b.x, b.out, b.out, lambda send, recv, op: comm.Alltoallv([send, sends], [recv, recvs])
        )

    def bytes_sent(self, algorithm: str, count: int, itemsize: int, size: int, rank: int) -> int | None:
        """Pairwise: every block but its own (``part[0]``); the splits' exchange is not counted
        (it travels beside the algorithm)."""
        if algorithms.spec(ALLTOALL, algorithm).bytes_sent is None or size == 1:
            return 0 if size == 1 else None
        sent = algorithms.bytes_sent(algorithm, size, 1, size, rank, collective=ALLTOALL)
        if sent is None:
            return None
        return (count - self.parts(count, size)[0]) * itemsize


COLLECTIVES: dict[str, Collective] = {
    kind.name: kind for kind in (AllReduce(), ReduceScatter(), AllGather(), Broadcast(), AllToAll())
}
UNEVEN = UnevenAllToAll()


def kind_of(collective: str, uneven: bool = False) -> Collective:
    """The bench's description of ``collective`` (``uneven``: the all-to-all's uneven form)."""
    return UNEVEN if uneven and collective == ALLTOALL else COLLECTIVES[collective]


__all__ = ["COLLECTIVES", "UNEVEN", "BareCall", "Buffers", "Collective", "kind_of"]
