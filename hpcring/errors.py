"""What hpcring raises beyond the built-in exceptions, and how a job ends when a rank fails.

An exception on one rank of an MPI job leaves the others blocked in their next
collective: the job hangs until its wall-time runs out. `abort_on_error` turns an
uncaught exception into a traceback (printed once, by the failing rank) followed by
MPI_Abort, so the whole job ends at once with a non-zero status, as
`python -m mpi4py script.py` does.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import ParamSpec, TypeVar

P = ParamSpec("P")

# Seconds between writing why the job ends and MPI_Abort. MPICH's launcher (Hydra) lost the whole
# of a rank's last output in about 1 abort in 7 here when MPI_Abort followed the write at once.
ABORT_GRACE = 0.5


class StallError(TimeoutError):
    """Some ranks did not arrive at a collective in time: a hang turned into an error."""

    def __init__(self, missing: list[int], what: str, timeout: float, detail: str = "") -> None:
        """``missing``: the ranks, [] where they cannot be known (a first call); ``detail``: appended
        to the message as it is (the flight record's lines, or "; ...")."""
        self.missing = list(missing)
        # rank -> the stall notice it sent: [rank, call number, peer it waited for or -1, where]
        # (`hpcring.flight.Where` names the last word).
        self.waiting: dict[int, list[int]] = {}
        ranks = ", ".join(map(str, self.missing))
        who = f"rank{'s' if len(self.missing) != 1 else ''} {ranks}" if self.missing else "a rank"
        super().__init__(
            f"hpcring: {who} did not arrive at "
            f"{what} within {timeout:g} s (HPCRING_TIMEOUT / timeout=); they are stuck elsewhere, "
            f"crashed, or skipped the call{detail}"
        )


class RankFailedError(RuntimeError):
    """Ranks of the communicator died during a collective, and MPI's fault tolerance (ULFM) said
    so: the survivors get this error instead of a hang or an abort, and can go on together on
    ``hpcring.shrink(comm)`` (docs/elastic.md)."""

    def __init__(
        self, failed: list[int], what: str, detail: str = "", error_class: int | None = None
    ) -> None:
        """``failed``: the ranks (of the communicator the call was made on) that MPI reports
        failed; ``what``: the call; ``detail``: appended as it is; ``error_class``: MPI's."""
        self.failed = list(failed)
        self.what = what
        self.error_class = error_class
        if self.failed:
            plural = "s" if len(self.failed) != 1 else ""
            who = f"rank{plural} {', '.join(map(str, self.failed))} failed"
        else:  # the communicator was revoked by a survivor before this rank heard which one died
            who = "a rank failed (another rank revoked the communicator; MPI has not named it yet)"
        super().__init__(
            f"hpcring: {who} during {what}{detail}; the survivors can go on together on "
            "comm = hpcring.shrink(comm) (docs/elastic.md)"
        )


R = TypeVar("R")


@contextmanager
def abort_on_error(exit_code: int = 1) -> Iterator[None]:
    """Abort MPI_COMM_WORLD when the body raises (SystemExit and KeyboardInterrupt pass through)."""
    try:
        yield
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:
        import traceback

        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank() if MPI.Is_initialized() else "?"
        sys.stderr.write(f"hpcring: rank {rank} failed, aborting the job:\n{traceback.format_exc()}")
        if MPI.Is_initialized() and not MPI.Is_finalized():
            abort_job(exit_code)
        raise


def abort_job(exit_code: int = 1) -> None:
    """MPI_Abort on MPI_COMM_WORLD, once what this rank wrote has had time to reach the launcher."""
    from mpi4py import MPI

    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_GRACE)
    MPI.COMM_WORLD.Abort(exit_code)


def aborting(function: Callable[P, R]) -> Callable[P, R]:
    """Decorator form of `abort_on_error`, for a script's main()."""

    @wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with abort_on_error():
            return function(*args, **kwargs)

    return wrapper
