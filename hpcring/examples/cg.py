"""Conjugate gradients on the 1-D Poisson matrix, rows distributed over the ranks, written as an
mpi4py user writes it: a few doubles all-reduced per iteration, the case hpcring's latency matters in.

    mpiexec -n 2 python -m hpcring.examples.cg [--rows 200] [--hpcring [--algorithm mpi]]

A = tridiag(-1, 2, -1) of order N = rows x ranks, and b = A x* for a known x* (a parabola with a
wobble, x*_i = i (N + 1 - i) / N + sin i): the printed error |x - x*| says the solve is right.
Each iteration multiplies by A (one neighbour exchange each side, `Sendrecv`) and all-reduces two
dot products of one double each; the end all-reduces the error norm (MAX) and a sum.

``--hpcring`` changes one line, ``comm = hpcring.Intracomm(comm)``: the all-reduces go through
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


def matvec(comm: MPI.Intracomm, x: np.ndarray, out: np.ndarray, halo: np.ndarray) -> None:
    """out <- A x for this rank's rows: the neighbours' edge values come by Sendrecv."""
    rank, size = comm.Get_rank(), comm.Get_size()
    left = rank - 1 if rank > 0 else MPI.PROC_NULL
    right = rank + 1 if rank < size - 1 else MPI.PROC_NULL
    halo[:] = 0.0  # beyond the ends (PROC_NULL): the Dirichlet boundary, 0
    comm.Sendrecv(x[-1:], dest=right, recvbuf=halo[0:1], source=left)
    comm.Sendrecv(x[:1], dest=left, recvbuf=halo[1:2], source=right)
    out[:] = 2.0 * x
    out[1:] -= x[:-1]
    out[:-1] -= x[1:]
    out[0] -= halo[0]
    out[-1] -= halo[1]


def dot(comm: MPI.Intracomm, a: np.ndarray, b: np.ndarray, buf: np.ndarray) -> float:
    """The global a . b: a local dot product, then one Allreduce of one double."""
    buf[0] = a @ b
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    return float(buf[0])


def exact(comm: MPI.Intracomm, rows: int) -> np.ndarray:
    """This rank's rows of x*."""
    n = rows * comm.Get_size()
    i = np.arange(comm.Get_rank() * rows + 1, (comm.Get_rank() + 1) * rows + 1, dtype=np.float64)
    return i * (n + 1 - i) / n + np.sin(i)


def solve(comm: MPI.Intracomm, b: np.ndarray, tol: float, max_iter: int) -> tuple[np.ndarray, int, float]:
    """CG from x = 0 until |r| <= tol |b|: (this rank's x, iterations, final |r|)."""
    rows = b.size
    x = np.zeros(rows)
    r = b.copy()
    p = r.copy()
    ap = np.empty(rows)
    halo = np.empty(2)
    buf = np.empty(1)
    rr = dot(comm, r, r, buf)
    stop = tol * tol * dot(comm, b, b, buf)
    iterations = 0
    while iterations < max_iter and rr > stop:
        matvec(comm, p, ap, halo)
        alpha = rr / dot(comm, p, ap, buf)
        x += alpha * p
        r -= alpha * ap
        rr_next = dot(comm, r, r, buf)
        p *= rr_next / rr
        p += r
        rr = rr_next
        iterations += 1
    return x, iterations, rr**0.5


@hpcring.aborting
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcring.examples.cg", description=__doc__)
    parser.add_argument("--rows", type=int, default=200, help="rows (vector length) per rank")
    parser.add_argument("--tol", type=float, default=1e-10, help="relative residual to stop at")
    parser.add_argument("--max-iter", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3, help="solves, for the time")
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

    truth = exact(comm, args.rows)
    b = np.empty(args.rows)
    matvec(comm, truth, b, np.empty(2))
    solve(comm, b, args.tol, args.max_iter)  # warm-up: the first calls set things up
    comm.Barrier()
    start = MPI.Wtime()
    for _ in range(max(args.repeat, 1)):
        x, iterations, residual = solve(comm, b, args.tol, args.max_iter)
    elapsed = comm.allreduce(MPI.Wtime() - start, op=MPI.MAX)

    n = args.rows * size
    error = np.array([np.max(np.abs(x - truth))])
    comm.Allreduce(MPI.IN_PLACE, error, op=MPI.MAX)
    total = np.array([x.sum()])
    comm.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
    if rank == 0:
        print(
            f"cg: N={n} on {size} ranks: {iterations} iterations, residual {residual!r}, "
            f"max error {float(error[0])!r}, sum(x) {float(total[0])!r}"
        )
        via = f"hpcring.Intracomm (algorithm {args.algorithm})" if args.hpcring else "MPI"
        solves = max(args.repeat, 1)
        per = elapsed / (solves * max(iterations, 1))
        print(f"time: {elapsed:.4f} s for {solves} solves, {1e6 * per:.1f} us per iteration, via {via}")
        print(first)
    return 0


if __name__ == "__main__":
    sys.exit(main())
