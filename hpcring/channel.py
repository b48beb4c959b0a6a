"""The communicator as the algorithms see it: their only surface to MPI.

A `Channel` holds hpcring's private duplicate of the user's communicator, the array
adapter of the call's arrays, grow-only scratch buffers, cached schedules, and a count of
the bytes hpcring hands to MPI. Every MPI call that moves an algorithm's data goes through
it, and so does every setup step an algorithm takes (the topology, a bounded barrier before
a collective that cannot be bounded itself), so the algorithms import nothing of MPI.
Device memory reaches MPI through the adapter's `mpi_view` (staged through pinned host
memory where MPI is not CUDA-aware); the streamed staging pipeline of the ring is the
adapter's `staging`, driven by `hpcring.algorithms.ring_staged`.

Bytes sent are counted as the payload hpcring gives MPI times the number of *other*
ranks it is addressed to: a Sendrecv to a neighbour counts its send buffer once, a
Gather counts each non-root's contribution once, a Bcast counts the root's buffer
G-1 times. How MPI routes that payload inside (trees, pipelines) is its own business;
the library's own collectives (`mpi`) are counted as unknown.

Two hooks let a channel change what travels without the algorithms knowing how:
`as_sent` (this rank keeps exactly what it sends of a finished piece) and `sub_channels`
(the channels of a two-level algorithm). A plain channel sends what it is given; a
`hpcring.wire.WireChannel` narrows it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from mpi4py import MPI

from . import config, topology
from .arrays import Adapter
from .errors import StallError
from .flight import Where
from .polling import Waiter, arrive, cancel
from .tracing import channel_call, channel_start, channel_wait


class Traffic:
    """Bytes handed to MPI, shared by a channel and its twins (a wire channel counts what travels)."""

    __slots__ = ("sent", "unknown")

    def __init__(self) -> None:
        self.sent = 0  # cumulative; the bench reads differences
        self.unknown = False  # set once an opaque library collective ran


class Channel:
    """hpcring's duplicate of one user communicator, for one array adapter."""

    wire: Any = None  # the dtype payloads travel as: None, as they are (`hpcring.wire.WireChannel`)

    def __init__(self, comm: MPI.Intracomm, adapter: Adapter, waiter: Waiter | None = None) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.adapter = adapter
        self.xp = adapter.xp
        self._host = adapter.direct and not adapter.device  # host arrays: MPI takes them as they are
        self.traffic = Traffic()
        self.step = 0  # exchanges begun in the current call (stepped algorithms): the flight record's step
        self.what = "the data exchange"  # how a StallError names this channel's waits (the engine sets it)
        self._scratch: dict[str, Any] = {}
        self._schedules: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._resources: dict[str, Any] = {}
        self.config = config.current()
        # Every wait is bounded: the engine sets ``timeout`` per call (None: no limit). The
        # waiter is the communicator's own where `hpcring.comm` passes it, so one receive is
        # posted for notices; a sub-communicator's channel makes its own.
        self.timeout: float | None = None
        self.waiter = Waiter(comm) if waiter is None else waiter
        self.owner: Any = None  # the CommState whose call number a stall notice carries
        self.names: list[int] | None = None  # these ranks' numbers in the parent communicator

    @property
    def bytes_sent(self) -> int:
        return self.traffic.sent

    @property
    def bytes_unknown(self) -> bool:
        return self.traffic.unknown

    def on(self, comm: MPI.Intracomm) -> Channel:
        """A channel on another communicator (a sub-communicator of this one) for the same arrays,
        under the same settings snapshot, its ranks named as this one's in a StallError."""
        sub = Channel(comm, self.adapter)
        sub.config = self.config
        parent, group = self.comm.Get_group(), comm.Get_group()
        sub.names = group.Translate_ranks(list(range(sub.size)), parent)
        group.Free()
        parent.Free()
        return sub

    # -- what the algorithms set up: topology, barriers, schedules, resources, scratch --

    def topology(self) -> topology.Topology:
        """Which ranks share a node (collective the first time on this communicator, bounded)."""
        return topology.of(self.comm, self.waiter if self.size > 1 else None, self.timeout)

    def arrive(self, what: str) -> None:
        """A bounded barrier before a collective that has no non-blocking form or takes a Python
        object: every rank is known to be there, or StallError naming the others."""
        arrive(self.waiter, self.timeout, what)

    def sub_channels(self, topo: topology.Topology) -> tuple[Channel, Channel]:
        """The node-local and cross-node channels of a two-level algorithm (`Topology.channels`)."""
        local, cross = topo.channels(self)
        local.timeout = cross.timeout = self.timeout
        return local, cross

    def as_sent(self, piece: Any) -> None:
        """This rank finished ``piece`` and will only send it on from now: afterwards it holds
        exactly what the others receive. A plain channel sends what it is given: nothing to do."""

    def travel_itemsize(self, itemsize: int) -> int:
        """Bytes an element of ``itemsize`` costs on the wire (chunks are sized by what travels)."""
        return itemsize

    SCHEDULES = 16  # schedules kept per channel; a training loop reuses a handful of bucket sizes

    def schedule(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        """The cached schedule for ``key``, built once by ``build()`` (least recently used go first).

        Schedules hold what an algorithm can work out before any data moves (bounds,
        neighbours, steps), so a warm call only reads them. They live as long as this
        Channel, which lives in the communicator's attribute: freeing the communicator frees them.
        """
        made = self.cached(key)
        if made is None:
            made = self._schedules[key] = build()
            if len(self._schedules) > self.SCHEDULES:
                self._schedules.popitem(last=False)
        return made

    def cached(self, key: tuple[Any, ...]) -> Any:
        """The schedule for ``key`` if one was built, as a use of it (None otherwise; builds nothing)."""
        made = self._schedules.get(key)
        if made is not None:
            self._schedules.move_to_end(key)
        return made

    def schedules(self) -> OrderedDict[tuple[Any, ...], Any]:
        """The schedules themselves (least recently used first), for the compiled core's warm calls
        to look a key up as `cached` does (hpcring.engine.Call._warm)."""
        return self._schedules

    def resource(self, name: str, build: Callable[[], Any]) -> Any:
        """An object made once per channel by ``build()`` and kept as long as it (a library's own
        communicator, say); unlike schedules, never evicted. ``build`` may be collective."""
        made = self._resources.get(name)
        if made is None:
            made = self._resources[name] = build()
        return made

    def discard(self) -> None:
        """Drop the scratch, schedules and resources: the communicator was freed."""
        self._scratch.clear()
        self._schedules.clear()
        self._resources.clear()

    def scratch_table(self) -> dict[str, Any]:
        """The scratch buffers by name (shared with a wire twin): where the compiled core finds
        the scratch a program's rows name, and notices one grown since."""
        return self._scratch

    def scratch_held(self) -> int:
        """Bytes of scratch this channel already holds (reused, so not needed again)."""
        return sum(buf.nbytes for buf in self._scratch.values())

    def scratch(self, name: str, count: int, dtype: np.dtype) -> Any:
        """A 1-D array of ``count`` elements, reused across calls (grow-only, one per name)."""
        nbytes = count * dtype.itemsize
        buf = self._scratch.get(name)
        if buf is None or buf.nbytes < nbytes:
            buf = self.adapter.empty(nbytes, np.dtype(np.uint8))
            self._scratch[name] = buf
        return buf[:nbytes].view(dtype)

    # -- waits: bounded by the call's timeout --

    def finish(self, request: MPI.Request, peer: int = -1, receive: bool = False) -> None:
        """Wait for ``request`` within the call's timeout, or raise StallError. ``peer``: the
        rank it waits for (-1: all); a ``receive`` that will not complete is cancelled first
        (sends and collectives cannot be: MPI-4 deprecates the one and forbids the other)."""
        woke = self.waiter.bounded(request, self.timeout)  # a request already done: one test
        if woke is not None:
            if receive:
                cancel(request)
            raise self._stall(woke, peer)

    def _stall(self, woke: int, peer: int) -> StallError:
        """The StallError of a wait inside an algorithm, naming ranks as the user's communicator does."""
        call = self.owner.calls if self.owner is not None else -1
        names = self.names
        what = self.what + (f" call {call}" if call >= 0 else "")
        if peer >= 0:
            what += f" (waiting for rank {peer if names is None else names[peer]})"
        error = self.waiter.stall(woke, what, self.timeout or 0.0, call, peer, Where.ALGORITHM)
        if names is not None:
            error.missing = [names[r] for r in error.missing]
            error.args = (f"{error.args[0]} (ranks of the sub-communicator {error.missing})",)
        return error

    @channel_wait
    def wait(self, request: MPI.Request, nap: float = 0.0) -> None:
        """Wait until ``request`` completes, within the call's timeout; with ``nap`` (seconds),
        sleep between tests instead of spinning in MPI, leaving the core to ranks that have work
        (oversubscribed nodes)."""
        if not nap:
            self.finish(request)
            return
        deadline = time.monotonic() + self.timeout if self.timeout else None
        while not request.Test():
            if deadline is not None and time.monotonic() > deadline:
                raise self._stall(self.rank, -1)  # the notice-and-listen road, from here
            time.sleep(nap)

    @channel_wait
    def waitall(self, requests: Iterable[MPI.Request], nap: float = 0.0) -> None:
        """Wait until every request in ``requests`` completes (``nap``: as `wait`)."""
        for request in requests:
            self.wait(request, nap)

    # -- point to point and collectives: raw bytes, so any dtype travels, even one the MPI
    # -- library has no datatype for (float16, bfloat16)

    def _exchange(self, send: Any, dest: int, recv: Any, source: int) -> None:
        """Sendrecv as a receive and a send, each waited for within the timeout."""
        comm = self.comm
        if self.timeout is None:  # timeout=0: no deadline, so MPI's own blocking call (its latency)
            comm.Sendrecv(send, dest, 0, recv, source, 0)
            return
        received = comm.Irecv(recv, source, 0)
        sent = comm.Isend(send, dest, 0)
        if not received.Test():
            self.finish(received, source, receive=True)
        if not sent.Test():
            self.finish(sent, dest)

    @channel_call
    def sendrecv(self, send: Any, dest: int, recv: Any, source: int) -> None:
        """Send ``send`` to ``dest`` while receiving ``recv`` from ``source``."""
        if dest != self.rank:
            self.traffic.sent += send.nbytes
        if self._host:  # NumPy: MPI reads and writes the arrays themselves, no view to set up
            self._exchange(_raw(send), dest, _raw(recv), source)
            return
        view = self.adapter.mpi_view
        with (
            view(send, copy_in=True, copy_out=False, slot=0) as s,
            view(recv, copy_in=False, copy_out=True, slot=1) as r,
        ):
            self._exchange(_raw(s), dest, _raw(r), source)

    @channel_call
    def sendrecv_host(self, send: np.ndarray, dest: int, recv: np.ndarray, source: int) -> None:
        """Sendrecv of host buffers that a staging pipeline filled (pinned slots): no view, no copy."""
        if dest != self.rank:
            self.traffic.sent += send.nbytes
        self._exchange(_raw(send), dest, _raw(recv), source)

    @channel_call
    def send(self, send: Any, dest: int) -> None:
        """Send ``send`` to ``dest``, returning once MPI is done with it."""
        if dest != self.rank:
            self.traffic.sent += send.nbytes
        with self.adapter.mpi_view(send, copy_in=True, copy_out=False) as s:
            self.finish(self.comm.Isend(_raw(s), dest, 0), dest)

    @channel_call
    def recv(self, recv: Any, source: int) -> None:
        """Receive into ``recv`` from ``source``."""
        with self.adapter.mpi_view(recv, copy_in=False, copy_out=True) as r:
            self.finish(self.comm.Irecv(_raw(r), source, 0), source, receive=True)

    # Non-blocking calls hand MPI the array's own memory until the request completes, so
    # they exist only where MPI reads the array directly (host memory, CUDA-aware MPI):
    # a staged copy would have to outlive the call. The view still synchronizes the
    # device stream first, so earlier kernels have written (or stopped reading) the buffer.

    @channel_start
    def isend(self, send: Any, dest: int, tag: int = 0) -> MPI.Request:
        """Start sending ``send`` to ``dest``; do not write ``send`` until the request is waited on."""
        if not self.adapter.direct:
            raise RuntimeError("Channel.isend needs a buffer MPI can read directly (host or CUDA-aware)")
        if dest != self.rank:
            self.traffic.sent += send.nbytes
        with self.adapter.mpi_view(send, copy_in=True, copy_out=False) as s:
            return self.comm.Isend(_raw(s), dest, tag)

    @channel_start
    def irecv(self, recv: Any, source: int, tag: int = 0) -> MPI.Request:
        """Start receiving into ``recv`` from ``source``; read it only after the request is waited on."""
        if not self.adapter.direct:
            raise RuntimeError("Channel.irecv needs a buffer MPI can write directly (host or CUDA-aware)")
        with self.adapter.mpi_view(recv, copy_in=False, copy_out=False) as r:
            return self.comm.Irecv(_raw(r), source, tag)

    @channel_call
    def gather(self, send: Any, stack: Any, root: int) -> None:
        """Gather ``send`` of every rank into row r of ``stack`` (G x n) at ``root``.

        The root's own row is already in place (MPI_IN_PLACE), so the root sends nothing.
        """
        view = self.adapter.mpi_view
        if self.rank == root:
            with view(stack, copy_in=True, copy_out=True) as r:
                self.finish(self.comm.Igather(MPI.IN_PLACE, _raw(r), root))
        else:
            self.traffic.sent += send.nbytes
            with view(send, copy_in=True, copy_out=False) as s:
                self.finish(self.comm.Igather(_raw(s), None, root), root)

    @channel_call
    def bcast(self, buf: Any, root: int) -> None:
        """Broadcast ``buf`` from ``root`` to every rank."""
        is_root = self.rank == root
        if is_root:
            self.traffic.sent += buf.nbytes * (self.size - 1)
        with self.adapter.mpi_view(buf, copy_in=is_root, copy_out=not is_root) as b:
            self.finish(self.comm.Ibcast(_raw(b), root), -1 if is_root else root)

    # -- the library's own collectives (`mpi`): typed buffers, blocking on purpose --
    #
    # On Open MPI 5 the non-blocking all-reduce with the test loop cost +0.9 us at 8 B, +5.4 us
    # at 4 KiB and +80 us (+50%) at 1 MiB (2 ranks, minimum of 4 runs), its non-blocking
    # collectives running other algorithms than its blocking ones. With ``check=True`` the
    # agreement has just seen every rank arrive at this very call; the watchdog
    # (`hpcring.watchdog`) covers a rank frozen inside it.

    def allreduce_init(self, src: Any, dst: Any, op: Any) -> MPI.Prequest | None:
        """A persistent MPI_Allreduce (MPI-4) on these very buffers, where MPI reads them directly
        (host memory, CUDA-aware MPI) and the library has one; None otherwise."""
        if not self.adapter.direct or not hasattr(self.comm, "Allreduce_init"):
            return None
        self.traffic.unknown = True
        try:
            return self.comm.Allreduce_init(MPI.IN_PLACE if src is dst else src, dst, op)
        except (NotImplementedError, MPI.Exception):  # an MPI before 4.0
            return None

    @channel_call
    def allreduce(self, src: Any, dst: Any, op: Any) -> None:
        """MPI_Allreduce with typed buffers (the MPI library must know the dtype)."""
        self.traffic.unknown = True
        if not self.adapter.device:  # host memory: MPI reads and writes the arrays themselves
            self.comm.Allreduce(MPI.IN_PLACE if src is dst else src, dst, op)
            return
        view = self.adapter.mpi_view
        if src is dst:
            with view(dst, copy_in=True, copy_out=True) as d:
                self.comm.Allreduce(MPI.IN_PLACE, d, op)
        else:
            with (
                view(src, copy_in=True, copy_out=False, slot=0) as s,
                view(dst, copy_in=False, copy_out=True, slot=1) as d,
            ):
                self.comm.Allreduce(s, d, op)

    @channel_call
    def reduce_scatter(self, src: Any, dst: Any, counts: list[int], op: Any) -> None:
        """MPI_Reduce_scatter: rank r's ``counts[r]`` elements of the reduction land in its ``dst``."""
        self.traffic.unknown = True
        view = self.adapter.mpi_view
        with (
            view(src, copy_in=True, copy_out=False, slot=0) as s,
            view(dst, copy_in=False, copy_out=True, slot=1) as d,
        ):
            self.comm.Reduce_scatter(s, d, counts, op)

    @channel_call
    def allgather(self, src: Any, dst: Any) -> None:
        """MPI_Allgather of raw bytes: every rank's ``src`` into its row of ``dst``, in rank order
        (``src`` None: this rank's row of ``dst`` holds it already, MPI_IN_PLACE)."""
        self.traffic.unknown = True
        view = self.adapter.mpi_view
        if src is None:
            with view(dst, copy_in=True, copy_out=True) as d:
                self.comm.Allgather(MPI.IN_PLACE, _raw(d))
            return
        with (
            view(src, copy_in=True, copy_out=False, slot=0) as s,
            view(dst, copy_in=False, copy_out=True, slot=1) as d,
        ):
            self.comm.Allgather(_raw(s), _raw(d))

    @channel_call
    def broadcast(self, buf: Any, root: int) -> None:
        """MPI_Bcast of raw bytes from ``root`` (the library's own tree)."""
        self.traffic.unknown = True
        with self.adapter.mpi_view(buf, copy_in=self.rank == root, copy_out=self.rank != root) as b:
            self.comm.Bcast(_raw(b), root)

    @channel_call
    def alltoall(self, src: Any, dst: Any) -> None:
        """MPI_Alltoall of raw bytes: block i of ``src`` to rank i, rank i's block into row i of ``dst``."""
        self.traffic.unknown = True
        if self._host:  # NumPy: MPI reads and writes the arrays themselves, no view to set up
            self.comm.Alltoall(_raw(src), _raw(dst))
            return
        view = self.adapter.mpi_view
        with (
            view(src, copy_in=True, copy_out=False, slot=0) as s,
            view(dst, copy_in=False, copy_out=True, slot=1) as d,
        ):
            self.comm.Alltoall(_raw(s), _raw(d))

    @channel_call
    def alltoallv(
        self,
        src: Any,
        send_counts: tuple[int, ...],
        send_displs: tuple[int, ...],
        dst: Any,
        recv_counts: tuple[int, ...],
        recv_displs: tuple[int, ...],
    ) -> None:
        """MPI_Alltoallv of raw bytes; counts and displacements in elements of ``src``'s dtype."""
        self.traffic.unknown = True
        item = src.dtype.itemsize
        view = self.adapter.mpi_view
        with (
            view(src, copy_in=True, copy_out=False, slot=0) as s,
            view(dst, copy_in=False, copy_out=True, slot=1) as d,
        ):
            self.comm.Alltoallv(
                [_raw(s), [c * item for c in send_counts], [o * item for o in send_displs], MPI.BYTE],
                [_raw(d), [c * item for c in recv_counts], [o * item for o in recv_displs], MPI.BYTE],
            )

    # -- small setup exchanges a collective makes before its data moves, bounded by the timeout --

    def counts(self, sends: list[int]) -> list[int]:
        """``sends[i]`` to rank i, and what each rank sent this one (an all-to-all of G integers,
        MPI_Ialltoall, waited for within the timeout): how an uneven all-to-all learns its
        receive counts."""
        out = np.empty(self.size, dtype=np.int64)
        self.finish(self.comm.Ialltoall(np.asarray(sends, dtype=np.int64), out))
        return out.tolist()

    def table(self, row: list[int]) -> np.ndarray:
        """Every rank's ``row`` of integers (all of one length), by rank (MPI_Iallgather, waited for
        within the timeout)."""
        mine = np.asarray(row, dtype=np.int64)
        out = np.empty((self.size, mine.size), dtype=np.int64)
        self.finish(self.comm.Iallgather(mine, out))
        return out

    def verdict(self, bad: bool) -> bool:
        """Whether any rank's ``bad`` is true (MPI_Iallreduce under MAX of one integer, waited for
        within the timeout): every rank learns the same answer, so all raise or none."""
        word = np.array([int(bad)], dtype=np.int64)
        self.finish(self.comm.Iallreduce(MPI.IN_PLACE, word, MPI.MAX))
        return bool(word[0])


def _raw(array: Any) -> Any:
    """The same memory as bytes, so MPI needs no datatype for it."""
    if array.ndim != 1:
        array = array.reshape(-1)
    return array.view(np.uint8) if array.dtype != np.uint8 else array
