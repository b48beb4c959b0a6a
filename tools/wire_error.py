"""The error of wire= on random data: measured under mpiexec, or simulated serially for any G.

    mpiexec -n G python tools/wire_error.py            every algorithm, both wires, measured
    python tools/wire_error.py --simulate 1000         ring, rabenseifner (1024), hierarchical 125x8

Each figure is over N standard-normal float32 elements per rank: the worst elementwise error as
a fraction of sum_i |x_i| (what `hpcring.wire.error_bound` bounds), that bound, and the normwise
relative error ||result - exact||_2 / ||exact||_2. The simulation applies the same roundings in
the same order as the algorithms do (each hop narrows the partial it sends; the owner rounds
what it keeps), in NumPy, without MPI.
"""

from __future__ import annotations

import sys

import numpy as np

from hpcring import wire

N = 1 << 18


def figures(result: np.ndarray, exact: np.ndarray, magnitude: np.ndarray) -> tuple[float, float]:
    worst = float(np.max(np.abs(result - exact) / magnitude))
    norm = float(np.linalg.norm(result - exact) / np.linalg.norm(exact))
    return worst, norm


def measured() -> None:
    from mpi4py import MPI

    import hpcring

    comm = MPI.COMM_WORLD
    x = np.random.default_rng(comm.rank).standard_normal(N).astype(np.float32)
    exact, magnitude = np.empty(N), np.empty(N)
    comm.Allreduce(x.astype(np.float64), exact)
    comm.Allreduce(np.abs(x).astype(np.float64), magnitude)
    for name in ("bfloat16", "float16"):
        for algorithm in ("naive", "ps", "ring", "rabenseifner", "hierarchical", None):
            if algorithm is None:  # float32 all the way, for scale
                out, label = hpcring.allreduce(x, algorithm="ring", out=np.empty_like(x)), "ring float32"
            else:
                out, label = (
                    hpcring.allreduce(x, algorithm=algorithm, wire=name, out=np.empty_like(x)),
                    algorithm,
                )
            worst, norm = figures(out.astype(np.float64), exact, magnitude)
            bound = wire.error_bound(algorithm or "ring", comm.size, name, 2.0**-24) if algorithm else 0.0
            if comm.rank == 0:
                print(
                    f"G={comm.size} {name:9} {label:13} worst {worst:.2e} bound {bound:.2e} norm {norm:.2e}"
                )


def narrow(a: np.ndarray, name: str) -> np.ndarray:
    return a.astype(wire.WIRES[name]).astype(np.float32)


def simulated(size: int, n: int = 1 << 14) -> None:
    x = np.random.default_rng(0).standard_normal((size, n)).astype(np.float32)
    exact, magnitude = x.astype(np.float64).sum(0), np.abs(x.astype(np.float64)).sum(0)
    for name in ("bfloat16", "float16"):
        p = narrow(x[0], name)  # ring: G-1 hops, each narrows the partial it sends, then the owner
        for k in range(1, size):
            p = narrow(p + x[k], name)
        print(f"G={size} {name:9} ring          " + _line(p, exact, magnitude, "ring", size, name))
        core = 1 << (size - 1).bit_length()  # rabenseifner on the next power of two (zeros beyond)
        s = np.zeros((core, n), np.float32)
        s[:size] = x
        while len(s) > 1:  # each halving step: the keeper adds what its partner narrowed
            s = s[0::2] + narrow(s[1::2], name)
        p = narrow(s[0], name)
        print(f"G={core} {name:9} rabenseifner  " + _line(p, exact, magnitude, "rabenseifner", core, name))
        per = 8
        if size % per == 0:
            nodes = x.reshape(size // per, per, n)
            sums = []
            for node in nodes:  # ring reduce-scatter inside: L-1 narrowed hops, the node sum kept wide
                q = narrow(node[0], name)
                for k in range(1, per - 1):
                    q = narrow(q + node[k], name)
                sums.append(q + node[per - 1])
            p = narrow(sums[0], name)  # the ring across nodes, owner included
            for q in sums[1:]:
                p = narrow(p + q, name)
            label = f"hier {size // per}x{per}"
            print(
                f"G={size} {name:9} {label:13} " + _line(p, exact, magnitude, "hierarchical", size, name, per)
            )


def _line(
    p: np.ndarray, exact: np.ndarray, magnitude: np.ndarray, alg: str, size: int, name: str, per: int = 1
) -> str:
    worst, norm = figures(p.astype(np.float64), exact, magnitude)
    bound = wire.error_bound(alg, size, name, 2.0**-24, per)
    return f"worst {worst:.2e} bound {bound:.2e} norm {norm:.2e}"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--simulate":
        simulated(int(sys.argv[2]))
    else:
        measured()
