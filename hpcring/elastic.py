"""Elastic data parallelism: a rank dies, the survivors shrink the communicator, agree on where
they are, and go on training, on MPI's fault tolerance (ULFM; docs/elastic.md).

Two pieces. `shrink` is the recovery of one communicator: revoke everything hpcring (and the
user) had on it, so that no survivor stays inside an operation; ``MPI_Comm_shrink`` to the
survivors; rebuild hpcring's state on the new communicator (its duplicate, channels,
topology, auto's table for the new rank count) with one small collective; and
``MPI_Comm_agree`` that every survivor got there. A rank that dies meanwhile makes the
agreement fail on every survivor alike, and they shrink again.

`Elastic` wraps a data-parallel loop. Each step is split in two: ``compute(comm, t)``, the
collective part (forward, backward, the gradient all-reduce), which a failure can interrupt
on some ranks and not on others, and ``apply(t, result)``, the local update, which it cannot.
So after a failure a survivor has completed either the step the others are in or the one
before: before it applies a step it keeps a copy of the state (the roll-back image), the
survivors agree on the last step completed on every one of them (``MPI_Comm_agree``), and a
rank one step ahead restores its image. The step is then computed again, its global batch
split over the survivors. Every survivor holds the whole model and optimizer state, so
nothing comes from disk; a checkpoint hook is there for failures that take every rank.

With ``reproducible=True`` sums (`hpcring.ExactSum`) the bits of a step do not depend on the
rank count, so a run that loses ranks ends with the weights of the uninterrupted run.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from . import config, growth, topology, ulfm
from .arrays import adapter_for
from .collectives import allreduce
from .comm import discard, intracomm, known_state, state_of
from .errors import RankFailedError, StallError

RESIDUES = 30  # bits of MPI_Comm_agree's flag that carry "step mod RESIDUES" (an int: 31 bits and a sign)
# Seconds a process of an elastic loop, or one that lost ranks, gives MPI_Finalize (and what runs
# at exit before it): Open MPI 5.0's can hang after failures (open-mpi/ompi#11404; here in about
# one job in five that lost ranks, all survivors inside its finalize; also where a rank died after
# the loop's last step, which no survivor saw); the process then ends by SIGALRM.
FINALIZE_WITHIN = 10
_bounded: list[bool] = []  # whether the exit is bounded already (once per process)


def require(comm: MPI.Intracomm | None = None, caller: str = "hpcring.elastic") -> None:
    """RuntimeError on every rank of ``comm``, saying how to launch, where this job cannot survive
    a failed rank (`hpcring.ulfm.launch_problem`). Collective."""
    comm = intracomm(comm, caller)
    problem = ulfm.launch_problem()
    if comm.allreduce(problem is not None, op=MPI.LOR):
        raise RuntimeError(
            f"{caller}: {problem or 'another rank cannot survive a failed rank: ' + ulfm.LAUNCH}"
        )


def is_failure(error: BaseException, comm: MPI.Comm | None = None) -> bool:
    """Whether ``error`` says that ranks failed: a RankFailedError from an hpcring call, or MPI's
    own error from a call the program made itself on ``comm`` (a ``comm.allreduce`` of a loss)."""
    return isinstance(error, RankFailedError) or ulfm.is_failure(error, comm)


# ---- recovery of one communicator ------------------------------------------------------------


def shrink(comm: MPI.Intracomm | None = None) -> MPI.Intracomm:
    """The communicator of ``comm``'s survivors, after a rank failed (`RankFailedError`), with
    hpcring's state for it made: collective over the survivors, every one of which must call it.

    Revokes ``comm`` and hpcring's communicators made from it first, so a survivor still waiting
    anywhere on them joins in; a rank that dies during the shrink is dropped too. ``comm`` itself
    is left to its owner (free it if you made it); hpcring forgets its state for it.
    """
    comm = intracomm(comm, "hpcring.shrink")
    problem = ulfm.launch_problem()
    if problem is not None:
        raise RuntimeError(f"hpcring.shrink: {problem}")
    bound_the_exit()
    current = comm
    while True:
        revoke_all(current)
        try:  # bounded: a survivor stuck elsewhere is a StallError here, not a hang in the shrink
            meet(current, 1)
        except MPI.Exception as error:  # one more rank died meanwhile: the shrink drops it too
            if not ulfm.is_failure(error, current):
                raise
        survivors = current.Shrink()
        made = 1
        try:
            rebuild(survivors)
        except Exception as error:
            if not is_failure(error, survivors):
                raise
            ulfm.revoke(survivors)  # the others may still wait in the rebuild: they come to the Agree
            made = 0
        try:
            made = agree(survivors, made)  # uniform: every survivor sees the same, or the same error
        except MPI.Exception as error:
            if not ulfm.is_failure(error, survivors):
                raise
            made = 0
        if current is not comm:
            _free(current)
        else:
            discard(comm)
        if made:
            return survivors
        current = survivors  # another rank died meanwhile: shrink again


def bound_the_exit() -> None:
    """End this process FINALIZE_WITHIN seconds into its exit where MPI_Finalize hangs: SIGALRM,
    its default action (the kernel's, no Python needed) armed by a handler that runs before
    mpi4py finalizes MPI (Python's exit handlers run first)."""
    if _bounded or not hasattr(signal, "alarm"):
        return
    _bounded.append(True)

    def arm() -> None:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(FINALIZE_WITHIN)

    atexit.register(arm)


def agree(comm: MPI.Intracomm, flag: int) -> int:
    """``MPI_Comm_agree`` (the AND of every live rank's ``flag``, the same on all, or the same error
    on all), waited for within HPCRING_TIMEOUT: StallError where a survivor never comes."""
    word = np.array([flag], dtype=np.intc)
    finish(comm.Iagree(word), "the survivors' agreement (MPI_Comm_agree)")
    return int(word[0])


def meet(comm: MPI.Intracomm, flag: int) -> int:
    """Every live rank of ``comm`` gets here, or StallError after HPCRING_TIMEOUT: the failures
    known so far acknowledged (``MPI_Comm_ack_failed``), so that the agreement that follows waits
    for every survivor instead of failing at once; it returns the AND of the survivors' ``flag``,
    or raises alike on all where one more rank died meanwhile."""
    comm.Ack_failed()
    return agree(comm, flag)


def finish(request: MPI.Request, what: str) -> None:
    """Wait for a recovery step that every survivor must join, testing it (so a failure during
    it raises at once, as MPI reports it) within HPCRING_TIMEOUT (0: no limit). A survivor that
    never joins is alive but stuck (Open MPI's TCP transport was seen to deadlock inside a
    process while it handled a failure): StallError, not a hang."""
    timeout = config.current().timeout
    deadline = time.monotonic() + timeout if timeout else None
    spins = 0
    while not request.Test():
        spins += 1
        if spins > 100:
            time.sleep(5e-4)
            if deadline is not None and time.monotonic() > deadline:
                raise StallError(
                    [], what, timeout, detail="; a survivor alive but stuck inside MPI cannot join a recovery"
                )


def revoke_all(comm: MPI.Intracomm) -> None:
    """Revoke ``comm`` and every communicator hpcring made from it (its duplicate, the node-level
    ones, the progress engine's of the non-blocking calls), so no survivor stays waiting on any."""
    state = known_state(comm)
    if state is not None:
        ulfm.revoke_state(state)
        for made in state.made.values():
            private = getattr(made, "comm", None)
            if isinstance(private, MPI.Intracomm):
                ulfm.revoke(private)
                inner = known_state(private)
                if inner is not None:
                    ulfm.revoke_state(inner)
    ulfm.revoke(comm)


def rebuild(comm: MPI.Intracomm) -> None:
    """hpcring's state for ``comm``, made now rather than at the first call: the duplicate, the
    channel for NumPy arrays, the topology and auto's table for this rank count (all collective),
    by one all-reduce of one element."""
    allreduce(np.zeros(1), algorithm="auto", comm=comm)


def _give_up(within: float) -> None:
    """A newcomer's join outlived its bound: end the process, saying so (no MPI call: it is stuck)."""
    sys.stderr.write(
        f"hpcring.elastic: this replacement could not join the job within {within:g} s "
        "(HPCRING_TIMEOUT); exiting\n"
    )
    sys.stderr.flush()
    os._exit(4)


def layout(comm: MPI.Intracomm) -> str:
    """The nodes of ``comm`` as hpcring's state for it found them ('2 nodes x 2 ranks'), or ''
    where no call has made that state yet. Local."""
    state = known_state(comm)
    found = topology.known(state.comm) if state is not None else None
    return found.describe() if found is not None else ""


def _free(comm: MPI.Intracomm) -> None:
    """Free a communicator hpcring made and no one else holds (a shrink's that lost ranks again)."""
    discard(comm)
    if comm != MPI.COMM_NULL and not MPI.Is_finalized():
        with contextlib.suppress(MPI.Exception):
            comm.Free()


# ---- the agreement on the step -----------------------------------------------------------------


def agree_step(comm: MPI.Intracomm, completed: int) -> int:
    """The last step completed on every rank of ``comm``, each rank having completed
    ``completed``: one ``MPI_Comm_agree`` (fault tolerant and uniform: every rank gets the same
    answer, or the same error). Each rank clears the bit of its step modulo RESIDUES in an
    all-ones flag; the agreement ANDs them (`lowest`)."""
    full = (1 << RESIDUES) - 1
    return lowest(agree(comm, full & ~(1 << (completed % RESIDUES))), completed)


def lowest(agreed: int, completed: int) -> int:
    """The lowest step of the ranks from the AND of their flags (`agree_step`), seen from a rank
    that completed ``completed``: the cleared bits are the steps present modulo RESIDUES, and the
    lowest is where their run begins. Ranks of a data-parallel loop are at most one step apart
    (a step's all-reduce needs every rank); two apart, or steps that do not follow on, is an
    error rather than a guess."""
    present = [r for r in range(RESIDUES) if not (agreed >> r) & 1]
    starts = [r for r in present if (r - 1) % RESIDUES not in present]
    if len(starts) != 1 or len(present) > 2 or completed % RESIDUES not in present:
        raise RuntimeError(
            f"hpcring.elastic: the survivors are more than one step apart (steps modulo {RESIDUES}: "
            f"{present}); every step must run a collective over every rank (its all-reduce)"
        )
    return completed - (completed - starts[0]) % RESIDUES


# ---- the loop ------------------------------------------------------------------------------------


class TooFewRanksError(RuntimeError):
    """Fewer ranks remain than the loop's minimum (``Elastic(min_size=...)``), and none joined:
    raised on every survivor alike."""


class JoinError(RuntimeError):
    """This replacement could not join the running job (the ranks that spawned it failed first,
    or no job answered at the rendezvous): raised by ``Elastic(...)`` on the newcomer only; the
    job goes on without it. End the process quietly (`MPI_Abort` could end the job it meant to
    join: the two are connected)."""


class NotNeededError(JoinError):
    """The job this process waited to join ended without needing it (a spare): nothing failed."""


@dataclass
class Recovery:
    """One recovery (or join), as a rank saw it."""

    lost: list[int]  # the ranks lost, numbered as in the communicator before
    before: int  # ranks before
    after: int  # ranks after (the replacements included)
    step: int  # the step the ranks go on with (completed on every one of them before it)
    rolled_back: bool  # this rank had applied that step already, and undid it
    seconds: float  # from the error caught to the agreement on the step (revoke, shrinks, agreements)
    rank: int  # this rank's number now
    error: str = ""  # what was raised, first line
    joined: int = 0  # ranks that joined (spawned, or connected), state received
    shrunk: int = 0  # ranks right after the shrink, before any joined
    at: float = 0.0  # time.time() when the failure was caught (or the join began)
    phases: dict[str, float] = field(default_factory=dict)  # seconds: shrink, spawn, connect, transfer
    state_bytes: int = 0  # bytes each newcomer received
    grow_error: str = ""  # why no replacement started (the loop went on with fewer ranks)
    lost_joining: int = 0  # ranks that held the state and died during the joins
    layout: str = ""  # the nodes of the communicator after it, as hpcring found them ('1 node x 4 ranks')


@dataclass
class Elastic:
    """A data-parallel loop that survives lost ranks, and grows back: ``Elastic(state, comm=comm,
    policy="replace").run(compute, apply, steps)``.

    ``state``: every array a step changes (weights, optimizer moments): what a rank one step
    ahead restores, and what a newcomer receives. Anything else a step reads must follow from the
    step number (an optimizer's step count: set it from ``t``). ``compute(comm, t)`` runs step
    ``t``'s collective part on the current communicator and returns what ``apply(t, result)``
    needs to update ``state`` locally; split the global batch by ``comm.Get_size()`` and
    ``comm.Get_rank()`` there, and rebuild there what is bound to a communicator (a
    `GradientSync`) when ``comm`` changes.

    ``policy``: after a loss, ``"shrink"`` goes on with the survivors; ``"replace"`` spawns
    replacements at once (``MPI_Comm_spawn`` of ``spawn_command``, default this program's own
    command line) up to ``max_size``; ``"replace-when-available"`` goes on shrunk and merges
    processes started later (by the launcher, by ``srun``) with ``HPCRING_ELASTIC_JOIN`` naming
    ``rendezvous``, the file where rank 0 publishes the job's port. ``min_size``: fewer ranks
    than that and the loop stops with `TooFewRanksError` on every survivor; ``max_size``: the
    size to grow back to (default: the size at the start). A replacement runs the same program:
    its ``Elastic(...)`` joins the job (receiving the step and ``state``) instead of starting one.

    ``checkpoint(comm, step)`` runs every ``every`` completed steps (on every rank: save from
    rank 0, say); ``on_failure(error)`` as a failure is caught, before the recovery;
    ``on_recovery(recovery)`` after it and after each join; ``on_phase(name, comm, step)`` as
    each phase of a recovery or join begins (``shrink``, ``spawn``, ``accept``, ``transfer``),
    for logs and for tests that make a rank die there. Launch under MPI's fault tolerance
    (docs/elastic.md): the constructor raises RuntimeError on every rank where the launch
    cannot survive a failure.
    """

    state: Sequence[Any]
    comm: Any = None
    checkpoint: Callable[[MPI.Intracomm, int], None] | None = None
    every: int = 0
    on_failure: Callable[[BaseException | None], None] | None = None
    on_recovery: Callable[[Recovery], None] | None = None
    step: int = 0  # steps completed (and applied) on this rank
    recoveries: list[Recovery] = field(default_factory=list)
    policy: str = "shrink"
    min_size: int = 1
    max_size: int | None = None
    spawn_command: Sequence[str] | None = None
    spawn_hosts: Sequence[str] | Callable[[MPI.Intracomm], Sequence[str]] = ()
    rendezvous: str | os.PathLike[str] | None = None
    on_phase: Callable[[str, MPI.Intracomm, int], None] | None = None
    transfer_algorithm: str = "auto"
    joins: int = 3  # spawns beyond those needed, per recovery (a join that loses ranks is made again)
    newcomer: str | None = field(default=None, init=False)  # how this process joined (`growth.joining`)
    _holds: bool = field(default=True, init=False, repr=False)  # whether it holds the state
    _left: int = field(default=0, init=False, repr=False)  # tries left to grow back, this recovery

    def __post_init__(self) -> None:
        if self.policy not in growth.POLICIES:
            raise ValueError(
                f"hpcring.elastic.Elastic: policy must be one of {growth.POLICIES}, got {self.policy!r}"
            )
        self.comm = intracomm(self.comm, "hpcring.elastic.Elastic")
        require(self.comm, "hpcring.elastic.Elastic")
        bound_the_exit()  # a rank may die after the last step too, unseen, and finalize hang
        self.state = list(self.state)
        self._adapters = [adapter_for(a) for a in self.state]
        self._image = [
            adapter.xp.array(a, copy=True) for adapter, a in zip(self._adapters, self.state, strict=True)
        ]
        self._origin = self.comm  # the user's: never freed here
        self._port: str | None = None
        self._rendezvous: growth.Rendezvous | None = None
        self._names: list[str] = []  # each rank's host (MPI_Get_processor_name)
        self._gone: set[str] = set()  # hosts that lost every rank: no replacement goes there
        self._group = self.comm.Get_group()
        self.newcomer = growth.joining()
        if self.newcomer is not None:
            self._holds = False
            self._join()
            return
        size = self.comm.Get_size()
        if self.max_size is None:
            self.max_size = size
        if not 1 <= self.min_size <= size <= self.max_size:
            raise ValueError(
                f"hpcring.elastic.Elastic: need 1 <= min_size ({self.min_size}) <= ranks ({size}) <= "
                f"max_size ({self.max_size})"
            )
        self._names = state_of(self.comm).comm.allgather(MPI.Get_processor_name())  # on hpcring's own
        if self.policy == "replace-when-available":
            self._open_port()

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    def run(
        self, compute: Callable[[MPI.Intracomm, int], Any], apply: Callable[[int, Any], None], steps: int
    ) -> None:
        """Run steps ``self.step`` .. ``steps - 1``; return once every rank has completed them.

        The end is agreed too (one ``MPI_Comm_agree``): a rank that finished the last step while
        another failed in it would otherwise leave, and the other would wait for it in the shrink."""
        try:
            while True:
                while self.step < steps:
                    t = self.step
                    try:
                        if self._rendezvous is not None:
                            self._poll(self._rendezvous)
                        result = compute(self.comm, t)
                        self._keep()
                        apply(t, result)
                        self.step = t + 1
                        if self.checkpoint is not None and self.every and self.step % self.every == 0:
                            self.checkpoint(self.comm, self.step)
                    except Exception as error:
                        caught = time.time(), time.perf_counter()
                        if not is_failure(error, self.comm):
                            raise
                        self.settle(False)
                        self.recover(error, steps, caught)
                caught = time.time(), time.perf_counter()
                if self.settle(True):
                    return
                self.recover(None, steps, caught)
        finally:
            if self._rendezvous is not None and self.rank == 0:
                self._rendezvous.close()

    def settle(self, healthy: bool) -> bool:
        """Whether every rank of the communicator is ``healthy`` and none failed: one
        ``MPI_Comm_agree`` on it, which a survivor that caught a failure and one that finished the
        loop both reach (the one that caught it revokes first, so that none stays in a collective)."""
        if not healthy:
            revoke_all(self.comm)
        try:  # the agreement also spreads what each knows of failures: decided alike on all
            return bool(meet(self.comm, int(healthy))) and not ulfm.failed_ranks(self.comm)
        except MPI.Exception as error:  # a failed rank: every survivor hears it here alike
            if not ulfm.is_failure(error, self.comm):
                raise
            return False

    def _keep(self) -> None:
        """The roll-back image: the state before this rank applies a step."""
        for image, array in zip(self._image, self.state, strict=True):
            image[...] = array

    def _phase(self, name: str, comm: MPI.Intracomm) -> None:
        if self.on_phase is not None:
            self.on_phase(name, comm, self.step)

    def recover(
        self, error: BaseException | None, steps: int | None = None, caught: tuple[float, float] | None = None
    ) -> Recovery:
        """Shrink to the survivors, agree on the last step completed on all, roll back a step
        applied here alone; then, by the policy (and where steps remain), spawn replacements and
        send them the state. Collective over the survivors, after `settle` (`run` calls both);
        ``caught``: (time.time(), time.perf_counter()) when the failure was caught."""
        at, began = caught or (time.time(), time.perf_counter())
        if self.on_failure is not None:
            self.on_failure(error)
        old, before = self.comm, self.comm.Get_size()
        comm = old
        while True:
            self._phase("shrink", comm)
            comm = self._shrink(comm)
            try:
                agreed = agree_step(comm, self.step)
                break
            except MPI.Exception as again:  # one more rank died while we agreed
                if not ulfm.is_failure(again, comm):
                    raise
        rolled_back = agreed == self.step - 1
        if rolled_back:
            for image, array in zip(self._image, self.state, strict=True):
                array[...] = image
        self.step = agreed
        lost = self._follow(old, comm)
        first = "a rank failed after the last step" if error is None else str(error).splitlines()[0]
        seconds = time.perf_counter() - began
        shrunk = comm.Get_size()
        made = Recovery(
            lost, before, shrunk, agreed, rolled_back, seconds, comm.Get_rank(), first,
            shrunk=shrunk, at=at, phases={"shrink": seconds},
        )  # fmt: skip
        if self.policy == "replace" and (steps is None or self.step < steps):
            self._left = self.joins + (self.max_size or 0) - self.size  # spawn calls allowed
            self._grow(made)
        if self.size < self.min_size:
            remain = f"{self.size} rank{' remains' if self.size == 1 else 's remain'}"
            raise TooFewRanksError(
                f"hpcring.elastic: {remain} after losing "
                f"rank{'s' if len(lost) != 1 else ''} {', '.join(map(str, lost)) or '?'}, fewer than the "
                f"minimum of {self.min_size} (Elastic(min_size=...)); stopped after step {self.step}"
            )
        made.layout = layout(self.comm)
        self.recoveries.append(made)
        if self.on_recovery is not None:
            self.on_recovery(made)
        return made

    def _shrink(self, comm: MPI.Intracomm) -> MPI.Intracomm:
        """`shrink`, freeing a communicator of ours that it replaces (never the user's)."""
        survivors = shrink(comm)
        if comm is not self._origin:
            _free(comm)
        return survivors

    # ---- growing back ----------------------------------------------------------------------------

    def _header(self) -> np.ndarray:
        """What a newcomer learns first (`hpcring.growth.HEADER`); from a rank that holds the state."""
        values = {
            "step": self.step,
            "policy": growth.POLICIES.index(self.policy),
            "min_size": self.min_size,
            "max_size": self.max_size or 0,
            "holds": int(self._holds),
            "bytes": growth.state_bytes(self.state),
            "joins": self._left,
        }
        return np.array([values[k] for k in growth.HEADER], dtype=np.int64)

    def _grow(self, made: Recovery) -> None:
        """Spawn replacements up to ``max_size``, one per ``MPI_Comm_spawn`` (each its own MPI job:
        where processes of one spawn die, Open MPI 5.0 refuses later spawns from a communicator
        that holds their survivors), each sent the state by `_admit` before the next; spawns
        that lose ranks are made again while calls are left (``joins`` more than needed).
        Collective over the ranks, newcomers included: they learned the calls left from the
        header, so every rank takes the same turns."""
        target = self.max_size or self.size
        while self._left > 0 and self.size < target:
            self._left -= 1
            self._phase("spawn", self.comm)
            began = time.perf_counter()
            try:
                inter = growth.spawn(self.comm, 1, self.spawn_command, self.hosts())
                spawned = inter.Get_remote_size()
                merged = growth.merge(inter, high=False)
            except (MPI.Exception, RuntimeError) as error:
                if is_failure(error, self.comm):  # a rank died while spawning: shrink, try again
                    self._regroup(made)
                    continue
                made.grow_error = str(error).splitlines()[0]  # no replacement could start: go on
                return
            made.phases["spawn"] = made.phases.get("spawn", 0.0) + time.perf_counter() - began
            self._admit(merged, made, spawned)

    def _follow(self, old: MPI.Intracomm, comm: MPI.Intracomm) -> list[int]:
        """Go on with ``comm``, the survivors of ``old`` (in its order): the ranks of ``old`` lost
        (returned), the hosts of the survivors, and the hosts that lost every rank (gone: no
        replacement is placed there). Local; ``old`` may be freed already."""
        mine = comm.Get_group()
        kept = MPI.Group.Translate_ranks(mine, list(range(comm.Get_size())), self._group)
        lost = sorted(set(range(len(self._names))) - set(kept))
        names = [self._names[k] for k in kept]
        self._gone |= {self._names[k] for k in lost} - set(names)
        self._names = names
        self.comm = comm
        self._group.Free()
        self._group = mine
        return lost

    def hosts(self) -> list[str]:
        """Where replacements go: ``spawn_hosts`` where given; else, where a whole host lost its
        ranks, the hosts of the ranks alive (in their order, once each), and otherwise the
        launcher's own placement (``[]``)."""
        if callable(self.spawn_hosts):
            return list(self.spawn_hosts(self.comm))
        if self.spawn_hosts:
            return list(self.spawn_hosts)
        return list(dict.fromkeys(self._names)) if self._gone else []

    def _regroup(self, made: Recovery) -> None:
        """A rank died during a join, among the ranks that hold the state: shrink to the others."""
        revoke_all(self.comm)
        with contextlib.suppress(MPI.Exception):
            meet(self.comm, 1)
        old = self.comm
        made.lost_joining += len(self._follow(old, self._shrink(old)))
        made.after = self.comm.Get_size()
        made.rank = self.comm.Get_rank()

    def _admit(self, merged: MPI.Intracomm, made: Recovery | None, newcomers: int) -> np.ndarray:
        """Send the state to the ``newcomers`` last ranks of ``merged`` (the ranks that hold it
        first), agree that every rank got it; where a rank dies meanwhile, shrink ``merged`` and
        send again (a newcomer that got nothing yet still needs it). Collective over ``merged``,
        newcomers included, whose step and settings come with the header. The first try sends
        to the newcomers alone (`growth.send_state`), and the agreement that follows carries
        its check: a newcomer whose state differs from rank 0's makes every rank's ValueError.
        A try after a loss broadcasts to all (`growth.transfer`, checked). Returns the header."""
        began = time.perf_counter()
        comm = merged
        first = True

        def arrived(header: np.ndarray) -> None:
            self.step = int(header[growth.HEADER.index("step")])
            self._phase("transfer", comm)

        while True:
            try:
                problem = None
                if first:  # every rank's later tries, after any loss, broadcast to all
                    first, size = False, comm.Get_size()
                    header, problem = growth.send_state(
                        comm, self.state, self._header(), range(size - newcomers, size),
                        self.transfer_algorithm, arrived,
                    )  # fmt: skip
                else:
                    header = growth.transfer(
                        comm, self.state, self._header(), self.transfer_algorithm, arrived
                    )
                names = comm.allgather(MPI.Get_processor_name())
                agreed = agree(comm, 1 | (0 if problem else 2))
                if not agreed & 2:
                    raise ValueError(
                        problem
                        or "hpcring.elastic: a newcomer's state differs from rank 0's (each array's type, "
                        "shape and dtype; its own error names them): it must build the state as the "
                        "job's ranks do (the same program and settings)"
                    )
                if agreed & 1:
                    break
            except LookupError:  # every rank that held the state died: no one can send it
                raise TooFewRanksError(
                    f"hpcring.elastic: 0 ranks remain that hold the state (each died while it was sent "
                    f"to {comm.Get_size()} newcomer{'s' if comm.Get_size() != 1 else ''}), fewer than the "
                    f"minimum of {self.min_size}; stopped after step {self.step}"
                ) from None
            except Exception as error:
                if not is_failure(error, comm):
                    raise
            with contextlib.suppress(MPI.Exception):
                revoke_all(comm)
                meet(comm, 1)
            survivors = shrink(comm)
            _free(comm)
            comm = survivors
        before = self.comm.Get_size() if self._holds else 0
        if self.comm is not self._origin and self.comm is not comm:
            _free(self.comm)
        self.comm = comm
        self._names = names
        self._group.Free()
        self._group = comm.Get_group()
        self._holds = True
        self._keep()
        if made is not None:
            made.phases["transfer"] = made.phases.get("transfer", 0.0) + time.perf_counter() - began
            made.joined += comm.Get_size() - before
            made.after = comm.Get_size()
            made.rank = comm.Get_rank()
            made.state_bytes = int(header[growth.HEADER.index("bytes")])
        return header

    def _join(self) -> None:
        """This process is a newcomer: merge with the running job (spawned by it, or connecting to
        its rendezvous), receive the step, the loop's settings and ``state``. JoinError where it
        cannot; a join that does not end within HPCRING_TIMEOUT (the ranks that spawned it died
        before they merged, and MPI's merge waits on) ends this process (status 4), saying so."""
        bound_the_exit()
        within = config.current().timeout or 300.0
        guard = threading.Timer(within, _give_up, (within,))
        guard.daemon = True
        try:
            if self.newcomer == "spawned":
                guard.start()
                inter = growth.parent()
                assert inter is not None
            else:  # a group started apart waits (unbounded while the job lives) for its invitation
                rendezvous = growth.Rendezvous(Path(os.environ[growth.JOIN_ENV]))
                inter = growth.connect(self.comm, rendezvous, within, guard.start)
                if inter is None:
                    raise NotNeededError(
                        f"hpcring.elastic: the job at {rendezvous.path} ended without needing this rank"
                    )
            arriving = inter.Get_size()  # this process's side: the newcomers, the last ranks merged
            merged = growth.merge(inter, high=True)
            header = self._admit(merged, None, arriving)
        except (MPI.Exception, RankFailedError, StallError, TimeoutError) as error:
            raise JoinError(f"hpcring.elastic: this replacement could not join the job: {error}") from None
        finally:
            guard.cancel()
        self.policy = growth.POLICIES[int(header[growth.HEADER.index("policy")])]
        self.min_size = int(header[growth.HEADER.index("min_size")])
        self.max_size = int(header[growth.HEADER.index("max_size")]) or None
        self._left = int(header[growth.HEADER.index("joins")])
        if self.policy == "replace-when-available":
            self._open_port()
        elif self.policy == "replace":  # a join that fell short: the ranks spawn again, this one too
            self._grow(Recovery([], 0, self.size, self.step, False, 0.0, self.rank, "joined"))

    # ---- ranks started later ----------------------------------------------------------------------

    def _open_port(self) -> None:
        """replace-when-available: rank 0 opens a port and publishes it at the rendezvous file."""
        path = self.rendezvous or os.environ.get(growth.RENDEZVOUS_ENV) or os.environ.get(growth.JOIN_ENV)
        if not path:
            raise ValueError(
                "hpcring.elastic.Elastic: policy 'replace-when-available' needs rendezvous= (or "
                f"{growth.RENDEZVOUS_ENV}): a file, on a file system the ranks started later can read, "
                "where rank 0 publishes the job's port"
            )
        self._rendezvous = growth.Rendezvous(Path(path))
        if self.rank == 0:
            self._port = MPI.Open_port()
            self._rendezvous.publish(self._port)

    def _poll(self, rendezvous: growth.Rendezvous) -> None:
        """Between steps (replace-when-available): rank 0 says the job is alive; where the job is
        short of ranks and a group waits at the rendezvous, rank 0 invites it, every rank learns
        it by one ``MPI_Comm_agree`` and they accept it together, then send it the state."""
        if self.rank == 0:
            if self._port is None:  # a new rank 0 (the old one died): the port is its own now
                self._port = MPI.Open_port()
                rendezvous.publish(self._port)
            rendezvous.alive()
        if self.size >= (self.max_size or 0):
            return
        invited = self.rank == 0 and any(rendezvous.invite(t) for t in rendezvous.waiting()[:1])
        if agree(self.comm, int(not invited)):
            return
        at, began = time.time(), time.perf_counter()
        before = self.comm.Get_size()
        self._phase("accept", self.comm)
        inter = growth.accept(self.comm, self._port or "")
        guests = inter.Get_remote_size()
        merged = growth.merge(inter, high=False)
        made = Recovery(
            [], before, before, self.step, False, 0.0, self.rank, "ranks joined",
            shrunk=before, at=at, phases={"connect": time.perf_counter() - began},
        )  # fmt: skip
        self._admit(merged, made, guests)
        made.seconds = time.perf_counter() - began
        made.layout = layout(self.comm)
        self.recoveries.append(made)
        if self.on_recovery is not None:
            self.on_recovery(made)


__all__ = [
    "Elastic",
    "JoinError",
    "NotNeededError",
    "Recovery",
    "TooFewRanksError",
    "agree",
    "agree_step",
    "bound_the_exit",
    "is_failure",
    "layout",
    "lowest",
    "meet",
    "rebuild",
    "require",
    "revoke_all",
    "shrink",
]
