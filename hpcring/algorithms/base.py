"""What an algorithm declares: one `Spec` per collective it implements, and the cost model's `Phase`.

Each module in this package is one algorithm (gloo's one algorithm, one file; nccl-tests'
small contract per collective). For every collective it implements it defines a module-level
`Spec` (``ALLREDUCE``, ``REDUCE_SCATTER``, ``ALLGATHER``, ``BROADCAST``): the function that runs
it, its formulas, and its traits. `hpcring.algorithms` lists each Spec in its collective's table,
one line each; everything outside this package asks a Spec, never an algorithm's name:

- the engine runs ``run``, prices ``scratch_bytes`` before anything is allocated, and asks
  ``choose`` (`auto`) which algorithm a call really runs;
- the flight recorder reads the step counter of a ``stepped`` algorithm, and the watchdog
  watches a ``blocking`` one;
- ``wire=`` narrows only where ``narrowings`` is given (it also counts the roundings of the
  error bound), and the bench checks ``bytes_sent``;
- the cost model predicts from ``phases``, and `hpcring.viz` titles a traced step by ``picture``.

The run functions take a `hpcring.channel.Channel` ``ch`` and flat arrays (NumPy or CuPy):

- all-reduce ``run(ch, src, dst, op)``: ``dst`` (of ``src``'s length, maybe ``src`` itself: in
  place) ends holding the reduction of every rank's ``src``;
- reduce-scatter ``run(ch, src, dst, op)``: ``dst`` ends holding this rank's part of the
  reduction (parts as `hpcring.partition.segment_bounds` cuts ``src``, as ``numpy.array_split``);
  ``dst`` may be that part of ``src`` itself (in place, the rest of ``src`` is then scratch);
- all-gather ``run(ch, src, dst)``: ``dst`` (G times ``src``'s length) ends holding every rank's
  ``src`` in rank order; ``src`` may be this rank's row of ``dst`` itself (in place);
- broadcast ``run(ch, buf, root)``: ``buf`` ends holding the root's ``buf`` on every rank;
- all-to-all ``run(ch, src, dst, layout)``: ``dst`` (apart from ``src``) ends holding, at
  ``layout.recv_displs[i]``, the ``layout.recv_counts[i]`` elements rank i sent this rank, which
  rank i took from its own ``src`` at its ``send_displs[this rank]`` (`Layout`: MPI_Alltoallv's
  four arrays, in elements; equal blocks are MPI_Alltoall).

``op`` is a `hpcring.ops.Op` other than mean, which the engine divides afterwards. Every rank
ends with bitwise the same result (an all-to-all: the bits each rank was sent). A run function
is called only with G > 1 and data to move: the engine handles the cases with nothing to
exchange.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..records import Record


class Run(Protocol):
    """A collective's run function (module docstring: the four signatures)."""

    def __call__(self, ch: Any, *args: Any) -> None: ...


# The records a first call loads are NamedTuples (`hpcring.records.Record`): a frozen dataclass
# takes 0.4-1.4 ms to create at import (its methods generated and compiled), in every process.
class Phase(Record):
    """The cost model's step: ``messages`` messages of ``nbytes`` each, one after another, then
    ``reduced`` bytes reduced.

    ``distance`` is the rank distance of the partner (to find the link on a machine of
    nodes); ``pattern`` says who sends at once: "shift" (every rank r to r+d), "xor" (every
    rank r to r^d), "single" (one rank alone, as a root does), "local" (every rank computes,
    no message), "root" (the root alone computes). ``partial``: some ranks sit out the
    phase, waiting in MPI (Rabenseifner's fold, the first steps of a binomial tree).
    """

    messages: float
    nbytes: float
    reduced: float = 0.0
    distance: int = 1
    pattern: str = "shift"
    partial: bool = False


class Split(Record):
    """An all-reduce as its two phases, for a caller that works between them: the reproducible
    sum (`hpcring.exact`) reduces integer words and gathers the rounded results.

    ``reduce_scatter(ch, src, dst, op)`` leaves ``dst`` holding, at ``owned``, the reduction over
    every rank (elsewhere partial results); ``src`` and ``dst`` are apart and may differ in dtype
    (``op`` combines them: one operand may be a piece of ``src``, the other of ``dst`` or of
    scratch of ``dst``'s dtype). ``all_gather(ch, dst)`` passes every rank's ``owned`` part of
    ``dst`` (another array than the reduce-scatter's, maybe) on until every rank has all of it.
    ``once``: each element of ``owned`` is combined exactly once in the reduce-scatter, by its
    last combination (the ring), so ``op`` may finish the element there. ``owners()``: every
    rank's ``owned``, as (rank, slice) in the order of a pairwise exchange (position p sends to
    p + k and receives from p - k), for a caller that gathers the contributions unreduced."""

    owned: slice
    reduce_scatter: Callable[[Any, Any, Any, Any], None]
    all_gather: Callable[[Any, Any], None]
    once: bool = False
    owners: Callable[[], tuple[tuple[int, slice], ...]] | None = None


class Spec(Record):
    """One algorithm of one collective, as its module declares it (module docstring).

    ``bytes_sent(count, itemsize, size, rank)`` is the payload this rank hands to MPI in one
    call, by formula (None: the library's traffic, not visible); ``count`` is the elements of
    the input (all-gather and broadcast: of one rank's buffer). With ``topology_aware`` it also
    takes ``per_node`` (ranks per node, in blocks) and ``wire_itemsize`` (the bytes an element
    costs across nodes, wire=), as keywords. ``scratch_bytes(count, itemsize, size, rank)`` is
    the scratch it needs on that rank, so an allocation that cannot fit is refused first.
    """

    # A chooser (`auto`) has none of these three: the engine runs, counts and prices its choice.
    run: Callable[..., None] | None = None
    bytes_sent: Callable[..., int | None] | None = None
    scratch_bytes: Callable[[int, int, int, int], int] | None = None
    # The cost model: phases(nbytes, ranks) -> [Phase]; None: not modelled step by step
    phases: Callable[[float, int], list[Phase]] | None = None
    # ... or priced as the cheapest of these algorithms (a library's own choice among them)
    modelled_as: tuple[str, ...] = ()
    # ... or, on a machine of nodes, levels(nbytes, ranks, per_node) -> (the phases inside one
    # node, those across nodes of one rank's share): a two-level algorithm
    levels: Callable[[float, int, int], tuple[list[Phase], list[Phase]]] | None = None
    # ... and what it runs where its structure does not apply (a two-level one on one node)
    fallback: str | None = None
    # its messages are the library's collectives (ps: a Gather and a Bcast), so the cost model
    # adds no per-step software of hpcring's to them (`hpcring.model.costs.Software`)
    library_steps: bool = False
    # wire=: narrowings(size, per_node) -> how often one element's value is rounded to the wire
    # dtype on its longest path (the error bound's k); None: it cannot narrow (the library moves
    # the data) and wire= is refused
    narrowings: Callable[[int, int], int] | None = None
    stepped: bool = False  # counts its exchanges on ``ch.step`` (the flight record's step)
    blocking: bool = False  # its data exchange is one blocking library call (the watchdog's)
    # its all-reduce is the library's, so a small one's data may ride with the agreement, which
    # the library reduces too (hpcring.agreement: one collective for the checked call)
    rides: bool = False
    ring_order: bool = False  # runs in the topology's node order: bytes_sent's rank is a position
    topology_aware: bool = False  # bytes_sent takes per_node and wire_itemsize
    # Why this rank's arrays cannot run it (a verdict of the agreement: every rank raises it)
    refuses: Callable[[Any], str | None] | None = None
    # auto: choose(ch, nbytes, in_place, known) -> the name (one of ``known``) this call runs
    # (collective the first time for a size; every rank is inside the call then), and
    # default(nbytes, size) -> the name untuned (the memory guard and the formulas, before the
    # ranks agree)
    choose: Callable[[Any, int, bool, Any], str] | None = None
    default: Callable[[int, int], str] | None = None
    # auto with wire=: whether the chosen Spec should narrow here, keep_wire(ch, chosen)
    keep_wire: Callable[[Any, Spec], bool] | None = None
    # hpcring.plan: persistent(ch, src, dst, op) -> a started-and-waited request on these
    # buffers (MPI-4's MPI_Allreduce_init), or None
    persistent: Callable[..., Any] | None = None
    # reproducible=True: split(ch, count) -> the all-reduce of ``count`` elements on ``ch`` as its
    # two phases (`Split`), or None: the reproducible sum then runs the whole all-reduce twice
    split: Callable[[Any, int], Split] | None = None
    # ... and split_sent(count, size, rank) -> the elements this rank sends in each phase
    split_sent: Callable[[int, int, int], tuple[int, int]] | None = None
    # hpcring.viz: picture(index, steps, size) -> the title of traced step ``index``, or None
    picture: Callable[[int, int, int], str | None] | None = None
    # all-to-all: runs equal blocks only (MPI_Alltoall), so a call with send_splits= is refused
    equal_only: bool = False
    name: str = ""  # set by the table it is listed in
    collective: str = ""

    def sent(
        self,
        count: int,
        itemsize: int,
        size: int,
        rank: int,
        per_node: int = 1,
        wire: int | None = None,
        root: int | None = None,
    ) -> int | None:
        """``bytes_sent`` with what the call knows: ``per_node`` where it counts, ``wire`` (the
        itemsize on the wire), which a flat algorithm sends every element in, and a broadcast's
        ``root``."""
        assert self.bytes_sent is not None, f"{self.name}: a chooser's bytes are its choice's"
        if self.topology_aware:
            return self.bytes_sent(count, itemsize, size, rank, per_node=per_node, wire_itemsize=wire)
        if root is not None:
            return self.bytes_sent(count, wire or itemsize, size, rank, root=root)
        return self.bytes_sent(count, wire or itemsize, size, rank)


def choice_key(collective: str, nbytes: int, in_place: bool) -> tuple[str, str, int, bool]:
    """Where auto keeps its choice for a call among its channel's schedules: what
    `hpcring.algorithms.auto.choose` stores and the engine's warm calls look up."""
    return ("auto", collective, nbytes, in_place)


class Layout(Record):
    """Where an all-to-all's blocks lie, in elements of the flat arrays: MPI_Alltoallv's four
    arrays. ``send_counts[i]`` elements from ``send_displs[i]`` of this rank's input go to rank i;
    ``recv_counts[i]`` elements from rank i land at ``recv_displs[i]`` of its output."""

    send_counts: tuple[int, ...]
    send_displs: tuple[int, ...]
    recv_counts: tuple[int, ...]
    recv_displs: tuple[int, ...]
    equal: bool = False  # every block the same size: MPI_Alltoall's (follows from the counts)

    @property
    def block(self) -> int:
        """The elements of one block, where the blocks are equal."""
        return self.send_counts[0] if self.send_counts else 0

    @staticmethod
    def blocks(block: int, size: int) -> Layout:
        """Equal blocks of ``block`` elements for ``size`` ranks, in rank order."""
        displs = tuple(i * block for i in range(size))
        counts = (block,) * size
        return Layout(counts, displs, counts, displs, True)

    @staticmethod
    def of(sends: tuple[int, ...], recvs: tuple[int, ...]) -> Layout:
        """The layout of blocks of these counts, packed in rank order on both sides."""
        equal = len(set(sends) | set(recvs)) <= 1
        return Layout(tuple(sends), _displs(sends), tuple(recvs), _displs(recvs), equal)


def _displs(counts: tuple[int, ...]) -> tuple[int, ...]:
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return tuple(out)


def no_scratch(count: int, itemsize: int, size: int, rank: int) -> int:
    """``scratch_bytes`` of an algorithm that moves data straight into place (or leaves it to the
    library): hpcring allocates nothing for it."""
    return 0


def same_memory(a: Any, b: Any) -> bool:
    """Whether two flat arrays are the very same non-empty memory (a collective in place: the
    engine hands an algorithm the user's own part or row as its output)."""
    return bool(a.size and a.size == b.size and a.dtype == b.dtype and _address(a) == _address(b))


def _address(array: Any) -> int:
    interface = getattr(array, "__array_interface__", None) or array.__cuda_array_interface__
    return int(interface["data"][0])


__all__ = ["Layout", "Phase", "Run", "Spec", "Split", "no_scratch", "same_memory"]
