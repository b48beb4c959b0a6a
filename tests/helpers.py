"""Small helpers shared by the tests: agreement on verdicts, result hashes, launching jobs."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from hpcring.arrays import available

FULL = os.environ.get("HPCRING_TEST_FULL") == "1"  # tests/run.sh --full: the long cases too
# The timeout of a call that a test makes wait out (a rank stays away): what each such case costs
# at each rank count. A rank that is present but late is still heard: the waiting ranks listen
# up to polling.GRACE more for every rank but one.
WAIT_OUT = 0.5  # s

# A GPU test skips, saying why, where CuPy or a GPU is missing; BACKENDS parametrizes a test
# over the array kinds (its CuPy case marked gpu, for tests/gpu/check.sh).
needs_gpu = pytest.mark.skipif("cupy" not in available(), reason="needs CuPy and a GPU")
BACKENDS = ["numpy", pytest.param("cupy", marks=[pytest.mark.gpu, needs_gpu])]


def everywhere(comm: MPI.Intracomm, ok: bool) -> bool:
    """True when ``ok`` holds on every rank, so all ranks assert the same thing and none hangs."""
    return bool(comm.allreduce(bool(ok), op=MPI.LAND))


def digest(array: Any) -> str:
    """A hash of the result's bytes, for bitwise comparison across ranks."""
    host = array.get() if hasattr(array, "get") and not isinstance(array, np.ndarray) else array
    return hashlib.sha256(np.ascontiguousarray(host).tobytes()).hexdigest()


def identical_everywhere(comm: MPI.Intracomm, array: Any) -> bool:
    """True when ``array`` has the same bytes on every rank of ``comm``."""
    hashes = comm.allgather(digest(array))
    return len(set(hashes)) == 1


class Verdicts:
    """Checks kept on each rank and settled in one collective: a test that makes many calls asserts
    the same things on every rank, as `everywhere` and `identical_everywhere` do per check, at the
    cost of one ``allgather`` (not one collective per check and call)."""

    def __init__(self, comm: MPI.Intracomm) -> None:
        self.comm = comm
        self.failed: list[str] = []  # this rank's: "where: what"
        self.digests: list[tuple[str, str]] = []  # (where, digest) of each result that must agree

    def check(self, where: str, **checks: bool) -> None:
        """Record each named check that does not hold on this rank."""
        self.failed += [f"{where}: {name}" for name, ok in checks.items() if not ok]

    def same_bits(self, where: str, array: Any) -> None:
        """Record ``array``'s hash: it must be the same on every rank."""
        self.digests.append((where, digest(array)))

    def settle(self) -> None:
        """Assert, on every rank alike, that every check held on every rank and that every recorded
        result has the same bits on every rank (collective)."""
        every = self.comm.allgather((self.failed, self.digests))
        failed = [f"rank {rank}: {line}" for rank, (lines, _) in enumerate(every) for line in lines]
        assert not failed, "\n".join(failed[:20])
        assert len({len(d) for _, d in every}) == 1, "the ranks recorded different numbers of results"
        differ = [where for i, (where, _) in enumerate(every[0][1]) if len({d[i][1] for _, d in every}) != 1]
        assert not differ, f"different bits across ranks: {differ[:10]}"


def raises_everywhere(kind: type[Exception], match: str, call: Callable[[], object]) -> None:
    """``call()`` raises ``kind`` with ``match`` in its message on every rank of COMM_WORLD, quickly."""
    world = MPI.COMM_WORLD
    start = time.monotonic()
    try:
        call()
    except kind as error:
        ok = match in str(error)
    else:
        ok = False
    assert everywhere(world, ok), f"expected {kind.__name__} matching {match!r} on every rank"
    assert everywhere(world, time.monotonic() - start < 10)


def mpiexec() -> str | None:
    """The mpiexec beside this Python (the MPI wheel's: Open MPI's or MPICH's), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


def open_mpi() -> bool:
    """Whether this Python's MPI is Open MPI (else an MPICH: its launcher is Hydra)."""
    return MPI.Get_library_version().startswith("Open MPI")


def launch(ranks: int) -> list[str]:
    """The command line that starts ``ranks`` ranks, more than there are cores: Open MPI's mpiexec
    needs ``--oversubscribe`` for that, MPICH's Hydra oversubscribes as it is and rejects the flag."""
    return [mpiexec() or "mpiexec", *(["--oversubscribe"] if open_mpi() else []), "-n", str(ranks)]


# What a running job or singleton leaves in its environment, which a job started from it must not
# inherit: Open MPI's (PMIx, PRRTE) and MPICH's Hydra's (its PMI descriptor, rank and control fd).
_JOB_VARIABLES = ("PMIX_", "PRTE_", "OMPI_COMM_", "OMPI_FILE_", "OMPI_MCA_orte", "OMPI_MCA_ess")
_JOB_VARIABLES += ("PMI_", "HYDI_", "HYDRA_", "MPI_LOCALNRANKS", "MPI_LOCALRANKID")


_jobs_tmp: str | None = None


def job_tmpdir() -> str:
    """A fresh TMPDIR for one launched job. Open MPI's mpiexec keeps its session in
    ``$TMPDIR/ompi.<its pid>``; a directory that a killed job left there makes a later mpiexec
    that gets the same pid fail to start ("The PMIx server's listener thread failed to start"),
    and the tests kill jobs. Removed when this process exits."""
    global _jobs_tmp
    if _jobs_tmp is None:
        _jobs_tmp = tempfile.mkdtemp(prefix="hpcring-jobs-")
        atexit.register(shutil.rmtree, _jobs_tmp, ignore_errors=True)
    return tempfile.mkdtemp(prefix="job-", dir=_jobs_tmp)


def launcher_env() -> dict[str, str]:
    """This process's environment minus what a running MPI job (or singleton) left in it, with a
    TMPDIR of the job's own (`job_tmpdir`)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(_JOB_VARIABLES)}
    env.update(
        TMPDIR=job_tmpdir(),
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def run_job(args: list[str], ranks: int = 2, timeout: float = 300) -> list[str]:
    """``python <args>`` under mpiexec at ``ranks`` ranks, as a user launches it; its stdout lines
    (the assertion shows stdout and stderr where it did not exit 0)."""
    done = subprocess.run(
        [*launch(ranks), sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=launcher_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def run_example(example: str, *flags: str, ranks: int = 2, timeout: float = 300) -> list[str]:
    """``python -m hpcring.examples.<example> <flags>`` under mpiexec (`run_job`)."""
    return run_job(["-m", f"hpcring.examples.{example}", *flags], ranks, timeout)


_UFUNCS = {"sum": "add", "max": "maximum", "min": "minimum", "prod": "multiply", "mean": "add"}


def exchange_tree(contributions: list[np.ndarray], code: int, op: int) -> np.ndarray:
    """What the agreement's exchange (hpcring.agreement.steps) makes of every rank's
    contribution: each odd rank below 2 (size - p) folded into the even one below it, then
    recursive doubling over the p left, the lowest bit first (the payload's op is bitwise
    commutative: the order within a pair does not matter)."""
    from hpcring import agreement

    def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = b.copy()
        agreement.combine_payload(code, op, a, out)
        return out

    size = len(contributions)
    p = 1 << (size.bit_length() - 1)
    extra = size - p
    held = [combine(contributions[2 * i + 1], contributions[2 * i]) for i in range(extra)]
    held += list(contributions[2 * extra :])
    mask = 1
    while mask < p:
        held = [combine(held[i ^ mask], held[i]) for i in range(p)]
        mask <<= 1
    return held[0]


def exchange_grouping(comm: MPI.Intracomm, x: np.ndarray, op: str) -> np.ndarray | None:
    """A checked `mpi` all-reduce of ``x`` (``op`` by name) whose data rides in the agreement's
    exchange on three or more ranks: its result, the terms grouped as the exchange groups them
    (which may differ from MPI_Allreduce's grouping in the last bit). None where the data does
    not ride there: MPI's own all-reduce moves it, or two ranks (a + b is b + a: MPI's bits)."""
    from hpcring import agreement, kernels

    x = np.ascontiguousarray(x)
    ufunc = _UFUNCS.get(op)
    if comm.size < 3 or not agreement.exchanges(comm.size) or ufunc is None:
        return None
    descriptor = agreement.payload_descriptor(x.dtype, ufunc, x.size, comm.size)
    if descriptor == agreement.NO_PAYLOAD:
        return None
    code, code_op, _ = descriptor
    assert kernels.DTYPES[code] == x.dtype
    return exchange_tree(comm.allgather(x.reshape(-1)), code, code_op).reshape(x.shape)
