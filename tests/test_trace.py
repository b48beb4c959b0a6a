"""Tracing: what a traced run records, the merged file's format, the pictures, and "off".

The MPI tests pass at any rank count G: expected sends come from `segment_bounds(count, G)`
and the ring's schedule, and the symbolic replay of every algorithm must end with every
rank holding every rank's contribution in every element (nothing the trace missed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import everywhere, needs_gpu
from mpi4py import MPI

import hpcring
from hpcring import config, viz
from hpcring.arrays import adapter_for
from hpcring.partition import segment_bounds

TRACE = hpcring.tracing  # the module; hpcring.trace is its context manager
FIXTURE = Path(__file__).resolve().parent.parent / "docs" / "img" / "trace-ring-4ranks.json"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """One temporary directory that every rank sees (rank 0 makes it)."""
    comm = MPI.COMM_WORLD
    holder = tempfile.TemporaryDirectory() if comm.rank == 0 else None
    path = Path(comm.bcast(holder.name if holder else None, root=0))
    yield path
    comm.Barrier()
    if holder:
        holder.cleanup()


def traced(path: Path, algorithm: str, count: int, dtype: Any = np.float64, comm: Any = None) -> None:
    x = np.arange(count, dtype=dtype) + MPI.COMM_WORLD.rank
    with hpcring.trace(path):
        hpcring.allreduce(x, algorithm=algorithm, comm=comm)


def events_of(path: Path) -> list[dict[str, Any]]:
    with open(path) as stream:
        return json.load(stream)["traceEvents"]


def on_root(check: Any) -> bool:
    """Run ``check()`` on rank 0 and give its verdict to every rank (an exception is False)."""
    comm = MPI.COMM_WORLD
    verdict = None
    if comm.rank == 0:
        try:
            verdict = bool(check())
        except Exception as error:
            print(f"check failed on rank 0: {error!r}")
            verdict = False
    return bool(comm.bcast(verdict, root=0))


@pytest.mark.mpi
@pytest.mark.parametrize("count", [12, 10, 3])
def test_ring_sends_one_segment_right_per_step(shared_dir: Path, count: int) -> None:
    comm = MPI.COMM_WORLD
    size, path = comm.size, shared_dir / "ring.json"
    traced(path, "ring", count)
    bounds = segment_bounds(count, size)

    def check() -> bool:
        events = events_of(path)
        for rank in range(size):
            sends = [e for e in events if e["pid"] == rank and e["name"] == "send"]
            assert len(sends) == (2 * (size - 1) if size > 1 else 0), (rank, len(sends))
            for step, event in enumerate(sends):
                # reduce-scatter: segment r - s; all-gather: segment r + 1 - s (hpcring/algorithms/ring.py)
                segment = (rank - step if step < size - 1 else rank + 1 - (step - size + 1)) % size
                lo, hi = bounds[segment]
                args = event["args"]
                assert args["peer"] == (rank + 1) % size, (rank, step, args)
                assert args["buffer"] == "buf", args
                assert args["bytes"] == (hi - lo) * 8, (rank, step, args, bounds)
                # an empty segment (count < G) has no address of its own: NumPy points it at the base
                assert hi == lo or args["offset"] == lo * 8, (rank, step, args, bounds)
        return True

    assert everywhere(comm, on_root(check))


@pytest.mark.mpi
def test_merged_file_is_trace_event_format(shared_dir: Path) -> None:
    comm = MPI.COMM_WORLD
    path = shared_dir / "t.json"
    traced(path, "ring", 8)

    def check() -> bool:
        events = events_of(path)
        assert isinstance(events, list) and events
        for event in events:
            assert {"ph", "ts", "pid", "tid", "name"} <= event.keys(), event
            assert event["ph"] in ("X", "M"), event
            if event["ph"] == "X":
                assert event["dur"] >= 0 and event["ts"] >= 0, event
        assert {e["pid"] for e in events} == set(range(comm.size))
        return True

    assert everywhere(comm, on_root(check))
    assert everywhere(comm, not (shared_dir / "t.json.rank0.json").exists())


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("algorithm", "chunk"),
    [("ring", ""), ("ring", "16"), ("naive", ""), ("ps", ""), ("rabenseifner", ""), ("mpi", "")],
    ids=["ring", "ring-pipelined", "naive", "ps", "rabenseifner", "mpi"],
)
def test_replay_ends_complete(
    shared_dir: Path, algorithm: str, chunk: str, monkeypatch: Any, fresh_world: MPI.Intracomm
) -> None:
    """Every message, reduction and copy is in the trace: replaying it yields the full sum everywhere."""
    comm = MPI.COMM_WORLD
    if chunk:  # 16-byte chunks: the pipelined ring (isend, irecv, wait)
        monkeypatch.setenv("HPCRING_CHUNK_BYTES", chunk)
        config.reload()
    path = shared_dir / f"{algorithm}.json"
    traced(path, algorithm, 13, comm=fresh_world)

    def check() -> bool:
        per_algorithm = viz.calls(viz.load(path))
        if algorithm not in per_algorithm:
            return comm.size == 1  # one rank: nothing to send, so no steps (mpi still calls MPI)
        result = viz.replay(algorithm, per_algorithm[algorithm])
        final = result.steps[-1].state
        full = (1 << comm.size) - 1
        assert all(final[r].get(("buf", i)) == full for r in range(comm.size) for i in range(13)), final
        return True

    assert everywhere(comm, on_root(check))


@pytest.mark.mpi
def test_viz_draws_every_ring_step(shared_dir: Path) -> None:
    comm = MPI.COMM_WORLD
    path = shared_dir / "ring.json"
    traced(path, "ring", comm.size * 2, np.float32)

    def check() -> bool:
        written = viz.render(path, shared_dir / "img")
        steps = 2 * (comm.size - 1) + 1 if comm.size > 1 else 0
        expected = {f"ring-step{k}.png" for k in range(steps)} | ({"ring.png"} if steps else set())
        assert {p.name for p in written} == expected, written
        return all(p.stat().st_size > 1000 for p in written)

    assert everywhere(comm, on_root(check))


@pytest.mark.mpi
def test_off_records_nothing(shared_dir: Path) -> None:
    comm = MPI.COMM_WORLD
    # off: the Channel and Op methods are the plain functions, not even a wrapper call
    assert everywhere(comm, not TRACE.TRACER.on and not TRACE.hooked() and os.environ.get(TRACE.ENV) is None)
    x = np.ones(7)
    hpcring.allreduce(x)
    assert everywhere(comm, not TRACE.TRACER.on and not any(shared_dir.iterdir()))
    with hpcring.trace(shared_dir / "on.json") as tracer:
        hpcring.allreduce(x)
        recorded = bool(tracer.events)
        hooked = TRACE.hooked()
    assert everywhere(comm, recorded and hooked and not TRACE.TRACER.on and not TRACE.hooked())


def test_viz_on_committed_trace(tmp_path: Path) -> None:
    """The sample trace in docs/img (a real 4-rank run) still replays and draws."""
    written = viz.render(FIXTURE, tmp_path)
    assert {p.name for p in written} == {f"ring-step{k}.png" for k in range(7)} | {"ring.png"}
    result = viz.replay("ring", viz.calls(viz.load(FIXTURE))["ring"])
    after_reduce_scatter = result.steps[3].state
    # rank r holds the complete segment r + 1 after the reduce-scatter, nothing complete before it
    bounds = segment_bounds(result.count, 4)
    for rank in range(4):
        lo, _ = bounds[(rank + 1) % 4]
        assert after_reduce_scatter[rank][("buf", lo)] == 0b1111
        assert result.steps[2].state[rank][("buf", lo)] != 0b1111


def test_merge_joins_rank_files(tmp_path: Path) -> None:
    """Per-rank files (written when MPI was finalized first) merge into one event list."""
    paths = []
    for rank in range(2):
        path = tmp_path / f"t.json.rank{rank}.json"
        TRACE.write(path, [{"name": "send", "ph": "X", "ts": 1.0, "dur": 2.0, "pid": rank, "tid": 0}])
        paths.append(str(path))
    TRACE.merge(paths, str(tmp_path / "t.json"))
    assert [e["pid"] for e in events_of(tmp_path / "t.json")] == [0, 1]


@pytest.mark.mpi
@pytest.mark.gpu
@needs_gpu
def test_staging_copies_are_traced(shared_dir: Path) -> None:
    """Without CUDA-aware MPI every device buffer crosses to the host and back: both are events."""
    import cupy

    comm = MPI.COMM_WORLD
    x = cupy.arange(13, dtype=cupy.float32) + comm.rank
    if adapter_for(x).direct:
        pytest.skip("CUDA-aware MPI: device buffers go to MPI directly, nothing is staged")
    path = shared_dir / "gpu.json"
    with hpcring.trace(path):
        hpcring.allreduce(x)

    def check() -> bool:
        events = events_of(path)
        names = {e["name"] for e in events if e["ph"] == "X"}
        if comm.size == 1:
            return True
        assert {"d2h", "h2d", "send", "recv", "reduce"} <= names, names
        result = viz.replay("ring", viz.calls(viz.load(path))["ring"])
        full = (1 << comm.size) - 1
        return all(
            result.steps[-1].state[r].get(("buf", i)) == full for r in range(comm.size) for i in range(13)
        )

    assert everywhere(comm, on_root(check))


def test_environment_variable_writes_file(tmp_path: Path) -> None:
    """HPCRING_TRACE=path in a plain (singleton MPI) process writes the file at exit."""
    path = tmp_path / "env.json"
    code = "import numpy as np, hpcring; hpcring.allreduce(np.ones(4))"
    env = {**os.environ, "HPCRING_TRACE": str(path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    events = events_of(path)
    assert [e["name"] for e in events if e["ph"] == "X"] == ["allreduce ring"]
