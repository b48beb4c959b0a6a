"""Point to point for the ``"hpcring"`` backend: send, recv and recv_anysource, non-blocking, with tags.

Pipeline parallelism (`torch.distributed.pipelining`) passes activations with ``isend``/``irecv``
and ``batch_isend_irecv``, which on any backend but NCCL's issues its operations one at a time:
a send that waited for its receiver would deadlock a ring of sends. So a send is an
``MPI_Isend`` that returns at once, a receive an ``MPI_Irecv``, each on the group's own
communicator for point to point (a duplicate made with the group: its tags never meet
hpcring's collectives or the user's messages), and the `Transfer` (a torch ``Work``) completes
when MPI says so.

Who drives MPI: the thread that waits. ``wait()`` tests the request in a loop, as ``MPI_Wait``
does (yielding its core between tests once the peer is not there at once, napping once it has
waited long), so a step's latency is the library's and no thread spins between steps.
``is_completed()`` tests once; a ``get_future()`` hands the transfer to the group's `Poller`,
one thread that tests the transfers whose futures someone holds and naps between rounds. A
transfer that does not complete within the group's timeout raises `hpcring.StallError` naming
the peer (a receive is cancelled first; a send cannot be, and its buffer is kept for good, as a
stalled collective's are). Each transfer takes a slot in the communicator's flight record
(`hpcring.flight`), so a dump shows the sends and receives a rank was in.
"""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from ..agreement import Row
from ..errors import StallError
from ..flight import MASK, MOVING, Recorder, clock
from ..polling import ABANDONED, cancel, free, gave_up

YIELD_AFTER = 64  # tests before a waiting thread yields its core between tests (os.sched_yield)
NAP_AFTER = 0.05  # seconds without completion after which it naps instead: a peer that late is busy
NAP = 2e-4  # seconds of that nap
POLL = 2e-4  # the poller's pause between rounds
_NOT_STEPPED = SimpleNamespace(stepped=False)


class Record:
    """What a flight slot says of a transfer (`hpcring.flight.facts` reads it as a call); its row
    is made only when a record is read."""

    __slots__ = ("kind", "nbytes", "peer", "tag")
    ran, spec, channel = None, _NOT_STEPPED, None

    def __init__(self, kind: str, nbytes: int, peer: int, tag: int) -> None:
        self.kind, self.nbytes, self.peer, self.tag = kind, nbytes, peer, tag

    @property
    def row(self) -> Row:
        return Row(
            collective=self.kind,
            count=self.nbytes,
            dtype=np.dtype(np.uint8),
            op=None,
            algorithm=f"MPI_I{self.kind.removesuffix('_anysource')} (tag {self.tag})",
            array="torch.Tensor",
            placement=None,
            root=self.peer,
            settings=0,
            wire=None,
        )


class Transfer(dist.Work):
    """One send or receive in flight (module docstring): a torch ``Work``."""

    def __init__(
        self,
        p2p: P2P,
        request: MPI.Request,
        tensor: torch.Tensor,
        kind: str,
        peer: int,
        tag: int,
        keep: Any,
        then: Any = None,
    ) -> None:
        super().__init__()
        self._p2p, self._request, self._keep, self._then = p2p, request, keep, then
        self._tensor, self._peer, self._tag, self._kind = tensor, peer, tag, kind
        self._status = MPI.Status() if peer < 0 else None
        self._source = peer
        self._lock = threading.Lock()
        self._done = False
        self._error: BaseException | None = None
        self._future: torch.futures.Future[Any] | None = None
        self._deadline = time.monotonic() + p2p.timeout if p2p.timeout > 0 else None
        flight = p2p.flight
        seq = flight.seq = flight.seq + 1
        self._slot = slot = flight.slots[seq & MASK]
        slot.call, slot.number, slot.phase, slot.start = (
            Record(kind, len(keep), peer, tag),
            0,
            MOVING,
            clock(),
        )

    def _test(self) -> bool:
        """One MPI_Test (under this transfer's lock: two threads never test one request); True once done."""
        with self._lock:
            if self._done:
                return True
            try:
                done = self._request.Test(self._status)
            except MPI.Exception as error:
                self._finish(error)
                return True
            if not done:
                if self._deadline is not None and time.monotonic() > self._deadline:
                    self._finish(self._stall())
                    return True
                return False
            if self._status is not None:  # recv_anysource: who sent it
                self._source = self._status.Get_source()
            error: BaseException | None = None
            if self._then is not None:
                try:
                    self._then()
                except BaseException as failed:
                    error = failed
            self._slot.end = clock()
            self._finish(error)
            return True

    def _finish(self, error: BaseException | None) -> None:
        self._done, self._error, self._keep = True, error, None if error is None else self._keep
        if error is not None:
            self._p2p.flight.failed(self._slot, error)
        future = self._future
        if future is not None:
            if error is None:
                future.set_result([self._tensor])
            else:
                future.set_exception(error)

    def _stall(self) -> StallError:
        gave_up(self._p2p.comm)  # what was sent on it may never be received: kept, never freed
        if self._kind == "send":
            ABANDONED.append(self._request)  # MPI may still read the buffer: kept for good
            ABANDONED.append(self._keep)  # type: ignore[arg-type]
        else:
            cancel(self._request)
        who = "any rank" if self._kind == "recv_anysource" else f"rank {self._peer}"
        missing = [] if self._kind == "recv_anysource" else [self._peer]
        what = "send to" if self._kind == "send" else "recv from"
        return StallError(missing, f"the hpcring backend's {what} {who} (tag {self._tag})", self._p2p.timeout)

    def wait(self, timeout: Any = None) -> bool:
        """Test until done (this thread drives MPI, as MPI_Wait does, yielding its core between
        tests once the peer is not there at once), bounded by the group's timeout; raise what the
        transfer raised."""
        tests = 0
        began = 0.0
        while not self._test():
            tests += 1
            if tests < YIELD_AFTER:
                continue
            if tests == YIELD_AFTER:
                began = time.monotonic()
            if tests & 63 or time.monotonic() - began < NAP_AFTER:
                os.sched_yield()
            else:
                time.sleep(NAP)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._test()

    def is_success(self) -> bool:
        return self._test() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error if self._done else None

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return [self._tensor]

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future[Any]:
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                if self._done:
                    if self._error is None:
                        self._future.set_result([self._tensor])
                    else:
                        self._future.set_exception(self._error)
                    return self._future
        self._p2p.poller().watch(self)
        return self._future

    def _source_rank(self) -> int:
        """The rank the data came from (``recv_anysource``: as MPI's status says)."""
        self.wait()
        return self._source

    source_rank = _source_rank


class Poller:
    """One thread that completes the transfers whose futures are held (module docstring)."""

    def __init__(self, name: str) -> None:
        self._pending: list[Transfer] = []
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def watch(self, transfer: Transfer) -> None:
        with self._wake:
            self._pending.append(transfer)
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._stopped:
                    self._wake.wait()
                if self._stopped and not self._pending:
                    return
                pending = list(self._pending)
            done = [t for t in pending if t._test()]
            with self._wake:
                self._pending = [t for t in self._pending if t not in done]
            if len(done) < len(pending):
                time.sleep(POLL)

    def stop(self) -> None:
        """End the thread once the transfers it watches are done."""
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(timeout=60)


class P2P:
    """The group's point-to-point side: its own communicator, timeout and flight record."""

    def __init__(self, comm: MPI.Intracomm, timeout: float) -> None:
        self.comm = comm.Dup()  # collective: made with the group, on every one of its ranks
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.timeout = timeout
        self.flight = Recorder(self.rank, self.size)
        upper = self.comm.Get_attr(MPI.TAG_UB)
        self.tag_ub = int(upper) if upper is not None else 32767
        self._poller: Poller | None = None
        self._lock = threading.Lock()

    def poller(self) -> Poller:
        with self._lock:
            if self._poller is None:
                self._poller = Poller(f"hpcring-torch-p2p-{id(self):x}")
            return self._poller

    def check(self, peer: int | None, tag: int, what: str) -> None:
        """ValueError for a peer outside the group, this rank itself, or a tag MPI cannot carry."""
        if peer is not None and not 0 <= peer < self.size:
            raise ValueError(f"hpcring backend: {what} with rank {peer}, outside the group of {self.size}")
        if peer == self.rank:
            raise ValueError(f"hpcring backend: {what} with this rank itself ({peer})")
        if not 0 <= tag <= self.tag_ub:
            raise ValueError(
                f"hpcring backend: {what}'s tag must be 0 to {self.tag_ub} (MPI_TAG_UB), got {tag}"
            )

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> Transfer:
        """Start sending ``tensor`` to ``peer``: returns at once (MPI_Isend of its bytes)."""
        self.check(peer, tag, "send")
        data = host_bytes(tensor)
        request = self.comm.Isend(data, peer, tag)
        return Transfer(self, request, tensor, "send", peer, tag, data)

    def recv(self, tensor: torch.Tensor, peer: int | None, tag: int) -> Transfer:
        """Start receiving into ``tensor`` from ``peer`` (None: any rank)."""
        self.check(peer, tag, "recv")
        direct = tensor.device.type == "cpu" and tensor.is_contiguous()
        data = host_bytes(tensor) if direct else np.empty(tensor.nbytes, dtype=np.uint8)
        source = MPI.ANY_SOURCE if peer is None else peer
        request = self.comm.Irecv(data, source, tag)
        then = None if direct else (lambda: _copy_bytes_into(tensor, data))
        kind = "recv" if peer is not None else "recv_anysource"
        return Transfer(self, request, tensor, kind, -1 if peer is None else peer, tag, data, then)

    def close(self) -> None:
        if self._poller is not None:
            self._poller.stop()
        if not MPI.Is_finalized():
            free(self.comm)  # kept where a transfer gave up (`hpcring.polling.free`)


def host_bytes(tensor: torch.Tensor) -> Any:
    """``tensor``'s bytes as a buffer MPI reads or writes: the tensor's own memory where it is a
    contiguous CPU tensor (as with every backend, it is not to be written while a send is in
    flight, and the transfer holds the tensor), else a host copy (a CUDA tensor: through host
    memory, no CUDA-aware path here)."""
    t = tensor
    if t.device.type != "cpu":
        t = t.detach().cpu()
    elif not t.is_contiguous():
        t = t.detach().contiguous()
    nbytes = t.nbytes
    if nbytes == 0:
        return np.empty(0, dtype=np.uint8)
    if t is tensor:
        return MPI.buffer.fromaddress(t.data_ptr(), nbytes)
    return t.reshape(-1).view(torch.uint8).numpy()


def _copy_bytes_into(tensor: torch.Tensor, data: np.ndarray) -> None:
    """A staged receive's bytes into ``tensor`` (any layout, any device)."""
    if tensor.numel() == 0:
        return
    source = torch.from_numpy(data).view(tensor.dtype).reshape(tensor.shape)
    with torch.no_grad():
        tensor.copy_(source)


__all__ = ["P2P", "Poller", "Transfer", "host_bytes"]
