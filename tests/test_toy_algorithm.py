"""A new algorithm is one module and its table line: a toy all-reduce registered from here runs,
and the flight recorder, the watchdog, wire=, the cost model and the trace viewer each handle it
or refuse it by the traits its Spec declares, with no edit anywhere else."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from helpers import everywhere, identical_everywhere, raises_everywhere
from mpi4py import MPI

import hpcring
from hpcring import agreement, algorithms, flight, watchdog, wire
from hpcring.algorithms import Phase, Spec
from hpcring.model.costs import NO_SOFTWARE, Link, ModelError, predict
from hpcring.viz import Replay, describe

WORLD = MPI.COMM_WORLD


def toy_allreduce(ch: Any, src: Any, dst: Any, op: Any) -> None:
    """Every rank's buffer to every rank, one exchange at a time, summed in rank order (the
    naive schedule, written again: what a reader of this test needs on one screen)."""
    size, rank = ch.size, ch.rank
    rows = ch.scratch("toy", size * src.size, src.dtype).reshape(size, src.size)
    rows[rank] = src
    ch.as_sent(rows[rank])  # wire=: keep what the others receive
    ch.step = 0
    for step in range(1, size):
        ch.step += 1
        ch.sendrecv(rows[rank], (rank + step) % size, rows[(rank - step) % size], (rank - step) % size)
    dst[...] = rows[0]
    for row in range(1, size):
        op.reduce(ch.xp, dst, rows[row])


def toy_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    return (size - 1) * count * itemsize if size > 1 else 0


def toy_scratch(count: int, itemsize: int, size: int, rank: int) -> int:
    return size * count * itemsize if size > 1 else 0


def toy_phases(n: float, p: int) -> list[Phase]:
    return [Phase(1, n, 0.0, s) for s in range(1, p)] + (
        [Phase(0, 0.0, (p - 1) * n, 0, "local")] if p > 1 else []
    )


TOY = Spec(run=toy_allreduce, bytes_sent=toy_bytes, scratch_bytes=toy_scratch, stepped=True)


@pytest.fixture
def toys() -> Iterator[dict[str, Spec]]:
    """Three toys of one module: plain (stepped, not modelled, refuses wire=), narrowing and
    modelled and pictured, and one that declares itself a blocking library call."""
    made = {
        "toy": algorithms.register("allreduce", "toy", TOY),
        "toywire": algorithms.register(
            "allreduce",
            "toywire",
            Spec(
                run=toy_allreduce,
                bytes_sent=toy_bytes,
                scratch_bytes=toy_scratch,
                narrowings=lambda size, per_node: 1,
                phases=toy_phases,
                picture=lambda index, steps, size: f"toy step {index} of {steps}",
            ),
        ),
        "toyblocking": algorithms.register(
            "allreduce",
            "toyblocking",
            Spec(run=toy_allreduce, bytes_sent=toy_bytes, scratch_bytes=toy_scratch, blocking=True),
        ),
    }
    yield made
    for name in made:
        algorithms.unregister("allreduce", name)


@pytest.mark.mpi
def test_a_registered_algorithm_runs_and_is_recorded(toys: dict[str, Spec]) -> None:
    comm = WORLD.Dup()
    x = np.arange(10, dtype=np.float64) + WORLD.rank
    want = WORLD.size * np.arange(10) + WORLD.size * (WORLD.size - 1) / 2
    out = hpcring.allreduce(x, algorithm="toy", comm=comm, out=np.empty_like(x))
    ok = bool((out == want).all()) and identical_everywhere(WORLD, out)
    # this call's record, whichever live recorder is comm's (the progress engine's is another)
    (entry,) = [e for record in flight.records() for e in record["calls"] if e["algorithm"] == "toy"]
    ok &= entry["ran"] == "toy" and entry["phase"] == "done"
    ok &= hpcring.algorithms.bytes_sent("toy", 10, 8, WORLD.size, WORLD.rank) == (WORLD.size - 1) * 80
    assert everywhere(WORLD, ok)
    comm.Free()


@pytest.mark.mpi
def test_wire_follows_the_declared_narrowings(toys: dict[str, Spec]) -> None:
    """A Spec without ``narrowings`` cannot narrow: wire= is refused on every rank, naming those
    that can (the toy that declares them among them); with them, it narrows."""
    x = np.linspace(-1, 1, 64, dtype=np.float32) * (WORLD.rank + 1)
    raises_everywhere(
        ValueError,
        "cannot narrow it; wire='bfloat16' needs",
        lambda: hpcring.allreduce(x, algorithm="toy", wire="bfloat16"),
    )
    ok = False
    try:
        hpcring.allreduce(x.copy(), algorithm="toy", wire="bfloat16")
    except ValueError as error:
        ok = "toywire" in str(error)
    out = hpcring.allreduce(x.copy(), algorithm="toywire", wire="bfloat16")
    ok &= identical_everywhere(WORLD, out) and wire.narrowings("toywire", WORLD.size) == (WORLD.size > 1)
    assert everywhere(WORLD, ok)


def test_the_watchdog_watches_only_what_declares_itself_blocking(toys: dict[str, Spec]) -> None:
    recorder = flight.Recorder(0, 2)

    def stuck_in(spec: Spec) -> flight.Slot | None:
        call = SimpleNamespace(spec=spec, channel=SimpleNamespace(timeout=1.0))
        recorder.seq += 1
        slot = recorder.slots[recorder.seq & flight.MASK]
        slot.call, slot.phase, slot.start, slot.end = call, flight.MOVING, 0.0, -1.0
        return watchdog.overdue(recorder, 100.0)  # 100 s into a call with a 1 s timeout

    assert stuck_in(toys["toy"]) is None  # its waits are hpcring's own, bounded
    assert stuck_in(toys["toyblocking"]) is not None


def test_the_flight_record_reads_the_step_of_a_stepped_algorithm(toys: dict[str, Spec]) -> None:
    recorder = flight.Recorder(0, 2)
    row = agreement.Row("allreduce", 8, np.dtype(np.float64), "sum", "toy", "numpy.ndarray", True, 0, 0, None)
    for spec, step in ((toys["toy"], 3), (toys["toywire"], 0)):  # toywire does not declare stepped
        call = SimpleNamespace(spec=spec, row=row, ran=spec.name, channel=SimpleNamespace(step=3))
        recorder.seq += 1
        slot = recorder.slots[recorder.seq & flight.MASK]
        slot.call, slot.phase, slot.start, slot.end = call, flight.MOVING, 1.0, 0.0
        assert recorder.entry(recorder.seq, slot)["step"] == step


def test_the_cost_model_prices_declared_phases_and_refuses_the_rest(toys: dict[str, Spec]) -> None:
    link = Link(1e-6, 1e-9)
    assert predict("toywire", 1 << 20, 4, link, gamma=1e-10, software=NO_SOFTWARE) == pytest.approx(
        3 * (1e-6 + (1 << 20) * 1e-9) + 3 * (1 << 20) * 1e-10
    )
    with pytest.raises(ModelError, match="unknown algorithm 'toy'"):
        predict("toy", 1 << 20, 4, link, gamma=1e-10)
    with pytest.raises(ModelError, match="unknown algorithm 'nope'"):
        predict("nope", 1 << 20, 4, link, gamma=1e-10)


def test_the_trace_viewer_titles_a_step_by_the_declared_picture(toys: dict[str, Spec]) -> None:
    step = SimpleNamespace(collective=None)
    for name, title in (("toywire", "toy step 1 of 3"), ("toy", "toy step 1/3")):
        replay = Replay(algorithm=name, size=2, count=4, itemsize=8, steps=[step] * 4)
        assert describe(replay, 1) == title


def test_an_unregistered_name_is_an_error_everywhere() -> None:
    with pytest.raises(ValueError, match="unknown algorithm 'toy'"):
        algorithms.spec("allreduce", "toy")
    with pytest.raises(ValueError, match="unknown algorithm 'toy'"):
        wire.narrowings("toy", 4)
    with pytest.raises(ValueError, match=r"hpcring\.allreduce: unknown algorithm 'toy'"):
        hpcring.allreduce(np.ones(2), algorithm="toy", comm=MPI.COMM_SELF, check=False)
