"""Time per call of the ring (blocking vs pipelined), Rabenseifner and MPI_Allreduce.

    mpiexec -n 4 python tools/time_ring.py [--runs 7] [--inplace] [--chunks 65536,262144]

Prints, on rank 0, the median over runs of the time per call (each run: the max over
ranks of the mean of a batch of calls). Algorithms are interleaved run by run so a noisy
machine slows them alike. Calls the algorithms directly, past validation, so only the
data movement is timed. `ring-old` is the ring before plans and pipelining; `--chunks`
adds the pipelined ring forced to those chunk sizes.
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np
from mpi4py import MPI

from hpcring import config
from hpcring.algorithms import ALLREDUCE, PORTABLE, spec
from hpcring.arrays import adapter_for
from hpcring.channel import Channel
from hpcring.comm import channel_for
from hpcring.ops import OPS, Op
from hpcring.partition import segment_bounds


def old_ring(ch: Channel, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """The ring as it was before plans and pipelining (commit d5f3375), for comparison."""
    if dst is not src:
        dst[...] = src
    size, rank = ch.size, ch.rank
    if size == 1 or dst.size == 0:
        return
    seg = [slice(start, stop) for start, stop in segment_bounds(dst.size, size)]
    right, left = (rank + 1) % size, (rank - 1) % size
    incoming = ch.scratch("ring", seg[0].stop - seg[0].start, dst.dtype)
    for step in range(size - 1):
        out_seg, in_seg = seg[(rank - step) % size], seg[(rank - step - 1) % size]
        buf = incoming[: in_seg.stop - in_seg.start]
        ch.sendrecv(dst[out_seg], right, buf, left)
        op.reduce(ch.xp, dst[in_seg], buf)
    for step in range(size - 1):
        out_seg, in_seg = seg[(rank + 1 - step) % size], seg[(rank - step) % size]
        ch.sendrecv(dst[out_seg], right, dst[in_seg], left)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--sizes", default="65536,1048576,16777216", help="bytes, comma separated")
    parser.add_argument("--inplace", action="store_true")
    parser.add_argument("--algorithms", default="ring-old,ring,rabenseifner,mpi")
    parser.add_argument("--chunks", default="", help="chunk bytes to try for the pipelined ring")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    ch = channel_for(comm, adapter_for(np.empty(0)))
    algs = {name: spec(ALLREDUCE, name).run for name in PORTABLE if name != "auto"}
    algs["ring-old"] = old_ring
    variants = [(name, None) for name in args.algorithms.split(",")]
    for chunk in filter(None, args.chunks.split(",")):
        variants.append(("ring", chunk))
    if comm.rank == 0:
        print(
            f"# {comm.size} ranks, float32 sum, {'in place' if args.inplace else 'out of place'}, "
            f"median of {args.runs} runs; time per call in us"
        )
    for nbytes in map(int, args.sizes.split(",")):
        src = np.ones(nbytes // 4, dtype=np.float32)  # written: np.zeros maps the shared zero page
        dst = src if args.inplace else np.empty_like(src)
        batch = max(3, min(200, (64 << 20) // (nbytes * 4)))
        times: dict[tuple[str, str | None], list[float]] = {v: [] for v in variants}
        for run in range(args.runs + 1):  # run 0 warms up (plans, scratch, MPI connections)
            for name, chunk in variants:
                if chunk is None:
                    os.environ.pop("HPCRING_CHUNK_BYTES", None)
                else:
                    os.environ["HPCRING_CHUNK_BYTES"] = chunk
                ch.config = config.reload()  # a channel keeps the config it was made with
                comm.Barrier()
                start = MPI.Wtime()
                for _ in range(batch):
                    algs[name](ch, src, dst, OPS["sum"])
                elapsed = comm.allreduce((MPI.Wtime() - start) / batch, op=MPI.MAX)
                if run:
                    times[(name, chunk)].append(elapsed)
        os.environ.pop("HPCRING_CHUNK_BYTES", None)
        if comm.rank == 0:
            medians = {v: statistics.median(t) * 1e6 for v, t in times.items()}
            base = medians.get(("mpi", None))
            for (name, chunk), us in medians.items():
                label = name if chunk is None else f"ring chunk={chunk}"
                ratio = f"{us / base:6.2f}x mpi" if base else ""
                print(f"{nbytes:>10} B  {label:<24} {us:12.1f} us  {ratio}")


if __name__ == "__main__":
    main()
