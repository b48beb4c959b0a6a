"""A rank that never arrives becomes a StallError on the others, naming it, instead of a hang."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import WAIT_OUT, everywhere, launch, launcher_env
from mpi4py import MPI

import hpcring
from hpcring import config

WORLD = MPI.COMM_WORLD
TIMEOUT = WAIT_OUT  # only the stalled call has it
JOB = str(Path(__file__).with_name("stall_job.py"))
JOB_TIMEOUT = 2.0  # stall_job.TIMEOUT


@pytest.mark.parametrize("skipper", ["last", "first"])
@pytest.mark.parametrize("algorithm", ["ring", "ps"])
@pytest.mark.parametrize("first", [False, True], ids=["warm", "first-call"])
@pytest.mark.mpi
@pytest.mark.waits_out
def test_rank_skips_the_call(skipper: str, algorithm: str, first: bool) -> None:
    """Skipped on a warm communicator (the others name the rank), or as the FIRST call on a fresh
    one (its Idup: they say a rank did not arrive, and why they cannot say which)."""
    if WORLD.size == 1:
        pytest.skip("needs a rank to miss")
    missing = WORLD.size - 1 if skipper == "last" else 0
    comm = WORLD.Dup()
    if not first:
        hpcring.allreduce(np.ones(4), comm=comm)  # warm: the duplicate exists on every rank
    ok = True
    if WORLD.rank != missing:
        start = time.monotonic()
        try:
            hpcring.allreduce(np.ones(1000), comm=comm, algorithm=algorithm, timeout=TIMEOUT)
            ok = False
        except hpcring.StallError as error:
            elapsed = time.monotonic() - start
            if first:  # nothing of hpcring's travels on the user's communicator: no rank can be named
                ok = error.missing == [] and str(error).startswith("hpcring: a rank did not arrive")
            else:
                ok = error.missing == [missing] and f"rank {missing} did not arrive" in str(error)
            ok &= TIMEOUT - 0.1 <= elapsed <= TIMEOUT + 2.0
            ok &= isinstance(error, TimeoutError)
    assert everywhere(WORLD, ok)
    comm.Free()


@pytest.mark.mpi
@pytest.mark.mpi
def test_first_call_on_a_split_communicator_waits_for_a_late_rank() -> None:
    """The first call's wait looks for notices under MPI_TAG_UB, which Open MPI caches on
    COMM_WORLD only: on a communicator made by a split, with a rank late enough for the wait
    to look, the call must still complete (it raised TypeError, the tag being None)."""
    comm = WORLD.Split(0, WORLD.size - WORLD.rank)  # reversed order: not a duplicate of WORLD
    if WORLD.rank == 0:
        time.sleep(0.3)
    x = np.ones(3)
    hpcring.allreduce(x, comm=comm, timeout=30)
    assert everywhere(WORLD, bool((x == WORLD.size).all()))
    comm.Free()


def test_timeout_from_environment(monkeypatch) -> None:
    from hpcring.engine import default_timeout

    monkeypatch.setenv("HPCRING_TIMEOUT", "7.5")
    config.reload()
    assert default_timeout() == 7.5
    monkeypatch.setenv("HPCRING_TIMEOUT", "soon")
    config.reload()
    with pytest.raises(ValueError, match="HPCRING_TIMEOUT"):
        default_timeout()


def _job(*args: str, ranks: int) -> tuple[int, str, float]:
    """Run tests/stall_job.py under mpiexec: (exit status, output, seconds)."""
    command = [*launch(ranks), sys.executable, JOB, *args]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=90, env=launcher_env())
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


def _results(output: str) -> dict[int, dict[str, str]]:
    rows = {}
    # A line may follow another rank's text that lacked its newline when the launcher forwarded it.
    for match in re.finditer(r"RESULT (rank=\S+(?: \w+=\S*)*)", output):
        fields = dict(word.split("=", 1) for word in match.group(1).split())
        rows[int(fields["rank"])] = fields
    return rows


@pytest.mark.parametrize(("skipper", "ranks"), [("first", 2), ("last", 3)])  # each job ~10 s
def test_first_call_skip(skipper: str, ranks: int) -> None:
    """The first call on a fresh communicator (its Idup) is bounded: every other rank raises at its
    deadline, saying that a rank did not arrive and why it cannot say which (nothing of hpcring's
    travels on the user's communicator, and its own is what the first call makes)."""
    missing = 0 if skipper == "first" else ranks - 1
    status, output, seconds = _job("skip", str(missing), ranks=ranks)
    rows = _results(output)
    assert status != 0 and len(rows) == ranks, output
    assert seconds < 45, f"the job took {seconds:.0f} s to end (MPI_Finalize after a StallError)"
    for rank, row in rows.items():
        if rank == missing:
            continue
        assert row.get("missing") == "", output
        assert JOB_TIMEOUT - 0.1 <= float(row["elapsed"]) <= JOB_TIMEOUT + 2.0, output
    assert "a rank did not arrive at the first hpcring call" in output
    assert "which rank cannot be known" in output
    assert "received signal" not in output, output


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner"])
def test_rank_frozen_mid_call(algorithm: str, ranks: int) -> None:
    """A rank that stops after its first exchange: the others raise StallError naming it within
    timeout + 2 s; woken, it ends in an error too; the job ends non-zero, no hang and no crash
    (woken, rank 1 of 3 in Rabenseifner took up a send its peer had given up on: that peer
    crashed in MPI_Finalize while the send's array was freed, until `polling.abandon`)."""
    frozen = 1
    status, output, seconds = _job("freeze", str(frozen), algorithm, ranks=ranks)
    rows = _results(output)
    assert status != 0 and len(rows) == ranks, output
    assert "received signal" not in output, output
    assert seconds < 45, f"the job took {seconds:.0f} s to end (MPI_Finalize after a StallError)"
    for rank, row in rows.items():
        if rank == frozen:
            assert "completed" not in row, output
            continue
        assert row.get("missing") == str(frozen), output
        assert float(row["elapsed"]) <= JOB_TIMEOUT + 2.0, output


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_rank_frozen_mid_warm_call() -> None:
    """As above, in a call after two of its kind: with the compiled core, the others run the whole
    call in C (agreement and step table) and still name the frozen rank in time."""
    frozen = 1
    status, output, seconds = _job("freeze", str(frozen), "ring", "2", ranks=3)
    rows = _results(output)
    assert status != 0 and len(rows) == 3, output
    assert "received signal" not in output, output
    assert seconds < 45, f"the job took {seconds:.0f} s to end (MPI_Finalize after a StallError)"
    for rank, row in rows.items():
        if rank != frozen:
            assert row.get("missing") == str(frozen), output
            assert float(row["elapsed"]) <= JOB_TIMEOUT + 2.0, output
    assert "did not arrive at the data exchange call 3" in output, output


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
@pytest.mark.parametrize("ranks", [2, 3])
def test_rank_frozen_inside_mpi_allreduce(ranks: int) -> None:
    """`mpi` blocks in MPI_Allreduce: a rank frozen just before it leaves the others inside it,
    where only the watchdog sees them; it names the frozen rank and ends the job (MPI_Abort)
    within timeout + 2 s and a bit, instead of a hang."""
    status, output, seconds = _job("freeze", "1", "mpi", ranks=ranks)
    assert status != 0, output
    assert seconds < 30, f"the job took {seconds:.0f} s to end"
    assert "rank 1 did not arrive at the blocking allreduce of call 2" in output, output
    assert "it ends the job (MPI_Abort)" in output, output
    # (The launcher sends SIGCONT before it kills, so the frozen rank may still finish the call
    # and print a result while the job is ending: what counts is the diagnosis and the end.)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["ring", "mpi", "rabenseifner"])
def test_no_deadline_runs_blocking_calls(algorithm: str) -> None:
    """timeout=0: no deadline, MPI's own blocking calls; the same closed-form result."""
    x = np.full(1001, WORLD.rank + 1, dtype=np.float64)
    hpcring.allreduce(x, algorithm=algorithm, timeout=0)
    assert everywhere(WORLD, bool((x == WORLD.size * (WORLD.size + 1) / 2).all()))
