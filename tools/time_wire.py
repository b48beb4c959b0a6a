"""The bfloat16 wire on one node: its kernels against a copy, the ring's time taken apart, and the
floor its bytes set.

    python tools/time_wire.py kernels [--mib 8,4] [--runs 7]
    mpiexec -n 4 python tools/time_wire.py ring [--mib 16] [--runs 7] [--calls 5]

``kernels`` (one process): GB/s (bytes read plus bytes written, each counted once) of
``np.copyto`` on a float32 segment of ``--mib`` MiB, and of each kernel a ``wire="bfloat16"``
ring runs on a segment of that size, as the compiled core runs it (one row of a `core.program`
table, the very code a warm call runs): the narrowing before the first send, the widening sum of
a receive in place, a receive summed and narrowed for the next send (the wide sum not stored),
the owner's last sum rounded to the wire and narrowed for the all-gather, and the all-gather's
widening. Median over runs, the cases taking turns within each run; the ratio is to
``np.copyto``'s GB/s in the same run.

``ring`` (under mpiexec): time per call of the float32 ring all-reduce (``check=False``: its
compiled table, as a warm call runs it) and of the same ring with ``wire="bfloat16"``, each whole,
with its messages only (every conversion and reduction row dropped), and with its kernels only
(every send, receive and wait dropped); median over runs of the max over ranks, the variants
taking turns run by run. Then the floor the bytes set: the bytes each rank reads and writes per
call (its kernels, plus one copy of every message it receives, as shared memory moves it), wire
over plain. On one node, where a message costs a copy, that ratio is what the wire can reach
with every pass at copy speed and nothing else in the way.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from hpcring import algorithms, core, program
from hpcring import wire as wires
from hpcring.arrays import adapter_for
from hpcring.comm import channel_for
from hpcring.ops import OPS

F32, BF16 = 2, 1  # hpcring.kernels.DTYPE_CODES of float32 and bfloat16
PAIR = BF16 | F32 << 8


def traffic(size: int) -> tuple[float, float]:
    """Bytes read plus written per rank per float32 element of the buffer, (plain, wire), for the
    ring all-reduce of ``size`` ranks; a message of b bytes costs b read and b written (one copy).

    Per segment element (segments are 1/size of the buffer), plain: size - 1 reduce-scatter steps
    of a 4-byte message and a sum (read 8, write 4), size - 1 all-gather steps of a 4-byte message.
    Wire: the first narrowing (read 4, write 2), size - 1 messages of 2 bytes each way, size - 2
    receives summed and narrowed (read 2 + 4, write 2), the owner's last sum rounded and narrowed
    (read 2 + 4, write 4 + 2), size - 1 all-gather receives widened (read 2, write 4)."""
    steps = size - 1
    plain = steps * (8 + 12) + steps * 8
    wire = 6 + steps * 4 + (size - 2) * 8 + 12 + steps * (4 + 6)
    return plain / size, wire / size


def kernel_program(channel: object, rows: list[list[int]], src: np.ndarray, dst: np.ndarray) -> object:
    """A compiled table of ``rows`` on ``src`` (buffer 0) and ``dst`` (buffer 1)."""
    table = np.zeros((len(rows), program.WIDTH), np.int64)
    for i, row in enumerate(rows):
        table[i, : len(row)] = row
    recording = program.Program(
        table, [program.Buffer("src"), program.Buffer("dst")], [channel], np.zeros(0, np.int32), 0, False
    )
    made, why = core.program(recording, src, dst)
    if made is None:
        raise SystemExit(f"the compiled core is needed: {why}")
    return made


def kernel_cases(channel: object, n: int) -> list[tuple[str, int, Callable[[], object]]]:
    """(name, bytes read + written, call) for a float32 segment of ``n`` elements."""
    rng = np.random.default_rng(0)
    # src: the segment (n float32), then a received wire segment (n bfloat16); dst: the output
    # segment, then a narrowed one
    # byte offsets of the wide and the wire parts in either buffer (the wire part a page and three
    # cache lines past the wide one, not at its page offset, as apart allocations would rarely be)
    seg, wire = 0, 4 * n + 4096 + 192
    src = np.empty(n + n // 2 + 2048, np.float32)
    dst = np.empty_like(src)
    src[:n] = rng.standard_normal(n).astype(np.float32)
    dst[:n] = rng.standard_normal(n).astype(np.float32)
    wires.narrow(src[:n], src[wire // 4 : wire // 4 + n // 2].view(wires.wire_dtype("bfloat16")))
    passed_on, rounded = program.WIDE_NARROW | program.WIDE_ONLY, program.WIDE_ROUND
    add = [program.WIDEN_ADD, 0, wire]  # a received wire segment, widened and added to...
    rows = {
        "narrow (first send)": ([program.NARROW, 0, seg, 1, wire, n, F32, BF16], 6 * n),
        "widen_add in place": ([*add, 1, seg, 1, seg, n, PAIR, 0, -1, 0], 10 * n),
        "widen_add + narrow": ([*add, 0, seg, 1, seg, n, PAIR, passed_on, 1, wire], 8 * n),
        "widen_add + round": ([*add, 0, seg, 1, seg, n, PAIR, rounded, 1, wire], 12 * n),
        "widen (all-gather)": ([program.WIDEN, 0, wire, 1, seg, n, BF16, F32], 6 * n),
    }
    cases: list[tuple[str, int, Callable[[], object]]] = [
        ("np.copyto", 8 * n, lambda: np.copyto(dst[:n], src[:n])),
    ]
    for name, (row, moved) in rows.items():
        made = kernel_program(channel, [row], src, dst)
        cases.append((name, moved, lambda made=made: made.run(src, dst, None)))
    return cases


def kernels_main(args: argparse.Namespace) -> None:
    channel = channel_for(MPI.COMM_SELF, adapter_for(np.empty(0)))
    for mib in map(float, args.mib.split(",")):
        n = int(mib * (1 << 20)) // 8 * 2  # even: the wire part is n // 2 float32s
        cases = kernel_cases(channel, n)
        repeat = max(5, int((256 << 20) / (8 * n)))
        rates: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        ratios: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        for run in range(args.runs + 1):
            got = {}
            for name, moved, call in cases:
                call()
                began = time.perf_counter()
                for _ in range(repeat):
                    call()
                got[name] = moved * repeat / (time.perf_counter() - began) / 1e9
            if run:  # run 0 warms up
                for name, rate in got.items():
                    rates[name].append(rate)
                    ratios[name].append(rate / got["np.copyto"])
        print(f"# float32 segment of {mib:g} MiB, median of {args.runs} runs; GB/s read + written")
        for name, _, _ in cases:
            rate, ratio = statistics.median(rates[name]), statistics.median(ratios[name])
            print(f"{name:<22} {rate:7.1f} GB/s  {ratio:5.2f}x copyto")


def ring_main(args: argparse.Namespace) -> None:
    comm = MPI.COMM_WORLD
    messages = {program.SEND, program.RECV, program.WAIT}
    spec = algorithms.spec("allreduce", "ring")
    for mib in map(float, args.mib.split(",")):
        n = int(mib * (1 << 20)) // 4
        x = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
        y = np.empty_like(x)
        plain = channel_for(comm, adapter_for(x))
        narrowed = wires.WireChannel(plain, wires.wire_dtype("bfloat16"))
        variants = {}
        for label, channel, wire in (("plain", plain, None), ("bf16", narrowed, narrowed.wire)):
            spec.run(channel, x, y, OPS["sum"])  # the schedules, as a first call makes them
            recording = program.record(spec, "reducing", channel, x, y, OPS["sum"], 0, wire)
            for part, keep in (
                ("", lambda kind: True),
                (" messages", lambda kind: kind in messages),
                (" kernels", lambda kind: kind not in messages),
            ):
                rows = recording.rows.copy()
                for row in rows:
                    if row[0] != program.STEP and not keep(int(row[0])):
                        row[:] = 0
                        row[0] = program.STEP  # a row that does nothing (keeps the request rows' numbers)
                recording.rows, kept = rows, recording.rows
                variants[label + part] = core.program(recording, x, y)[0]
                recording.rows = kept
        times: dict[str, list[float]] = {name: [] for name in variants}
        for run in range(args.runs + 1):
            for name, made in variants.items():
                made.run(x, y, None)
                comm.Barrier()
                began = time.perf_counter()
                for _ in range(args.calls):
                    made.run(x, y, None)
                elapsed = comm.allreduce((time.perf_counter() - began) / args.calls, op=MPI.MAX)
                if run:
                    times[name].append(elapsed)
        if comm.rank == 0:
            base = statistics.median(times["plain"])
            print(f"# {comm.size} ranks, ring all-reduce of {mib:g} MiB float32, median of {args.runs} runs")
            for name, t in times.items():
                m = statistics.median(t)
                spread = f"[{min(t) * 1e3:.2f}-{max(t) * 1e3:.2f}]"
                print(f"{name:<16} {m * 1e3:8.3f} ms  {m / base:5.2f}x plain  {spread}")
            p, w = traffic(comm.size)
            print(
                f"floor: {w:.1f} against {p:.1f} bytes read + written per element per rank, wire/plain "
                f"= {w / p:.2f}x"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("kernels", "ring"))
    parser.add_argument("--mib", default=None, help="MiB, comma separated (kernels: of a segment)")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    if args.what == "kernels":
        args.mib = args.mib or "8,4"
        kernels_main(args)
    else:
        args.mib = args.mib or "16"
        ring_main(args)


if __name__ == "__main__":
    main()
