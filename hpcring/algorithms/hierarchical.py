"""Hierarchical all-reduce: reduce-scatter inside the node, all-reduce across nodes, all-gather inside.

With H nodes of L ranks each, local rank j ends the node's ring reduce-scatter holding
the node's sum of shard j+1 (n/L elements); the L ranks with the same local rank, one per
node, then all-reduce that shard across nodes at the same time (every local rank uses the
network at once, as NCCL does), and each local rank sends its finished shard to the
other L-1 ranks of its node. Cost, with intra-node link (a_i, b_i) and inter-node link
(a_x, b_x):

    2(L-1)·a_i + 2(L-1)/L·n·b_i                       reduce-scatter + all-gather in the node
  + 2(H-1)·a_x + 2(H-1)/H·(n/L)·b_x·L                 ring across nodes, L flows share one NIC
  + (L-1)/L·n·g + (H-1)/H·(n/L)·g                     reductions

so each node's network link carries 2(H-1)/H·n bytes each way, where a flat ring over
all G = H·L ranks carries 2(G-1)/G·n per link but serialises L times more steps
through it. The cross-node step runs `ring` (or `rabenseifner` with
``HPCRING_HIERARCHICAL_INTER=rabenseifner``, the same on every rank) on its own
communicator, so it pipelines as those do.

The all-gather inside the node overlaps the one across nodes (as Open MPI's coll/han
pipelines its levels): every batch of a rank's shard (pieces of BATCH_BYTES or more, a
segment's last one shorter) goes to the other local ranks as soon as the cross-node
ring has finished it, while the ring still runs, and their batches land straight in
place. Where the ring cannot report finished pieces (Rabenseifner across, or staged
device memory), the shards are exchanged after it, pairwise. Measured on the emulated
cluster (2 hosts x 2 ranks, 1 Gbit/s, 64 MiB, A/B): 650-658 ms without, 629-641 ms with.

Where there is no second level (one node, every rank alone on its node, or nodes of
unequal size) it runs the flat ring, in the ring order that keeps neighbours on one node.
Every element is reduced once per node and once across nodes by ranks that then only
copy it, so all ranks end with the same bits.
"""

from __future__ import annotations

import bisect
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .. import config
from ..partition import chunk_bounds, segment_bounds
from . import rabenseifner, ring
from .base import Phase, Spec

if TYPE_CHECKING:
    from ..channel import Channel
    from ..config import Config
    from ..ops import Op

# The all-gather inside the node travels in batches of 1 MiB or more (at most about
# MAX_BATCHES per shard, so the receives posted ahead stay few), each cut from one segment
# of the cross-node ring, so it is final as soon as that segment is.
BATCH_BYTES = 1 << 20
MAX_BATCHES = 64
TAG = 16  # batch i of a shard travels with tag TAG + i on the node communicator


def inter_module(settings: Config | None = None) -> ModuleType:
    """The algorithm that all-reduces each shard across nodes: HPCRING_HIERARCHICAL_INTER of
    ``settings`` (default `config.current()`), else ring."""
    name = (settings or config.current()).hierarchical_inter
    return {"ring": ring, "rabenseifner": rabenseifner}[name]


def batches(length: int, nodes: int, itemsize: int) -> tuple[tuple[int, int], ...]:
    """Bounds of the batches a shard of ``length`` elements travels in inside the node."""
    if length == 0:
        return ()
    per = max(BATCH_BYTES // itemsize, -(-length // MAX_BATCHES), 1)
    return tuple(
        piece
        for start, stop in segment_bounds(length, nodes)
        if stop > start
        for piece in chunk_bounds(start, stop, per)
    )


class _Forward:
    """Told of every finished piece of this rank's shard (by the ring), it sends each batch to
    the other local ranks once the whole batch is final."""

    def __init__(self, local: Channel, shard: Any, pieces: tuple[tuple[int, int], ...], peers: list[int]):
        self.local, self.shard, self.pieces, self.peers = local, shard, pieces, peers
        self.starts = [start for start, _ in pieces]
        self.left = [stop - start for start, stop in pieces]
        self.requests: list[Any] = []

    def __call__(self, piece: slice) -> None:
        position, stop = piece.start, piece.stop
        i = bisect.bisect_right(self.starts, position) - 1
        while position < stop:
            start, end = self.pieces[i]
            done = min(end, stop) - position
            self.left[i] -= done
            if self.left[i] == 0:
                for peer in self.peers:
                    self.requests.append(self.local.isend(self.shard[start:end], peer, TAG + i))
            position += done
            i += 1


def allreduce(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- op over all ranks of src (dst may be src)."""
    topo = ch.topology()
    if not topo.two_level:
        ring.allreduce(ch, src, dst, op)
        return
    # wire=: the channel decides what its sub-channels narrow (`Channel.sub_channels`): only the
    # network, so the node's sum is rounded once, not at every local hop; the ring across nodes
    # narrows, and its owners round the shard, so the all-gather inside passes on values
    # already on the wire grid.
    local, cross = ch.sub_channels(topo)
    inter = inter_module(ch.config)
    sent_before = local.traffic.sent + cross.traffic.sent
    size, me, itemsize, n = local.size, local.rank, dst.dtype.itemsize, src.size
    # Reduce-scatter in the node, the ring's (rank order, whole segments): local rank j ends
    # with shard j + 1 reduced over the node. Step 0 sends from src and every reduction writes
    # dst, so out of place copies nothing.
    plan = local.schedule(
        ("hierarchical", n),
        lambda: ring.build(size, me, segment_bounds(n, size), ring.successors(size), ring.UNCHUNKED),
    )
    ring.reduce_scatter_phase(local, plan, src, dst, op)
    # Shard j + 1 now holds this node's sum: all-reduce it with the same shard of every node.
    # Streamed in chunks below the TCP eager limit (ring.NETWORK_CHUNK_BYTES), so the link
    # keeps sending while a chunk is reduced; HPCRING_CHUNK_BYTES overrides it.
    seg = plan.segments
    mine = dst[plan.segment(0)]
    peers = [q for q in range(size) if q != me]
    if inter is ring and ch.adapter.direct:
        # All-gather in the node during the one across: receives for every other local
        # rank's batches go up first (straight into place: nothing else touches those
        # shards now), and this rank's batches leave as the ring finishes them.
        shards = ch.schedule(
            ("hierarchical-batches", n, size, cross.size, itemsize),
            lambda: tuple(batches(s.stop - s.start, cross.size, itemsize) for s in seg),
        )
        receives = [
            local.irecv(dst[seg[(q + 1) % size]][start:stop], q, TAG + i)
            for q in peers
            for i, (start, stop) in enumerate(shards[(q + 1) % size])
        ]
        forward = _Forward(local, mine, shards[(me + 1) % size], peers)
        if mine.size:  # empty only where n < L, then on every node alike
            ring.allreduce(cross, mine, mine, op, chunk_bytes=ring.NETWORK_CHUNK_BYTES, on_final=forward)
        local.waitall(receives + forward.requests, ring.wait_nap(ch.config))
    else:
        if mine.size:
            if inter is ring:
                ring.allreduce(cross, mine, mine, op, chunk_bytes=ring.NETWORK_CHUNK_BYTES)
            else:
                inter.allreduce(cross, mine, mine, op)
        # All-gather in the node afterwards: at step s send this shard s ranks on, receive
        # the shard of the rank s back, straight into place.
        for step in range(1, size):
            to, frm = (me + step) % size, (me - step) % size
            local.sendrecv(mine, to, dst[seg[(frm + 1) % size]], frm)
    ch.traffic.sent += local.traffic.sent + cross.traffic.sent - sent_before
    ch.traffic.unknown |= local.traffic.unknown or cross.traffic.unknown


def bytes_sent(
    count: int, itemsize: int, size: int, rank: int, per_node: int = 1, wire_itemsize: int | None = None
) -> int:
    """A ring reduce-scatter over L ranks in the node, the cross-node algorithm over H on this
    rank's shard, and that shard sent to the L-1 other ranks of the node.

    ``per_node`` is L, ranks placed in blocks of L (node = rank // L); 1 (or a size that
    is not H·L with H > 1) gives the flat ring this falls back to. ``wire_itemsize`` (wire=):
    the bytes per element that cross nodes, and all of them on the flat ring.
    """
    if size == 1 or count == 0:
        return 0
    if per_node <= 1 or size % per_node or size == per_node:
        return ring.bytes_sent(count, wire_itemsize or itemsize, size, rank)
    nodes, local_rank = size // per_node, rank % per_node
    start, stop = segment_bounds(count, per_node)[(local_rank + 1) % per_node]
    wide = wire_itemsize or itemsize
    inter = inter_module().ALLREDUCE
    across = inter.sent(stop - start, wide, nodes, rank // per_node) or 0 if stop > start else 0
    # Inside: the reduce-scatter sends every segment but shard j+1; the all-gather sends
    # shard j+1 to each of the other L-1 local ranks.
    inside = (count - (stop - start)) + (per_node - 1) * (stop - start)
    return inside * itemsize + across


def scratch_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """At most half the buffer: one in-node shard, n/L with L >= 2 (the flat ring needs n/G).

    The guard runs before the topology is known, so it assumes the smallest node of two.
    """
    return -(-count // 2) * itemsize if size > 1 and count else 0


def narrowings(size: int, per_node: int) -> int:
    """The ring across nodes, owner included (the node's sum stays wide); the flat ring's otherwise."""
    if per_node > 1 and size % per_node == 0 and size > per_node:
        return size // per_node
    return size


def levels(n: float, p: int, per_node: int) -> tuple[list[Phase], list[Phase]]:
    """On H nodes of L ranks: the ring's reduce-scatter and all-gather inside a node, and the
    ring all-reduce of one rank's n/L shard across the H nodes (the cost model shares each
    node's link among the L ranks that cross it at once)."""
    return ring.allreduce_steps(n, per_node), ring.allreduce_steps(n / per_node, p // per_node)


ALLREDUCE = Spec(
    run=allreduce,
    bytes_sent=bytes_sent,
    scratch_bytes=scratch_bytes,
    levels=levels,
    fallback="ring",
    narrowings=narrowings,
    stepped=True,
    ring_order=True,
    topology_aware=True,
)
