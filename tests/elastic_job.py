"""The digits example's elastic run (`hpcring.examples.train.train_elastic`) with deaths placed
where a launcher's kill cannot aim: for tests/test_elastic.py.

    mpiexec --with-ft ulfm ... python tests/elastic_job.py [--die-in-recovery R] [--die-after S:R] [FLAGS]

``--die-in-recovery R``: world rank R kills itself (SIGKILL) the moment it catches the first
failure, so the others lose it while they recover from the first one. ``--die-after S:R``: world
rank R kills itself right after it applied step S (S the last step: after the others may have
left the loop). FLAGS: the example's own. Prints what the example prints: ``step S/T ranks G``
per step from the lowest surviving rank, a line per recovery, the weights digest last.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

import numpy as np
from mpi4py import MPI

from hpcring.examples import train

WORLD = MPI.COMM_WORLD.Get_rank()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--die-in-recovery", type=int, default=-1)
    parser.add_argument("--die-after", default="")
    ours, rest = parser.parse_known_args(argv)
    args = train.parse(rest)
    after = tuple(map(int, ours.die_after.split(":"))) if ours.die_after else (-1, -1)

    def progress(step: int, total: int, comm: MPI.Intracomm) -> None:
        if comm.Get_rank() == 0:
            print(f"step {step}/{total} ranks {comm.Get_size()}", flush=True)
        if (step, WORLD) == after:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_failure(error: BaseException | None) -> None:
        if ours.die_in_recovery == WORLD:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_recovery(made: Any) -> None:
        if made.rank == 0:
            print(
                f"# lost ranks {made.lost}: {made.before} -> {made.after}, after step {made.step}", flush=True
            )

    result = train.train_elastic(
        MPI.COMM_WORLD,
        max_steps=args.max_steps,
        reproducible=args.reproducible,
        algorithm=args.algorithm,
        progress=progress,
        on_failure=on_failure,
        on_recovery=on_recovery,
    )
    if result.comm.Get_rank() == 0:
        print(f"# weights digest {train._digest(result.params, np)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
