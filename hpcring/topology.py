"""Which ranks share a node: found once per communicator, cached, freed with it.

A node is what MPI calls a shared-memory domain (``MPI_Comm_split_type`` with
``COMM_TYPE_SHARED``): the ranks that can reach each other without the network. From
that split every rank learns how many nodes there are, how many ranks each holds, and
the ring order that keeps neighbours on one node (ranks grouped by node, nodes in order
of their lowest rank). Where every node holds the same number L > 1 of ranks and there
is more than one node, it also makes the communicator of the ranks with the same local
rank across nodes: the one `hierarchical` reduces each shard on.

``HPCRING_RANKS_PER_NODE=L`` (the same on every rank) replaces the shared-memory split
by blocks of L consecutive ranks: for a machine whose MPI reports the wrong domains,
and to run the two-level algorithm on one machine in tests. It is read (from
`hpcring.config.current()`) when a communicator is first used.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

from . import config, polling
from .arrays import device_key
from .polling import Waiter, arrive

if TYPE_CHECKING:
    from .channel import Channel


class Topology:
    """The nodes of one communicator, as seen from this rank. (A plain class: a dataclass costs
    every process its creation at the first call, and this one is never compared.)"""

    def __init__(
        self,
        size: int,
        rank: int,
        node: int,
        local_rank: int,
        per_node: tuple[int, ...],
        order: tuple[int, ...],
    ) -> None:
        self.size, self.rank = size, rank
        self.node = node  # index of this rank's node (nodes numbered by their lowest rank)
        self.local_rank = local_rank
        self.per_node = per_node  # ranks on each node, in node order
        self.order = order  # ranks grouped by node: a ring in this order crosses nodes H times
        self.local: MPI.Intracomm | None = None  # the ranks of this node (None when unused)
        self.cross: MPI.Intracomm | None = None  # same local rank on every node (two-level case only)
        self.ring: tuple[int, ...] | None = None  # ``order`` where it differs from rank order, else None
        self._channels: dict[Any, tuple[Channel, Channel]] = {}

    def __repr__(self) -> str:
        where = f"rank {self.rank}, node {self.node}, local rank {self.local_rank}"
        return f"Topology({self.describe()}, {where})"

    @property
    def nodes(self) -> int:
        return len(self.per_node)

    @property
    def uniform(self) -> bool:
        """Every node holds the same number of ranks."""
        return len(set(self.per_node)) == 1

    @property
    def two_level(self) -> bool:
        """Several nodes, the same number L > 1 of ranks on each: where `hierarchical` applies."""
        return self.nodes > 1 and self.uniform and self.per_node[0] > 1

    def describe(self) -> str:
        """'2 nodes x 2 ranks' (or '3 nodes, ranks per node 1-2')."""
        if self.uniform:
            nodes, ranks = self.nodes, self.per_node[0]
            return f"{nodes} node{'s' * (nodes > 1)} x {ranks} rank{'s' * (ranks > 1)}"
        return f"{self.nodes} nodes, ranks per node {min(self.per_node)}-{max(self.per_node)}"

    def summary(self) -> dict[str, Any]:
        """The topology as the bench header and JSON show it, and as `auto` keys its tables."""
        return {
            "describe": self.describe(),
            "nodes": self.nodes,
            "ranks_per_node": list(self.per_node),
            "two_level": self.two_level,
            "ring_order": "node order" if self.order != tuple(range(self.size)) else "rank order",
        }

    def channels(self, channel: Channel) -> tuple[Channel, Channel]:
        """Channels on the node-local and cross-node communicators, for ``channel``'s arrays and
        device (scratch made on one GPU is not used on another, as for the main channel)."""
        key = device_key(channel.adapter)
        made = self._channels.get(key)
        if made is None:
            if self.local is None or self.cross is None:
                raise RuntimeError("hpcring.topology: no sub-communicators (not a two-level topology)")
            made = self._channels[key] = (channel.on(self.local), channel.on(self.cross))
        return made

    def close(self) -> None:
        """Free the sub-communicators (once; nothing after MPI_Finalize)."""
        for pair in self._channels.values():
            for sub in pair:
                sub.waiter.close()
        self._channels.clear()
        for name in ("local", "cross"):
            comm = getattr(self, name)
            setattr(self, name, None)
            if comm is not None and not MPI.Is_finalized():
                polling.free(comm)  # kept where a wait on it gave up


def discover(comm: MPI.Intracomm) -> Topology:
    """Find the nodes of ``comm`` (collective: one split, one allgather, one more split if two-level)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    forced = config.current().ranks_per_node
    if forced is None:
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    else:
        local = comm.Split(rank // forced, rank)
    # Local rank 0 is the node's lowest rank (key=rank): it names the node. Its rank here is read
    # from the two groups, with no message (a first call's collectives each cost a round).
    mine, whole = local.Get_group(), comm.Get_group()
    leader = MPI.Group.Translate_ranks(mine, [0], whole)[0]
    mine.Free()
    whole.Free()
    everyone = comm.allgather((leader, local.Get_rank()))
    leaders = sorted({lead for lead, _ in everyone})
    node_of = [leaders.index(lead) for lead, _ in everyone]
    per_node = tuple(node_of.count(node) for node in range(len(leaders)))
    topo = Topology(
        size=size,
        rank=rank,
        node=node_of[rank],
        local_rank=everyone[rank][1],
        per_node=per_node,
        order=tuple(sorted(range(size), key=lambda r: (node_of[r], r))),
    )
    topo.ring = None if topo.order == tuple(range(size)) else topo.order
    if topo.two_level:
        topo.local = local
        topo.cross = comm.Split(topo.local_rank, topo.node)
    else:
        local.Free()
    return topo


_keyval: int | None = None
_lock = threading.Lock()


def _delete(comm: MPI.Comm, keyval: int, topo: Topology) -> None:
    """Attribute delete callback: the communicator is freed, so are its sub-communicators."""
    topo.close()


def of(comm: MPI.Intracomm, waiter: Waiter | None = None, timeout: float | None = None) -> Topology:
    """The cached topology of ``comm`` (collective the first time: every rank must call it then).

    With ``waiter`` (on ``comm``), the discovery is preceded by a bounded barrier on it, within
    ``timeout`` seconds (None: no limit): MPI_Comm_split_type has no non-blocking form, so every
    rank is first known to be there, or every rank that is raises StallError.

    Cached as an attribute of ``comm`` itself, so a warm call makes no communicator and
    freeing ``comm`` (hpcring's private duplicate, freed with the user's) frees the
    sub-communicators too.
    """
    global _keyval
    with _lock:
        if _keyval is None:
            _keyval = MPI.Comm.Create_keyval(delete_fn=_delete)
    topo = comm.Get_attr(_keyval)
    if topo is None:
        if waiter is not None:
            arrive(waiter, timeout, "hpcring's topology discovery")
        topo = discover(comm)
        comm.Set_attr(_keyval, topo)
    return topo


def known(comm: MPI.Intracomm) -> Topology | None:
    """``comm``'s topology where `of` has found it, else None (local: discovers nothing)."""
    return None if _keyval is None else comm.Get_attr(_keyval)


__all__ = ["Topology", "discover", "known", "of"]
