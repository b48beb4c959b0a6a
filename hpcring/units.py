"""Units: one size grammar, one byte formatter each way, each collective's bus-bandwidth factor
and what its size counts.

Sizes use binary suffixes as nccl-tests does (``64K`` is 65536 bytes), on the command
lines of the bench and the model alike. A collective's size is nccl-tests' too: the whole
buffer, which for the all-gather is its output (G inputs) and for the reduce-scatter its
input (G parts); `input_bytes` turns it into what each rank passes in.
"""

from __future__ import annotations

import re

# compiled at its first use (re's own cache), not at import: a first call that never parses a size
# does not pay for it
_SIZE = r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(?:i?b)?\s*$"
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from ``8``, ``64K``, ``1.5M``, ``16MiB``, ``1G`` (binary units); ValueError otherwise.

    A fraction is fine when it names whole bytes (``1.5K``); one that does not (``0.3``) is
    refused rather than truncated, so a typo never becomes another size.
    """
    match = re.match(_SIZE, text, re.IGNORECASE)
    if match is None:
        raise ValueError(f"invalid size {text!r}: use a number of bytes with an optional K, M, G or T suffix")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value != int(value):
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    return int(value)


def format_size(nbytes: int) -> str:
    """The shortest exact spelling of ``nbytes`` in `parse_size`'s grammar (``16M``, ``4100``)."""
    for suffix, unit in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(int(nbytes))


def format_bytes(nbytes: float) -> str:
    """``nbytes`` rounded for a person to read in a message (``512 B``, ``1.5 MiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


# nccl-tests' bus-bandwidth factors (doc/PERFORMANCE.md there): what an ideal algorithm's busbw
# equals the link bandwidth with, whatever G is. By collective, as `hpcring.algorithms` names them.
_FACTORS = {
    "allreduce": (lambda g: 2.0 * (g - 1) / g, "2(G-1)/G"),
    "reduce_scatter": (lambda g: (g - 1) / g, "(G-1)/G"),
    "allgather": (lambda g: (g - 1) / g, "(G-1)/G"),
    "broadcast": (lambda g: 1.0, "1"),
    "alltoall": (lambda g: (g - 1) / g, "(G-1)/G"),
}
# The collectives whose size (nccl-tests') is G inputs: the all-gather's output.
_GATHERED = frozenset({"allgather"})
_TITLES = {
    "allreduce": "all-reduce",
    "reduce_scatter": "reduce-scatter",
    "allgather": "all-gather",
    "alltoall": "all-to-all",
}


def collective_title(collective: str) -> str:
    """How a header or a plot names ``collective`` for people, in nccl-tests' spelling ("all-gather")."""
    return _TITLES.get(collective, collective)


def busbw_factor(size: int, collective: str = "allreduce") -> float:
    """nccl-tests' bus-bandwidth factor of ``collective`` on ``size`` ranks, the same for every
    algorithm: 2(G-1)/G for the all-reduce, (G-1)/G for the reduce-scatter, the all-gather and
    the all-to-all, 1 for the broadcast.

    It scales algbw so that an ideal algorithm reaches the link bandwidth whatever G is,
    which makes numbers comparable across rank counts. It is a property of the
    collective, not of the algorithm: a naive all-reduce that sends more does not get
    a bigger factor, it gets a lower busbw.
    """
    return _FACTORS[collective][0](size) if size > 0 else 0.0


def busbw_formula(collective: str = "allreduce") -> str:
    """`busbw_factor` of ``collective`` as the header writes it ("2(G-1)/G")."""
    return _FACTORS[collective][1]


def input_bytes(nbytes: int, size: int, collective: str = "allreduce") -> int:
    """What each of ``size`` ranks passes in for a ``collective`` of nccl-tests' size ``nbytes``
    (the whole buffer): the all-gather's input is one G-th of its output; every other
    collective's input is the whole buffer (the reduce-scatter's, cut into G parts)."""
    return nbytes // size if collective in _GATHERED else nbytes


def busbw(nbytes: float, size: int, seconds: float, collective: str = "allreduce") -> float:
    """Bus bandwidth in bytes/s of a ``collective`` of ``nbytes`` (nccl-tests' size) over ``size``
    ranks in ``seconds``."""
    return nbytes / seconds * busbw_factor(size, collective)
