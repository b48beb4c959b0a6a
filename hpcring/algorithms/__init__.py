"""The algorithms, one module each, and each collective's table of them.

A module declares a `Spec` for every collective it implements (`hpcring.algorithms.base` says
what a Spec holds); the tables below list them, one line per (collective, algorithm). Adding an
algorithm is one module and its lines here; nothing outside this package keeps a list of names,
and a name a table does not hold is an error, never another algorithm's answer.

Importing this package needs no MPI (the algorithms reach MPI only through the channel they
are given), so the cost model and the trace viewer read the Specs too.
"""

from __future__ import annotations

import importlib

from .base import Layout, Phase, Spec

ALLREDUCE, REDUCE_SCATTER, ALLGATHER, BROADCAST = "allreduce", "reduce_scatter", "allgather", "broadcast"
ALLTOALL = "alltoall"
COLLECTIVES = (ALLREDUCE, REDUCE_SCATTER, ALLGATHER, BROADCAST, ALLTOALL)

# Where each Spec lives ("module:NAME" in this package): a module is imported when one of its
# Specs is first asked for (`spec`, `table`), so a code that only ever runs `mpi` never loads the
# ring's or Rabenseifner's (an embedding code pays for what it runs, at its first call).
_WHERE: dict[str, dict[str, str]] = {
    ALLREDUCE: {
        "naive": "naive:ALLREDUCE",
        "ps": "ps:ALLREDUCE",
        "ring": "ring:ALLREDUCE",
        "rabenseifner": "rabenseifner:ALLREDUCE",
        "hierarchical": "hierarchical:ALLREDUCE",
        "mpi": "mpi:ALLREDUCE",
        "auto": "auto:ALLREDUCE",
        "nccl": "nccl:ALLREDUCE",
    },
    REDUCE_SCATTER: {
        "naive": "naive:REDUCE_SCATTER",
        "ring": "ring:REDUCE_SCATTER",
        "rabenseifner": "rabenseifner:REDUCE_SCATTER",
        "mpi": "mpi:REDUCE_SCATTER",
        "auto": "auto:REDUCE_SCATTER",
    },
    ALLGATHER: {
        "naive": "naive:ALLGATHER",
        "ring": "ring:ALLGATHER",
        "rabenseifner": "rabenseifner:ALLGATHER",
        "mpi": "mpi:ALLGATHER",
        "auto": "auto:ALLGATHER",
    },
    BROADCAST: {
        "naive": "naive:BROADCAST",
        "ring": "ring:BROADCAST",
        "binomial": "binomial:BROADCAST",
        "mpi": "mpi:BROADCAST",
        "auto": "auto:BROADCAST",
    },
    ALLTOALL: {
        "pairwise": "pairwise:ALLTOALL",
        "bruck": "bruck:ALLTOALL",
        "mpi": "mpi:ALLTOALL",
        "auto": "auto:ALLTOALL",
    },
}
# The choosers among them: they pick another algorithm of the table and run nothing themselves.
CHOOSERS = frozenset({"auto"})
# Baselines that only run on some machines (NCCL: CuPy, one GPU per rank). They can be named
# as a collective's algorithm and the bench adds them on GPUs, but they are not in `portable`,
# which `hpcring.ALGORITHMS` is for the all-reduce: the algorithms that run everywhere.
BASELINES = frozenset({"nccl"})
# The Specs made so far, named, per collective; a registered one (`register`) goes straight here.
_TABLES: dict[str, dict[str, Spec]] = {collective: {} for collective in _WHERE}


def _where(collective: str) -> dict[str, str]:
    try:
        return _WHERE[collective]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown collective {collective!r}; choose one of {', '.join(COLLECTIVES)}"
        ) from None


def _load(collective: str, name: str) -> Spec | None:
    """``name``'s Spec of ``collective``, its module imported now where it was not; None: no such."""
    made = _TABLES[collective].get(name)
    if made is None and name in _WHERE[collective]:
        module, attribute = _WHERE[collective][name].split(":")
        found = getattr(importlib.import_module(f".{module}", __name__), attribute)
        made = _TABLES[collective][name] = found._replace(name=name, collective=collective)
    return made


def names(collective: str) -> tuple[str, ...]:
    """The names of ``collective``'s algorithms, in the table's order (nothing imported)."""
    where = _where(collective)
    return (*where, *(name for name in _TABLES[collective] if name not in where))


def register(collective: str, name: str, spec: Spec) -> Spec:
    """List ``spec`` under ``name`` in ``collective``'s table (a new algorithm's one line, for a
    module outside this package); returns the Spec as the table holds it (named)."""
    _where(collective)
    named = spec._replace(name=name, collective=collective)
    _TABLES[collective][name] = named
    return named


def unregister(collective: str, name: str) -> None:
    """Take ``name`` out of ``collective``'s table again (a registered one; a built-in is made again
    when next asked for)."""
    _where(collective)
    _TABLES[collective].pop(name, None)


def table(collective: str) -> dict[str, Spec]:
    """The algorithms of ``collective``, by name (every module imported); ValueError for a
    collective there is none of."""
    return {name: made for name in names(collective) if (made := _load(collective, name)) is not None}


def spec(collective: str, name: str) -> Spec:
    """The algorithm called ``name`` of ``collective``; ValueError listing the valid names otherwise."""
    known = names(collective)
    made = _load(collective, name) if isinstance(name, str) and name in known else None
    if made is None:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(known)}")
    return made


def portable(collective: str = ALLREDUCE) -> tuple[str, ...]:
    """The names of ``collective``'s algorithms that run everywhere (no baselines)."""
    return tuple(name for name in names(collective) if name not in BASELINES)


def choices(collective: str = ALLREDUCE) -> tuple[str, ...]:
    """What a chooser (`auto`) may choose for ``collective``: every portable algorithm that runs
    itself (not a chooser)."""
    where = _where(collective)
    return tuple(
        name
        for name in portable(collective)
        if name not in CHOOSERS and (name in where or _TABLES[collective][name].choose is None)
    )


def uneven(collective: str = ALLTOALL) -> tuple[str, ...]:
    """What a chooser may choose for an all-to-all of uneven blocks (send_splits=): the choices
    that do not run equal blocks only."""
    return tuple(name for name in choices(collective) if not table(collective)[name].equal_only)


def priced(s: Spec, count: int, itemsize: int, size: int) -> Spec:
    """The Spec whose formulas stand for ``s``: a chooser's (auto's) untuned default choice for
    ``count`` elements on ``size`` ranks, else ``s`` itself."""
    return spec(s.collective, s.default(count * itemsize, size)) if s.default is not None else s


def bytes_sent(
    name: str,
    count: int,
    itemsize: int,
    size: int,
    rank: int,
    per_node: int = 1,
    *,
    collective: str = ALLREDUCE,
    wire: int | None = None,
    root: int | None = None,
) -> int | None:
    """Bytes rank ``rank`` of ``size`` hands to MPI for one call of ``name`` on ``count`` elements
    (all-gather, broadcast: of one rank's buffer), by the algorithm's formula (`Spec.sent`);
    None where the library's traffic is not visible. A chooser counts as its untuned default."""
    chosen = priced(spec(collective, name), count, itemsize, size)
    return chosen.sent(count, itemsize, size, rank, per_node, wire, root)


def scratch_bytes(
    name: str, count: int, itemsize: int, size: int, rank: int, collective: str = ALLREDUCE
) -> int:
    """Scratch rank ``rank`` of ``size`` needs for one call of ``name`` on ``count`` elements."""
    chosen = priced(spec(collective, name), count, itemsize, size)
    return chosen.scratch_bytes(count, itemsize, size, rank) if chosen.scratch_bytes else 0


PORTABLE: tuple[str, ...] = portable(ALLREDUCE)

__all__ = [
    "ALLGATHER",
    "ALLREDUCE",
    "ALLTOALL",
    "BASELINES",
    "BROADCAST",
    "CHOOSERS",
    "COLLECTIVES",
    "PORTABLE",
    "REDUCE_SCATTER",
    "Layout",
    "Phase",
    "Spec",
    "bytes_sent",
    "names",
    "portable",
    "priced",
    "register",
    "scratch_bytes",
    "spec",
    "table",
    "uneven",
    "unregister",
]
