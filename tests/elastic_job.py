"""The digits example's elastic run (`hpcring.examples.train.train_elastic`) with deaths placed
where a launcher's kill cannot aim: for tests/test_elastic.py and tests/test_elastic_grow.py.

    mpiexec --with-ft ulfm ... python tests/elastic_job.py [--kill S:R:PHASE ...] [--marks DIR] [FLAGS]

``--kill S:R:PHASE``: the process that is rank R of the loop's communicator kills itself
(SIGKILL) the first time PHASE comes at or after step S; each kill happens once in the whole job
(a file in ``--marks DIR`` says it did: replacement ranks run this same program). PHASE:

- ``step``: inside step S or soon after (a thread started as step S-1 ends fires ``--delay`` ms
  later, once the rank lets it have Python's lock: in that step's microbatches or all-reduce,
  or a few steps on);
- ``boundary``: right after the rank applied step S;
- ``failure``: as the rank catches a failure (the others lose it while they recover);
- ``shrink``, ``spawn``, ``transfer``: as that phase of a recovery or join begins (`Elastic`'s
  ``on_phase``; ``transfer``: after the header, before the state: a newcomer if R is one);
- ``end``: as the loop has returned on this rank, step S or later (no survivor sees the loss).

Where replacements may join, give ``--marks`` (a folder every process sees; by default rank 0
of the first ranks makes one and tells the others). FLAGS: the example's own (``--grow``,
``--policy``, ``--min-ranks``...). Prints what the example
prints: ``step S/T ranks G`` per step from rank 0, a line per recovery and join, the weights
digest last, after the final test accuracy (or ``# stopped: ...`` where fewer ranks remain than
the minimum, status 3; ``# refused: ...`` from every rank, status 5, where a replacement built
by ``--newcomer-width`` holds other state than the job's).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
from typing import Any

import numpy as np
from mpi4py import MPI

from hpcring.examples import train

PHASES = ("step", "boundary", "failure", "shrink", "spawn", "transfer", "end")


class Schedule:
    """The kills of one job, each fired once across every process of it (marks in a folder)."""

    def __init__(self, kills: list[tuple[int, int, str]], marks: str, delay: float) -> None:
        self.kills, self.marks, self.delay = kills, marks, delay

    def due(self, phase: str, rank: int, step: int) -> int | None:
        """The number of a kill that is due here and not yet done, else None."""
        for number, (at, victim, kind) in enumerate(self.kills):
            done = os.path.exists(os.path.join(self.marks, f"kill-{number}"))
            if kind == phase and victim == rank and step >= at and not done:
                return number
        return None

    def die(self, number: int) -> None:
        """Mark kill ``number`` done (atomically: one process only) and SIGKILL this process."""
        try:
            os.close(os.open(os.path.join(self.marks, f"kill-{number}"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
        print(f"# killing myself: kill {number} {self.kills[number]}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def at(self, phase: str, rank: int, step: int) -> None:
        number = self.due(phase, rank, step)
        if number is not None:
            self.die(number)

    def arm(self, rank: int, step: int) -> None:
        """As step ``step`` - 1 ends: the ``step`` kill due in step ``step`` fires in it."""
        for number, (at, victim, kind) in enumerate(self.kills):
            if kind == "step" and victim == rank and at == step:
                timer = threading.Timer(self.delay, self.die, (number,))
                timer.daemon = True
                timer.start()


def parse_kill(text: str) -> tuple[int, int, str]:
    step, rank, phase = text.split(":")
    if phase not in PHASES:
        raise argparse.ArgumentTypeError(f"phase must be one of {PHASES}, got {phase!r}")
    return int(step), int(rank), phase


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill", type=parse_kill, action="append", default=[])
    parser.add_argument("--marks", default="")
    parser.add_argument("--delay", type=float, default=10.0, help="ms into the step for a 'step' kill")
    parser.add_argument("--newcomer-width", type=int, help="a replacement builds layers this wide instead")
    ours, rest = parser.parse_known_args(argv)
    args = train.parse(rest)
    kills = list(ours.kill)
    marks = ours.marks or tempfile.mkdtemp(prefix="hpcring-kills-")
    if not ours.marks and kills:  # one folder for every process: the job's first ranks agree on it
        marks = MPI.COMM_WORLD.bcast(marks, root=0)
    schedule = Schedule(kills, marks, ours.delay / 1e3)
    ranks: dict[str, int] = {"rank": MPI.COMM_WORLD.Get_rank(), "step": 0}

    def progress(step: int, total: int, comm: MPI.Intracomm) -> None:
        rank = comm.Get_rank()
        ranks.update(rank=rank, step=step)
        if rank == 0:
            print(f"step {step}/{total} ranks {comm.Get_size()}", flush=True)
        schedule.at("boundary", rank, step)
        schedule.arm(rank, step + 1)

    def on_failure(error: BaseException | None) -> None:
        schedule.at("failure", ranks["rank"], ranks["step"])

    def on_phase(name: str, comm: MPI.Intracomm, step: int) -> None:
        ranks.update(rank=comm.Get_rank())
        schedule.at(name, comm.Get_rank(), step)

    def on_recovery(made: Any) -> None:
        ranks.update(rank=made.rank)
        if made.rank != 0:
            return
        if made.lost:
            print(
                f"# lost ranks {made.lost}: {made.before} -> {made.shrunk}, after step {made.step}",
                flush=True,
            )
        if made.joined:
            print(f"# grown: {made.shrunk} -> {made.after} ranks, topology {made.layout}", flush=True)
        if made.grow_error or (policy == "replace" and made.after < made.before):
            print(
                f"# short: {made.after} of {made.before} ranks; {made.grow_error or 'no tries left'}",
                flush=True,
            )

    from hpcring import growth
    from hpcring.elastic import JoinError, TooFewRanksError

    policy = args.policy or ("replace" if args.grow else "shrink")
    try:
        result = train.train_elastic(
            MPI.COMM_WORLD,
            epochs=args.epochs,
            max_steps=args.max_steps,
            reproducible=args.reproducible,
            algorithm=args.algorithm,
            progress=progress,
            on_failure=on_failure,
            on_recovery=on_recovery,
            on_phase=on_phase,
            policy=policy,
            min_size=args.min_ranks,
            max_size=args.max_ranks,
            rendezvous=args.rendezvous,
            **({"width": ours.newcomer_width} if ours.newcomer_width and growth.joining() else {}),
        )
    except TooFewRanksError as error:
        print(f"# stopped: {error}", flush=True)
        return 3
    except ValueError as error:  # a replacement whose state differs: every rank says so
        print(f"# refused: {error}", flush=True)
        return 5
    except JoinError as error:
        print(f"# could not join: {error}", file=sys.stderr, flush=True)
        return 4
    schedule.at("end", result.comm.Get_rank(), ranks["step"])
    if result.comm.Get_rank() == 0:
        if result.epochs:  # as the example says it
            print(f"# final test accuracy {100 * result.epochs[-1]['accuracy']:.1f}%", flush=True)
        print(f"# weights digest {train._digest(result.params, np)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
