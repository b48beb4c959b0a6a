"""What an algorithm module provides: three functions, and optional hooks with their meaning.

Each module in this package is one algorithm (gloo's one algorithm, one file; nccl-tests'
small contract per collective). `Algorithm` names the contract as a typing Protocol, which a
module satisfies by defining these names at top level; `Entry` is what the package makes of a
module once, at import, so the hot path reads attributes instead of probing for hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol


class Algorithm(Protocol):
    """The required functions. ``ch`` is a `hpcring.channel.Channel`; ``src`` and ``dst`` are
    flat arrays of equal length (``dst`` may be ``src``: in place); ``op`` is a `hpcring.ops.Op`
    other than mean, which `hpcring.api` divides afterwards."""

    def allreduce(self, ch: Any, src: Any, dst: Any, op: Any) -> None:
        """On return ``dst`` holds the reduction of every rank's ``src``, bitwise identical on all
        ranks. Only called with G > 1 and a non-empty buffer: the API handles the cases with
        nothing to exchange."""

    def bytes_sent(self, count: int, itemsize: int, size: int, rank: int) -> int | None:
        """The bytes rank ``rank`` hands to MPI in one call, by the algorithm's formula (None where
        the library's own traffic is not visible); the bench compares it with the Channel's count."""

    def scratch_bytes(self, count: int, itemsize: int, size: int, rank: int) -> int:
        """The scratch memory that rank needs, so an impossible allocation is refused before any
        data moves."""


# The optional hooks: a module defines them only where they apply.
#
# refuses(backend) -> str | None
#     Why this rank's arrays cannot go to the algorithm (a local check that becomes a verdict of
#     the agreement, so every rank raises it): `nccl` takes only CuPy arrays on a GPU.
# resolve(ch, nbytes, in_place) -> str | None
#     The algorithm a call will really run, where the channel already knows it without
#     communicating (`auto`, for a size and placement it has chosen for); None before that.
# persistent(ch, src, dst, op) -> MPI.Prequest | None
#     A persistent request that runs the algorithm on these very buffers each time it is
#     started (`hpcring.plan`; `mpi`: MPI-4's MPI_Allreduce_init), or None where there is none;
#     without the hook a plan runs ``allreduce`` itself.
# TOPOLOGY_AWARE = True
#     ``bytes_sent`` takes ``per_node`` (ranks per node, in blocks) as a keyword as well.
# RING_ORDER = True
#     The algorithm runs in `hpcring.topology.Topology.order` (ranks grouped by node), so
#     ``bytes_sent``'s rank is this rank's position in that order.


@dataclass(frozen=True, slots=True)
class Entry:
    """One algorithm as the package keeps it: its functions and hooks, looked up once."""

    name: str
    allreduce: Callable[..., None]
    bytes_sent: Callable[..., int | None]
    scratch_bytes: Callable[..., int]
    refuses: Callable[[Any], str | None] | None
    resolve: Callable[[Any, int, bool], str | None] | None
    persistent: Callable[..., Any] | None
    topology_aware: bool
    ring_order: bool

    @classmethod
    def of(cls, name: str, module: Any) -> Entry:
        return cls(
            name=name,
            allreduce=module.allreduce,
            bytes_sent=module.bytes_sent,
            scratch_bytes=module.scratch_bytes,
            refuses=getattr(module, "refuses", None),
            resolve=getattr(module, "resolve", None),
            persistent=getattr(module, "persistent", None),
            topology_aware=getattr(module, "TOPOLOGY_AWARE", False),
            ring_order=getattr(module, "RING_ORDER", False),
        )


class Prepared(NamedTuple):
    """The answer to the one question the API asks before a call: what runs, and what it needs."""

    name: str  # the algorithm that runs (`auto`: its choice, once made for this size and placement)
    run: Callable[..., None]  # its allreduce(ch, src, dst, op)
    scratch: int  # bytes of scratch it needs on this rank, before what the channel already holds
