"""auto: the algorithm measured fastest on this machine for the collective, message size and rank count.

Cost: that of the algorithm it picks. auto runs nothing itself: it chooses, and the engine
runs the choice. The choice comes from a tuning file written by `python -m hpcring.bench
--tune` (path: HPCRING_TUNING, else ~/.cache/hpcring/tuning.json; its format, reader and
writer are `hpcring.algorithms.tuning`): for each collective and rank count, a list of (up to
this many bytes, algorithm) thresholds. Without a file, or without an entry for this key,
built-in defaults apply (measured: `tuning.DEFAULT`): for the all-reduce the library's own up
to 64 KiB (latency; on 2 ranks up to 32 KiB, as far as a checked call's data rides with its
agreement), then Rabenseifner where G is a power of two (log2 G steps, the ring's bytes) and
the ring otherwise. Rank 0 reads the file once per communicator and broadcasts the
table, so every rank makes the same choice even if their files differ.

The topology counts too: on several nodes of L > 1 ranks each the table is the one tuned for
that shape, keyed "HxL" (e.g. "2x2"; `bench --tune` run on those nodes writes it), else
`tuning.two_level_default`, which follows the cost model: the library's own up to 32 KiB, then
Rabenseifner (2·log2 G latency steps, where hierarchical's ring across H nodes takes 2(H-1)),
and, where G is not a power of two, `hierarchical` from H MiB, where Rabenseifner's fold costs
more than the longer ring.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from . import tuning
from .base import Spec, choice_key

if TYPE_CHECKING:
    from ..channel import Channel

# wire= on one node: off, by measurement (docs/compression.md). Shared memory moves float32
# faster than the narrowing and widening of every chunk costs: on the 2-core machine the ring
# with wire="bfloat16" took longer than without at 2 and 4 ranks, 16 and 64 MiB.
WIRE_ON_ONE_NODE = False


def _table(
    ch: Channel, collective: str, in_place: bool, known: Sequence[str] | None
) -> tuple[tuple[int | None, str], ...]:
    """The table of this communicator for ``collective`` in place or not: read by rank 0 once,
    broadcast, then cached as a schedule."""

    def build() -> tuple[tuple[int | None, str], ...]:
        from .. import topology  # here: the cost model imports this module without MPI

        found = topology.known(ch.comm) is not None
        shape = ch.topology().summary()  # collective on first use, like the bcast
        if found:  # else its discovery, just now, met every rank: the bcast is bounded either way
            ch.arrive("auto's table broadcast")
        if ch.rank != 0:  # only rank 0's copy counts, so only rank 0 reads (and warns)
            return ch.comm.bcast(None, root=0)
        key = tuning.key_for(ch.size, shape, collective=collective)
        if in_place:
            inplace = tuning.key_for(ch.size, shape, True, collective)
            table = tuning.load(inplace, fallback=key, known=known)
        else:
            table = tuning.load(key, known=known)
        return ch.comm.bcast(table, root=0)

    return ch.schedule(("auto-table", collective, in_place), build)


def choose(collective: str, ch: Channel, nbytes: int, in_place: bool, known: Sequence[str] | None) -> str:
    """What a ``collective`` call of ``nbytes`` in place or not runs on this channel, among the
    names ``known``; kept once chosen (collective the first time on a channel, as the table's
    broadcast is: every rank is inside the call then)."""
    return ch.schedule(
        choice_key(collective, nbytes, in_place),
        lambda: tuning.choose(nbytes, _table(ch, collective, in_place, known)),
    )


def chosen(
    ch: Channel,
    nbytes: int,
    in_place: bool = False,
    collective: str = "allreduce",
    known: Sequence[str] | None = None,
) -> str:
    """What auto runs for an ``nbytes`` call on this channel (collective the first time, as
    `choose`): how the bench labels its auto rows."""
    return choose(collective, ch, nbytes, in_place, known)


def default(collective: str, nbytes: int, size: int) -> str:
    """What auto runs for ``nbytes`` on ``size`` ranks of one node, untuned: what the memory guard
    and the formulas price before the ranks have agreed (they cannot read the table yet)."""
    return tuning.choose(nbytes, tuning.default_table(tuning.key_for(size, None, collective=collective)))


# The all-to-all's uneven form (send_splits=): the ranks' sizes differ, so no size can choose
# (ranks that chose differently would run different algorithms, and hang). One choice for every
# size: pairwise, ahead of the library's own MPI_Alltoallv through hpcring (`mpi`) at 4 ranks
# from 64 KiB to 4 MiB per rank here (bench --uneven, docs/collectives.md).
UNEVEN = "pairwise"


def choose_alltoall(ch: Channel, nbytes: int, in_place: bool, known: Sequence[str] | None) -> str:
    """auto for the all-to-all: by the tuning table for equal blocks of ``nbytes`` per rank; for
    uneven blocks (``nbytes`` < 0: the sizes differ from rank to rank), `UNEVEN` where it is among
    ``known``, else the first of them."""
    if nbytes < 0:
        names = list(known or ())
        return UNEVEN if UNEVEN in names or not names else names[0]
    return choose("alltoall", ch, nbytes, in_place, known)


def keep_wire(ch: Channel, chosen: Spec) -> bool:
    """Whether auto with wire= narrows what its choice sends: only an algorithm that moves data
    itself can (`mpi` cannot), and only across nodes does half the bytes save time."""
    return chosen.narrowings is not None and (WIRE_ON_ONE_NODE or ch.topology().nodes > 1)


def _chooser(collective: str) -> Spec:
    return Spec(
        run=None,
        bytes_sent=None,
        scratch_bytes=None,
        choose=choose_alltoall if collective == "alltoall" else partial(choose, collective),
        default=partial(default, collective),
        keep_wire=keep_wire,
        # wire= is accepted (its choice may narrow); the bound is the ring's, the largest
        narrowings=(lambda size, per_node: size) if collective == "allreduce" else None,
    )


ALLREDUCE = _chooser("allreduce")
REDUCE_SCATTER = _chooser("reduce_scatter")
ALLGATHER = _chooser("allgather")
BROADCAST = _chooser("broadcast")
ALLTOALL = _chooser("alltoall")
