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
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from . import config, ulfm
from .arrays import adapter_for
from .collectives import allreduce
from .comm import discard, intracomm, known_state
from .errors import RankFailedError, StallError

RESIDUES = 30  # bits of MPI_Comm_agree's flag that carry "step mod RESIDUES" (an int: 31 bits and a sign)
# Seconds a process that lost ranks gives MPI_Finalize (and what runs at exit before it): Open MPI
# 5.0's can hang after failures (open-mpi/ompi#11404; here in about one job in five that lost
# ranks, all survivors inside its finalize); the process then ends by SIGALRM.
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


@dataclass
class Recovery:
    """One recovery, as a survivor saw it."""

    lost: list[int]  # the ranks lost, numbered as in the communicator before
    before: int  # ranks before
    after: int  # ranks after
    step: int  # the step the survivors go on with (completed on every one of them before it)
    rolled_back: bool  # this rank had applied that step already, and undid it
    seconds: float  # from the error to the agreement on the step (shrinks included)
    rank: int  # this rank's number among the survivors
    error: str = ""  # what was raised, first line


@dataclass
class Elastic:
    """A data-parallel loop that survives lost ranks: ``Elastic(state, comm=comm).run(compute,
    apply, steps)``.

    ``state``: every array a step changes (weights, optimizer moments): what a rank one step
    ahead restores. Anything else a step reads must follow from the step number (an optimizer's
    step count: set it from ``t``). ``compute(comm, t)`` runs step ``t``'s collective part on the
    current communicator and returns what ``apply(t, result)`` needs to update ``state`` locally;
    split the global batch by ``comm.Get_size()`` and ``comm.Get_rank()`` there, and rebuild
    there what is bound to a communicator (a `GradientSync`) when ``comm`` changes.

    ``checkpoint(comm, step)`` runs every ``every`` completed steps (on every rank: save from
    rank 0, say); ``on_failure(error)`` as a failure is caught, before the recovery;
    ``on_recovery(recovery)`` after it. Launch under MPI's fault tolerance (docs/elastic.md):
    the constructor raises RuntimeError on every rank where the launch cannot survive a failure.
    """

    state: Sequence[Any]
    comm: Any = None
    checkpoint: Callable[[MPI.Intracomm, int], None] | None = None
    every: int = 0
    on_failure: Callable[[BaseException | None], None] | None = None
    on_recovery: Callable[[Recovery], None] | None = None
    step: int = 0  # steps completed (and applied) on this rank
    recoveries: list[Recovery] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.comm = intracomm(self.comm, "hpcring.elastic.Elastic")
        require(self.comm, "hpcring.elastic.Elastic")
        self.state = list(self.state)
        self._adapters = [adapter_for(a) for a in self.state]
        self._image = [
            adapter.xp.array(a, copy=True) for adapter, a in zip(self._adapters, self.state, strict=True)
        ]
        self._origin = self.comm  # the user's: never freed here

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    def run(
        self, compute: Callable[[MPI.Intracomm, int], Any], apply: Callable[[int, Any], None], steps: int
    ) -> None:
        """Run steps ``self.step`` .. ``steps - 1``; return once every survivor has completed them.

        The end is agreed too (one ``MPI_Comm_agree``): a rank that finished the last step while
        another failed in it would otherwise leave, and the other would wait for it in the shrink."""
        while True:
            while self.step < steps:
                t = self.step
                try:
                    result = compute(self.comm, t)
                    self._keep()
                    apply(t, result)
                    self.step = t + 1
                    if self.checkpoint is not None and self.every and self.step % self.every == 0:
                        self.checkpoint(self.comm, self.step)
                except Exception as error:
                    if not is_failure(error, self.comm):
                        raise
                    self.settle(False)
                    self.recover(error)
            if self.settle(True):
                return
            self.recover(None)

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

    def recover(self, error: BaseException | None) -> Recovery:
        """Shrink to the survivors, agree on the last step completed on all, roll back a step
        applied here alone. Collective over the survivors, after `settle` (`run` calls both)."""
        began = time.perf_counter()
        if self.on_failure is not None:
            self.on_failure(error)
        old, before = self.comm, self.comm.Get_size()
        group = old.Get_group()
        comm = old
        while True:
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
        self.comm = comm
        mine = comm.Get_group()
        try:
            kept = MPI.Group.Translate_ranks(mine, list(range(comm.Get_size())), group)
        finally:
            mine.Free()
            group.Free()
        lost = sorted(set(range(before)) - set(kept))
        first = "a rank failed after the last step" if error is None else str(error).splitlines()[0]
        seconds = time.perf_counter() - began
        made = Recovery(lost, before, comm.Get_size(), agreed, rolled_back, seconds, comm.Get_rank(), first)
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


__all__ = [
    "Elastic",
    "Recovery",
    "agree",
    "agree_step",
    "bound_the_exit",
    "is_failure",
    "lowest",
    "meet",
    "rebuild",
    "require",
    "revoke_all",
    "shrink",
]
