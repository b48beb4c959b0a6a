"""Agreement before data moves: every rank arrives, with the same call, or all raise.

The fast path is one tiny collective: every rank contributes its row (the call's number, then
the `Row`: collective, count, dtype, op, algorithm, array kind, placement, root, the digest of
the settings that must agree, wire; 11 integers), a verdict, the row negated and the verdict
again, and a non-blocking all-reduce under MAX gives every rank max(row) and -min(row) at
once; the ranks agree exactly where they are equal, and any local verdict (a bad argument)
shows as a 1 in its column. Only when something is off are the rows gathered, on a slow path
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
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

import numpy as np
from mpi4py import MPI

from . import algorithms
from .arrays import NAMES
from .flight import Recorder
from .ops import NAMES as DTYPE_NAMES
from .ops import OPS
from .ops import code as dtype_code
from .polling import Waiter
from .wire import WIRE_NAMES

REPRODUCIBLE = " (reproducible=True)"  # the op as the row sees it where reproducible=True
_OPS = [*OPS, *(op + REPRODUCIBLE for op in OPS)]  # ranks that differ on reproducible= differ on op
_WIRES = [None, *WIRE_NAMES]  # wire=None is 0
HINTS = {
    "call": " (a rank skipped or repeated a call on this communicator)",
    "settings": (
        " (the HPCRING_* variables that must be the same on every rank differ; "
        "docs/configuration.md marks them)"
    ),
}


@dataclass(frozen=True)
class Row:
    """What must agree across ranks before a collective's data moves, as this rank sees it.

    The array kind is part of it: NumPy on some ranks and CuPy on others would stage and sum
    fine, but almost always means a rank that skipped moving its data to the GPU. So is the
    placement, as MPI asks of MPI_IN_PLACE: `auto` keeps a choice per size and placement, and
    ranks that chose differently would run different algorithms. ``settings`` is the digest of
    the communicator's must-agree HPCRING_* values (`hpcring.config.Config.digest`): ranks with
    other chunk sizes or node shapes would run other schedules, and hang. ``wire`` too: ranks that
    narrow what they send and ranks that do not would read each other's bytes as another dtype.
    A value this rank does not know (it refused its input) is None: its verdict, not this row,
    is then what the others hear.
    """

    collective: str
    count: int | None
    dtype: np.dtype | None
    op: str | None  # None: a collective that reduces nothing
    algorithm: str
    array: str | None  # the array kind's name (`hpcring.arrays.NAMES`)
    placement: bool | None  # in place
    root: int
    settings: int
    wire: str | None

    def words(self) -> list[int]:
        """The row as integers, in field order (-1 where a value is unknown), for the collective."""
        names = list(algorithms.table(self.collective))
        return [
            algorithms.COLLECTIVES.index(self.collective),
            -1 if self.count is None else self.count,
            -1 if self.dtype is None else dtype_code(self.dtype),
            _OPS.index(self.op) if self.op in _OPS else -1,
            names.index(self.algorithm) if self.algorithm in names else -1,
            NAMES.index(self.array) if self.array in NAMES else -1,
            -1 if self.placement is None else int(self.placement),
            self.root,
            self.settings,
            _WIRES.index(self.wire) if self.wire in _WIRES else -1,
        ]

    def describe(self, field: str, value: int) -> str:
        """A value of ``field`` as any rank's row encodes it, as a person would name it."""
        names: dict[str, list[Any]] = {
            "collective": list(algorithms.COLLECTIVES),
            "dtype": list(DTYPE_NAMES),
            "op": _OPS,
            "algorithm": list(algorithms.table(self.collective)),
            "array": NAMES,
            "placement": ["out of place (out=)", "in place"],
            "wire": [f"wire={w!r}" for w in _WIRES],
        }
        if field in names:
            return str(names[field][value]) if 0 <= value < len(names[field]) else "?"
        if field == "settings":
            return f"digest {value:08x}"
        return str(value)


FIELDS = ("call", *(f.name for f in fields(Row)))  # the call's number comes first


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
        words: Sequence[int],
        row: Row,
        problem: Exception | None,
        *,
        timeout: float,
        what: str,
        caller: str,
    ) -> None:
        """Raise on every rank if any rank failed, disagrees on the row, or does not arrive in time.

        ``words`` is the call's number, then ``row.words()``; ``what`` names the call for a
        StallError (which adds the call number), ``caller`` the collective for the other
        messages ("hpcring.allgather").
        """
        verdict = int(problem is not None)
        # [row, verdict, -row, verdict] under MAX: [max(row), any verdict, -min(row), any verdict].
        # (Python lists and one small array: NumPy's slicing and negation cost more here.)
        buf = np.array([*words, verdict, *[-v for v in words], verdict], dtype=np.int64)
        request = self.comm.Iallreduce(MPI.IN_PLACE, buf, MPI.MAX)
        if not request.Test():
            self.wait(request, words[0], timeout, what)
        got, width = buf.tolist(), len(words) + 1
        if got[width - 1] or any(
            high + low for high, low in zip(got[: width - 1], got[width:], strict=False)
        ):
            self.disagree(words, row, problem, caller)

    def wait(self, request: MPI.Request, number: int, timeout: float, what: str) -> None:
        """Wait for the agreement's collective of call ``number`` within ``timeout`` (0: no limit),
        or raise StallError naming the ranks that did not arrive (the compiled core's agreement
        comes here too, once its own spinning is over)."""
        deadline = time.monotonic() + timeout if timeout > 0 else None
        woke = self.waiter.wait(request, deadline)
        if woke is not None:
            raise self.waiter.stall(woke, f"{what} call {number} on this communicator", timeout, number)

    def disagree(self, words: Sequence[int], row: Row, problem: Exception | None, caller: str) -> None:
        """The collective showed something off (``words``: this rank's call number and row): raise
        the same exception on every rank (every rank comes here: each saw the same maxima)."""
        self._raise_for(np.array([*words, int(problem is not None)], dtype=np.int64), row, problem, caller)

    def _raise_for(self, mine: np.ndarray, row: Row, problem: Exception | None, what: str) -> None:
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
                    raise ValueError(self._settings_differ(what))
                detail = by_value(values, partial(row.describe, field))
                hint = HINTS.get(field, "")
                raise ValueError(f"{what}: ranks disagree on {field}: {detail}{hint}")
        raise AssertionError("the agreement saw a difference the table does not show")

    def _settings_differ(self, what: str) -> str:
        """The must-agree variables that differ, their values and the ranks (every rank gathers
        every rank's values: this runs only after the digests differed)."""
        mine = {} if self.settings is None else self.settings.agreed()
        everyone = self.comm.allgather(mine)
        parts = []
        for name in sorted({name for values in everyone for name in values}):
            seen = [values.get(name, "=?") for values in everyone]
            if len(set(seen)) == 1:
                continue
            shown = by_value(seen, _setting)
            parts.append(f"{name}: {shown}")
        return (
            f"{what}: ranks disagree on settings: {' | '.join(parts) or 'digests differ'}{HINTS['settings']}"
        )


def by_value(values: Sequence[Any], name: Any) -> str:
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
