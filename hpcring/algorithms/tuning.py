"""The tuning file: what `python -m hpcring.bench --tune` writes and `auto` reads.

Its path is HPCRING_TUNING, else ~/.cache/hpcring/tuning.json. It holds, per table key
(the rank count, or "HxL" on H nodes of L ranks; "-in-place" added for calls in place),
a list of (up to this many bytes, algorithm) thresholds, and what each table was measured
on. Reader and writer live here together, so the format has one home; `auto` only asks
`load` for a table and `choose` for a size. Without a file, or without an entry for the
key, the built-in defaults below apply.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from .. import config

# (largest message in bytes, algorithm); None: no upper bound. `bench --tune` replaces them
# with this machine's crossovers. Untuned, by measurement (one node, `python -m hpcring.bench
# -b 8 -e 64M -f 4 -a ring,rabenseifner,mpi,auto --passes 3`, 2 and 4 ranks, in place and
# out of place, 2026-12-01): the library's own up to 64 KiB, where latency decides (it won
# every size to 32 KiB, by 1.2-1.8x), then Rabenseifner for a power-of-two rank count
# (log2 G steps, the ring's bytes: within 0.75x of the best algorithm at every size of the
# four sweeps, where the former table, ring from 256 KiB on, fell to 0.63x), and the ring
# for any other count, where Rabenseifner's fold sends the whole buffer twice more.
DEFAULT: tuple[tuple[int | None, str], ...] = ((64 << 10, "mpi"), (None, "rabenseifner"))
DEFAULT_NOT_POWER_OF_TWO: tuple[tuple[int | None, str], ...] = ((64 << 10, "mpi"), (None, "ring"))
# On 2 ranks the library's own only up to 32 KiB: as far as a checked call's data rides with the
# agreement there (hpcring.agreement.TWO_RANKS), one exchange; past it a checked `mpi` call pays
# the agreement's exchange and then MPI's all-reduce, and at 64 KiB out of place Rabenseifner
# measured 1.14-1.23x the bare call against 0.83-0.89x for `mpi` (three sweeps, 2026-12-07),
# in place the two within 0.02 of each other.
DEFAULT_TWO_RANKS: tuple[tuple[int | None, str], ...] = ((32 << 10, "mpi"), (None, "rabenseifner"))
# Across nodes (a table keyed "HxL"), untuned: what the cost model (hpcring.model, presets of
# GPU clusters: NVLink 4 inside a node, NDR/HDR InfiniBand or 100 Gb/s RoCE between nodes, a NIC
# per GPU or per node) finds fastest, or close to it. The library's own up to 32 KiB, then flat
# Rabenseifner: 2·log2 G latency steps where hierarchical's ring across H nodes takes 2(H-1)
# (at 1000 GPUs, 25 MiB: 0.45 ms against 1.02 ms), and, where G is a power of two, the same
# bytes. Where G is not a power of two Rabenseifner's fold sends the whole buffer twice more, and
# from about 1 MiB per node that costs more than hierarchical's longer ring: hierarchical from
# H MiB. tests/test_defaults_model.py fails where this table and the model part (on those
# presets every choice is within 0.75x of the model's best, and within 0.9x at 99% of sizes).
# Measured otherwise on one TCP network: on the emulated cluster (2 hosts x 2 ranks, 1 Gbit/s,
# docs/multinode.md) hierarchical's 60 KiB stream beat Rabenseifner's whole-buffer messages,
# 1.07-1.49x against 0.25-0.78x the library's own; `bench --tune` on such nodes writes "HxL".
DEFAULT_TWO_LEVEL: tuple[tuple[int | None, str], ...] = ((32 << 10, "mpi"), (None, "rabenseifner"))
HIERARCHICAL_PER_NODE = 1 << 20  # G not a power of two: hierarchical from this many bytes per node


def two_level_default(nodes: int, per_node: int) -> tuple[tuple[int | None, str], ...]:
    """The untuned all-reduce table on ``nodes`` nodes of ``per_node`` ranks (see DEFAULT_TWO_LEVEL)."""
    ranks = nodes * per_node
    if ranks & (ranks - 1) == 0:
        return DEFAULT_TWO_LEVEL
    return ((32 << 10, "mpi"), (nodes * HIERARCHICAL_PER_NODE, "rabenseifner"), (None, "hierarchical"))


# The other collectives, untuned: the library's own for latency-bound messages, then the
# bandwidth-optimal schedules (the same halves of the same algorithms as the all-reduce's).
DEFAULTS: dict[str, tuple[tuple[tuple[int | None, str], ...], ...]] = {
    # collective: (power-of-two G, other G, two levels)
    "allreduce": (DEFAULT, DEFAULT_NOT_POWER_OF_TWO, DEFAULT_TWO_LEVEL),
    "reduce_scatter": (DEFAULT, DEFAULT_NOT_POWER_OF_TWO, ((32 << 10, "mpi"), (None, "ring"))),
    "allgather": (DEFAULT, DEFAULT_NOT_POWER_OF_TWO, ((32 << 10, "mpi"), (None, "ring"))),
    "broadcast": (((64 << 10, "mpi"), (None, "ring")),) * 3,
    # Bruck's log2 G messages for blocks that small (they pay at many ranks; at 2 and 4 ranks on
    # one node Bruck and pairwise measured within the noise of each other up to 16 KiB). Above,
    # on one node, the library's own (`mpi`, its warm call in C as pairwise's is): at 2 ranks the
    # two measured within 0.02 of each other from 64 KiB to 16 MiB, at 4 ranks (2 cores) `mpi`
    # ahead at every size (0.69 against 0.55 of the bare call at 64 KiB, 1.02 against 0.82 at
    # 16 MiB; docs/collectives.md). Across nodes pairwise, which sends the least, in G-1 paced steps.
    "alltoall": (
        ((1 << 10, "bruck"), (None, "mpi")),
        ((1 << 10, "bruck"), (None, "mpi")),
        ((1 << 10, "bruck"), (None, "pairwise")),
    ),
}
FORMAT = 1


# Added to a table's key for calls in place (`bench --tune --in-place` writes it). In place the
# library's own Allreduce skips the copy of the input that out of place it makes first, so the
# crossovers move: at 2 ranks `mpi` won up to 4 MiB in place, and only up to 64 KiB out of
# place (docs/benchmarking.md). Where a file has no in-place table, the other one serves.
IN_PLACE = "-in-place"


def table_key(size: int, nodes: int = 1, per_node: int = 1) -> str:
    """The tuning file's key for a communicator: its rank count, or "HxL" on H nodes of L ranks."""
    return f"{nodes}x{per_node}" if nodes > 1 and per_node > 1 else str(size)


def key_for(
    size: int, shape: dict[str, Any] | None, in_place: bool = False, collective: str = "allreduce"
) -> str:
    """The key of the table that calls of ``collective`` on ``size`` ranks read (in place or
    not), where ``shape`` is their `Topology.summary` (None: one node): "HxL" only where the
    two-level algorithms apply; "COLLECTIVE:" in front for all but the all-reduce (whose keys
    came first). `bench --tune` writes under the same key."""
    key = str(size)
    if shape and shape["two_level"]:
        key = table_key(size, shape["nodes"], shape["ranks_per_node"][0])
    if collective != "allreduce":
        key = f"{collective}:{key}"
    return key + IN_PLACE if in_place else key


def tuning_path() -> Path:
    """Where the tuning file is read and written: HPCRING_TUNING, else the user's cache."""
    given = config.current().tuning
    return Path(given) if given else Path.home() / ".cache" / "hpcring" / "tuning.json"


# ---------------------------------------------------------------------------------------
# Reading (auto, on rank 0).


def load(
    size: int | str,
    path: Path | None = None,
    fallback: str | None = None,
    known: Sequence[str] | None = None,
) -> tuple[tuple[int | None, str], ...]:
    """The thresholds for ``size`` ranks (or a `key_for` key) from the tuning file, else those
    of the key ``fallback`` (quietly: the in-place table falls back to the out-of-place one),
    else the defaults. ``known``: the names auto may choose (a table naming another is unusable)."""
    path = tuning_path() if path is None else path
    default = default_table(size)
    try:
        if not path.exists():  # may raise too: a name too long, a folder not searchable
            return default
        import json  # only where there is a file to read

        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
        if fallback is not None and str(size) not in data["tables"]:
            return load(fallback, path, known=known)
        rows = data["tables"][str(size)]
        table = tuple((None if limit is None else int(limit), str(name)) for limit, name in rows)
        if not table or table[-1][0] is not None:
            raise ValueError("the last threshold must be open-ended (null)")
        unknown = [name for _, name in table if known is not None and name not in known]
        if unknown:
            raise ValueError(f"unknown algorithms {unknown}")
        return table
    except KeyError:
        what = f"{size} ranks" if str(size).isdigit() else f"table {size}"
        warnings.warn(
            f"hpcring: tuning file {path} has no entry for {what}; using the defaults "
            f"(run `{tune_command(size)}`)",
            stacklevel=2,
        )
    except (OSError, ValueError, TypeError, AttributeError) as error:
        warnings.warn(f"hpcring: ignoring tuning file {path} ({error}); using the defaults", stacklevel=2)
    return default


def tune_command(key: int | str) -> str:
    """The bench command that writes the table ``key`` (a `key_for` key) on one node of ranks:
    "reduce_scatter:4" -> mpiexec -n 4 python -m hpcring.bench --tune --collective reduce_scatter."""
    text = str(key)
    collective, _, shape = text.removesuffix(IN_PLACE).rpartition(":")
    nodes, _, per_node = shape.partition("x")
    ranks = int(nodes) * int(per_node) if per_node.isdigit() and nodes.isdigit() else shape
    flags = f" --collective {collective}" if collective else ""
    flags += " --in-place" if text.endswith(IN_PLACE) else ""
    return f"mpiexec -n {ranks} python -m hpcring.bench --tune{flags}"


def default_table(key: int | str) -> tuple[tuple[int | None, str], ...]:
    """The built-in table for a `table_key` (a rank count, or "HxL" for nodes): what an untuned
    machine runs."""
    collective, _, text = str(key).removesuffix(IN_PLACE).rpartition(":")
    power_of_two, other, two_level = DEFAULTS[collective or "allreduce"]
    if "x" in text:
        nodes, _, per_node = text.partition("x")
        if collective in ("", "allreduce") and nodes.isdigit() and per_node.isdigit():  # by shape
            return two_level_default(int(nodes), int(per_node))
        return two_level
    ranks = int(text) if text.isdigit() else 0
    if ranks == 2 and collective in ("", "allreduce"):
        return DEFAULT_TWO_RANKS
    return power_of_two if ranks & (ranks - 1) == 0 else other


def choose(nbytes: int, table: tuple[tuple[int | None, str], ...] = DEFAULT) -> str:
    """The algorithm for an ``nbytes`` message under ``table``."""
    for limit, name in table:
        if limit is None or nbytes <= limit:
            return name
    return table[-1][1]


# ---------------------------------------------------------------------------------------
# Writing (`bench --tune`, on rank 0).


class Measured(Protocol):
    """What the writer needs of a bench row (`hpcring.bench.measure.Row`)."""

    size: int
    algorithm: str
    time_us: float


# A size keeps the algorithm of the size below it unless another is faster by more than this.
# Timings of one row differ from pass to pass by a median 1.0% at 2 ranks, 2.6% at 3 and 3.4%
# at 4 (75th percentile 2.4%, 6.1%, 7.8%; five passes of 4 KiB-256 MiB, 2026-11-30), so two
# algorithms closer than a few percent are a coin toss: at 4 ranks one tuning chose the ring
# for 4-16 MiB, Rabenseifner for 64 MiB (1.2% ahead) and the ring again for 256 MiB, and in
# five later runs Rabenseifner at 64 MiB came out 11% behind the ring.
TUNING_TIE = 0.05


def tuning_table(rows: Sequence[Measured], known: Sequence[str], tie: float = TUNING_TIE) -> list[list[Any]]:
    """Thresholds for `auto` from measured rows: per size the fastest algorithm, runs merged.

    Each entry is [largest size in bytes, algorithm]; the last one is open-ended (None),
    so sizes beyond the sweep take the algorithm that won its largest size. Where the
    algorithm chosen for the size below is within ``tie`` (a fraction) of the fastest, it
    stays: a band ends only where another algorithm is ahead by more than the noise.
    """
    # Only what auto can run (``known``): not auto itself, not the GPU-only baselines, and not
    # the bench's bare MPI row (no hpcring algorithm; auto cannot run the library call without
    # its own dispatch). Where the bare call is fastest, `mpi`, the same call through
    # hpcring, is its stand-in. The tie is a ratio of two times, so it is the same whether
    # both are read against the bare call (the footer's busbw ratios) or not.
    rows = [r for r in rows if r.algorithm in known]
    table: list[list[Any]] = []
    for nbytes in sorted({r.size for r in rows}):
        times = {r.algorithm: r.time_us for r in rows if r.size == nbytes}
        best = min(times, key=times.__getitem__)
        incumbent = table[-1][1] if table else None
        if incumbent in times and times[incumbent] <= times[best] * (1 + tie):
            table[-1][0] = nbytes
        else:
            table.append([nbytes, best])
    if table:
        table[-1][0] = None
    return table


def write_tuning(
    rows: Sequence[Measured],
    *,
    size: int,
    header: dict[str, Any],
    known: Sequence[str],
    in_place: bool = False,
    collective: str = "allreduce",
) -> tuple[Path, str]:
    """Merge this rank count's thresholds for ``collective`` into the tuning file (other keys are
    kept); returns the file and the table's key (`key_for`)."""
    import json

    path = tuning_path()
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT or not isinstance(data.get("tables"), dict):
            raise ValueError
    except (OSError, ValueError):
        data = {"format": FORMAT, "tables": {}, "measured": {}}
    key = key_for(size, header.get("topology"), in_place, collective)
    data["tables"][key] = tuning_table(rows, known)
    data.setdefault("measured", {})[key] = {
        k: header[k] for k in ("mpi_library", "hosts", "device", "dtype", "op") if k in header
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path, key
