"""Agreement before data moves: every rank arrives, with the same call, or all raise.

The fast path is one tiny collective: every rank contributes its row (call number,
count, dtype, op, algorithm, array kind, placement, and the digest of the settings that
must agree) and the row negated, and a
non-blocking all-reduce under MAX gives every rank max(row) and -min(row) at once; the
ranks agree exactly where they are equal, and any local verdict (a bad argument) shows
as a 1 in its column. Only when something is off are the rows gathered, on a slow path
every rank takes together, to name the ranks and the values that differ.

A rank that does not arrive leaves the collective pending: each waiting rank waits for
it until its deadline (`hpcring.polling.Waiter`: a test loop, as MPI's own wait is),
then tells every other rank that it stopped waiting (one tiny message each), listens a
moment for the others', and names the ranks it did not hear from in a `StallError`. A
rank still waiting that hears such a message takes the same road at once, so every rank
that did arrive raises within the timeout plus that moment. After a StallError the
communicator holds unmatched messages: end the job.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
from mpi4py import MPI

from .flight import Recorder
from .polling import Waiter

FIELDS = ("call", "count", "dtype", "op", "algorithm", "array", "placement", "settings", "wire")
HINTS = {
    "call": " (a rank skipped or repeated a call on this communicator)",
    "settings": (
        " (the HPCRING_* variables that must be the same on every rank differ; "
        "docs/configuration.md marks them)"
    ),
}


class Agreement:
    """One communicator's agreement: the row and its negation in one tiny collective."""

    __slots__ = ("comm", "rank", "settings", "size", "waiter")

    def __init__(self, comm: MPI.Intracomm, flight: Recorder | None = None) -> None:
        self.comm = comm
        self.settings: Any = None  # the communicator's config snapshot, named on a settings mismatch
        self.waiter = Waiter(comm)
        self.waiter.flight = flight  # the communicator's record: a StallError names where ranks were
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def __call__(
        self,
        row: Sequence[int],
        problem: Exception | None,
        *,
        timeout: float,
        describe: Any,
        what: str,
    ) -> None:
        """Raise on every rank if any rank failed, disagrees on ``row``, or does not arrive in time.

        ``row`` is (call, count, dtype, op, algorithm, array, placement, settings, wire) as integers;
        ``describe(field, value)`` names a value for messages; ``what`` names the operation for
        StallError (which adds the call number).
        """
        verdict = int(problem is not None)
        # [row, verdict, -row, verdict] under MAX: [max(row), any verdict, -min(row), any verdict].
        # (Python lists and one small array: NumPy's slicing and negation cost more here.)
        buf = np.array([*row, verdict, *[-v for v in row], verdict], dtype=np.int64)
        request = self.comm.Iallreduce(MPI.IN_PLACE, buf, MPI.MAX)
        if not request.Test():
            deadline = time.monotonic() + timeout if timeout > 0 else None
            woke = self.waiter.wait(request, deadline)
            if woke is not None:
                raise self.waiter.stall(woke, f"{what} call {row[0]} on this communicator", timeout, row[0])
        got, width = buf.tolist(), len(row) + 1
        if got[width - 1] or any(
            high + low for high, low in zip(got[: width - 1], got[width:], strict=False)
        ):
            self._raise_for(np.array([*row, verdict], dtype=np.int64), problem, describe)

    def _raise_for(self, mine: np.ndarray, problem: Exception | None, describe: Any) -> None:
        """The same exception on every rank, from every rank's row (every rank is here: the
        collective completed, and showed every rank that something is off)."""
        table = np.empty((self.size, mine.size), dtype=np.int64)
        self.comm.Allgather(mine, table)
        failed = np.flatnonzero(table[:, -1])
        if failed.size:
            reports = self.comm.allgather(None if problem is None else (type(problem), str(problem)))
            if problem is not None:
                raise problem
            kind, message = reports[failed[0]]
            raise kind(f"rank {failed[0]} rejected its input: {message}")
        for column, field in enumerate(FIELDS):
            values = table[:, column].tolist()
            if len(set(values)) > 1:
                if field == "settings":
                    raise ValueError(self._settings_differ())
                detail = _by_value(values, partial(describe, field))
                hint = HINTS.get(field, "")
                raise ValueError(f"hpcring.allreduce: ranks disagree on {field}: {detail}{hint}")
        raise AssertionError("the agreement saw a difference the table does not show")

    def _settings_differ(self) -> str:
        """The must-agree variables that differ, their values and the ranks (every rank gathers
        every rank's values: this runs only after the digests differed)."""
        mine = {} if self.settings is None else self.settings.agreed()
        everyone = self.comm.allgather(mine)
        parts = []
        for name in sorted({name for values in everyone for name in values}):
            seen = [values.get(name, "=?") for values in everyone]
            if len(set(seen)) == 1:
                continue
            shown = _by_value(seen, _setting)
            parts.append(f"{name}: {shown}")
        return (
            f"hpcring.allreduce: ranks disagree on settings: {' | '.join(parts) or 'digests differ'}"
            f"{HINTS['settings']}"
        )


def _by_value(values: Sequence[Any], name: Any) -> str:
    """Each value of ``values`` (one per rank), ``name``d, with the ranks that hold it:
    "10 on ranks 0, 1, 2; 11 on rank 3"."""
    groups: dict[Any, list[int]] = {}
    for r, value in enumerate(values):
        groups.setdefault(value, []).append(r)
    return "; ".join(
        f"{name(value)} on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        for value, ranks in groups.items()
    )


def _setting(text: str) -> str:
    """A must-agree value as `Config.agreed` gives it ("=VALUE", "=None", or "!TEXT" unparsable)."""
    if text == "=None":
        return "unset"
    return text[1:] if text[0] == "=" else "unparsable " + text[1:]
