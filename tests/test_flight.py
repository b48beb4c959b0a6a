"""The flight recorder: what it keeps, what a StallError says with it, its dumps and their table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from helpers import WAIT_OUT, everywhere, launch, launcher_env
from mpi4py import MPI

import hpcring
from hpcring import config, flight
from hpcring.agreement import Row
from hpcring.comm import state_of

WORLD = MPI.COMM_WORLD
ROOT = Path(__file__).resolve().parents[1]


def record(comm: MPI.Intracomm) -> list[dict[str, Any]]:
    return state_of(comm).flight.as_dict()["calls"]


@pytest.fixture
def recorder_dir(monkeypatch: pytest.MonkeyPatch) -> Any:
    """HPCRING_FLIGHT_RECORDER set to one directory shared by every rank (rank 0 makes it)."""
    made = tempfile.mkdtemp(prefix="hpcring-flight-") if WORLD.rank == 0 else None
    directory = Path(WORLD.bcast(made, root=0))
    monkeypatch.setenv("HPCRING_FLIGHT_RECORDER", str(directory))
    config.reload()
    yield directory
    monkeypatch.delenv("HPCRING_FLIGHT_RECORDER")
    config.reload()


# --- at any rank count -----------------------------------------------------------------------


@pytest.mark.mpi
def test_record_after_a_few_calls() -> None:
    comm = WORLD.Dup()
    hpcring.allreduce(np.ones(10), comm=comm, algorithm="ring")
    hpcring.allreduce(
        np.ones(7, dtype=np.float32), comm=comm, op="max", algorithm="mpi", out=np.empty(7, np.float32)
    )
    hpcring.allreduce(np.ones(3, dtype=np.int32), comm=comm, algorithm="rabenseifner", check=False)
    calls = record(comm)
    agreed = 1 if comm.size > 1 else None  # one rank agrees on nothing: no number
    expect = [
        (1, agreed, "sum", "float64", 10, 80, "ring", "in place"),
        (2, agreed and 2, "max", "float32", 7, 28, "mpi", "out of place"),
        (3, None, "sum", "int32", 3, 12, "rabenseifner", "in place"),
    ]
    got = [
        (c["seq"], c["call"], c["op"], c["dtype"], c["count"], c["bytes"], c["algorithm"], c["placement"])
        for c in calls
    ]
    ok = got == expect and all(c["phase"] == "done" and not c["failed"] for c in calls)
    ok &= all(c["start"] <= c["end"] for c in calls) and calls[0]["end"] <= calls[1]["start"]
    assert everywhere(WORLD, ok), got
    comm.Free()


@pytest.mark.mpi
def test_ring_counts_its_steps() -> None:
    comm = WORLD.Dup()
    hpcring.allreduce(np.ones(12), comm=comm, algorithm="ring")
    channel = next(iter(state_of(comm).channels.values()))
    assert everywhere(WORLD, channel.step == 2 * (comm.size - 1))
    comm.Free()


@pytest.mark.mpi
def test_record_wraps_around_at_64() -> None:
    comm = WORLD.Dup()
    for count in range(1, 71):
        hpcring.allreduce(np.ones(count), comm=comm, algorithm="mpi")
    data = state_of(comm).flight.as_dict()
    calls = data["calls"]
    ok = data["calls_total"] == 70 and len(calls) == flight.SLOTS == 64
    ok &= [c["seq"] for c in calls] == list(range(7, 71)) and [c["count"] for c in calls] == list(
        range(7, 71)
    )
    if comm.size > 1:
        ok &= [c["call"] for c in calls] == list(range(7, 71))
    assert everywhere(WORLD, ok)
    comm.Free()


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.waits_out
def test_stall_error_names_the_missing_ranks_last_call() -> None:
    if WORLD.size == 1:
        pytest.skip("needs a rank to miss")
    missing = WORLD.size - 1
    comm = WORLD.Dup()
    hpcring.allreduce(np.ones(5), comm=comm, op="max", algorithm="ring")
    ok = True
    if WORLD.rank != missing:
        try:
            hpcring.allreduce(np.ones(9, dtype=np.float32), comm=comm, algorithm="ps", timeout=WAIT_OUT)
            ok = False
        except hpcring.StallError as error:
            text = str(error)
            ok = f"rank {missing}: last known at call 1 (allreduce max float64 x 5 (40 B), ring" in text
            ok &= (
                f"rank {WORLD.rank} (this one): waits in call 2 (allreduce sum float32 x 9 (36 B), ps)"
                in text
            )
            last = record(comm)[-1]
            ok &= last["call"] == 2 and last["phase"] == "agreement" and last["failed"]
            ok &= last["error"].startswith("StallError")
    assert everywhere(WORLD, ok)
    comm.Free()


@pytest.mark.mpi
def test_dump_on_a_disagreement(recorder_dir: Path) -> None:
    if WORLD.size == 1:
        pytest.skip("needs ranks to disagree")
    comm = WORLD.Dup()
    hpcring.allreduce(np.ones(4), comm=comm)
    with pytest.raises(ValueError, match="ranks disagree on count"):
        hpcring.allreduce(np.ones(4 + WORLD.rank), comm=comm)
    data = json.loads((recorder_dir / f"rank-{WORLD.rank}.json").read_text())
    mine = next(c for c in data["communicators"] if c["id"] == state_of(comm).flight.ident)
    last = mine["calls"][-1]
    ok = data["rank"] == WORLD.rank and data["size"] == WORLD.size and data["pid"] == os.getpid()
    ok &= data["reason"].startswith("ValueError: hpcring.allreduce: ranks disagree on count")
    ok &= mine["size"] == comm.size and last["count"] == 4 + WORLD.rank and last["phase"] == "agreement"
    ok &= last["failed"] and mine["calls"][-2]["phase"] == "done"
    assert everywhere(WORLD, ok)
    comm.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("op", [MPI.LAND, "not an op", 3], ids=["MPI.LAND", "a string", "a number"])
def test_a_refused_op_leaves_a_record_that_dumps(recorder_dir: Path, op: Any) -> None:
    """A call refused for its op (an MPI op hpcring does not take, or no op at all) raises on every
    rank, and the record of it still dumps as JSON afterwards (an mpi4py op in it made every later
    dump fail), its op a name or unknown."""
    comm = WORLD.Dup()
    hpcring.allreduce(np.ones(2), comm=comm)
    with pytest.raises(ValueError):
        hpcring.allreduce(np.ones(2), op=op, comm=comm)
    data = json.loads(flight.dump(recorder_dir, "test").read_text())
    mine = next(c for c in data["communicators"] if c["id"] == state_of(comm).flight.ident)
    last = mine["calls"][-1]
    ok = last["failed"] and last["op"] in (None, op) and mine["calls"][-2]["op"] == "sum"
    assert everywhere(WORLD, ok)
    comm.Free()


@pytest.mark.mpi
def test_dump_on_sigusr1(recorder_dir: Path) -> None:
    comm = WORLD.Dup()  # its recorder installs the handler, the variable being set
    hpcring.allreduce(np.ones(6), comm=comm, algorithm="mpi")
    path = recorder_dir / f"rank-{WORLD.rank}.json"
    os.kill(os.getpid(), signal.SIGUSR1)
    deadline = time.monotonic() + 5
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    data = json.loads(path.read_text())
    mine = [c for c in data["communicators"] if c["id"] == state_of(comm).flight.ident]
    ok = data["reason"] == "SIGUSR1" and len(mine) == 1 and mine[0]["calls"][-1]["count"] == 6
    assert everywhere(WORLD, ok)
    comm.Free()


# --- serial ----------------------------------------------------------------------------------


def test_handler_chains_the_previous_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    heard = []
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: heard.append(signum))
    monkeypatch.setattr(flight, "_installed", False)
    monkeypatch.setattr(flight, "_previous", flight._previous)  # put back after the test
    monkeypatch.setenv("HPCRING_FLIGHT_RECORDER", str(tmp_path))
    config.reload()
    try:
        flight.Recorder(0, 1)
        os.kill(os.getpid(), signal.SIGUSR1)
        for _ in range(100):
            if heard:
                break
            time.sleep(0.01)
        assert heard == [signal.SIGUSR1]
        assert json.loads((tmp_path / "rank-0.json").read_text())["reason"] == "SIGUSR1"
    finally:
        signal.signal(signal.SIGUSR1, before)
        monkeypatch.delenv("HPCRING_FLIGHT_RECORDER")
        config.reload()


def fake_call(count: int, dtype: str = "float64", op: str = "sum", algorithm: str = "ring") -> Any:
    """What the recorder reads of an engine Call: its agreed row, what ran, its Spec's traits."""
    row = Row("allreduce", count, np.dtype(dtype), op, algorithm, "numpy.ndarray", True, 0, 0, None)
    return SimpleNamespace(
        row=row, ran=algorithm, spec=SimpleNamespace(stepped=True), channel=SimpleNamespace(step=3)
    )


def recorded(rank: int, size: int, calls: list[tuple[Any, int]]) -> flight.Recorder:
    """A recorder as api would have filled it: (call, phase) per call, checked, numbered 1, 2, ..."""
    recorder = flight.Recorder(rank, size)
    for call, phase in calls:
        recorder.seq += 1
        slot = recorder.slots[recorder.seq & flight.MASK]
        slot.call, slot.number, slot.start = call, recorder.seq, float(recorder.seq)
        # api stores no phase at the end of a call, only its end time
        slot.phase, slot.end = (flight.MOVING, slot.start + 0.5) if phase == flight.DONE else (phase, 0.0)
    return recorder


def test_stall_detail_from_the_local_record_alone() -> None:
    recorder = recorded(1, 3, [(fake_call(5), flight.DONE), (fake_call(9, "float32"), flight.AGREEMENT)])
    recorder.slots[2].number = 0  # the agreement of call 2 never completed: api had not numbered it
    text = flight.stall_detail(recorder, [2], 2, {})
    assert (
        "rank 2: last known at call 1 (allreduce sum float64 x 5 (40 B), ring; every rank agreed on it)"
        in text
    )
    assert (
        "rank 1 (this one): waits in call 2 (allreduce sum float32 x 9 (36 B), ring), in the agreement"
        in text
    )
    assert "rank 0: stopped waiting too" in text
    first = flight.stall_detail(recorded(0, 2, [(fake_call(1), flight.AGREEMENT)]), [1], 1)
    assert "rank 1: no earlier call on this communicator" in first
    assert flight.stall_detail(None, [1], 1) == ""


def test_stall_detail_with_what_the_waiting_ranks_said() -> None:
    recorder = recorded(0, 4, [(fake_call(5), flight.DONE), (fake_call(8), flight.MOVING)])
    where = flight.Where.ALGORITHM
    text = flight.stall_detail(recorder, [3], 2, {0: [0, 2, 3, where], 1: [1, 2, 0, where]})
    assert "rank 3: last known at call 2 (allreduce sum float64 x 8" in text
    assert "its agreement completed, its data exchange did not" in text
    assert "rank 0: waits in call 2, in the data exchange, for rank 3" in text
    assert "rank 1: waits in call 2, in the data exchange, for rank 0" in text
    assert "(this one)" not in text  # what rank 0 said is what it knows


def dump_of(
    rank: int, calls: list[tuple[int, str, int, str]], reason: str = "StallError: x"
) -> dict[str, Any]:
    """A rank's dump with one communicator: (seq, phase, step, algorithm) per call."""
    entries = [
        {
            "seq": seq,
            "call": seq,
            "op": "sum",
            "dtype": "float64",
            "count": 10,
            "bytes": 80,
            "algorithm": algorithm,
            "ran": algorithm,
            "placement": "in place",
            "array": "numpy",
            "phase": phase,
            "failed": phase != "done",
            "step": step,
            "start": 0.0,
            "end": None,
            **({"error": reason} if phase != "done" else {}),
        }
        for seq, phase, step, algorithm in calls
    ]
    comm = {"id": 1, "rank": rank, "size": 3, "calls_total": len(entries), "calls": entries}
    return {
        "rank": rank,
        "size": 3,
        "host": "h",
        "pid": 1,
        "time": 0.0,
        "reason": reason,
        "communicators": [comm],
    }


def test_table_points_at_the_rank_that_got_least_far() -> None:
    done = [(1, "done", 0, "ring"), (2, "done", 0, "ring")]
    dumps = [
        dump_of(0, [*done, (3, "moving", 3, "ring")]),
        dump_of(1, [*done, (3, "moving", 1, "ring")], "SIGUSR1"),
        dump_of(2, [*done, (3, "moving", 4, "ring")]),
    ]
    text = flight.table(dumps)
    assert (
        "first to diverge: rank 1, stopped at # 3 (allreduce sum float64 x 10 (80 B), ring), moving step 1"
        in text
    )
    behind = flight.table([dumps[0], dumps[2], dump_of(1, done, "SIGUSR1")])
    assert "first to diverge: rank 1, stopped at # 2" in behind
    differ = flight.table([dump_of(0, [(1, "done", 0, "ring")]), dump_of(1, [(1, "done", 0, "ps")])])
    assert "<- ranks differ" in differ and "every rank with a dump got as far" in differ
    assert "1 of its 3 ranks left no dump" in differ and "no dump from rank 2: " in differ


def test_table_with_one_dump_claims_nothing_of_the_others() -> None:
    """A StallError writes only the raising rank's record: rank 1, which never reached call 3,
    left none, so the table must not say that every rank got to call 3."""
    done = [(1, "done", 0, "ring"), (2, "done", 0, "ring")]
    text = flight.table([dump_of(0, [*done, (3, "agreement", 0, "ring")])])
    assert "every rank got as far" not in text
    assert "every rank with a dump got as far: # 3" in text and "2 of its 3 ranks left no dump" in text
    assert "no dump from ranks 1, 2: where they are is unknown; send SIGUSR1 to every rank" in text


def test_main_on_an_empty_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert flight.main([str(tmp_path)]) == 1
    assert "no flight records" in capsys.readouterr().out
    assert flight.main([]) == 2


STALLING_JOB = """
    import os, signal, time
    import numpy as np
    from mpi4py import MPI
    import hpcring

    world = MPI.COMM_WORLD
    for _ in range(2):
        hpcring.allreduce(np.ones(100), algorithm="ring")
    hpcring.allreduce(np.ones(3, dtype=np.float32), op="max", algorithm="mpi")
    if world.rank == world.size - 1:  # skips the next call, then is asked for its record
        time.sleep(3)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.2)
    else:
        try:
            hpcring.allreduce(np.ones(100), algorithm="rabenseifner", timeout=1)
        except hpcring.StallError as error:
            print(error, flush=True)
"""


@pytest.mark.timeout(120)
def test_table_of_a_real_three_rank_stall(tmp_path: Path) -> None:
    script = tmp_path / "stall.py"
    script.write_text(textwrap.dedent(STALLING_JOB))
    records = tmp_path / "records"
    env = {**launcher_env(), "HPCRING_FLIGHT_RECORDER": str(records), "PYTHONPATH": str(ROOT)}
    command = [*launch(3), sys.executable, str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=90, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("rank 2: last known at call 3 (allreduce max float32 x 3 (12 B), mpi") == 2, (
        done.stdout
    )
    assert sorted(p.name for p in records.iterdir()) == ["rank-0.json", "rank-1.json", "rank-2.json"]
    shown = subprocess.run(
        [sys.executable, "-m", "hpcring.flight", str(records)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    assert (
        "first to diverge: rank 2, stopped at # 3 (allreduce max float32 x 3 (12 B), mpi), done"
        in shown.stdout
    )
    assert "rank 2: " in shown.stdout and "written for SIGUSR1" in shown.stdout
    row = [line for line in shown.stdout.splitlines() if line.strip().startswith("4 ")]
    assert len(row) == 1 and row[0].count("agreement FAILED") == 2, shown.stdout
