"""Jobs under MPI's fault tolerance (ULFM) for the elastic tests: launched, watched line by line,
and a rank killed from outside (SIGKILL) when a line shows; every wait bounded.

Only Open MPI's launcher starts such a job (``--with-ft ulfm``); MPICH's Hydra has no ULFM this
way, so the tests skip there, saying so (`NO_ULFM`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from helpers import launcher_env, mpiexec, open_mpi

ULFM = ["--with-ft", "ulfm", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self"]
NO_ULFM = pytest.mark.skipif(
    not open_mpi() or mpiexec() is None,
    reason="MPICH: its Hydra launcher has no ULFM (--with-ft ulfm is Open MPI's); elastic not tested here",
)
DIGEST = re.compile(r"^# weights digest ([0-9a-f]{64})$")
STEP = re.compile(r"^step (\d+)/(\d+) ranks (\d+)$")


def ulfm_launch(ranks: int, *flags: str) -> list[str]:
    """The launch line of a fault-tolerant job of ``ranks`` ranks (more than the cores allowed)."""
    return [mpiexec() or "mpiexec", "--oversubscribe", *ULFM, *flags, "-n", str(ranks)]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def rank_pid(root: int, rank: int) -> int:
    """The process of MPI rank ``rank`` in the job launched as process ``root`` (Open MPI sets
    OMPI_COMM_WORLD_RANK in each rank's environment)."""
    wanted = f"OMPI_COMM_WORLD_RANK={rank}".encode()
    for pid in descendants(root):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in environ and b"PMIX_RANK=" + str(rank).encode() in environ:
            return pid
    raise LookupError(f"no process of rank {rank} below {root}")


LIVE: set[Job] = set()  # jobs not yet ended: ended at exit (a test run cut short leaves none behind)


class Job:
    """A launched job whose stdout is read by a thread: `wait_for` a line, `kill` a rank, `finish`."""

    def __init__(
        self,
        command: Sequence[str],
        timeout: float,
        env: dict[str, str] | None = None,
        stop_on_crash: bool = False,
    ) -> None:
        self.command = list(command)
        self.deadline = time.monotonic() + timeout
        # Where Open MPI itself crashes in a process (`mpi_crashed`), end the job a moment later,
        # as if it had ended, instead of at its deadline: a survivor of such a crash may stay stuck
        # inside MPI, and the caller runs the job again.
        self.stop_on_crash = stop_on_crash
        self.lines: list[tuple[float, str]] = []  # (time.time() when read, line)
        self.killed: dict[int, float] = {}  # rank -> time.time() of its SIGKILL
        self.pids: dict[int, int] = {}  # rank -> its process, once found
        self.lingered = False  # the launcher outlived the survivors' last word (`finish_after`)
        self._queue: queue.Queue[tuple[float, str] | None] = queue.Queue()
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**launcher_env(), **(env or {})},
            start_new_session=True,  # its own process group: ended as one where it hangs
        )
        self._errors: list[str] = []
        LIVE.add(self)
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_errors, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put((time.time(), line.rstrip("\n")))
        self._queue.put(None)

    def _read_errors(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._errors.append(line.rstrip("\n"))

    @property
    def stderr(self) -> str:
        return "\n".join(self._errors)

    def _next(self) -> tuple[float, str] | None:
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.stop()
                pytest.fail(f"job ran past its time limit: {' '.join(self.command)}\n{self.output()}")
            if self.stop_on_crash and self.mpi_crashed:
                time.sleep(CRASH_GRACE)  # the rest of the report, and what the others still say
                self.stop()
                return None
            try:
                item = self._queue.get(timeout=min(left, 1.0) if self.stop_on_crash else left)
            except queue.Empty:
                continue
            if item is not None:
                self.lines.append(item)
            return item

    def wait_for(self, pattern: str) -> str:
        """The first line (from now) that matches ``pattern``; fails where the job ends first."""
        regex = re.compile(pattern)
        while (item := self._next()) is not None:
            if regex.search(item[1]):
                return item[1]
        self.process.wait(timeout=30)
        pytest.fail(f"the job ended without a line matching {pattern!r}:\n{self.output()}")

    def find(self, ranks: int) -> None:
        """Find the processes of ranks 0 .. ``ranks`` - 1 now (every rank has started), so that a
        later `kill` takes no time: /proc is read here, not while the job runs on."""
        self.pids.update({rank: rank_pid(self.process.pid, rank) for rank in range(ranks)})

    def kill(self, rank: int) -> None:
        """SIGKILL rank ``rank``, from outside, as a node that dies does."""
        pid = self.pids.get(rank) or rank_pid(self.process.pid, rank)
        self.killed[rank] = time.time()
        os.kill(pid, signal.SIGKILL)

    def finish(self) -> list[str]:
        """Every line, once the job has ended (within its time limit)."""
        while self._next() is not None:
            pass
        left = max(self.deadline - time.monotonic(), 1.0)
        try:
            self.process.wait(timeout=left)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"job did not end: {' '.join(self.command)}\n{self.output()}")
        LIVE.discard(self)
        return [line for _, line in self.lines]

    def finish_after(self, pattern: str, grace: float) -> list[str]:
        """Every line, once the job has ended; where a line matching ``pattern`` (the survivors'
        last word) came and the launcher then lingers past ``grace`` seconds, the job is ended and
        ``lingered`` set: judged by what the survivors reported (the launcher's own exit after
        failures is Open MPI's: shared/ulfm.md)."""
        regex = re.compile(pattern)
        seen = False
        while not seen and (item := self._next()) is not None:
            seen = bool(regex.search(item[1]))
        if seen:
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.lingered = True
                self.stop()
        return self.finish()

    def stop(self) -> None:
        """End the job (a hang): its ranks first, each by its process id (the launcher puts them in
        process groups of their own), then the launcher's process group."""
        if self.process.poll() is None:
            for pid in descendants(self.process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        LIVE.discard(self)

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines) + "\n--- stderr ---\n" + self.stderr

    @property
    def mpi_crashed(self) -> bool:
        """Whether a process of the job crashed inside Open MPI itself: a signal report (Open MPI's
        handler prints one per process, each line under its ``[host:pid]``) whose frames are in
        libpmix and none in hpcring's own code (its PMIx thread), or whose faulting frame (the
        first after the signal handler's) is in Open MPI's point-to-point layer (ob1)."""
        reports: dict[str, list[str]] = {}
        for line in self._errors:
            if match := REPORT.match(line):
                reports.setdefault(match.group(1), []).append(line)
        return any(
            any(CRASHED in line for line in report)
            and (
                (any("libpmix" in line for line in report) and not any("hpcring" in line for line in report))
                or any(FAULTING.search(line) and "mca_pml_ob1" in line for line in report)
            )
            for report in reports.values()
        )


REPORT = re.compile(r"^\[[^\]:]+:(\d+)\] ")  # a line of Open MPI's signal report, by process id
CRASHED = "*** Process received signal ***"
CRASH_GRACE = 5.0  # seconds a job whose Open MPI crashed runs on before it is ended (`Job.stop_on_crash`)
FAULTING = re.compile(r"\] \[ 1\] ")  # the frame that faulted ([ 0] is the signal handler's return)


def ran(start: Callable[[], Job], finish: Callable[[Job], list[str]] = Job.finish) -> tuple[Job, list[str]]:
    """A job ``start``-ed and ``finish``-ed; where Open MPI crashed in one of its processes
    (`Job.mpi_crashed`), once more.

    Under ULFM, as ranks die around a spawn, a survivor has been seen to abort in its PMIx
    progress thread ("corrupted double-linked list" in pmix_ptl_base_process_msg, after libevent's
    "Epoll ADD ... Bad file descriptor"), and the launcher then lost the job ("LAUNCHER JOB OBJECT
    NOT FOUND"): once in many runs, no hpcring code on that thread's stack. Which code corrupted
    the heap is not known (Open MPI's spawn and connect under failures is the likely place). As
    two ranks died inside one step, a survivor has also been seen to fault in ob1's scheduling of
    a pending receive (``mca_pml_ob1_recv_request_schedule_once``, a null pointer), inside
    ``MPI_Test`` of the step's agreement. The rerun must pass on its own, the crash is printed,
    and a second such crash fails.
    """
    run = start()
    run.stop_on_crash = True  # ended soon after such a crash, not at its deadline
    lines = finish(run)
    if run.mpi_crashed:
        sys.stderr.write(f"# Open MPI crashed in the job; once more:\n{run.stderr[-4000:]}\n")
        run = start()
        run.stop_on_crash = True
        lines = finish(run)
        assert not run.mpi_crashed, f"Open MPI crashed twice:\n{run.output()}"
    return run, lines


@atexit.register
def _stop_live() -> None:
    for job in list(LIVE):
        with contextlib.suppress(Exception):
            job.stop()


def without_late_lines(lines: Sequence[str]) -> list[str]:
    """``lines`` less the progress lines that came after the digest and repeat an earlier step:
    a killed rank's last line, printed (and flushed) before it died, which the launcher can pass
    on after every other (seen once in 50 soak jobs: ``step 5/30`` after the digest)."""
    done = next((i for i in range(len(lines) - 1, -1, -1) if DIGEST.match(lines[i])), None)
    if done is None:
        return list(lines)
    last = max((int(m.group(1)) for line in lines[:done] if (m := STEP.match(line))), default=0)
    late = [(m := STEP.match(line)) is not None and int(m.group(1)) < last for line in lines[done + 1 :]]
    return list(lines[: done + 1]) if all(late) else list(lines)


def digest_of(lines: Sequence[str]) -> str:
    """The weights digest a run printed last (it must be the last line, but for late lines)."""
    assert lines, "no output"
    match = DIGEST.match(without_late_lines(lines)[-1])
    assert match, f"the last line is not the weights digest: {lines[-5:]}"
    return match.group(1)


def steps_of(lines: Sequence[str]) -> list[tuple[int, int, int]]:
    """(step, total, ranks) of every progress line (but for late lines after the digest)."""
    kept = without_late_lines(lines)
    return [tuple(map(int, m.groups())) for line in kept if (m := STEP.match(line))]  # type: ignore[misc]


PYTHON = sys.executable
