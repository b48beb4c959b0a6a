"""hpcring's state for one user communicator: its private duplicates and what hangs off them.

The first call on a communicator (collective, blocking) duplicates it twice, so hpcring's
messages never meet the user's: one duplicate for the calls made in the caller's thread, one for
the non-blocking calls' progress engine (`hpcring.nonblocking`), so that the two never interleave
their collectives differently on different ranks. The state is an MPI attribute of the user's
communicator: it lives as long as that communicator, and the attribute's delete callback frees
the duplicates and everything made for them (channels, the progress engine, a library's own
communicator) when the user frees it, so nothing leaks one per call.

The duplicates are made at a blocking call, never left in flight: Open MPI 5 mismatches the
messages of an ``MPI_Comm_idup`` still pending while a rank posts another non-blocking collective
on the same communicator (open-mpi/ompi#2025: wrong sums, MPI_ERR_TRUNCATE), and the user may
post one at any time. Until the first duplicate exists hpcring has no communicator of its own
among these ranks, and it sends nothing on the user's: a rank that never makes the first call is
a StallError on the others at their deadline, which cannot name it (`first_call_stall`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from . import config, polling, watchdog
from .agreement import HINTS, Agreement, by_value
from .arrays import device_key
from .channel import Channel
from .errors import StallError
from .flight import Recorder
from .polling import Waiter

_lock = threading.Lock()  # guards the keyval, the table of communicators being set up, channel creation
_keyval: int | None = None  # created on first use: importing hpcring must not need MPI initialized
_creating: dict[int, threading.Lock] = {}  # communicator handle -> lock held while it is duplicated
_creating_any: list[bool] = []  # the first state made here read the wait policy (`hpcring.polling.share`)
FIRST_CALL = "the first hpcring call on this communicator"


class CommState:
    """What hpcring keeps for one user communicator. (A plain class: a dataclass costs every
    process its creation at the first call.)"""

    def __init__(
        self,
        comm: MPI.Intracomm,
        lock: threading.Lock,
        owned: bool = True,
        background: MPI.Intracomm | None = None,
    ) -> None:
        self.comm = comm  # the private duplicate every hpcring message travels on
        self.lock = lock  # held while something is made for this communicator (possibly collectively)
        self.owned = owned  # ``comm`` is freed with this state (not where it was adopted: `adopt`)
        self.background = background  # the progress engine's duplicate (`adopt`ed), freed with it
        self.busy = threading.Lock()  # one collective at a time
        self.channels: dict[Any, Channel] = {}  # per array adapter and device
        self.made: dict[str, Any] = {}  # `attached` objects, by key
        self.closers: list[Callable[[], None]] = []
        self.calls = 0  # checked calls so far: the agreement names the call a rank stopped at
        self.warm: dict[Any, Any] = {}  # `hpcring.engine`'s warm calls, by signature
        self._agreement: Agreement | None = None
        # MPI errors come back as exceptions whatever the user's communicator does with them: under
        # MPI's fault tolerance a failed rank is then an error of the test loops too (`hpcring.ulfm`).
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        # the last calls on this rank (`hpcring.flight`), made once
        self.flight = Recorder(self.comm.Get_rank(), self.comm.Get_size())
        self.settings: config.Config = config.current()  # the HPCRING_* values it runs under
        self.timeout: float | None  # HPCRING_TIMEOUT as it took it (None: a bad value)
        try:  # read once: a read costs ~1 us; a bad value is read again per call, and raises there
            self.timeout = self.settings.timeout
        except ValueError:
            self.timeout = None
        self.exchange_ranks: int  # HPCRING_EXCHANGE_RANKS as it took it (0: a bad value)
        try:  # checked alike on every rank at the first call (`agree_on_exchange`)
            self.exchange_ranks = self.settings.exchange_ranks
        except ValueError:
            self.exchange_ranks = 0

    @property
    def agreement(self) -> Agreement:
        """The agreement on this communicator's duplicate (its buffer made once)."""
        made = self._agreement
        if made is None:
            made = self._agreement = Agreement(self.comm, self.flight, self.exchange_ranks)
        return made

    def channel(self, adapter: Any) -> Channel:
        """The Channel for ``adapter``'s arrays on its current device, made on first use (local)."""
        key = device_key(adapter)
        channel = self.channels.get(key)  # a dict read is atomic: no lock once it is made
        if channel is None:
            with _lock:
                channel = self.channels.get(key)
                if channel is None:
                    channel = Channel(self.comm, adapter, self.agreement.waiter)  # one receive for notices
                    channel.owner = self  # whose call number a stall notice carries
                    channel.config = self.settings
                    self.channels[key] = channel
        return channel

    def close(self) -> None:
        """Close what was made for this communicator, newest first, then free the duplicate."""
        for close in reversed(self.closers):
            close()
        self.closers.clear()
        # What holds memory goes now, not when the garbage collector finds the cycles that the
        # warm calls and the flight record make with the channels (a duplicate made and freed
        # per stall grew the soak's resident memory by 3 MiB each until a collection).
        for channel in self.channels.values():
            channel.discard()
        self.channels.clear()
        self.warm.clear()
        if self._agreement is not None:
            self._agreement.waiter.close()
        if not MPI.Is_finalized():
            # Freed unless a wait on them gave up (`hpcring.polling.free`: kept for good then).
            if self.background is not None and not polling.free(self.background):
                discard(self.background)  # freeing it would have closed its state: close it here
            if self.owned:
                polling.free(self.comm)


def _release(comm: MPI.Comm, keyval: int, state: CommState) -> None:
    """Attribute delete callback: the user freed their communicator, so free what we made for it."""
    state.close()


def known_state(comm: Any) -> CommState | None:
    """``comm``'s state where a call has made it, else None: a warm call's lookup, with no lock
    (reading an attribute is safe from any thread) and no Dup."""
    keyval = _keyval
    if keyval is None or comm.__class__ is not MPI.Intracomm:
        return None
    return comm.Get_attr(keyval)


def state_of(comm: MPI.Intracomm, timeout: float | None = None) -> CommState:
    """hpcring's state for ``comm``; the first call on a communicator (collective) duplicates it,
    within ``timeout`` seconds (None: HPCRING_TIMEOUT; 0: no limit) or StallError."""
    global _keyval
    with _lock:
        if _keyval is None:
            _keyval = MPI.Comm.Create_keyval(delete_fn=_release)
        state = comm.Get_attr(_keyval)
        if state is not None:
            return state
        creating = _creating.setdefault(MPI._handleof(comm), threading.Lock())
        if not _creating_any:  # how this process's waits spend their core (HPCRING_WAIT), read once
            _creating_any.append(polling.share())
    # The Dup is collective: hold only this communicator's lock across it. A process-wide lock
    # here deadlocks two threads that set up two communicators, when ranks take them in
    # opposite orders (each rank's Dup waits for a rank whose other thread holds the lock).
    with creating:
        state = comm.Get_attr(_keyval)
        if state is None:
            state = CommState(comm=duplicate(comm, timeout), lock=creating)
            if state.comm.Get_size() > 1:
                watchdog.watch()  # the one blocking wait (`mpi`'s MPI_Allreduce), watched
            state.background = _second(state, timeout)
            with _lock:
                comm.Set_attr(_keyval, state)
                _creating.pop(MPI._handleof(comm), None)
        return state


def _second(state: CommState, timeout: float | None) -> MPI.Intracomm:
    """The progress engine's duplicate, of hpcring's first (every rank is in this first call: it
    has just duplicated the user's communicator), bounded, its stall notices on the first. It is
    made while `agree_on_exchange` runs: the two collectives in flight together cost a first call
    one round where one after the other they cost two."""
    if timeout is None:
        timeout = config.current().timeout
    second, request = state.comm.Idup()
    waiter = state.agreement.waiter
    agree_on_exchange(state, timeout, (second, request))
    woke = waiter.bounded(request, timeout)
    if woke is not None:
        raise waiter.stall(woke, FIRST_CALL, timeout)
    adopt(second)
    return second


def agree_on_exchange(
    state: CommState, timeout: float | None, second: tuple[MPI.Intracomm, MPI.Request] | None = None
) -> None:
    """Every rank's agreements on ``state``'s communicator take the same road: the exchange up to
    HPCRING_EXCHANGE_RANKS ranks, else the collective (`hpcring.agreement.exchanges`). Ranks that
    took different roads would wait for each other's messages until their deadline, before the
    row's digest of the must-agree settings could show the difference; so the first call checks
    this one value itself, in one small collective, and on a difference (or a bad value on any
    rank) every rank raises ValueError naming the values and the ranks, and frees the duplicates
    (``second``'s too: a duplicate still being made, which every rank posted before this check)."""
    comm, mine = state.comm, state.exchange_ranks
    if timeout is None:
        timeout = config.current().timeout
    same = True
    if comm.Get_size() > 1:
        values = np.array([mine, -mine], np.int64)  # under max: the largest and minus the smallest
        waiter = state.agreement.waiter
        woke = waiter.bounded(comm.Iallreduce(MPI.IN_PLACE, values, MPI.MAX), timeout)
        if woke is not None:
            raise waiter.stall(woke, FIRST_CALL, timeout)
        same = bool(values[0] == -values[1])
    if same and mine:
        return
    everyone = comm.allgather(mine)
    if second is not None:  # every rank has posted it (they all reached the allgather): it completes
        second[1].Wait()
        polling.free(second[0])
    state.close()
    name = "HPCRING_EXCHANGE_RANKS"
    shown = by_value(everyone, lambda value: str(value) if value else "not an integer from 1 to 4")
    if len(set(everyone)) == 1:  # a bad value, the same on every rank: the parser's own words
        config.BY_NAME[name].parse(name, state.settings.raw(name))
    raise ValueError(f"{FIRST_CALL}: ranks disagree on settings: {name}: {shown}{HINTS['settings']}")


def duplicate(comm: MPI.Intracomm, timeout: float | None) -> MPI.Intracomm:
    """``comm.Idup()`` waited for against the deadline (None: HPCRING_TIMEOUT; 0: no limit): a rank
    that never makes its first call becomes a StallError on the others (`first_call_stall`)."""
    if timeout is None:
        timeout = config.current().timeout
    dup, request = comm.Idup()
    wait_first(comm, request, timeout)
    return dup


def wait_first(comm: MPI.Intracomm, request: MPI.Request, timeout: float) -> None:
    """Wait for the ``Idup`` of ``comm`` that a first call posted, within ``timeout`` seconds (0: no
    limit), or raise `first_call_stall`. Nothing is sent meanwhile: hpcring has no communicator of
    its own yet, and a notice on ``comm`` could be received as the user's data."""
    waiter = Waiter(comm, notices=False)
    if waiter.bounded(request, timeout) is not None:
        raise first_call_stall(timeout)


def first_call_stall(timeout: float) -> StallError:
    """The StallError of a first call that not every rank made: which rank is missing cannot be
    known (a notice naming it would travel on the user's communicator, where a receive of the
    user's with MPI.ANY_TAG takes it as data), so every rank that did arrive says so at its own
    deadline; from the first call on, a StallError names the rank."""
    return StallError(
        [],
        FIRST_CALL,
        timeout,
        detail=(
            "; which rank cannot be known: hpcring sends nothing on your communicator, and the "
            "communicator of its own that would carry the news is what this first call makes"
        ),
    )


def adopt(comm: MPI.Intracomm) -> CommState:
    """hpcring's state on a communicator that hpcring made itself (a duplicate, complete): its
    messages travel on ``comm`` as it is, with no further duplicate. Local; ``comm`` stays its
    maker's to free (freeing it closes the state)."""
    global _keyval
    with _lock:
        if _keyval is None:
            _keyval = MPI.Comm.Create_keyval(delete_fn=_release)
        state = comm.Get_attr(_keyval)
        if state is None:
            state = CommState(comm=comm, lock=threading.Lock(), owned=False)
            if state.comm.Get_size() > 1:
                watchdog.watch()
            comm.Set_attr(_keyval, state)
        return state


def discard(comm: MPI.Intracomm) -> None:
    """Drop hpcring's state for ``comm`` (closed, its duplicate freed), as freeing ``comm`` would;
    local. A communicator that lost ranks (`hpcring.shrink`) keeps no revoked duplicate: a later
    call on it starts afresh and fails as any operation on it does."""
    if _keyval is not None and comm.Get_attr(_keyval) is not None:
        comm.Delete_attr(_keyval)


def channel_for(comm: MPI.Intracomm, adapter: Any) -> Channel:
    """The cached Channel of ``comm`` for ``adapter``'s arrays (on its current device)."""
    return state_of(comm).channel(adapter)


def attached(comm: MPI.Intracomm, key: str, build: Callable[[], Any]) -> Any:
    """The object ``build()`` made for ``comm`` under ``key``, made once and cached with its state.

    ``build`` may be collective (every rank reaches the first call in the same order): it runs
    under this communicator's own lock only, as the Dup in `state_of` does. An object with a
    ``close()`` is closed, in reverse order of making, when the user frees the communicator.
    """
    state = state_of(comm)
    with state.lock:
        made = state.made.get(key)
        if made is None:
            made = state.made[key] = build()
            if hasattr(made, "close"):
                state.closers.append(made.close)
        return made


def intracomm(comm: MPI.Intracomm | None, caller: str) -> MPI.Intracomm:
    """``comm``, or COMM_WORLD for None; TypeError (naming ``caller``, "hpcring.allgather") for
    anything else."""
    comm = MPI.COMM_WORLD if comm is None else comm
    if type(comm) is not MPI.Intracomm:  # an hpcring.Intracomm: hpcring's own messages go to MPI itself
        comm = getattr(comm, "_hpcring_plain", comm)
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"{caller}: comm must be an mpi4py intracommunicator, got {comm!r}")
    return comm


__all__ = [
    "FIRST_CALL",
    "CommState",
    "adopt",
    "attached",
    "channel_for",
    "discard",
    "duplicate",
    "first_call_stall",
    "intracomm",
    "known_state",
    "state_of",
    "wait_first",
]
