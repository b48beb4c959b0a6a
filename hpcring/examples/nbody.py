"""An N-body step loop, written as an mpi4py user writes it: every step all-reduces a small force
array (8 bodies x 3 components of float64 = 192 bytes by default), the case hpcring's latency
matters in.

    mpiexec -n 2 python -m hpcring.examples.nbody [--bodies 8] [--steps 1000] [--hpcring]

Replicated data: every rank holds every body's position and velocity, and owns the bodies
j = rank, rank + size, ... Each step it adds up the softened gravity its own bodies exert on all
bodies, `Allreduce(MPI.IN_PLACE, force, op=MPI.SUM)` gives every rank the total, and every rank
moves every body (leapfrog). The printed energy drift says the integration is sane.

``--hpcring`` changes one line, ``comm = hpcring.Intracomm(comm)``: the all-reduce goes through
hpcring, everything else stays MPI's. The result line is the same, bit for bit, with and without
it (with the default algorithm ``mpi`` underneath); the time line shows what hpcring costs.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import hpcring
from hpcring.examples import first_call

SOFTENING = 0.05


def partial_forces(pos: np.ndarray, mass: np.ndarray, mine: np.ndarray, out: np.ndarray) -> None:
    """out <- the force the bodies ``mine`` exert on every body."""
    d = pos[mine][None, :, :] - pos[:, None, :]  # (all, mine, 3): from each body to each of mine
    r2 = np.einsum("ijk,ijk->ij", d, d) + SOFTENING**2
    weight = mass[:, None] * mass[mine][None, :] / (r2 * np.sqrt(r2))
    np.einsum("ij,ijk->ik", weight, d, out=out)


def energy(pos: np.ndarray, vel: np.ndarray, mass: np.ndarray) -> float:
    """Kinetic plus (softened) potential energy; every rank has every body, so no communication."""
    kinetic = 0.5 * float(np.sum(mass[:, None] * vel * vel))
    d = pos[None, :, :] - pos[:, None, :]
    r = np.sqrt(np.einsum("ijk,ijk->ij", d, d) + SOFTENING**2)
    i, j = np.triu_indices(len(mass), k=1)
    return kinetic - float(np.sum(mass[i] * mass[j] / r[i, j]))


@hpcring.aborting
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcring.examples.nbody", description=__doc__)
    parser.add_argument("--bodies", type=int, default=8, help="in all (3 float64 each in the force array)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--dt", type=float, default=1e-3)
    parser.add_argument("--hpcring", action="store_true", help="comm = hpcring.Intracomm(comm)")
    parser.add_argument("--algorithm", default="mpi", help="with --hpcring: one of hpcring.ALGORITHMS")
    parser.add_argument("--no-check", action="store_true", help="with --hpcring: check=False")
    args = parser.parse_args(argv)

    if args.hpcring and args.algorithm not in hpcring.ALGORITHMS:
        parser.error(f"--algorithm: choose one of {', '.join(hpcring.ALGORITHMS)}")
    # The one-line change, hpcring.Intracomm(comm), made inside `first_call`, which times it with
    # the first all-reduce (hpcring's modules load on first use, then).
    comm, first = first_call(
        lambda c, **options: hpcring.Intracomm(c, **options), args.hpcring, args.algorithm, not args.no_check
    )
    rank, size = comm.Get_rank(), comm.Get_size()

    rng = np.random.default_rng(0)  # the same bodies on every rank
    pos = rng.standard_normal((args.bodies, 3))
    vel = 0.1 * rng.standard_normal((args.bodies, 3))
    mass = rng.uniform(0.5, 1.5, args.bodies)
    mine = np.arange(rank, args.bodies, size)
    force = np.empty((args.bodies, 3))
    before = energy(pos, vel, mass)

    def forces() -> None:
        partial_forces(pos, mass, mine, force)
        comm.Allreduce(MPI.IN_PLACE, force, op=MPI.SUM)

    forces()  # the first call sets things up; it is also the leapfrog's first kick
    comm.Barrier()
    start = MPI.Wtime()
    for _ in range(args.steps):
        vel += 0.5 * args.dt * force / mass[:, None]
        pos += args.dt * vel
        forces()
        vel += 0.5 * args.dt * force / mass[:, None]
    elapsed = comm.allreduce(MPI.Wtime() - start, op=MPI.MAX)

    after = energy(pos, vel, mass)
    if rank == 0:
        print(
            f"nbody: {args.bodies} bodies on {size} ranks, {args.steps} steps: energy {after!r} "
            f"(drift {(after - before) / abs(before)!r}), sum(pos) {float(pos.sum())!r}"
        )
        via = f"hpcring.Intracomm (algorithm {args.algorithm})" if args.hpcring else "MPI"
        per = elapsed / max(args.steps, 1)
        print(f"time: {elapsed:.4f} s for {args.steps} steps, {1e6 * per:.1f} us per step, via {via}")
        print(first)
    return 0


if __name__ == "__main__":
    sys.exit(main())
