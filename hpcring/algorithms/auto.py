"""auto: the algorithm measured fastest on this machine for the message size and rank count.

Cost: that of the algorithm it picks. The choice comes from a tuning file written by
`python -m hpcring.bench --tune` (path: HPCRING_TUNING, else ~/.cache/hpcring/tuning.json;
its format, reader and writer are `hpcring.algorithms.tuning`): for each rank count, a
list of (up to this many bytes, algorithm) thresholds. Without a file, or without an
entry for this rank count, built-in defaults apply (measured: `tuning.DEFAULT`): the
library's own Allreduce up to 64 KiB (latency), then Rabenseifner where G is a power of two
(log2 G steps, the ring's bytes) and the ring otherwise. Rank 0 reads the file once per
communicator and broadcasts the table, so every rank makes the same choice even if their
files differ.

The topology counts too: on several nodes of L > 1 ranks each (`hpcring.topology`) the
table is the one tuned for that shape, keyed "HxL" (e.g. "2x2"; `bench --tune` run on
those nodes writes it), else `tuning.DEFAULT_TWO_LEVEL`, in which `hierarchical` takes
the large messages: its inter-node links carry 2(H-1)/H·n where a flat ring's carry
2(G-1)/G·n in L times as many steps.
"""

from __future__ import annotations

import sys
from typing import Any

from .. import topology
from ..channel import Channel
from ..ops import Op
from ..polling import arrive
from ..wire import WireChannel
from .tuning import choose, default_table, key_for, load


def _table(ch: Channel, in_place: bool = False) -> tuple[tuple[int | None, str], ...]:
    """The table of this communicator for calls in place or not: read by rank 0 once,
    broadcast, then cached as a plan."""

    def build() -> tuple[tuple[int | None, str], ...]:
        shape = topology.summary(topology.of(ch.comm, ch))  # collective on first use, like the bcast
        arrive(ch.waiter, ch.timeout, "auto's table broadcast")  # every rank is there: the bcast is bounded
        if ch.rank != 0:  # only rank 0's copy counts, so only rank 0 reads (and warns)
            return ch.comm.bcast(None, root=0)
        key = key_for(ch.size, shape)
        table = load(key_for(ch.size, shape, in_place=True), fallback=key) if in_place else load(key)
        return ch.comm.bcast(table, root=0)

    return ch.plan(("auto-table", in_place), build)


def chosen(ch: Channel, nbytes: int, in_place: bool = False) -> str:
    """What `allreduce` below runs for an ``nbytes`` message on this channel, in place or not
    (collective on first use)."""
    return choose(nbytes, _table(ch, in_place))


def allreduce(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- op over all ranks of src, by the algorithm tuned for this size and placement.

    The choice for a size is a plan of its own, so later calls of that size need no
    communication to make it; `hpcring.api` then runs the choice directly (`resolve`)."""
    name = choose_for(ch, src.nbytes, dst is src)
    if isinstance(ch, WireChannel) and not wire_pays(ch, name):
        ch = ch.inner  # wire= where it does not pay: the same choice, sent as it is
    _package().get(name)(ch, src, dst, op)


# wire= on one node: off, by measurement (docs/compression.md). Shared memory moves float32
# faster than the narrowing and widening of every chunk costs: on the 2-core machine the ring
# with wire="bfloat16" took longer than without at 2 and 4 ranks, 16 and 64 MiB.
WIRE_ON_ONE_NODE = False


def wire_pays(ch: Channel, name: str) -> bool:
    """Whether `auto` with wire= narrows what its choice ``name`` sends: only an algorithm that
    moves data itself can (`mpi` cannot), and only across nodes does half the bytes save time."""
    if name in ("mpi", "nccl"):
        return False
    return WIRE_ON_ONE_NODE or topology.of(ch.comm).nodes > 1


def choose_for(ch: Channel, nbytes: int, in_place: bool) -> str:
    """The algorithm for ``nbytes`` in place or not on this channel, kept once chosen (collective
    the first time on a channel, as the table's broadcast is)."""
    return ch.plan(_choice_key(nbytes, in_place), lambda: chosen(ch, nbytes, in_place))


def _choice_key(nbytes: int, in_place: bool) -> tuple[Any, ...]:
    """The plan key under which the choice for a size and placement is kept."""
    return ("auto", nbytes, in_place)


def resolve(ch: Channel, nbytes: int, in_place: bool) -> str | None:
    """The algorithm an ``nbytes`` call runs on this channel, if a call of that size and
    placement already chose it (local: no communication); None before that.

    A 4 KiB call takes 15-20 us at 2 ranks and 60 at 3 ranks sharing 2 cores, where each
    microsecond of Python costs several: the memory guard prices the choice itself (often
    `mpi`, no scratch), and the call skips this module's own dispatch. With wire= (a
    `WireChannel`) it stays None: `allreduce` above decides whether the wire pays."""
    if isinstance(ch, WireChannel):
        return None
    return ch.cached(_choice_key(nbytes, in_place))


def bytes_sent(count: int, itemsize: int, size: int, rank: int) -> int | None:
    """Those of the default choice (the bench asks the channel which one really ran)."""
    return _package().bytes_sent(choose(count * itemsize, default_table(size)), count, itemsize, size, rank)


def scratch_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """Those of the default choice: the guard runs before the ranks agree, so it cannot read the table."""
    return _package().scratch_bytes(
        choose(count * itemsize, default_table(size)), count, itemsize, size, rank
    )


def _package() -> Any:
    """hpcring.algorithms, which imports this module: reached at call time, not import time."""
    return sys.modules[__package__]
