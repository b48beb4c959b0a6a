"""Ranks joining a running job: how a shrunk world grows back (docs/elastic.md, "Growing back").

On MPI's own means, under its fault tolerance (ULFM):

- `spawn`: the survivors start replacement processes (``MPI_Comm_spawn``, collective over them)
  and `merge` the intercommunicator into one communicator (``MPI_Intercomm_merge``), the
  survivors first, so their ranks keep their order;
- `accept` and `connect`: processes that a launcher or SLURM starts later (``srun`` into the
  same allocation) meet the survivors at a port (``MPI_Open_port``; its name in a file both sides
  can read, the `Rendezvous`) by ``MPI_Comm_connect``/``MPI_Comm_accept``, then merge.

The newcomers then receive what every rank of a data-parallel job holds alike, the step and the
model and optimizer state, from the survivors' rank 0: in a join's first try by `send_state`,
messages to the newcomers alone, whose layout the join's agreement checks; in a try after a
loss by `transfer`, ``hpcring.broadcast`` on hpcring's engine to every rank, so the arrays'
shapes and dtypes are checked against the survivors' before a byte moves. A rank that dies
meanwhile is an MPI error on the others, and the join shrinks and tries again. Nothing comes
from disk.
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from . import config, core
from .collectives import allreduce, broadcast
from .comm import known_state, state_of
from .errors import StallError
from .ops import supported

POLICIES = ("shrink", "replace", "replace-when-available")
PACK_BELOW = 1 << 20  # bytes: NumPy arrays smaller than this travel packed in one buffer, one call
# The header every newcomer receives first: the loop's step and settings, and whether the rank
# that sends it holds the state (a newcomer does not: every rank that held it died in the join).
HEADER = ("step", "policy", "min_size", "max_size", "holds", "bytes", "joins")  # joins: tries left
JOIN_ENV = "HPCRING_ELASTIC_JOIN"  # set on processes started later: the rendezvous file to join at
RENDEZVOUS_ENV = "HPCRING_ELASTIC_RENDEZVOUS"  # the survivors' rendezvous file (replace-when-available)
# What `send_state` sends after the header: whether the state follows in messages (1) or by
# `transfer` (0), a checksum of the sender's layout (each array's type, shape and dtype), and how
# many arrays follow one message each.
PREAMBLE = ("direct", "layout", "apart")
TAG = 0x4852  # send_state's messages, on hpcring's own duplicate of the communicator


def errors_return(comm: Any) -> Any:
    """``comm`` with MPI errors returned as exceptions (a failed rank is an error, not the end)."""
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    return comm


# ---- who joins ----------------------------------------------------------------------------------


def parent() -> MPI.Intercomm | None:
    """The intercommunicator to the survivors that spawned this process, or None (one of the job's
    first ranks, or a process that connects: `joining`)."""
    made = MPI.Comm.Get_parent()
    return None if made == MPI.COMM_NULL else errors_return(made)


def joining() -> str | None:
    """How this process joins a running job: ``"spawned"`` (the survivors spawned it),
    ``"connect"`` (started later with HPCRING_ELASTIC_JOIN naming the job's rendezvous file), or
    None (one of the job's first ranks). Local."""
    if MPI.Comm.Get_parent() != MPI.COMM_NULL:
        return "spawned"
    if os.environ.get(JOIN_ENV):
        return "connect"
    return None


def command() -> list[str]:
    """This process's own command line (the interpreter, its flags, ``-m module`` or the script,
    the arguments): what a replacement runs, so that it builds the same state and joins."""
    argv = list(getattr(sys, "orig_argv", []) or [sys.executable, *sys.argv])
    return [sys.executable, *argv[1:]]


# ---- spawn, connect, merge ------------------------------------------------------------------------


def spawn(
    comm: MPI.Intracomm, count: int, argv: Sequence[str] | None = None, hosts: Sequence[str] = ()
) -> MPI.Intercomm:
    """``count`` new processes running ``argv`` (default: this program, `command`), started by the
    survivors in ``comm`` (collective over them; rank 0's arguments count): ``MPI_Comm_spawn``,
    in this process's working directory, on ``hosts`` where given (host names, the launcher's
    placement otherwise). RuntimeError on every survivor where a process did not start."""
    argv = list(argv or command())
    info = MPI.Info.Create()
    try:
        info.Set("wdir", os.getcwd())
        if hosts:
            info.Set("host", ",".join(hosts))
            info.Set("map_by", "slot:OVERSUBSCRIBE")  # their slots may all be taken: share them
        errors: list[int] = []
        inter = comm.Spawn(argv[0], argv[1:], maxprocs=count, info=info, root=0, errcodes=errors)
    finally:
        info.Free()
    errors_return(inter)
    failed = [code for code in errors if code != MPI.SUCCESS]
    if failed or inter.Get_remote_size() != count:
        raise RuntimeError(
            f"hpcring.elastic: MPI_Comm_spawn started {inter.Get_remote_size()} of {count} replacement "
            f"processes ({' '.join(argv)}): error codes {failed}"
        )
    return inter


def merge(inter: MPI.Intercomm, high: bool) -> MPI.Intracomm:
    """One communicator of both sides of ``inter`` (``MPI_Intercomm_merge``; collective over both):
    the side with ``high`` False first. ``inter`` is freed."""
    merged = errors_return(inter.Merge(high))
    with contextlib.suppress(MPI.Exception):
        inter.Free()
    return merged


@dataclass
class Rendezvous:
    """Where ranks started apart from the job find it: a file holding the port name that the
    job's rank 0 opened (``MPI_Open_port``), on a file system both sides read (a shared one
    across nodes). Beside it, each group of processes that wants to join leaves a ticket
    (``NAME.ID.want``); rank 0, when the job needs ranks, invites the oldest (renames it
    ``NAME.ID.go``) and accepts; the group connects only once invited, so that no process
    waits inside MPI for a job that never accepts. Rank 0 touches the port file at every step
    (its age says the job is alive); ``NAME.closed`` says the job ended."""

    path: Path

    @property
    def closed(self) -> Path:
        return self.path.with_name(f"{self.path.name}.closed")

    def publish(self, port: str) -> None:
        """Write the port name (atomically: a reader sees the whole name or no file)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        partial.write_text(port)
        partial.replace(self.path)
        with contextlib.suppress(FileNotFoundError):
            self.closed.unlink()

    def alive(self) -> None:
        """Rank 0, at each step: the job is alive."""
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.path)

    def port(self) -> str:
        """The published port name ('' where there is none)."""
        try:
            return self.path.read_text().strip()
        except FileNotFoundError:
            return ""

    def ticket(self) -> Path:
        """Announce a group of processes that wants to join (its ticket)."""
        made = self.path.with_name(f"{self.path.name}.{uuid.uuid4().hex}.want")
        made.parent.mkdir(parents=True, exist_ok=True)
        made.write_text(str(os.getpid()))
        return made

    def waiting(self) -> list[Path]:
        """The tickets of groups that want to join, oldest first."""
        found = list(self.path.parent.glob(f"{self.path.name}.*.want"))
        return sorted(found, key=lambda p: p.stat().st_mtime if p.exists() else 0.0)

    def invite(self, ticket: Path) -> bool:
        """Invite the group of ``ticket`` to connect now (False where it withdrew meanwhile)."""
        try:
            ticket.replace(ticket.with_suffix(".go"))
        except FileNotFoundError:
            return False
        return True

    def invited(self, ticket: Path, within: float) -> bool:
        """Wait until the job invites ``ticket`` (True) or ends (False: closed, or no sign of life
        from its rank 0 for ``within`` seconds once it published)."""
        go = ticket.with_suffix(".go")
        while True:
            if go.exists():
                go.unlink()
                return True
            if self.closed.exists():
                ticket.unlink(missing_ok=True)
                return False
            with contextlib.suppress(FileNotFoundError):
                if within and time.time() - self.path.stat().st_mtime > within:
                    ticket.unlink(missing_ok=True)
                    return False
            time.sleep(0.02)

    def close(self) -> None:
        """The job ends: groups still waiting go home."""
        self.closed.parent.mkdir(parents=True, exist_ok=True)
        self.closed.write_text("")
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def accept(comm: MPI.Intracomm, port: str) -> MPI.Intercomm:
    """``MPI_Comm_accept`` at ``port`` (collective over ``comm``; rank 0 holds the port)."""
    return errors_return(comm.Accept(port, root=0))


def connect(
    comm: MPI.Intracomm, rendezvous: Rendezvous, within: float, invited: Callable[[], None] | None = None
) -> MPI.Intercomm | None:
    """Connect ``comm``'s processes (collective over them: a group started together) to the job
    published at ``rendezvous`` once it invites them: rank 0 leaves the ticket and waits; None
    where the job ended first, or showed no sign of life for ``within`` seconds. ``invited()``
    runs as the invitation comes. The waiting and the connect travel on a duplicate of ``comm``."""
    own = errors_return(comm.Dup())
    try:
        ticket = rendezvous.ticket() if own.Get_rank() == 0 else None
        go = rendezvous.invited(ticket, within) if ticket is not None else False
        if not own.bcast(go, root=0):
            return None
        if invited is not None:
            invited()
        port = rendezvous.port() if own.Get_rank() == 0 else ""
        return errors_return(own.Connect(port, root=0))
    finally:
        own.Free()


# ---- the state ---------------------------------------------------------------------------------


def transfer(
    comm: MPI.Intracomm,
    state: Sequence[Any],
    header: np.ndarray,
    algorithm: str = "auto",
    arrived: Callable[[np.ndarray], None] | None = None,
) -> np.ndarray:
    """Rank 0's ``header`` (int64, `HEADER`) and ``state`` on every rank of ``comm``: collective;
    each rank passes arrays of the shapes and dtypes it expects (a newcomer: the ones it built).
    The header and the arrays under PACK_BELOW bytes travel in one buffer, one call; larger arrays
    in place, one call each. Each call is checked like any other: the packed buffer's size, then
    each larger array's shape and dtype (packed arrays that differ only in shape or dtype, their
    bytes the same in all, are not told apart: the newcomers run the survivors' program). On a
    communicator hpcring has not used yet, its state there is made first (the duplicate, the
    topology, auto's table: a checked all-reduce of one element). ``arrived(header)`` runs
    once the header is in, before the large arrays. Returns the header."""
    if known_state(comm) is None:
        allreduce(np.zeros(1), algorithm="auto", comm=comm)
    small = [a for a in state if _packable(a)]
    words = np.empty(len(HEADER) + -(-sum(a.nbytes for a in small) // 8), dtype=np.int64)
    if comm.Get_rank() == 0:  # int64 words (a dtype every path takes): the header, then the bytes
        words[: len(HEADER)] = header
        _pack(small, words[len(HEADER) :].view(np.uint8))
    broadcast(words, root=0, algorithm=algorithm, comm=comm)
    header[...] = words[: len(HEADER)]
    if arrived is not None:
        arrived(header)
    if not header[HEADER.index("holds")]:
        raise LookupError("every rank that held the state died before it was sent")
    if comm.Get_rank() != 0:
        _unpack(words[len(HEADER) :].view(np.uint8), small)
    for array in state:
        if not _packable(array):
            broadcast(array, root=0, algorithm=algorithm, comm=comm)
    return header


def send_state(
    comm: MPI.Intracomm,
    state: Sequence[Any],
    header: np.ndarray,
    newcomers: range,
    algorithm: str = "auto",
    arrived: Callable[[np.ndarray], None] | None = None,
) -> tuple[np.ndarray, str | None]:
    """`transfer` for a join's first try, where every rank knows which ranks are the newcomers
    (``newcomers``: the last ranks of ``comm``; the others hold the state alike): rank 0 sends
    the header, the small arrays packed after it and then each larger array, one message each,
    to each newcomer only, on hpcring's own duplicate of ``comm``. The holders send and receive
    nothing, and there is no collective but the set-up of hpcring's state on a new
    communicator. A newcomer takes any message (its size from ``MPI_Mprobe``), so a layout
    unlike rank 0's cannot derail MPI; it is returned as the problem (None: none) for the
    caller's next collective to make every rank's error. Where rank 0's state is not all
    contiguous NumPy arrays, its first message says so and every rank goes on with `transfer`.
    The arrays under PACK_BELOW travel in the first message, as `transfer` packs them, and not
    one message each: none of rank 0's sends is then still moving when the newcomer goes on (a
    newcomer that dies with a send toward it still moving was seen to deadlock rank 0 inside
    Open MPI's TCP transport, docs/elastic.md). Returns the header and this rank's problem."""
    if 0 in newcomers:
        raise ValueError(
            f"hpcring.growth.send_state: rank 0 sends the state, so it cannot be a newcomer ({newcomers})"
        )
    made = known_state(comm)
    if made is None:
        allreduce(np.zeros(1), algorithm="auto", comm=comm)
        made = state_of(comm)
    private, rank = made.comm, comm.Get_rank()
    module = _compiled()  # the whole first message in one call where the compiled core runs
    got = NotImplemented
    if module is not None:
        got = module.first_try(
            private, state, header, newcomers.start, newcomers.stop, PACK_BELOW, TAG, _seconds()
        )  # fmt: skip
    if got is NotImplemented:
        got = _first_try(private, rank, state, header, newcomers)
    if got is None:
        if rank == 0:
            _stalled("the state sent to the newcomers", _STUCK)
        _stalled(*_NEVER_SENT)
    if rank not in newcomers:  # got: whether the state went (or goes) directly
        if arrived is not None:
            arrived(header)
        if not got:
            return transfer(comm, state, header, algorithm, None), None
        return header, None
    if type(got) is tuple:  # rank 0's layout: the header and the packed arrays are in
        pending = [private.Irecv(_bytes(a), 0, TAG) for a in got]
        _arrived(header, arrived)
        if pending:  # the larger arrays arrive in place
            _wait(pending, "the state from rank 0")
        return header, None
    words = got if isinstance(got, np.ndarray) else np.frombuffer(got, dtype=np.int64)
    sent_direct, _, sent_apart = (int(w) for w in words[len(HEADER) : len(HEADER) + len(PREAMBLE)])
    header[...] = words[: len(HEADER)]
    _arrived(header, arrived)
    if not sent_direct:
        return transfer(comm, state, header, algorithm), None
    status = MPI.Status()
    for _ in range(sent_apart):  # what rank 0 sends comes in all the same, left unread
        message = _probe(private, status)
        _wait([message.Irecv(np.empty(status.Get_count(MPI.BYTE), np.uint8))], "the state from rank 0")
    shapes = [(type(a).__name__, getattr(a, "shape", None), str(getattr(a, "dtype", None))) for a in state]
    return header, (
        f"hpcring.elastic: this newcomer's state differs from rank 0's (each array's type, shape "
        f"and dtype: {shapes}); a newcomer must build the state as the job's ranks do (the same "
        "program and settings)"
    )


def _arrived(header: np.ndarray, arrived: Callable[[np.ndarray], None] | None) -> None:
    """A newcomer has rank 0's header: ``arrived`` hears it, and a header that says rank 0 does
    not hold the state (every holder died) is a LookupError."""
    if arrived is not None:
        arrived(header)
    if not header[HEADER.index("holds")]:
        raise LookupError("every rank that held the state died before it was sent")


def _first_try(
    private: MPI.Intracomm, rank: int, state: Sequence[Any], header: np.ndarray, newcomers: range
) -> Any:
    """`send_state`'s first message on this rank, as the compiled core's ``first_try`` sends and
    takes it (the reference): rank 0 sends the header, the preamble and the packed arrays, then
    each array apart, and returns whether its state went directly; a newcomer returns the arrays
    to receive apart (a tuple) once the header and the packed arrays are unpacked, where the
    message is its own layout's, else the message's words, every array as it was; another rank
    returns whether its state would go directly. Its waits raise StallError at HPCRING_TIMEOUT."""
    small, apart, layout = _plan(state)
    lead = len(HEADER) + len(PREAMBLE)
    nbytes = (lead - (-sum(a.nbytes for a in small) // 8)) * 8
    if rank == 0:
        words = np.zeros(nbytes // 8, dtype=np.int64)
        words[: len(HEADER)] = header
        words[len(HEADER) : lead] = (int(layout is not None), layout or 0, len(apart))
        if small:
            _pack(small, words[lead:].view(np.uint8))
        requests = []
        for newcomer in newcomers:
            requests.append(private.Isend(words, newcomer, TAG))
            requests += [private.Isend(_bytes(a), newcomer, TAG) for a in apart]
        _wait(requests, "the state sent to the newcomers")
        return layout is not None
    if rank not in newcomers:
        return layout is not None
    status = MPI.Status()
    message = _probe(private, status)
    words = np.empty(status.Get_count(MPI.BYTE) // 8, dtype=np.int64)
    _wait([message.Irecv(words)], "the state from rank 0")
    if layout is None or words.nbytes != nbytes or list(words[len(HEADER) : lead]) != [1, layout, len(apart)]:
        return words
    header[...] = words[: len(HEADER)]
    if small:
        _unpack(words[lead:].view(np.uint8), small)
    return tuple(apart)


def _compiled() -> Any:
    """The compiled core's module where it runs now (HPCRING_CORE), else None."""
    return core.mpi_core()[0] if core.active() else None


def _plan(state: Sequence[Any]) -> tuple[list[np.ndarray], list[np.ndarray], int | None]:
    """How `send_state` sends ``state``: the arrays packed into the first message (under
    PACK_BELOW bytes, as `transfer` packs them), those sent one message each, and the checksum
    of the layout (`_layout`); nothing and no checksum (None) where an array is not a
    C-contiguous NumPy array with a buffer format, which then goes by `transfer`."""
    small, apart, views = [], [], []
    for a in state:
        if type(a) is not np.ndarray or not a.flags.c_contiguous:
            return [], [], None
        try:
            views.append(memoryview(a))
        except (BufferError, ValueError, TypeError):  # a dtype without a buffer format
            return [], [], None
        (small if a.nbytes < PACK_BELOW else apart).append(a)
    return small, apart, _layout(views)


def _layout(views: Sequence[memoryview]) -> int:
    """The checksum of a state's layout that its first message carries, the compiled core's
    (state.h): FNV-1a 64 over each array's buffer format, a NUL, then its itemsize, ndim and
    shape as little-endian int64; as an int64."""
    h = 0xCBF29CE484222325
    for view in views:
        blob = (
            view.format.encode()
            + b"\0"
            + struct.pack(f"<{2 + view.ndim}q", view.itemsize, view.ndim, *view.shape)
        )
        for byte in blob:
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h - (1 << 64) if h >= 1 << 63 else h


def _bytes(array: np.ndarray) -> np.ndarray:
    """A contiguous NumPy array's memory as bytes: any dtype travels, MPI's or not."""
    return array.reshape(-1).view(np.uint8)


def _wait(requests: list[MPI.Request], what: str) -> None:
    """Wait for ``requests`` within HPCRING_TIMEOUT, testing them (a failed peer raises at once,
    as MPI reports it)."""
    _until(lambda: MPI.Request.Testall(requests), what, _STUCK)


_STUCK = "; a rank alive but stuck inside MPI cannot join"
_NEVER_SENT = ("the state from rank 0", "; rank 0 never sent it")  # a newcomer's stall: what, detail


def _seconds() -> float:
    """HPCRING_TIMEOUT for one wait, as the compiled core takes it (0: no limit)."""
    return float(config.current().timeout or 0)


def _stalled(what: str, detail: str) -> None:
    raise StallError([], what, config.current().timeout, detail=detail)


def _probe(private: MPI.Intracomm, status: MPI.Status) -> MPI.Message:
    """The next message from rank 0 under `TAG` (``MPI_Improbe``), within HPCRING_TIMEOUT."""
    return _until(lambda: private.Improbe(0, TAG, status), *_NEVER_SENT)


def _until(ready: Callable[[], Any], what: str, detail: str) -> Any:
    """``ready()``'s first true value: spin a few milliseconds, then nap, so a small state costs a
    message's latency and a stuck one leaves the core. StallError (``what``, ``detail``) at
    HPCRING_TIMEOUT, never a hang."""
    timeout = config.current().timeout
    began = time.monotonic()
    while not (value := ready()):
        waited = time.monotonic() - began
        if timeout and waited > timeout:
            _stalled(what, detail)
        if waited > 0.005:
            time.sleep(2e-4)
    return value


def state_bytes(state: Sequence[Any]) -> int:
    """The bytes ``state`` holds (what a newcomer receives)."""
    return sum(int(a.nbytes) for a in state)


def _packable(array: Any) -> bool:
    """A NumPy array that travels in the packed buffer: a small one, or one of a dtype that
    hpcring's collectives do not take (its bytes travel as they are)."""
    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
        return False
    return array.nbytes < PACK_BELOW or not supported(array.dtype)


def _pack(arrays: Sequence[np.ndarray], into: np.ndarray) -> None:
    at = 0
    for a in arrays:
        into[at : at + a.nbytes] = a.reshape(-1).view(np.uint8)
        at += a.nbytes


def _unpack(packed: np.ndarray, arrays: Sequence[np.ndarray]) -> None:
    at = 0
    for a in arrays:
        a.reshape(-1).view(np.uint8)[...] = packed[at : at + a.nbytes]
        at += a.nbytes


__all__ = [
    "HEADER",
    "JOIN_ENV",
    "POLICIES",
    "PREAMBLE",
    "RENDEZVOUS_ENV",
    "Rendezvous",
    "accept",
    "command",
    "connect",
    "errors_return",
    "joining",
    "merge",
    "parent",
    "send_state",
    "spawn",
    "state_bytes",
    "transfer",
]
