"""Does communication hide behind backprop? Four kinds of step, interleaved, timed in one run.

    mpiexec -n 4 python -m hpcring.examples.overlap [--width 1024] [--depth 4] [--steps 20]

- compute: forward + backward + optimizer, no communication at all;
- communication: the same buckets all-reduced, nothing computed;
- no overlap: backward, then every bucket launched, then wait;
- overlap: each bucket launched from backward the moment it is complete.

The four kinds take turns step by step, so load from other jobs on the machine hits
them alike; the medians (max over ranks per step) are printed. Overlap works when its
step is below compute + communication, and pays off when it is below no overlap.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

import hpcring
from hpcring.examples.train import (
    Optimizer,
    array_module,
    init_params,
    limit_threads,
    load_digits_split,
    loss_and_backward,
)
from hpcring.training import GradientSync


@hpcring.aborting
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcring.examples.overlap", description=__doc__)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--bucket-mb", type=float, default=5.0)
    parser.add_argument("--algorithm", default="auto", choices=hpcring.ALGORITHMS)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--steps", type=int, default=20, help="steps of each kind")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads per rank")
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval in seconds (Python's default 0.005)",
    )
    parser.add_argument(
        "--device", default="cpu", choices=("cpu", "gpu"), help="NumPy or CuPy (one GPU per rank)"
    )
    parser.add_argument(
        "--idle-compute",
        action="store_true",
        help="stand in for an accelerator: each layer's backward sleeps as long as the CPU takes for it, "
        "leaving the cores free, as GPU kernels do",
    )
    args = parser.parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    limit_threads(args.threads)
    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    xp = array_module(args.device, comm)  # compute on the GPU leaves the CPU to the communication thread
    x, y, _, _ = load_digits_split()
    dtype = np.dtype(args.dtype)
    params = init_params([x.shape[1], *[args.width] * args.depth, 10], 0, dtype, xp)
    sync = GradientSync(
        [xp.zeros_like(p) for p in params],
        comm=comm,
        bucket_bytes=int(args.bucket_mb * (1 << 20)),
        algorithm=args.algorithm,
    )
    opt = Optimizer("sgd", params, 1e-3, xp)
    mine = np.array_split(np.arange(args.batch), size)[rank]
    xb, yb = xp.asarray(x[mine].astype(dtype)), xp.asarray(y[mine])

    def backward(ready: Callable[[int], None]) -> None:
        loss_and_backward(params, sync.grads, xb, yb, 1.0 / args.batch, xp, ready)
        opt.step(sync.grads)
        if xp is not np:
            xp.cuda.get_current_stream().synchronize()  # the step is over when the GPU is done

    if args.idle_compute:
        cpu = []
        for _ in range(5):
            start = time.perf_counter()
            backward(lambda i: None)
            cpu.append(time.perf_counter() - start)
        per_layer = comm.allreduce(statistics.median(cpu), op=MPI.MAX) / (len(params) // 2)

        def backward(ready: Callable[[int], None]) -> None:
            for layer in reversed(range(len(params) // 2)):
                time.sleep(per_layer)
                ready(2 * layer)
                ready(2 * layer + 1)

    def compute() -> None:
        backward(lambda i: None)

    def communicate() -> None:
        sync.ready_all()
        sync.wait()

    def no_overlap() -> None:
        backward(lambda i: None)
        sync.ready_all()
        sync.wait()

    def overlap() -> None:
        backward(sync.ready)
        sync.wait()

    kinds = {"compute": compute, "communication": communicate, "no overlap": no_overlap, "overlap": overlap}
    times: dict[str, list[float]] = {name: [] for name in kinds}
    for step in range(args.steps + 2):  # the first two rounds warm up plans and scratch
        for name, run in kinds.items():
            comm.Barrier()
            start = time.perf_counter()
            run()
            elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
            if step >= 2:
                times[name].append(elapsed)
    med = {name: 1e3 * statistics.median(values) for name, values in times.items()}
    if rank == 0:
        count = sum(p.size for p in params)
        print(
            f"# {size} ranks | MLP width {args.width} depth {args.depth}, {count:,} parameters "
            f"({count * dtype.itemsize / 2**20:.1f} MiB {dtype.name}) | {len(sync.buckets)} buckets | "
            f"algorithm {args.algorithm} | compute {'idle (sleep)' if args.idle_compute else args.device} | "
            f"progress {hpcring.info()['iallreduce_progress']} | "
            f"median of {args.steps} steps each (max over ranks)"
        )
        for name in kinds:
            print(f"{name:>24}: {med[name]:8.2f} ms")
        total = med["compute"] + med["communication"]
        print(f"{'compute + communication':>24}: {total:8.2f} ms")
        hidden = total - med["overlap"]
        print(
            f"# overlap step is {hidden:.2f} ms below compute + communication "
            f"({100 * hidden / med['communication']:.0f}% of communication hidden), "
            f"{med['no overlap'] - med['overlap']:.2f} ms below the no-overlap step"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
