"""All-reduce algorithms, one module each, registered here by name.

Every module has the same three functions, ``allreduce``, ``bytes_sent`` and
``scratch_bytes``, and may define optional hooks (`hpcring.algorithms.base` names them all
and says what each means). The table below is explicit: adding an algorithm is one module
and one line here. The API asks one question per call, `prepare`: what runs, and the
scratch it needs, or why it cannot run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import auto, hierarchical, mpi, naive, nccl, ps, rabenseifner, ring
from .base import Algorithm, Entry, Prepared

MODULES: dict[str, ModuleType] = {
    "naive": naive,
    "ps": ps,
    "ring": ring,
    "rabenseifner": rabenseifner,
    "hierarchical": hierarchical,
    "mpi": mpi,
    "auto": auto,
    "nccl": nccl,
}
# Baselines that only run on some machines (NCCL: CuPy, one GPU per rank). They can be named
# in allreduce(algorithm=...) and the bench adds them on GPUs, but they are not in PORTABLE,
# which is `hpcring.ALGORITHMS`: the algorithms that run everywhere.
BASELINES = ("nccl",)
PORTABLE: tuple[str, ...] = tuple(name for name in MODULES if name not in BASELINES)
# Each module's functions and hooks, found once: a missing module attribute costs half a
# microsecond per call to look for, and at 3 ranks on 2 cores each microsecond between MPI
# calls costs several.
ENTRIES: dict[str, Entry] = {name: Entry.of(name, module) for name, module in MODULES.items()}


def entry(name: str) -> Entry:
    """The algorithm called ``name``; ValueError listing the valid names otherwise."""
    try:
        return ENTRIES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"hpcring.allreduce: unknown algorithm {name!r}; choose one of {', '.join(MODULES)}"
        ) from None


def get(name: str) -> Callable[..., None]:
    """The all-reduce function of the algorithm called ``name``."""
    return entry(name).allreduce


@functools.lru_cache(maxsize=256)
def _scratch(name: str, count: int, itemsize: int, size: int, rank: int) -> int:
    # A pure function of the call's shape, worked out once per shape: a warm call looks it up.
    return ENTRIES[name].scratch_bytes(count, itemsize, size, rank)


def prepare(name: str, ch: Any, count: int, itemsize: int, in_place: bool) -> Prepared:
    """What a call of algorithm ``name`` on ``ch`` for ``count`` elements runs, and the scratch
    it needs (local: no communication).

    ValueError for an unknown name, TypeError where the algorithm refuses this channel's arrays
    (`nccl` without a GPU). `auto` answers with its choice once a call of this size and
    placement has made it, so the memory guard prices what really runs and the call skips
    auto's own dispatch; before that, with itself.
    """
    chosen = entry(name)
    if chosen.refuses is not None:
        refusal = chosen.refuses(ch.backend)
        if refusal:
            raise TypeError(f"hpcring.allreduce: {refusal}")
    if chosen.resolve is not None:
        resolved = chosen.resolve(ch, count * itemsize, in_place)
        if resolved is not None:
            chosen = ENTRIES[resolved]
    return Prepared(chosen.name, chosen.allreduce, _scratch(chosen.name, count, itemsize, ch.size, ch.rank))


def bytes_sent(name: str, count: int, itemsize: int, size: int, rank: int, per_node: int = 1) -> int | None:
    """Bytes rank ``rank`` of ``size`` hands to MPI for one call, by the algorithm's formula.

    ``per_node`` (ranks per node, in blocks) reaches the modules whose traffic depends on
    it (those with ``TOPOLOGY_AWARE``); the flat ones ignore it.
    """
    chosen = entry(name)
    if chosen.topology_aware:
        return chosen.bytes_sent(count, itemsize, size, rank, per_node=per_node)
    return chosen.bytes_sent(count, itemsize, size, rank)


def scratch_bytes(name: str, count: int, itemsize: int, size: int, rank: int) -> int:
    """Scratch memory rank ``rank`` of ``size`` needs for one call of ``count`` elements."""
    return entry(name).scratch_bytes(count, itemsize, size, rank)


__all__ = [
    "BASELINES",
    "ENTRIES",
    "MODULES",
    "PORTABLE",
    "Algorithm",
    "Entry",
    "Prepared",
    "bytes_sent",
    "entry",
    "get",
    "prepare",
    "scratch_bytes",
]
