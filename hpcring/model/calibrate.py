"""Calibration and validation under mpiexec: alpha, beta, gamma measured here, predictions timed.

The only part of the model that needs MPI, NumPy and hpcring itself, each imported inside the
function that uses it, so that importing this module (the command line does) stays cheap.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..units import parse_size
from .costs import AGREEMENT_BYTES, MODELLED, Busy, ModelError, Params, log2_floor, predict


def flush_bytes() -> int:
    """What calibration writes to leave a rank's caches cold: twice the per-core L2 (4 MiB
    here), from sysfs; 4 MiB where the kernel does not say."""
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "level").read_text().strip() == "2":
                return 2 * parse_size((index / "size").read_text().strip().rstrip("B"))
        except (OSError, ValueError):
            break
    return 4 << 20


def _median_time(run: Any, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def calibrate(comm: Any, *, quick: bool = False, array: str = "numpy") -> Params:
    """Measure alpha, beta (ping-pong between ranks 0 and 1) and gamma (local add) on this machine.

    Collective over ``comm``; needs 2 ranks or more. Ranks other than the pair sleep
    between polls of a non-blocking barrier, so they leave the cores to the pair (ranks
    spinning in MPI took a third of the bandwidth of an emulated 1 Gbit/s link from it on
    2 cores). When ``comm`` spans several nodes, alpha and beta are measured between rank 0
    and a rank of its own node, and inter_alpha and inter_beta between rank 0 and the first
    rank of another node: inter_beta with both directions busy at once (an exchange), as
    every cross-node step of an all-reduce uses the link; the one-way ping-pong figure is
    kept in ``meta["inter_beta_one_way"]``.
    """
    import numpy as np

    from ..polling import idle_barrier
    from ..topology import discover

    if comm.Get_size() < 2:
        raise ModelError("calibration needs at least 2 ranks to ping-pong: run it under mpiexec -n 2")
    rank = comm.Get_rank()
    # Several large sizes, each a median, then the median of their per-byte costs: on a
    # shared, loaded machine one size alone can land on a bad moment.
    small_repeats, large_repeats = (50, 5) if quick else (500, 15)
    sizes = [1 << 18, 1 << 20] if quick else [1 << 20, 4 << 20, 16 << 20]

    topo = discover(comm)
    topo.close()
    near = topo.order[1] if topo.per_node[0] > 1 else 1  # rank 0's node is the first in order
    far = topo.order[topo.per_node[0]] if topo.nodes > 1 else None

    def one_way(nbytes: int, repeats: int, peer: int) -> float:
        buf = np.zeros(max(nbytes, 1), dtype=np.uint8)
        samples = []
        comm.Barrier()
        for _ in range(repeats + 2):  # 2 warm-up round trips
            start = time.perf_counter()
            if rank == 0:
                comm.Send(buf, dest=peer, tag=7)
                comm.Recv(buf, source=peer, tag=7)
            elif rank == peer:
                comm.Recv(buf, source=0, tag=7)
                comm.Send(buf, dest=0, tag=7)
            samples.append((time.perf_counter() - start) / 2)
        idle_barrier(comm)
        return comm.bcast(statistics.median(samples[2:]), root=0)

    def both_ways(nbytes: int, repeats: int, peer: int) -> float:
        send, recv = np.zeros(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8)
        tick, samples = np.zeros(1, dtype=np.uint8), []
        comm.Barrier()
        if rank in (0, peer):
            other = peer if rank == 0 else 0
            for _ in range(repeats + 2):  # 2 warm-ups
                comm.Sendrecv(tick, other, 8, recv[:1], other, 8)  # start together
                start = time.perf_counter()
                comm.Sendrecv(send, other, 9, recv, other, 9)
                samples.append(time.perf_counter() - start)
        idle_barrier(comm)
        return comm.bcast(statistics.median(samples[2:]) if rank == 0 else None, root=0)

    def link(peer: int) -> tuple[float, float]:
        alpha = one_way(1, small_repeats, peer)
        per_byte = (max(one_way(n, large_repeats, peer) - alpha, 1e-15) / n for n in sizes)
        return alpha, statistics.median(per_byte)

    alpha, beta = link(near)
    inter_alpha, inter_beta, one_way_beta = None, None, None
    if far is not None:
        inter_alpha, one_way_beta = link(far)
        inter_beta = statistics.median(
            max(both_ways(n, large_repeats, far) - inter_alpha, 1e-15) / n for n in sizes
        )
    gamma = None
    if rank == 0:
        gamma = statistics.median(_gamma(array, n, large_repeats) for n in sizes)
    gamma = comm.bcast(gamma)
    # All ranks at once: a figure of one machine (across nodes the links above say it).
    busy, partial = {}, {}
    if far is None:
        busy[comm.Get_size()] = _busy(comm, array, sizes, small_repeats, large_repeats)
        figures = _partial(comm, array, sizes, small_repeats, large_repeats)
        if figures is not None:
            partial[comm.Get_size()] = figures
    from ..core import describe
    from ..library import mpi_library

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    meta = {
        "array": array,
        "ranks": comm.Get_size(),
        "host": socket.gethostname(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "mpi_library": mpi_library(),
        # busy alpha is a step of hpcring's own ring: its software cost is this core's
        "core": describe()[0],
        "quick": quick,
        "sizes": sizes,
        "nodes": list(topo.per_node),
        "flush_bytes": flush_bytes(),
    }
    if one_way_beta is not None:
        meta["inter_beta_one_way"] = one_way_beta
    return Params(
        alpha,
        beta,
        gamma,
        cores,
        meta,
        busy=busy,
        inter_alpha=inter_alpha,
        inter_beta=inter_beta,
        partial=partial,
    )


def _busy(comm: Any, array: str, sizes: Sequence[int], small: int, large: int) -> Busy:
    """alpha, beta, gamma with every rank at work at once, as in a ring step: each rank sends to
    its right neighbour while receiving from its left, then adds. Each sample is the slowest
    rank's time (a step waits for it); the figure is the median of the samples. ``cold`` is
    what the one-element call adds after each rank wrote `flush_bytes`, as a large call
    leaves the caches.

    hpcring's software apart (`Busy.step`, `Busy.overhead`): an unchecked call's fixed cost is
    the library's all-reduce through hpcring less the bare one; a ring step's software is its
    share of the unchecked one-element ring, that fixed cost taken out, less MPI's exchange
    latency (the `Sendrecv` less mpi4py's own work around it, timed on MPI_PROC_NULL: the
    compiled core calls MPI from C); a checked call's overhead is that fixed cost and what the
    agreement adds, less the agreement's collective timed bare. Each is at least 0."""
    import numpy as np
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    flush = np.ones(flush_bytes() // 8)

    def slowest(run: Any, repeats: int, cold: bool = False) -> float:
        samples = np.empty(repeats + 2)
        for i in range(repeats + 2):  # 2 warm-ups
            if cold:
                flush.fill(float(i))
            comm.Barrier()
            start = time.perf_counter()
            run()
            samples[i] = time.perf_counter() - start
        comm.Allreduce(MPI.IN_PLACE, samples, op=MPI.MAX)
        return float(np.median(samples[2:]))

    def exchange(nbytes: int, peer: Any = None) -> Any:
        send, recv = np.ones(max(nbytes, 1), np.uint8), np.empty(max(nbytes, 1), np.uint8)
        to, frm = (right, left) if peer is None else (peer, peer)
        return lambda: comm.Sendrecv(send, to, 9, recv, frm, 9)

    latency = slowest(exchange(1), small)
    beta = statistics.median(max(slowest(exchange(n), large) - latency, 1e-15) / n for n in sizes)
    gamma = statistics.median(slowest(_adder(array, n), large) / n for n in sizes)

    import hpcring  # hpcring's own ring on one element: 2(p-1) steps that carry (next to) nothing

    from ..agreement import collective

    one = np.zeros(1, np.float32)  # summed in place call after call: zeros never overflow

    def call(algorithm: str, check: bool) -> Any:
        return lambda: hpcring.allreduce(one, algorithm=algorithm, comm=comm, check=check)

    bare, checked = slowest(call("ring", False), small // 5), slowest(call("ring", True), small // 5)
    cold = slowest(call("ring", True), small // 5, cold=True)
    alpha = max(latency, bare / (2 * (size - 1)))
    # The software apart from MPI's own costs.
    mpi_latency = max(latency - slowest(exchange(1, MPI.PROC_NULL), small), 0.0)
    library = slowest(lambda: comm.Allreduce(MPI.IN_PLACE, one, op=MPI.SUM), small)
    fixed = max(slowest(call("mpi", False), small // 5) - library, 0.0)
    datatype, op = collective()
    row = np.zeros(AGREEMENT_BYTES, np.uint8)  # nothing riding, every rank alike
    agreement = slowest(lambda: comm.Allreduce(MPI.IN_PLACE, [row, 1, datatype], op), small)
    step = max((bare - fixed) / (2 * (size - 1)) - mpi_latency, 0.0)
    overhead = max(fixed + checked - bare - agreement, 0.0)
    return Busy(alpha, beta, gamma, max(checked - bare, 0.0), max(cold - checked, 0.0), step, overhead)


def _partial(comm: Any, array: str, sizes: Sequence[int], small: int, large: int) -> Busy | None:
    """`_busy` figures of the largest power of two below p of the p ranks while the others
    wait in a blocking receive, as Rabenseifner's folded ranks and the leaves of a
    binomial Bcast do (on shared cores they still spin); None below 3 ranks. The ranks at
    work are those of Rabenseifner's core where p is not a power of two, so that with
    ranks bound to cores they share cores as its steps do; else the lower half."""
    import numpy as np
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 3:
        return None
    extra = size - (1 << log2_floor(size))
    ranks = [r for r in range(size) if r >= 2 * extra or r % 2] if extra else list(range(size // 2))
    tick = np.zeros(1, np.uint8)
    working = comm.Split(0 if rank in ranks else MPI.UNDEFINED, rank)
    figures = None
    if working != MPI.COMM_NULL:
        figures = _busy(working, array, sizes, small, large)
        working.Free()
        if rank == ranks[0]:
            for waiter in sorted(set(range(size)) - set(ranks)):
                comm.Send(tick, waiter, tag=10)
    else:
        comm.Recv(tick, ranks[0], tag=10)
    return comm.bcast(figures, root=ranks[0])


def _adder(array: str, nbytes: int) -> Any:
    """acc += other on float32 of ``nbytes`` with the array module in use, pages touched once."""
    import numpy as np

    from ..arrays import adapter_named

    check_array(array)
    backend = adapter_named(array)
    acc = backend.xp.ones(nbytes // 4, dtype=np.float32)
    other = backend.xp.ones(nbytes // 4, dtype=np.float32)

    def add() -> None:
        backend.xp.add(acc, other, out=acc)
        backend.synchronize()

    add()
    return add


def _gamma(array: str, nbytes: int, repeats: int) -> float:
    """Seconds per byte of acc += other (float32) with the array module in use, one rank alone."""
    return _median_time(_adder(array, nbytes), repeats) / nbytes


def validate(
    comm: Any, params: Params, sizes: Sequence[int], algorithms: Sequence[str], iterations: int, bcast: str
) -> list[dict[str, Any]]:
    """Time hpcring.allreduce per algorithm and size (max over ranks, median of iterations)."""
    import numpy as np
    from mpi4py import MPI

    import hpcring

    p = comm.Get_size()
    rows = []
    for nbytes in sizes:
        x = np.ones(nbytes // 4, dtype=np.float32)
        for algorithm in algorithms:
            samples = []
            for i in range(iterations + 2):  # 2 warm-ups: scratch buffers, the duplicate comm
                comm.Barrier()
                start = time.perf_counter()
                hpcring.allreduce(x, algorithm=algorithm, comm=comm)
                elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
                if i >= 2:
                    samples.append(elapsed)
                x.fill(1.0)
            measured = statistics.median(samples)
            predicted = predict(algorithm, x.nbytes, p, params, bcast=bcast)
            rows.append(
                {
                    "algorithm": algorithm,
                    "bytes": x.nbytes,
                    "ranks": p,
                    "predicted": predicted,
                    "measured": measured,
                    "ratio": predicted / measured,
                }
            )
    return rows


def runnable() -> list[str]:
    """The modelled algorithms that this hpcring runs: what --validate can time."""
    import hpcring

    return [a for a in hpcring.ALGORITHMS if a in MODELLED]


def check_array(array: str) -> None:
    """ModelError unless ``array`` (numpy, cupy) is usable in this process."""
    from ..arrays import available

    if array not in available():
        raise ModelError(f"array module {array!r} is not usable here; choose one of {available()}")
