"""All-reduce algorithms, one module each, registered here by name.

Each module exposes the same three functions (nccl-tests' small contract per collective):

- ``allreduce(ch, src, dst, op)``: ``ch`` is a `hpcring.channel.Channel`, ``src`` and
  ``dst`` flat arrays of equal length (``dst`` may be ``src``: in place), ``op`` a
  `hpcring.ops.Op` other than mean. On return ``dst`` holds the reduction of every
  rank's ``src``, bitwise identical on all ranks. It is only called with G > 1 and a
  non-empty buffer: `hpcring.api` handles the cases with nothing to exchange.
- ``bytes_sent(count, itemsize, size, rank)``: the bytes that rank hands to MPI in one
  call, by the algorithm's formula (None where MPI's own traffic is not visible); the
  bench compares it with what the Channel counted.
- ``scratch_bytes(count, itemsize, size, rank)``: the scratch memory that rank needs,
  so an impossible allocation is refused before any data moves.

A module whose traffic depends on the nodes (``TOPOLOGY_AWARE = True``) takes
``per_node`` in ``bytes_sent`` as well; it finds the nodes itself (`hpcring.topology`).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import auto, hierarchical, mpi, naive, nccl, ps, rabenseifner, ring

Algorithm = Callable[..., None]

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
# in allreduce(algorithm=...) and the bench adds them on GPUs, but they are not in
# REGISTRY, which is `hpcring.ALGORITHMS`: the algorithms that run everywhere.
BASELINES = ("nccl",)
REGISTRY: dict[str, Algorithm] = {
    name: module.allreduce for name, module in MODULES.items() if name not in BASELINES
}


def module(name: str) -> ModuleType:
    """The module of the algorithm called ``name``; ValueError listing the valid names otherwise."""
    try:
        return MODULES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"hpcring.allreduce: unknown algorithm {name!r}; choose one of {', '.join(MODULES)}"
        ) from None


def get(name: str) -> Algorithm:
    """The all-reduce function of the algorithm called ``name``."""
    return module(name).allreduce


def resolved(name: str, ch: Any, nbytes: int, in_place: bool) -> str:
    """The algorithm a call of ``name`` will run, where the channel already knows it without
    communicating (`auto`'s choice for a size it has seen); else ``name`` itself."""
    resolve = _RESOLVERS.get(name)
    return (resolve(ch, nbytes, in_place) or name) if resolve is not None else name


# The optional hooks, found once: a missing module attribute costs half a microsecond per
# call to look for, and at 3 ranks on 2 cores each microsecond between MPI calls costs several.
_RESOLVERS: dict[str, Callable[..., str | None]] = {
    name: module.resolve for name, module in MODULES.items() if hasattr(module, "resolve")
}
_REFUSERS: dict[ModuleType, Callable[[Any], str | None]] = {
    module: module.refuses for module in MODULES.values() if hasattr(module, "refuses")
}


def refuses(name: str, backend: Any) -> str | None:
    """Why algorithm ``name`` cannot take this backend's arrays (a local check), or None."""
    check = _REFUSERS.get(module(name))
    return None if check is None else check(backend)


def bytes_sent(name: str, count: int, itemsize: int, size: int, rank: int, per_node: int = 1) -> int | None:
    """Bytes rank ``rank`` of ``size`` hands to MPI for one call, by the algorithm's formula.

    ``per_node`` (ranks per node, in blocks) reaches the modules whose traffic depends on
    it (those with ``TOPOLOGY_AWARE``); the flat ones ignore it.
    """
    chosen = module(name)
    if getattr(chosen, "TOPOLOGY_AWARE", False):
        return chosen.bytes_sent(count, itemsize, size, rank, per_node=per_node)
    return chosen.bytes_sent(count, itemsize, size, rank)


def scratch_bytes(name: str, count: int, itemsize: int, size: int, rank: int) -> int:
    """Scratch memory rank ``rank`` of ``size`` needs for one call of ``count`` elements."""
    return module(name).scratch_bytes(count, itemsize, size, rank)


__all__ = [
    "BASELINES",
    "MODULES",
    "REGISTRY",
    "Algorithm",
    "bytes_sent",
    "get",
    "module",
    "refuses",
    "resolved",
    "scratch_bytes",
]
