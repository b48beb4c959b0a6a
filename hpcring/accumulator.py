"""`ExactSum`: local contributions kept, then one reproducible all-reduce over every rank's.

A front end of the engine (`hpcring.engine`): its `allreduce` is `hpcring.allreduce` with
``reproducible=True`` whose contributions are this accumulator's, so the same checks, the same
agreement and the same errors.
"""

from __future__ import annotations

from typing import Any

from .algorithms import ALLREDUCE
from .arrays import adapter_for
from .engine import Options, first
from .exact import MAX_CONTRIBUTIONS, format_of


class ExactSum:
    """An accumulator of local contributions whose all-reduce is reproducible.

    ``acc = ExactSum(like=x)``; ``acc.add(a)`` any number of times (arrays of x's shape and
    dtype); ``acc.allreduce(comm=..., algorithm=...)`` returns the sum over every contribution
    on every rank, whose bits depend only on that multiset: not on how the contributions are
    split over the ranks, the order of the adds, the rank count or the algorithm. So B
    microbatches over G ranks give the same bits for every G. The contributions are kept (one
    copy per add) until `allreduce`, where they are converted on the grid all ranks agree on.
    """

    def __init__(self, like: Any) -> None:
        self._adapter = adapter_for(like)
        self.dtype = self._adapter.dtype(like)
        self.shape = tuple(self._adapter.shape(like))
        try:
            format_of(self.dtype)
        except TypeError as error:
            raise TypeError(f"hpcring.ExactSum: {error}") from None
        self._parts: list[Any] = []

    def add(self, a: Any) -> None:
        """Keep a copy of ``a`` as one contribution."""
        adapter = self._adapter
        if not adapter.owns(a) or adapter.dtype(a) != self.dtype or tuple(adapter.shape(a)) != self.shape:
            raise ValueError(
                f"hpcring.ExactSum.add: expected an array of shape {self.shape} and dtype {self.dtype}"
            )
        if len(self._parts) >= MAX_CONTRIBUTIONS:
            raise ValueError(f"hpcring.ExactSum.add: at most {MAX_CONTRIBUTIONS} contributions")
        self._parts.append(adapter.xp.array(a, copy=True).reshape(-1))

    def __len__(self) -> int:
        return len(self._parts)

    def clear(self) -> None:
        """Forget every contribution (for the next step)."""
        self._parts.clear()

    def allreduce(
        self,
        *,
        comm: Any = None,
        algorithm: str = "ring",
        op: str = "sum",
        out: Any = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> Any:
        """The reproducible sum (or mean over the ranks) of every rank's contributions, on
        every rank; in ``out`` if given, else a new array. Collective; the ranks agree first, as
        `hpcring.allreduce` does (same checks, same errors)."""
        result = self._adapter.xp.zeros(self.shape, dtype=self.dtype) if out is None else out
        options = Options(ALLREDUCE, op, algorithm, reproducible=True)
        return first(options, result, None, comm, check, timeout, parts=self._parts)


__all__ = ["ExactSum"]
