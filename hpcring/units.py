"""Units: one size grammar, one byte formatter each way, the all-reduce bus-bandwidth factor.

Sizes use binary suffixes as nccl-tests does (``64K`` is 65536 bytes), on the command
lines of the bench and the model alike.
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from ``8``, ``64K``, ``1.5M``, ``16MiB``, ``1G`` (binary units); ValueError otherwise.

    A fraction is fine when it names whole bytes (``1.5K``); one that does not (``0.3``) is
    refused rather than truncated, so a typo never becomes another size.
    """
    match = _SIZE.match(text)
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


def busbw_factor(size: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor 2(G-1)/G, the same for every algorithm.

    It scales algbw so that an ideal all-reduce reaches the link bandwidth whatever G is,
    which makes numbers comparable across rank counts. It is a property of the
    collective, not of the algorithm: a naive all-reduce that sends more does not get
    a bigger factor, it gets a lower busbw.
    """
    return 2.0 * (size - 1) / size if size > 0 else 0.0


def busbw(nbytes: float, size: int, seconds: float) -> float:
    """Bus bandwidth in bytes/s of an all-reduce of ``nbytes`` over ``size`` ranks in ``seconds``."""
    return nbytes / seconds * busbw_factor(size)
