"""auto: the algorithm measured fastest on this machine for the message size and rank count.

Cost: that of the algorithm it picks. The choice comes from a tuning file written by
`python -m hpcring.bench --tune` (path: HPCRING_TUNING, else ~/.cache/hpcring/tuning.json):
for each rank count, a list of (up to this many bytes, algorithm) thresholds. Without
a file, or without an entry for this rank count, built-in defaults apply: the library's
own Allreduce for tiny messages (latency), Rabenseifner for medium ones (log2 G steps),
the ring for large ones (bandwidth). Rank 0 reads the file once per communicator and
broadcasts the table, so every rank makes the same choice even if their files differ.

The topology counts too: on several nodes of L > 1 ranks each (`hpcring.topology`) the
table is the one tuned for that shape, keyed "HxL" (e.g. "2x2"; `bench --tune` run on
those nodes writes it), else DEFAULT_TWO_LEVEL, in which `hierarchical` takes the large
messages: its inter-node links carry 2(H-1)/H·n where a flat ring's carry 2(G-1)/G·n
in L times as many steps.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from .. import topology
from ..channel import Channel
from ..ops import Op

# (largest message in bytes, algorithm); None: no upper bound. Chosen so that an untuned
# machine gets the textbook shape; `bench --tune` replaces them with measured crossovers.
DEFAULT: tuple[tuple[int | None, str], ...] = ((4 << 10, "mpi"), (256 << 10, "rabenseifner"), (None, "ring"))
# Across nodes, measured on the emulated cluster (2 hosts x 2 ranks, 1 Gbit/s TCP, `bench
# --tune`, busbw relative to MPI_Allreduce): MPI's own up to 32 KiB, then hierarchical
# (1.07-1.49x at 64-512 KiB and 8-16 MiB, 0.90x at 1-4 MiB); Rabenseifner's large early
# exchanges across the network reached only 0.25-0.78x from 16 KiB up.
DEFAULT_TWO_LEVEL: tuple[tuple[int | None, str], ...] = ((32 << 10, "mpi"), (None, "hierarchical"))
FORMAT = 1


# Added to a table's key for calls in place (`bench --tune --in-place` writes it). In place the
# library's own Allreduce skips the copy of the input that out of place it makes first, so the
# crossovers move: at 2 ranks `mpi` won up to 4 MiB in place, and only up to 64 KiB out of
# place (docs/benchmarking.md). Where a file has no in-place table, the other one serves.
IN_PLACE = "-in-place"


def table_key(size: int, nodes: int = 1, per_node: int = 1) -> str:
    """The tuning file's key for a communicator: its rank count, or "HxL" on H nodes of L ranks."""
    return f"{nodes}x{per_node}" if nodes > 1 and per_node > 1 else str(size)


def key_for(size: int, shape: dict[str, Any] | None, in_place: bool = False) -> str:
    """The key of the table that calls of ``size`` ranks read (in place or not), where
    ``shape`` is their `topology.summary` (None: one node): "HxL" only where `hierarchical`
    applies. `bench --tune` writes under the same key."""
    key = str(size)
    if shape and shape["two_level"]:
        key = table_key(size, shape["nodes"], shape["ranks_per_node"][0])
    return key + IN_PLACE if in_place else key


def tuning_path() -> Path:
    """Where the tuning file is read and written: HPCRING_TUNING, else the user's cache."""
    env = os.environ.get("HPCRING_TUNING", "").strip()
    return Path(env) if env else Path.home() / ".cache" / "hpcring" / "tuning.json"


def load(
    size: int | str, path: Path | None = None, fallback: str | None = None
) -> tuple[tuple[int | None, str], ...]:
    """The thresholds for ``size`` ranks (or a `table_key`) from the tuning file, else those of
    the key ``fallback`` (quietly: the in-place table falls back to the out-of-place one),
    else the defaults."""
    from . import BASELINES, MODULES  # late: this module is one of them

    path = tuning_path() if path is None else path
    default = DEFAULT_TWO_LEVEL if "x" in str(size) else DEFAULT
    try:
        if not path.exists():  # may raise too: a name too long, a folder not searchable
            return default
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
        if fallback is not None and str(size) not in data["tables"]:
            return load(fallback, path)
        rows = data["tables"][str(size)]
        table = tuple((None if limit is None else int(limit), str(name)) for limit, name in rows)
        if not table or table[-1][0] is not None:
            raise ValueError("the last threshold must be open-ended (null)")
        unknown = [name for _, name in table if name not in MODULES or name in ("auto", *BASELINES)]
        if unknown:
            raise ValueError(f"unknown algorithms {unknown}")
        return table
    except KeyError:
        warnings.warn(
            f"hpcring: tuning file {path} has no entry for {size} ranks; using the defaults "
            f"(run `mpiexec -n {size} python -m hpcring.bench --tune`)",
            stacklevel=2,
        )
    except (OSError, ValueError, TypeError, AttributeError) as error:
        warnings.warn(f"hpcring: ignoring tuning file {path} ({error}); using the defaults", stacklevel=2)
    return default


def choose(nbytes: int, table: tuple[tuple[int | None, str], ...] = DEFAULT) -> str:
    """The algorithm for an ``nbytes`` message under ``table``."""
    for limit, name in table:
        if limit is None or nbytes <= limit:
            return name
    return table[-1][1]


def _table(ch: Channel, in_place: bool = False) -> tuple[tuple[int | None, str], ...]:
    """The table of this communicator for calls in place or not: read by rank 0 once,
    broadcast, then cached as a plan."""

    def build() -> tuple[tuple[int | None, str], ...]:
        shape = topology.summary(topology.of(ch.comm))  # collective on first use, like the bcast
        if ch.rank != 0:  # only rank 0's copy counts, so only rank 0 reads (and warns)
            return ch.comm.bcast(None, root=0)
        key = key_for(ch.size, shape)
        table = load(key_for(ch.size, shape, in_place=True), fallback=key) if in_place else load(key)
        return ch.comm.bcast(table, root=0)

    return ch.plan(("auto-table", in_place), build)


def chosen(ch: Channel, nbytes: int, in_place: bool = False) -> str:
    """What `allreduce` below runs for an ``nbytes`` message on this channel, in place or not
    (collective on first use)."""
    return choose(nbytes, _table(ch, in_place))


def allreduce(ch: Channel, src: Any, dst: Any, op: Op) -> None:
    """dst <- op over all ranks of src, by the algorithm tuned for this size and placement.

    The choice for a size is a plan of its own, so later calls of that size need no
    communication to make it; `hpcring.api` then runs the choice directly (`resolve`)."""
    nbytes, in_place = src.nbytes, dst is src
    name = ch.plan(_choice_key(nbytes, in_place), lambda: chosen(ch, nbytes, in_place))
    _package().get(name)(ch, src, dst, op)


def _choice_key(nbytes: int, in_place: bool) -> tuple[Any, ...]:
    """The plan key under which the choice for a size and placement is kept."""
    return ("auto", nbytes, in_place)


def resolve(ch: Channel, nbytes: int, in_place: bool) -> str | None:
    """The algorithm an ``nbytes`` call runs on this channel, if a call of that size and
    placement already chose it (local: no communication); None before that.

    A 4 KiB call takes 15-20 us at 2 ranks and 60 at 3 ranks sharing 2 cores, where each
    microsecond of Python costs several: the memory guard prices the choice itself (often
    `mpi`, no scratch), and the call skips this module's own dispatch."""
    return ch.cached(_choice_key(nbytes, in_place))


def bytes_sent(count: int, itemsize: int, size: int, rank: int) -> int | None:
    """Those of the default choice (the bench asks the channel which one really ran)."""
    return _package().bytes_sent(choose(count * itemsize), count, itemsize, size, rank)


def scratch_bytes(count: int, itemsize: int, size: int, rank: int) -> int:
    """Those of the default choice: the guard runs before the ranks agree, so it cannot read the table."""
    return _package().scratch_bytes(choose(count * itemsize), count, itemsize, size, rank)


def _package() -> Any:
    """hpcring.algorithms, which imports this module: reached at call time, not import time."""
    return sys.modules[__package__]
