"""Hierarchical all-reduce: reduce-scatter inside the node, all-reduce across nodes, all-gather inside.

With H nodes of L ranks each, local rank j ends the node's ring reduce-scatter holding
the node's sum of shard j+1 (n/L elements); the L ranks with the same local rank, one per
node, then all-reduce that shard across nodes at the same time (every local rank uses the
network at once, as NCCL does), and a ring all-gather inside the node hands every rank
all L shards. Cost, with intra-node link (a_i, b_i) and inter-node link (a_x, b_x):

    2(L-1)·a_i + 2(L-1)/L·n·b_i                       reduce-scatter + all-gather in the node
  + 2(H-1)·a_x + 2(H-1)/H·(n/L)·b_x·L                 ring across nodes, L flows share one NIC
  + (L-1)/L·n·g + (H-1)/H·(n/L)·g                     reductions

so each node's network link carries 2(H-1)/H·n bytes each way, where a flat ring over
all G = H·L ranks carries 2(G-1)/G·n per link but serialises L times more steps
through it. The cross-node step runs `ring` (or `rabenseifner` with
``HPCRING_HIERARCHICAL_INTER=rabenseifner``, the same on every rank) on its own
communicator, so it pipelines as those do.

Where there is no second level (one node, every rank alone on its node, or nodes of
unequal size) it runs the flat ring, in the ring order that keeps neighbours on one node.
Every element is reduced once per node and once across nodes by ranks that then only
copy it, so all ranks end with the same bits.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

from .. import topology
from ..channel import Channel
from ..ops import Op
from ..partition import segment_bounds
from . import rabenseifner, ring

TOPOLOGY_AWARE = True  # bytes_sent takes per_node: the bench passes the ranks per node it found
RING_ORDER = True  # bytes_sent's rank is the position in `topology.ring_order` (node, then local rank)


def inter_module() -> ModuleType:
    """The algorithm that all-reduces each shard across nodes: HPCRING_HIERARCHICAL_INTER, else ring."""
    name = os.environ.get("HPCRING_HIERARCHICAL_INTER", "ring").strip() or "ring"
    modules = {"ring": ring, "rabenseifner": rabenseifner}
    if name not in modules:
        raise ValueError(f"HPCRING_HIERARCHICAL_INTER must be ring or rabenseifner, got {name!r}")
    return modules[name]


def allreduce(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- op over all ranks of src (dst may be src)."""
    topo = topology.of(ch.comm)
    if not topo.two_level:
        ring.allreduce(ch, src, dst, op)
        return
    local, cross = topo.channels(ch)
    sent_before = local.bytes_sent + cross.bytes_sent
    xp, size, me = ch.xp, local.size, local.rank
    seg = ch.plan(
        ("hierarchical", src.size, size), lambda: tuple(slice(*b) for b in segment_bounds(src.size, size))
    )
    left, right = (me - 1) % size, (me + 1) % size
    # Reduce-scatter in the node, as in the ring: at step s local rank j sends its partial
    # sum of shard j - s and reduces the one of shard j - s - 1 from its left neighbour.
    # Step 0 sends from src and every reduction writes dst, so out of place copies nothing.
    incoming = ch.scratch("hierarchical", seg[0].stop - seg[0].start, dst.dtype)
    for step in range(size - 1):
        out_seg, in_seg = seg[(me - step) % size], seg[(me - step - 1) % size]
        buf = incoming[: in_seg.stop - in_seg.start]
        local.sendrecv((src if step == 0 else dst)[out_seg], right, buf, left)
        op.combine(xp, src[in_seg], buf, dst[in_seg])
    # Shard j + 1 now holds this node's sum: all-reduce it with the same shard of every node.
    shard = dst[seg[(me + 1) % size]]
    if shard.size:  # the same on every node: n and L are
        inter = inter_module()
        if inter is ring:
            # Streamed in chunks below the TCP eager limit (ring.NETWORK_CHUNK_BYTES), so the
            # link keeps sending while a chunk is reduced; HPCRING_CHUNK_BYTES overrides it.
            ring.allreduce(cross, shard, shard, op, chunk_bytes=ring.NETWORK_CHUNK_BYTES)
        else:
            inter.allreduce(cross, shard, shard, op)
    # All-gather in the node: pass complete shards around, straight into place.
    for step in range(size - 1):
        out_seg, in_seg = seg[(me + 1 - step) % size], seg[(me - step) % size]
        local.sendrecv(dst[out_seg], right, dst[in_seg], left)
    ch.bytes_sent += local.bytes_sent + cross.bytes_sent - sent_before
    ch.bytes_unknown |= local.bytes_unknown or cross.bytes_unknown


def bytes_sent(count: int, itemsize: int, size: int, rank: int, per_node: int = 1) -> int:
    """A ring over L ranks in the node, plus the cross-node algorithm over H on this rank's shard.

    ``per_node`` is L, ranks placed in blocks of L (node = rank // L); 1 (or a size that
    is not H·L with H > 1) gives the flat ring this falls back to.
    """
    if size == 1 or count == 0:
        return 0
    if per_node <= 1 or size % per_node or size == per_node:
        return ring.bytes_sent(count, itemsize, size, rank)
    nodes, local_rank = size // per_node, rank % per_node
    start, stop = segment_bounds(count, per_node)[(local_rank + 1) % per_node]
    across = inter_module().bytes_sent(stop - start, itemsize, nodes, rank // per_node) if stop > start else 0
    return ring.bytes_sent(count, itemsize, per_node, local_rank) + across


def scratch_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """At most half the buffer: one in-node shard, n/L with L >= 2 (the flat ring needs n/G).

    The guard runs before the topology is known, so it assumes the smallest node of two.
    """
    return -(-count // 2) * itemsize if size > 1 and count else 0
