"""Elastic data parallelism under MPI's fault tolerance (ULFM), with ranks killed for real.

Detection: a rank that dies inside any hpcring collective (SIGKILL, os._exit, a crash) makes
every survivor raise RankFailedError at once, naming it and the call; hpcring.shrink gives a
communicator on which the survivors' next all-reduce is right (tests/ulfm_job.py: every
algorithm of the all-reduce, the other collectives, the reproducible sum, the non-blocking call
and a plan, each case on the survivors of the one before). Training: the digits example with
--elastic --reproducible loses ranks killed from outside after step 20 (at 4 and 3 ranks, rank 0,
twice in one run, one more while the survivors recover, one after the last step) and ends with
the weights digest of the run that lost nothing, which is also the one-rank run's. Bad launches
stop every rank before training, saying how to launch. Serial tests: each launches its job, and
every job is bounded (a hang fails the test, the job is ended).

The whole file takes about 3.5 minutes on 2 busy cores; by default (CI) it runs a representative
part in about 2.5: detection on every algorithm, the bad launches, rank 0 killed mid-training at
4 ranks, the middle rank at 3, and two ranks killed in one run (the digests compared with the
one-rank run). The longer training runs (`LONG`: 17-30 s each) run with
``bash tests/run.sh --full`` (or ``HPCRING_TEST_FULL=1 python -m pytest -q tests/test_elastic.py``).
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import launch
from mpi4py import MPI
from ulfm_helpers import NO_ULFM, PYTHON, Job, digest_of, steps_of, ulfm_launch

from hpcring.examples import train

pytestmark = [NO_ULFM, pytest.mark.timeout(600)]
HERE = Path(__file__).resolve().parent
STEPS = 60
TRAIN = [
    PYTHON,
    "-m",
    "hpcring.examples.train",
    "--elastic",
    "--reproducible",
    "--max-steps",
    str(STEPS),
    "--digest",
]
JOB_SECONDS = 300  # a job's bound: ranks start slowly on 2 shared cores (10-20 s each under load)
# A survivor stuck inside MPI (never seen but once, an Open MPI deadlock) fails the recovery after this
TIMEOUT = {"HPCRING_TIMEOUT": "60"}
LONG = pytest.mark.full  # a longer kill run (17-30 s on 2 cores): tests/run.sh --full
DETECTED_WITHIN = 1.5  # seconds from a death to RankFailedError on every survivor ("about 1 s")


@pytest.fixture(scope="module")
def one_rank() -> str:
    """The weights digest of the one-rank reproducible run (in this process)."""
    result = train.train(MPI.COMM_SELF, max_steps=STEPS, reproducible=True)
    return train._digest(result.params, np)


def run(ranks: int, kills: list[tuple[int, int]], command: list[str] = TRAIN) -> list[str]:
    """``command`` on ``ranks`` ranks; for each (r, s) of ``kills`` world rank r is SIGKILLed right
    after it applied step s. Where ``command`` is TRAIN or tests/elastic_job.py the rank kills
    itself there (elastic_job.py's boundary kill): a kill sent from here once the step's line
    showed could come after the job's remaining steps had ended, on two busy cores. Another
    command (the example with flags of its own) is killed from here: give it steps enough."""
    if kills and command is TRAIN:
        command = [PYTHON, str(HERE / "elastic_job.py"), "--reproducible", "--max-steps", str(STEPS)]
    itself = str(HERE / "elastic_job.py") in command
    gone: list[int] = []
    for rank, step in kills if itself else []:  # the loop's rank of world rank ``rank`` then
        command = [*command, "--kill", f"{step}:{rank - sum(g < rank for g in gone)}:boundary"]
        gone.append(rank)
    job = Job([*ulfm_launch(ranks), *command], JOB_SECONDS, env=TIMEOUT)
    if kills and not itself:
        job.wait_for(r"^step 1/")  # every rank runs: find them now, kill them at once later
        job.find(ranks)
        for rank, step in kills:
            job.wait_for(rf"^step {step}/")
            job.kill(rank)
    lines = job.finish()
    assert any(line.startswith("step ") for line in lines), job.output()
    return lines


def last_step(lines: list[str]) -> tuple[int, int, int]:
    return steps_of(lines)[-1]


@LONG
def test_uninterrupted_elastic_run_has_the_one_rank_digest(one_rank: str) -> None:
    lines = run(4, [])
    assert digest_of(lines) == one_rank
    assert [s for s, _, g in steps_of(lines)] == list(range(1, STEPS + 1))
    assert {g for _, _, g in steps_of(lines)} == {4}


def test_rank_0_killed_at_4_ranks(one_rank: str) -> None:
    """Rank 0 kills itself once it applied step 20. A survivor whose step-20 all-reduce still
    waited for a message of rank 0's that died with it has completed step 19 only: the survivors
    then go on from the last step all of them completed, step 19, and end with the same digest.
    (On two loaded cores it failed now and then on that line alone, which the report cut off: the
    assertion shows the lost-ranks lines first.)"""
    lines = run(4, [(0, 20)])
    assert last_step(lines) == (STEPS, STEPS, 3)
    lost = [line for line in lines if line.startswith("# lost ranks")]
    assert lost in (
        ["# lost ranks [0]: 4 -> 3, after step 20"],
        ["# lost ranks [0]: 4 -> 3, after step 19"],
    ), (lost, lines[-8:])
    assert digest_of(lines) == one_rank


def test_middle_rank_killed_at_3_ranks(one_rank: str) -> None:
    lines = run(3, [(1, 20)])
    assert last_step(lines) == (STEPS, STEPS, 2)
    assert digest_of(lines) == one_rank


def test_two_ranks_killed_in_one_run(one_rank: str) -> None:
    lines = run(4, [(3, 10), (1, 30)])
    sizes = [g for _, _, g in steps_of(lines)]
    assert sizes[0] == 4 and 3 in sizes and sizes[-1] == 2, sizes
    assert sum(line.startswith("# lost rank") for line in lines) == 2
    assert digest_of(lines) == one_rank


def test_a_rank_lost_as_the_loop_ends_leaves_no_survivor_in_the_exit() -> None:
    """Rank 1 of 3 dies as the loop returns, where no survivor sees it: the survivors print the
    digest and end. Open MPI's MPI_Finalize can hang after a loss (open-mpi/ompi#11404; here
    in about one such job in fifteen): a process that made an Elastic loop ends at most
    FINALIZE_WITHIN seconds into its exit. Three jobs, each bounded well below a hang's."""
    job = [PYTHON, str(HERE / "elastic_job.py"), "--reproducible", "--max-steps", "20", "--kill", "20:1:end"]
    for _ in range(3):
        lines = Job([*ulfm_launch(3), *job], 90, env=TIMEOUT).finish()
        assert any(line.startswith("# weights digest ") for line in lines), lines


@LONG
def test_ranks_lost_while_recovering_and_after_the_last_step(one_rank: str) -> None:
    """Rank 3 dies after step 10; rank 1 dies as it catches that failure (the others lose it
    while they recover), rank 2 right after the last step (the others may have finished): rank 0
    ends alone, with the same weights."""
    # rank 1 as it catches the failure; world rank 2, rank 1 of the survivors then, after the last step
    job = [PYTHON, str(HERE / "elastic_job.py"), "--kill", "0:1:failure", "--kill", f"{STEPS}:1:boundary"]
    lines = run(4, [(3, 10)], [*job, "--reproducible", "--max-steps", str(STEPS)])
    assert last_step(lines)[2] <= 2
    lost = [line for line in lines if line.startswith("# lost ranks")]
    assert len(lost) == 2, lost  # ranks 1 and 3 in one recovery (it shrinks again), rank 2 in another
    assert re.match(r"# lost ranks \[1, 3\]: 4 -> 2, after step \d+$", lost[0]), lost
    assert lost[1] == f"# lost ranks [1]: 2 -> 1, after step {STEPS}", lost
    assert digest_of(lines) == one_rank


@LONG
def test_without_reproducible_the_run_goes_on() -> None:
    """Without reproducible=True the survivors still finish; the sums' rounding follows the rank
    count, so the weights differ in the last bits from the run that lost nothing."""
    steps = 2000  # enough for the accuracy; rank 2 kills itself after step 10 (elastic_job.py)
    job = [PYTHON, str(HERE / "elastic_job.py"), "--epochs", "100", "--max-steps", str(steps), "--digest"]
    lines = run(3, [(2, 10)], job)
    assert last_step(lines) == (steps, steps, 2)
    accuracy = [
        float(line.split()[-1].rstrip("%")) for line in lines if line.startswith("# final test accuracy")
    ]
    assert accuracy and accuracy[0] > 80, lines
    digest_of(lines)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        pytest.param([], "not launched with MPI's fault tolerance", id="no-ulfm"),
        pytest.param(["--with-ft", "ulfm"], "shared-memory transport", id="shared-memory"),
    ],
)
def test_a_launch_that_cannot_survive_a_failure_stops_every_rank(flags: list[str], says: str) -> None:
    command = launch(2)
    command[1:1] = flags
    job = Job([*command, *TRAIN], JOB_SECONDS)
    lines = job.finish()
    assert job.process.returncode != 0
    assert not steps_of(lines), lines
    assert job.stderr.count("hpcring.examples.train --elastic: ") == 2, job.stderr  # every rank says it
    assert job.stderr.count(says) == 2, job.stderr
    assert "launch with: mpiexec --with-ft ulfm --mca pml ob1 --mca btl tcp,self" in job.stderr.replace(
        "keep to TCP even on one node:", "launch with:"
    )


# ---- detection, on every algorithm ------------------------------------------------------------

LINE = re.compile(r"^(DIED|RAISED|SHRUNK) case (\d+) rank (\d+) (.*)$")
CASES = {
    "two-level": (
        {"HPCRING_RANKS_PER_NODE": "2"},
        [
            "allreduce-hierarchical:3:kill",
            "allreduce-ring:0:kill",
            "allreduce-rabenseifner:2:crash",
            "plan-mpi:1:kill",
        ],
    ),
    "reducing": (
        {},
        ["allreduce-ps:5:exit", "allreduce-mpi:0:kill", "reproducible-ring:1:kill", "allreduce-naive:2:kill"],
    ),
    "others": (
        {},
        [
            "iallreduce-ring:4:kill",
            "reduce_scatter-ring:0:kill",
            "allgather-ring:1:kill",
            "broadcast-binomial:0:kill",
        ],
    ),
}
DETECTED: list[float] = []  # seconds from each death to each survivor's RankFailedError
SHRUNK: list[float] = []


# Open MPI's own crash report: a survivor that died inside the library while it handled another
# rank's failure (seen about once in eight runs of "others" on 2 loaded cores), not hpcring's doing.
MPI_CRASHED = "*** End of error message ***"
# What the other survivors say when one never came back from inside MPI: a survivor in MPI's own
# blocking all-reduce (`mpi`) that Open MPI did not wake when rank 0 was killed (twice in many
# runs of "reducing", both on 2 loaded cores). hpcring's own waits are bounded: a survivor stuck
# in one raises StallError, which fails the test on every attempt.
MPI_STUCK = "a survivor alive but stuck inside MPI"


@pytest.mark.parametrize("name", list(CASES))
def test_every_survivor_raises_rank_failed_error_at_once(name: str) -> None:
    env, cases = CASES[name]
    # Again (twice at most) only where Open MPI itself crashed or hung a survivor: about one run
    # in eight on 2 loaded cores, and twice in a row once.
    for attempt in range(3):
        job = Job(
            [*ulfm_launch(6), PYTHON, str(HERE / "ulfm_job.py"), *cases],
            JOB_SECONDS,
            env={**env, **TIMEOUT},
            stop_on_crash=attempt < 2,  # a survivor may hang after it: ended at once, and run again
        )
        lines = job.finish()
        crashes = sum(case.endswith(":crash") for case in cases)  # each such victim reports its own
        output = job.output()
        crashed = job.mpi_crashed or output.count(MPI_CRASHED) > crashes
        if attempt == 2 or (not crashed and MPI_STUCK not in output):
            break
    events: dict[int, dict[str, dict[int, str]]] = {}
    for line in lines:
        match = LINE.match(line)
        if match:
            kind, case, rank, rest = match.groups()
            events.setdefault(int(case), {}).setdefault(kind, {})[int(rank)] = rest
    size = 6
    for number, case in enumerate(cases):
        what, victim, _ = case.split(":")
        seen = events.get(number, {})
        assert set(seen.get("DIED", {})) == {int(victim)}, job.output()
        died = float(seen["DIED"][int(victim)].split()[-1])
        survivors = set(range(size)) - {int(victim)}
        assert set(seen.get("RAISED", {})) == survivors, f"case {case}: {job.output()}"
        collective = {"reproducible": "allreduce", "iallreduce": "allreduce", "plan": "allreduce"}.get(
            what.split("-")[0], what.split("-")[0]
        )
        for rest in seen["RAISED"].values():
            at, failed, message = re.match(r"at (\S+) failed (\S*) what (.*)", rest).groups()  # type: ignore[union-attr]
            # A survivor woken by another's revoke before MPI's detector reached it says so.
            assert failed == victim or (not failed and "MPI has not named it yet" in message), rest
            assert f"hpcring.{collective}(" in message and " call " in message, message
            DETECTED.append(float(at) - died)
            assert float(at) - died < DETECTED_WITHIN, (
                f"case {case}: RankFailedError {float(at) - died:.3f} s after"
            )
        assert set(seen.get("SHRUNK", {})) == survivors, f"case {case}: {job.output()}"
        for rest in seen["SHRUNK"].values():
            assert rest.startswith(f"size {size - 1} ") and rest.endswith("ok True"), rest
            SHRUNK.append(float(rest.split()[3]))
        size -= 1


def teardown_module() -> None:
    if DETECTED:
        sys.stderr.write(
            f"\nelastic: death -> RankFailedError median {1e3 * statistics.median(DETECTED):.1f} ms, "
            f"max {1e3 * max(DETECTED):.1f} ms ({len(DETECTED)}); shrink median "
            f"{1e3 * statistics.median(SHRUNK):.1f} ms\n"
        )
