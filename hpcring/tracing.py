"""Tracing: every step of every all-reduce, per rank, merged into one Chrome trace file.

``HPCRING_TRACE=trace.json`` (read when hpcring is imported) or ``with hpcring.trace(path):``
records each MPI call the algorithms make through `Channel` (send, receive, gather, bcast,
wait), each local reduction of `Op`, each local copy and each device<->host staging copy,
with its start and duration. At the end of the ``with`` (or at exit, for the variable) rank
0 gathers every rank's events and writes one trace-event JSON file that Perfetto
(https://ui.perfetto.dev) and chrome://tracing open: one process row per rank.

Every buffer is described relative to the user's flat buffer when it is a view of it
(``buffer`` "src", "dst" or "buf" for in place, ``offset`` and ``bytes``), so a reader (and
`hpcring.viz`) can tell which segment moved; other memory is "scratch", with its address.

Off by default, and then free: the Channel and Op methods marked as hooks are the plain
functions (the traced versions replace them on their classes only while a tracer is on),
and the few other hooks (api's call context, naive's and ps's local copies, CuPy staging)
check one attribute (``TRACER.on``) of a `NullTracer`. The hot path formats nothing and
allocates nothing.
"""

from __future__ import annotations

import atexit
import functools
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from . import config

ENV = config.Config.trace.name  # HPCRING_TRACE

# Rows inside one rank's process in the viewer: MPI sends (and the whole call), receives
# and waits, local work. Overlapping non-blocking calls thus stay readable.
TID_SEND, TID_RECV, TID_COMPUTE = 0, 1, 2
MPI_CALLS = "mpi"  # the category of the events that are MPI calls (a reader such as `hpcring.viz` asks it)
_THREAD_NAMES = {TID_SEND: "call / send", TID_RECV: "receive / wait", TID_COMPUTE: "reduce / copy"}


class NullTracer:
    """Tracing off: every hook is a no-op, so an off tracer costs one attribute read or call."""

    on = False

    def begin(self, collective: str, algorithm: str, channel: Any, src: Any, dst: Any) -> None:
        pass

    def end(self) -> None:
        pass

    def copy(self, dst: Any, src: Any) -> None:
        pass


class Tracer(NullTracer):
    """Tracing on: collects this rank's events in memory, as trace-event dicts."""

    on = True

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.events: list[dict[str, Any]] = []
        self.calls = 0
        self._context: dict[str, Any] = {}
        self._bases: tuple[tuple[str, int, int], ...] = ()
        self._pointer: Callable[[Any], int] = _pointer
        self._call_start = 0.0
        self._requests: dict[int, dict[str, Any]] = {}

    @staticmethod
    def now() -> float:
        """Microseconds (the trace-event unit) on this process's monotonic clock."""
        return time.perf_counter_ns() / 1000.0

    # --- per call context, set by the engine ------------------------------------------------

    def begin(self, collective: str, algorithm: str, channel: Any, src: Any, dst: Any) -> None:
        self.calls += 1
        backend = channel.adapter
        self._pointer = backend.data_pointer
        n = src.nbytes
        if dst is src:
            self._bases = (("buf", backend.data_pointer(src), n),) if n else ()
        else:
            self._bases = (
                (("src", backend.data_pointer(src), n), ("dst", backend.data_pointer(dst), n)) if n else ()
            )
        self._context = {
            "called": collective,
            "algorithm": algorithm,
            "call": self.calls,
            "count": int(src.size),
            "itemsize": int(src.dtype.itemsize),
            "dtype": src.dtype.name,
            "size": channel.size,
            "rank": channel.rank,
            "in_place": dst is src,
            "backend": backend.name,
        }
        self._call_start = self.now()

    def end(self) -> None:
        start = self._call_start
        context = self._context
        name = f"{context.get('called')} {context.get('algorithm')}"
        self._emit(name, "call", start, self.now() - start, TID_SEND)
        # Channel use outside a call (none in hpcring today) must not borrow this call's labels.
        self._context, self._bases = {}, ()

    # --- buffers -------------------------------------------------------------------------

    def where(self, array: Any) -> dict[str, Any]:
        """Which memory ``array`` is: a slice of the user's buffer (byte offset, length) or scratch."""
        if array is None:
            return {}
        nbytes = int(array.nbytes)
        try:
            address = self._pointer(array)
        except Exception:  # an array of another kind (a staging buffer): still describe it
            address = _pointer(array)
        # An empty view may not point where its slice starts (NumPy points it at the base),
        # so the offset of an empty buffer says nothing: its "bytes" (0) do.
        for name, base, length in self._bases:
            if base <= address < base + length or (nbytes == 0 and address == base + length):
                return {"buffer": name, "offset": address - base, "bytes": nbytes}
        return {"buffer": "scratch", "address": address, "bytes": nbytes}

    # --- events --------------------------------------------------------------------------

    def _emit(self, name: str, category: str, start: float, duration: float, tid: int, **args: Any) -> None:
        self.events.append(
            {
                "name": name,
                "cat": category,
                "ph": "X",
                "ts": start,
                "dur": duration,
                "pid": self.rank,
                "tid": tid,
                "args": {**self._context, **args},
            }
        )

    def transfer(
        self, kind: str, start: float, array: Any, peer: Any, end: float | None = None, **extra: Any
    ) -> None:
        """One send (kind "send") or receive ("recv") of ``array`` to or from ``peer``."""
        tid = TID_SEND if kind == "send" else TID_RECV
        duration = (self.now() if end is None else end) - start
        self._emit(kind, MPI_CALLS, start, duration, tid, peer=peer, **self.where(array), **extra)

    def reduce(self, start: float, left: Any, right: Any, out: Any) -> None:
        self._emit(
            "reduce",
            "compute",
            start,
            self.now() - start,
            TID_COMPUTE,
            left=self.where(left),
            right=self.where(right),
            out=self.where(out),
            **self.where(out),
        )

    def copy(self, dst: Any, src: Any) -> None:
        """A local copy an algorithm made outside MPI (``dst[...] = src``), already done."""
        now = self.now()
        self._emit("copy", "compute", now, 0.0, TID_COMPUTE, src=self.where(src), dst=self.where(dst))

    def staging(self, direction: str, start: float, device: Any, host: Any) -> None:
        """A device<->host staging copy around an MPI call (``direction`` "d2h" or "h2d")."""
        self._emit(direction, "copy", start, self.now() - start, TID_COMPUTE, **self.where(device))

    def request(self, request: Any, kind: str, array: Any, peer: int) -> None:
        self._requests[id(request)] = {"kind": kind, "peer": peer, **self.where(array)}

    def waited(self, start: float, requests: list[Any]) -> None:
        done = [self._requests.pop(id(r), {}) for r in requests]
        self._emit("wait", MPI_CALLS, start, self.now() - start, TID_RECV, requests=done)

    # --- merging -------------------------------------------------------------------------

    def collect(self, comm: Any) -> list[dict[str, Any]] | None:
        """Every rank's events on rank 0 of ``comm`` (None elsewhere), on one time line.

        Clocks of different processes are not aligned: the ranks leave a barrier together,
        so each rank's clock reading just after it becomes that rank's zero.
        """
        comm.Barrier()
        zero = self.now()
        for event in self.events:
            event["ts"] = round(event["ts"] - zero, 3)
            event["dur"] = round(event["dur"], 3)
        parts = comm.gather(self.events, root=0)
        self.events = []
        if parts is None:
            return None
        first = min((event["ts"] for events in parts for event in events), default=0.0)
        for events in parts:  # the earliest event of the run at 0: some viewers dislike negative times
            for event in events:
                event["ts"] = round(event["ts"] - first, 3)
        merged: list[dict[str, Any]] = []
        for rank, events in enumerate(parts):
            pid = events[0]["pid"] if events else rank
            merged.append(
                {
                    "name": "process_name",
                    "ph": "M",
                    "ts": 0,
                    "pid": pid,
                    "tid": 0,
                    "args": {"name": f"rank {pid}"},
                }
            )
            merged.append(
                {
                    "name": "process_sort_index",
                    "ph": "M",
                    "ts": 0,
                    "pid": pid,
                    "tid": 0,
                    "args": {"sort_index": pid},
                }
            )
            for tid, label in _THREAD_NAMES.items():
                merged.append(
                    {
                        "name": "thread_name",
                        "ph": "M",
                        "ts": 0,
                        "pid": pid,
                        "tid": tid,
                        "args": {"name": label},
                    }
                )
            merged.extend(events)
        return merged


def _pointer(array: Any) -> int:
    """The address of any native array, whichever adapter made it (a pinned staging buffer is NumPy's).

    Imported here, only while tracing: `import hpcring` loads this module, and must stay light
    enough for the cost model's predictions (no NumPy, no MPI)."""
    from .arrays import adapter_for

    return adapter_for(array).data_pointer(array)


TRACER: NullTracer = NullTracer()


def write(path: str | os.PathLike[str], events: list[dict[str, Any]]) -> None:
    """Write ``events`` as a Chrome trace-event JSON object (``traceEvents`` plus units)."""
    import json  # here: a process that never writes a trace never loads it

    with open(path, "w") as stream:
        json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, stream)


def start(comm: Any = None) -> Tracer:
    """Turn tracing on in this process (idempotent); returns the tracer."""
    global TRACER
    if not TRACER.on:
        from mpi4py import MPI

        TRACER = Tracer((comm or MPI.COMM_WORLD).Get_rank())
        _install(True)
    assert isinstance(TRACER, Tracer)
    return TRACER


def stop(path: str | os.PathLike[str], comm: Any = None) -> None:
    """Turn tracing off; rank 0 of ``comm`` (default COMM_WORLD) writes every rank's events to ``path``.

    Collective over ``comm``. If MPI is already finalized, each rank writes its own
    ``path.rank<r>.json`` instead, which `merge` joins.
    """
    global TRACER
    tracer, TRACER = TRACER, NullTracer()
    _install(False)
    if not isinstance(tracer, Tracer):
        return
    from mpi4py import MPI

    if MPI.Is_finalized():
        write(f"{path}.rank{tracer.rank}.json", tracer.events)
        return
    events = tracer.collect(comm or MPI.COMM_WORLD)
    if events is not None:
        write(path, events)


@contextmanager
def trace(path: str | os.PathLike[str], comm: Any = None) -> Iterator[Tracer]:
    """Record every all-reduce step inside the ``with`` into ``path`` (written by rank 0 on exit).

    Collective over ``comm`` (default COMM_WORLD): every rank enters and leaves it.
    """
    tracer = start(comm)
    try:
        yield tracer
    finally:
        stop(path, comm)


def merge(paths: list[str], out: str) -> None:
    """Join per-rank files (written when MPI was finalized before the merge) into one."""
    import json

    events: list[dict[str, Any]] = []
    for path in paths:
        with open(path) as stream:
            data = json.load(stream)
        events.extend(data["traceEvents"] if isinstance(data, dict) else data)
    write(out, events)


def from_environment() -> None:
    """Honour ``HPCRING_TRACE=path``: trace from now on, write the file at exit."""
    path = config.current().trace
    if path and not TRACER.on:
        start()
        atexit.register(stop, path)  # after mpi4py's own handler, so it runs before MPI_Finalize


# --- hooks -------------------------------------------------------------------------------
# Other modules call these functions (never ``TRACER`` itself); each reads the global at call time.


def call_begin(collective: str, algorithm: str, channel: Any, src: Any, dst: Any) -> None:
    """The engine, before the algorithm runs: which call, which algorithm, where the buffers are."""
    if TRACER.on:
        TRACER.begin(collective, algorithm, channel, src, dst)


def call_end() -> None:
    """The engine, after the algorithm (and mean): one span for the whole call."""
    if TRACER.on:
        TRACER.end()


def local_copy(dst: Any, src: Any) -> None:
    """An algorithm's ``dst[...] = src`` outside MPI, so a replay knows what ``dst`` holds."""
    if TRACER.on:
        TRACER.copy(dst, src)


clock = Tracer.now


def staging(direction: str, start: float, device: Any, host: Any) -> None:
    """An adapter's mpi_view: a device<->host copy that began at ``clock()`` time ``start``."""
    if TRACER.on:
        TRACER.staging(direction, start, device, host)


def _sendrecv(tracer: Tracer, start: float, ch: Any, send: Any, dest: int, recv: Any, source: int) -> None:
    end = tracer.now()  # one MPI call: both halves share its span
    tracer.transfer("send", start, send, dest, end)
    tracer.transfer("recv", start, recv, source, end)


def _send(tracer: Tracer, start: float, ch: Any, send: Any, dest: int) -> None:
    tracer.transfer("send", start, send, dest)


def _recv(tracer: Tracer, start: float, ch: Any, recv: Any, source: int) -> None:
    tracer.transfer("recv", start, recv, source)


def _gather(tracer: Tracer, start: float, ch: Any, send: Any, stack: Any, root: int) -> None:
    if ch.rank == root:
        end = tracer.now()
        for row in range(ch.size):
            if row != root:
                tracer.transfer("recv", start, stack[row], row, end, collective="gather")
    else:
        tracer.transfer("send", start, send, root, collective="gather")


def _bcast(tracer: Tracer, start: float, ch: Any, buf: Any, root: int) -> None:
    if ch.rank == root:
        end = tracer.now()
        for peer in range(ch.size):
            if peer != root:
                tracer.transfer("send", start, buf, peer, end, collective="bcast")
    else:
        tracer.transfer("recv", start, buf, root, collective="bcast")


def _library(name: str, result: int) -> Callable[..., None]:
    """A recorder of one library collective (`mpi`'s): one span, on the buffer argument
    ``result`` (the output) of the Channel method."""

    def record(tracer: Tracer, start: float, ch: Any, *args: Any) -> None:
        tracer._emit(name, MPI_CALLS, start, tracer.now() - start, TID_SEND, **tracer.where(args[result]))

    return record


_RECORDERS: dict[str, Callable[..., None]] = {
    "sendrecv": _sendrecv,
    "sendrecv_host": _sendrecv,
    "send": _send,
    "recv": _recv,
    "gather": _gather,
    "bcast": _bcast,
    "allreduce": _library("MPI_Allreduce", 1),
    "reduce_scatter": _library("MPI_Reduce_scatter", 1),
    "allgather": _library("MPI_Allgather", 1),
    "broadcast": _library("MPI_Bcast", 0),
    "alltoall": _library("MPI_Alltoall", 1),
    "alltoallv": _library("MPI_Alltoallv", 3),
}


class _Hook:
    """A traced method's two versions; the class holds the plain one while tracing is off.

    As a decorator's result it lives in the class body only until the class is created:
    ``__set_name__`` puts the undecorated function back, so an off hook is not even a
    wrapper call, and `_install` swaps the traced version in for as long as tracing is on.
    """

    def __init__(self, plain: Any, traced: Any) -> None:
        self.plain, self.traced = plain, traced

    def __set_name__(self, owner: type, name: str) -> None:
        setattr(owner, name, self.traced if TRACER.on else self.plain)
        _HOOKS.append((owner, name, self.plain, self.traced))


_HOOKS: list[tuple[type, str, Any, Any]] = []


def _install(on: bool) -> None:
    """Put the traced (on) or the plain (off) version of every hooked method on its class."""
    for owner, name, plain, traced in _HOOKS:
        setattr(owner, name, traced if on else plain)


def hooked() -> bool:
    """Whether the traced versions are in place (only while a tracer is on)."""
    return any(getattr(owner, name) is traced for owner, name, _, traced in _HOOKS)


def channel_call(method: Callable[..., Any]) -> Any:
    """Trace a blocking `Channel` method: one event per message it sends or receives."""
    record = _RECORDERS[method.__name__]

    @functools.wraps(method)
    def traced(ch: Any, *args: Any) -> Any:
        tracer = TRACER
        if not tracer.on:
            return method(ch, *args)
        start = tracer.now()
        result = method(ch, *args)
        record(tracer, start, ch, *args)
        return result

    return _Hook(method, traced)


def channel_start(method: Callable[..., Any]) -> Callable[..., Any]:
    """Trace `Channel.isend`/`irecv`: the event marks the start, the wait says which completed."""
    kind = "send" if method.__name__ == "isend" else "recv"

    @functools.wraps(method)
    def traced(ch: Any, array: Any, peer: int, *tag: int) -> Any:
        tracer = TRACER
        if not tracer.on:
            return method(ch, array, peer, *tag)
        start = tracer.now()
        request = method(ch, array, peer, *tag)
        tracer.transfer(kind, start, array, peer, nonblocking=True)
        tracer.request(request, kind, array, peer)
        return request

    return _Hook(method, traced)


def channel_wait(method: Callable[..., Any]) -> Any:
    """Trace `Channel.wait`/`waitall`: how long the rank blocked, and for what."""

    @functools.wraps(method)
    def traced(ch: Any, requests: Any, *nap: float) -> Any:
        tracer = TRACER
        if not tracer.on:
            return method(ch, requests, *nap)
        many = method.__name__ == "waitall"
        pending = list(requests) if many else [requests]
        start = tracer.now()
        result = method(ch, pending if many else requests, *nap)
        tracer.waited(start, pending)
        return result

    return _Hook(method, traced)


def reduction(method: Callable[..., Any]) -> Any:
    """Trace `Op.reduce` (acc, other) and `Op.combine` (left, right, out)."""

    @functools.wraps(method)
    def traced(op: Any, xp: Any, left: Any, right: Any, *out: Any) -> Any:
        tracer = TRACER
        if not tracer.on:
            return method(op, xp, left, right, *out)
        start = tracer.now()
        result = method(op, xp, left, right, *out)
        tracer.reduce(start, left, right, out[0] if out else left)
        return result

    return _Hook(method, traced)
