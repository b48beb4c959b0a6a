"""The alpha-beta-gamma cost model of every all-reduce here, its calibration, and predictions to 1000+ ranks.

A message of n bytes costs alpha + n*beta on a link; reducing n bytes locally costs n*gamma
(Hockney's model as used by Thakur, Rabenseifner & Gropp 2005). Each algorithm is written
once, as the list of `Phase`s it really performs, so the same description gives the flat
closed forms below, the per-link cost on a machine of nodes (`Nodes`), and the table and plot.

For n bytes on p ranks (p' = 2^floor(log2 p); every cost is 0 at p = 1):

- ring:         2(p-1)a + 2(p-1)/p n b + (p-1)/p n g
- rabenseifner: 2 log2(p) a + 2(p-1)/p n b + (p-1)/p n g                      (p a power of two)
                (2 log2(p') + 2) a + (2(p'-1)/p' + 2) n b + ((p'-1)/p' + 1) n g   (otherwise:
                the first 2(p-p') ranks pair up, the even one sends its whole buffer to the
                odd one, which reduces it and sends the whole result back at the end: the
                simple fold of Thakur et al. 2005, sec. 4.4, which is what runs here)
- naive:        (p-1)(a + n b) + (p+1) n g      (p-1 shifted exchanges, then p-1 reductions
                and 2 copies of the buffer, a copy costing what a reduction does)
- ps:           gather (p-1)(a + n b) + (p+1) n g at the root (reductions, 2 copies) + Bcast, which is
                ceil(log2 p)(a + n b) with ``bcast="binomial"`` (default: what Open MPI and
                MPICH do, a binomial tree) or (p-1)(a + n b) with ``bcast="linear"`` (the
                textbook server that sends to every worker over its one link)
- mpi:          the library's own choice; modelled as the cheaper of ring and rabenseifner
- hierarchical: ring reduce-scatter inside each node of L ranks, ring all-reduce of n/L bytes
                across the H nodes on each local rank at once (the L flows share one NIC
                unless each GPU has its own), ring all-gather inside the node.

busbw = algbw * 2(p-1)/p (nccl-tests), algbw = n / time.

Used by other modules (the bench's ``predicted (us)`` column, ``auto``)::

    from hpcring import model
    params = model.load_params()            # path: $HPCRING_MODEL, else ~/.cache/hpcring/model.json
    seconds = model.predict("ring", nbytes, ranks, params)

`load_params` raises `ModelError` (a ValueError) for a missing or corrupt file; `predict`
raises it for an unknown algorithm or a non-positive size or rank count. With calibrated
`Params`, steps in which every rank works are slowed by ranks/cores when the ranks outnumber
the calibrated cores (`oversubscription`), unless the calibration measured them with that many
ranks busy at once (`Busy`, one entry per rank count calibrated; `Params.partial` for the
phases some ranks sit out, waiting). A call adds `Busy.call` (the agreement) and, from
COLD_FROM bytes, `Busy.cold` (its fixed costs paid again with cold caches). `Link` and
`Nodes` assume a core or GPU per rank.

Command line (only rank 0 prints; user errors exit 2 with one line, no traceback)::

    mpiexec -n 2 python -m hpcring.model --calibrate [--output FILE] [--quick]   # again at -n 3, 4...
    mpiexec -n 4 python -m hpcring.model --validate [--params FILE] [--sizes 1M,4M,16M]
    python -m hpcring.model --ranks 8,64,512,1000 --bytes 100M,1G [--link ndr400] [--plot t.png]
    python -m hpcring.model --ranks 64,1000 --bytes 1G --gpus-per-node 8 --intra nvlink4 --link ndr400
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import os
import socket
import statistics
import sys
import textwrap
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ALGORITHMS = ("naive", "ps", "ring", "rabenseifner", "mpi")
BCAST_FORMS = ("binomial", "linear")
FORMAT_VERSION = 1


class ModelError(ValueError):
    """A user error: bad argument, unknown name, missing or corrupt calibration file."""


# ---------------------------------------------------------------------------------------------
# Parameters and links


@dataclass(frozen=True)
class Link:
    """One kind of link: alpha seconds per message, beta seconds per byte."""

    alpha: float
    beta: float


@dataclass(frozen=True)
class Busy:
    """alpha, beta and gamma measured with all p ranks of one machine exchanging and adding at
    once: what a step of ring, rabenseifner or naive costs when every rank does it together.

    ``alpha`` is a step of hpcring's own ring at the smallest size (the Python and mpi4py
    around each message included, which dwarf MPI's latency on shared memory), and ``call``
    what one call adds on top: the ranks' agreement before data moves (LogP's overhead o).
    """

    alpha: float
    beta: float
    gamma: float
    call: float = 0.0
    cold: float = 0.0  # what a call adds when it starts with cold caches (see COLD_FROM)


# A call that moves this much data per rank leaves the per-core caches cold: the interpreter
# and mpi4py then reload their own state, which more than doubled the fixed cost of a call
# here (a one-element call at 2 ranks after a 4 MiB write: 67 -> 156-176 us). Below it,
# a share of `cold`, in proportion.
COLD_FROM = 1 << 20


def flush_bytes() -> int:
    """What calibration writes to leave a rank's caches cold: twice the per-core L2 (4 MiB
    here), from sysfs; 4 MiB where the kernel does not say."""
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "level").read_text().strip() == "2":
                return 2 * parse_size((index / "size").read_text().strip().rstrip("B"))
        except (OSError, ModelError):
            break
    return 4 << 20


@dataclass(frozen=True)
class Params:
    """A flat machine: every pair of ranks is joined by the same link; gamma per byte reduced.

    ``alpha``, ``beta``, ``gamma`` are one pair alone (ping-pong, one rank adding); ``busy[p]``,
    where calibrated at p ranks, are the same with all p ranks busy. Ranks that share cores
    and memory bandwidth get much less each than a pair alone, and the busy figures hold
    that sharing, measured, where `oversubscription` can only guess its core part.
    """

    alpha: float
    beta: float
    gamma: float
    cores: int | None = None  # set when the ranks share this machine's cores (calibration does)
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    busy: dict[int, Busy] = field(default_factory=dict, compare=False)
    inter_alpha: float | None = None  # between nodes, when calibrated across nodes (alpha/beta: inside)
    inter_beta: float | None = None
    # partial[p]: at p ranks, with only the largest power of two below p at work and the rest
    # waiting in MPI, as in Rabenseifner's folded steps and the first steps of a binomial tree
    partial: dict[int, Busy] = field(default_factory=dict, compare=False)

    @property
    def link(self) -> Link:
        return Link(self.alpha, self.beta)

    @property
    def inter(self) -> Link | None:
        """The link between nodes, where the calibration had ranks on two nodes."""
        if self.inter_alpha is None or self.inter_beta is None:
            return None
        return Link(self.inter_alpha, self.inter_beta)

    def nodes(self, per_node: int) -> Nodes | None:
        """This machine as nodes of ``per_node`` ranks sharing one NIC each, where calibrated so."""
        inter = self.inter
        return None if inter is None or per_node <= 1 else Nodes(per_node, self.link, inter, nic_shared=True)


@dataclass(frozen=True)
class Preset:
    """An interconnect's assumed figures (see docs/scaling.md for where they come from)."""

    alpha: float
    beta: float
    gamma: float
    description: str


GB = 1e9
# Assumptions, not measurements: alpha is an end-to-end MPI latency, beta the inverse of the
# per-direction bandwidth one rank gets, gamma an H100/H200-class reduction (~1 TB/s of
# reduced data: HBM3 moves 3 bytes per reduced byte at ~3.3-4.8 TB/s).
PRESETS: dict[str, Preset] = {
    "roce100": Preset(5e-6, 1 / (12.5 * GB), 1e-12, "100 Gb/s Ethernet (RoCE v2), 12.5 GB/s, 5 us"),
    "hdr200": Preset(3e-6, 1 / (25 * GB), 1e-12, "HDR InfiniBand 200 Gb/s, 25 GB/s, 3 us"),
    "ndr400": Preset(3e-6, 1 / (50 * GB), 1e-12, "NDR InfiniBand 400 Gb/s, 50 GB/s, 3 us"),
    "nvlink4": Preset(1.5e-6, 1 / (450 * GB), 1e-12, "NVLink 4 (H100/H200), 450 GB/s per direction, 1.5 us"),
}


@dataclass(frozen=True)
class Nodes:
    """A machine of nodes with ``per_node`` ranks each, ranks placed in blocks (node = rank // L).

    A message between two ranks of one node takes ``intra``, otherwise ``inter``. With
    ``nic_shared`` the off-node messages that the ranks of one node send at the same time
    share one NIC, so each gets 1/flows of its bandwidth; otherwise every GPU has its own NIC.
    """

    per_node: int
    intra: Link
    inter: Link
    nic_shared: bool = True


# ---------------------------------------------------------------------------------------------
# The algorithms, each written once as the phases it performs


@dataclass(frozen=True)
class Phase:
    """``messages`` messages of ``nbytes`` each, one after another, then ``reduced`` bytes reduced.

    ``distance`` is the rank distance of the partner (to find the link on a machine of
    nodes); ``pattern`` says who sends at once: "shift" (every rank r to r+d), "xor" (every
    rank r to r^d), "single" (one rank alone, as a root does), "local" (every rank computes,
    no message), "root" (the root alone computes). ``partial``: some ranks sit out the
    phase, waiting in MPI (Rabenseifner's fold, the first steps of a binomial tree).
    """

    messages: float
    nbytes: float
    reduced: float = 0.0
    distance: int = 1
    pattern: str = "shift"
    partial: bool = False  # only some of the ranks work in it, the others wait in MPI


def _log2_floor(p: int) -> int:
    return p.bit_length() - 1


def ring_reduce_scatter(n: float, p: int) -> list[Phase]:
    """p-1 steps of one n/p segment to the right neighbour, each added into the local copy."""
    return [Phase(p - 1, n / p, (p - 1) / p * n)] if p > 1 else []


def ring_all_gather(n: float, p: int) -> list[Phase]:
    """p-1 steps passing complete n/p segments to the right neighbour, no arithmetic."""
    return [Phase(p - 1, n / p, 0.0)] if p > 1 else []


def _rabenseifner(n: float, p: int) -> list[Phase]:
    """Recursive halving reduce-scatter + recursive doubling all-gather, with the pre/post steps
    for p not a power of two: the first 2r ranks (r = p - p') pair up, each even one sends
    its whole buffer to its odd partner, which reduces it, works for both in the p' core,
    and sends the whole result back. Then every step has ranks that only wait."""
    if p == 1:
        return []
    k = _log2_floor(p)
    fold = (1 << k) != p
    halving = [Phase(1, n / 2 ** (s + 1), n / 2 ** (s + 1), 1 << s, "xor", fold) for s in range(k)]
    doubling = [Phase(1, n / 2 ** (s + 1), 0.0, 1 << s, "xor", fold) for s in reversed(range(k))]
    if not fold:
        return halving + doubling
    return [Phase(1, n, n, 1, "xor", True), *halving, *doubling, Phase(1, n, 0.0, 1, "xor", True)]


COPIES = 2  # whole-buffer copies naive (every rank) and ps (the root) make besides reducing


def _naive(n: float, p: int) -> list[Phase]:
    """Step s: every rank sends its whole buffer to r+s; then each rank reduces p copies.

    Two copies of n on every rank as well (its own buffer into the p-row scratch, and row 0
    into the result): a copy is one memory-bound pass like a reduction, so it costs gamma.
    """
    if p == 1:
        return []
    exchanges = [Phase(1, n, 0.0, s, "shift") for s in range(1, p)]
    return [*exchanges, Phase(0, 0.0, (p - 1) * n + COPIES * n, 0, "local")]


def _ps(n: float, p: int, bcast: str) -> list[Phase]:
    """Gather: the root receives p-1 buffers one at a time over its link; reduce; Bcast back."""
    if p == 1:
        return []
    gather = [Phase(1, n, 0.0, d, "single") for d in range(1, p)]
    reduce = [Phase(0, 0.0, (p - 1) * n + COPIES * n, 0, "root")]  # and the root's two copies
    if bcast == "linear":
        back = [Phase(1, n, 0.0, d, "single") for d in range(1, p)]
    else:  # binomial tree: at step s every rank that has the data sends to r + 2^s, where there is one
        steps = range(math.ceil(math.log2(p)))
        back = [Phase(1, n, 0.0, 1 << s, "xor", 2 * min(1 << s, p - (1 << s)) < p) for s in steps]
    return gather + reduce + back


def phases(algorithm: str, nbytes: float, ranks: int, *, bcast: str = "binomial") -> list[Phase]:
    """What ``algorithm`` does for ``nbytes`` on ``ranks`` (not "mpi", which is a choice)."""
    if algorithm == "ring":
        return ring_reduce_scatter(nbytes, ranks) + ring_all_gather(nbytes, ranks)
    if algorithm == "rabenseifner":
        return _rabenseifner(nbytes, ranks)
    if algorithm == "naive":
        return _naive(nbytes, ranks)
    if algorithm == "ps":
        return _ps(nbytes, ranks, bcast)
    raise ModelError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")


# ---------------------------------------------------------------------------------------------
# Evaluation on a flat machine or a machine of nodes


CONCURRENT = ("shift", "xor", "local")  # patterns in which every rank works at once


def _crossing(distance: int, pattern: str, per_node: int, ranks: int) -> int:
    """How many ranks of node 0 send off-node at once in this phase (0: it stays inside)."""
    if pattern in ("local", "root") or per_node <= 1:
        return 0 if pattern in ("local", "root") else 1
    if pattern == "single":
        return int(distance // per_node != 0)
    partners = (
        ((r ^ distance) for r in range(per_node))
        if pattern == "xor"
        else (((r + distance) % ranks) for r in range(per_node))
    )
    return sum(1 for q in partners if q // per_node != 0)


def seconds(
    steps: Iterable[Phase],
    machine: Link | Nodes,
    gamma: float,
    ranks: int,
    slowdown: float = 1.0,
    busy: Busy | None = None,
    partial: Busy | None = None,
) -> float:
    """The time of ``steps``: each phase on the link its messages cross, shared by the flows that
    cross at once; phases in which every rank works are ``slowdown`` times slower (`oversubscription`),
    or, where ``busy`` figures were measured for these ranks, cost what those say (``partial``
    ones for phases that some ranks sit out, where measured); steps that cross between nodes
    are not slowed: they wait on the network, not on the cores."""
    total = 0.0
    for step in steps:
        figures = partial if step.partial and partial is not None else busy
        if figures is not None and step.pattern in CONCURRENT:
            total += step.reduced * figures.gamma + step.messages * (
                figures.alpha + step.nbytes * figures.beta
            )
            continue
        cost, flows = step.reduced * gamma, 0
        if step.messages:
            if isinstance(machine, Link):
                link, share = machine, 1
            else:
                flows = _crossing(step.distance, step.pattern, machine.per_node, ranks)
                link = machine.inter if flows else machine.intra
                share = flows if (flows and machine.nic_shared) else 1
            cost += step.messages * (link.alpha + step.nbytes * link.beta * share)
        total += cost * (slowdown if step.pattern in CONCURRENT and not flows else 1.0)
    return total


def _check_size(nbytes: float, ranks: int) -> None:
    if not (isinstance(ranks, int) and ranks > 0):
        raise ModelError(f"ranks must be a positive integer, got {ranks!r}")
    if not nbytes > 0:
        raise ModelError(f"the size must be positive, got {nbytes!r} bytes")


def predict(
    algorithm: str,
    nbytes: int,
    ranks: int,
    params: Params | Link | Nodes,
    *,
    gamma: float | None = None,
    bcast: str = "binomial",
    per_node: int | None = None,
) -> float:
    """Predicted seconds of one all-reduce of ``nbytes`` per rank on ``ranks`` ranks.

    ``params`` is calibrated `Params` (a flat machine, gamma included), or a `Link` or
    `Nodes` with ``gamma`` given. Algorithms: naive, ps, ring, rabenseifner, mpi, and on
    `Nodes` also hierarchical. ``per_node`` with `Params` calibrated across nodes (they
    hold the inter-node link too) predicts on nodes of that many ranks, ranks in blocks.
    """
    _check_size(nbytes, ranks)
    if bcast not in BCAST_FORMS:
        raise ModelError(f"unknown bcast form {bcast!r}; choose one of {', '.join(BCAST_FORMS)}")
    slowdown, busy, partial = 1.0, None, None
    if isinstance(params, Params):
        two_level = params.nodes(per_node or 1) if ranks > (per_node or 1) else None
        machine: Link | Nodes = two_level or params.link
        gamma = params.gamma if gamma is None else gamma
        slowdown = oversubscription(ranks, params.cores)
        if not two_level:  # measured on one machine, flat
            busy, partial = params.busy.get(ranks), params.partial.get(ranks)
    else:
        machine = params
        if gamma is None:
            raise ModelError("predict: gamma is needed with a Link or Nodes")
    call = 0.0  # the default call agrees first (check=True), and large ones start cold
    if busy is not None:
        call = busy.call + busy.cold * min(1.0, nbytes / COLD_FROM)
    if algorithm == "mpi":
        return call + min(
            seconds(phases(a, nbytes, ranks), machine, gamma, ranks, slowdown, busy, partial)
            for a in ("ring", "rabenseifner")
        )
    if algorithm == "hierarchical":
        if not isinstance(machine, Nodes):
            raise ModelError("hierarchical needs a machine of nodes (--gpus-per-node)")
        return _hierarchical(nbytes, ranks, machine, gamma, slowdown)
    steps = phases(algorithm, nbytes, ranks, bcast=bcast)
    return call + seconds(steps, machine, gamma, ranks, slowdown, busy, partial)


def oversubscription(ranks: int, cores: int | None) -> float:
    """How much slower a step in which every rank works gets when ``ranks`` ranks share ``cores``.

    Such a step waits for its slowest peer, and a rank without a core of its own runs only
    cores/ranks of the time. Steps of one rank alone (the root of ps gathering and reducing)
    keep their speed: the others sleep in MPI. None: one core (or GPU) per rank.
    """
    return max(1.0, ranks / cores) if cores else 1.0


def _hierarchical(nbytes: float, ranks: int, machine: Nodes, gamma: float, slowdown: float = 1.0) -> float:
    """Reduce-scatter in the node, all-reduce of n/L across nodes (L flows at once), all-gather.

    ``slowdown`` (ranks sharing cores) applies inside the node; across, the ranks wait on the NIC."""
    per_node = machine.per_node
    if ranks % per_node:
        raise ModelError(f"{ranks} ranks do not fill nodes of {per_node}")
    nodes = ranks // per_node
    share = per_node if machine.nic_shared else 1
    inter = Link(machine.inter.alpha, machine.inter.beta * share)
    inside = ring_reduce_scatter(nbytes, per_node) + ring_all_gather(nbytes, per_node)
    across = phases("ring", nbytes / per_node, nodes)
    return seconds(inside, machine.intra, gamma, per_node, slowdown) + seconds(across, inter, gamma, nodes)


def busbw(nbytes: float, ranks: int, seconds_taken: float) -> float:
    """Bus bandwidth in bytes/s: algbw * 2(p-1)/p, the link speed a ring would need (nccl-tests)."""
    return nbytes / seconds_taken * 2 * (ranks - 1) / ranks


# ---------------------------------------------------------------------------------------------
# The calibration file


def default_path() -> Path:
    """$HPCRING_MODEL, else ~/.cache/hpcring/model.json."""
    env = os.environ.get("HPCRING_MODEL", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hpcring" / "model.json"


def load_params(path: str | os.PathLike[str] | None = None) -> Params:
    """The calibrated parameters at ``path`` (default: `default_path`); ModelError if missing or bad."""
    where = Path(path).expanduser() if path is not None else default_path()
    try:
        data = json.loads(where.read_text())
    except FileNotFoundError:
        raise ModelError(
            f"no calibration file at {where}: run `mpiexec -n 2 python -m hpcring.model --calibrate`"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelError(f"corrupt calibration file {where}: {error}") from None
    if not isinstance(data, dict):
        raise ModelError(f"corrupt calibration file {where}: not a JSON object")
    values = {}
    for key in ("alpha", "beta", "gamma"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise ModelError(
                f"corrupt calibration file {where}: {key} must be a positive number, got {value!r}"
            )
        values[key] = float(value)
    cores = data.get("cores")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores <= 0):
        raise ModelError(f"corrupt calibration file {where}: cores must be a positive integer, got {cores!r}")
    for key in ("inter_alpha", "inter_beta"):  # optional: calibrated across two nodes
        value = data.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf
        ):
            raise ModelError(
                f"corrupt calibration file {where}: {key} must be a positive number, got {value!r}"
            )
        values[key] = None if value is None else float(value)
    busy = _load_busy(data.get("busy", {}), where)
    partial = _load_busy(data.get("partial", {}), where, "partial")
    meta = {k: v for k, v in data.items() if k not in values and k not in ("cores", "busy", "partial")}
    meta["path"] = str(where)
    return Params(**values, cores=cores, meta=meta, busy=busy, partial=partial)


def _load_busy(table: Any, where: Path, name: str = "busy") -> dict[int, Busy]:
    """The ``busy`` (or ``partial``) table of a calibration file:
    {"p": {"alpha": ..., "beta": ..., "gamma": ..., "call": ..., "cold": ...}}."""
    if not isinstance(table, dict):
        raise ModelError(f"corrupt calibration file {where}: {name} must be an object")
    busy = {}
    for key, entry in table.items():
        ok = str(key).isdigit() and int(key) > 1 and isinstance(entry, dict)
        values = [entry.get(k) for k in ("alpha", "beta", "gamma")] if ok else []
        if not ok or not all(
            not isinstance(v, bool) and isinstance(v, int | float) and 0 < v < math.inf for v in values
        ):
            raise ModelError(
                f"corrupt calibration file {where}: {name}[{key!r}] must hold positive alpha, beta, gamma"
            )
        extra = {k: entry.get(k, 0.0) for k in ("call", "cold")}
        for k, v in extra.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise ModelError(
                    f"corrupt calibration file {where}: {name}[{key!r}] {k} must be a number >= 0"
                )
        busy[int(key)] = Busy(*map(float, values), **{k: float(v) for k, v in extra.items()})
    return busy


def save_params(params: Params, path: Path) -> None:
    """Write ``params`` atomically (a reader never sees half a file)."""
    record = {
        "version": FORMAT_VERSION,
        "alpha": params.alpha,
        "beta": params.beta,
        "gamma": params.gamma,
        "cores": params.cores,
        "busy": {str(p): vars(b) for p, b in sorted(params.busy.items())},
        "partial": {str(p): vars(b) for p, b in sorted(params.partial.items())},
        "inter_alpha": params.inter_alpha,
        "inter_beta": params.inter_beta,
    }
    record.update({k: v for k, v in params.meta.items() if k != "path"})
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        tmp.replace(path)
    except OSError as error:
        raise ModelError(f"cannot write the calibration file {path}: {error.strerror or error}") from None


# ---------------------------------------------------------------------------------------------
# Calibration and validation (under mpiexec)


def _median_time(run: Any, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def calibrate(comm: Any, *, quick: bool = False, array: str = "numpy") -> Params:
    """Measure alpha, beta (ping-pong between ranks 0 and 1) and gamma (local add) on this machine.

    Collective over ``comm``; needs 2 ranks or more. Ranks other than the pair sleep
    between polls of a non-blocking barrier, so they leave the cores to the pair (ranks
    spinning in MPI took a third of the bandwidth of an emulated 1 Gbit/s link from it on
    2 cores). When ``comm`` spans several nodes, alpha and beta are measured between rank 0
    and a rank of its own node, and inter_alpha and inter_beta between rank 0 and the first
    rank of another node: inter_beta with both directions busy at once (an exchange), as
    every cross-node step of an all-reduce uses the link; the one-way ping-pong figure is
    kept in ``meta["inter_beta_one_way"]``.
    """
    import numpy as np

    from .topology import discover

    if comm.Get_size() < 2:
        raise ModelError("calibration needs at least 2 ranks to ping-pong: run it under mpiexec -n 2")
    rank = comm.Get_rank()
    # Several large sizes, each a median, then the median of their per-byte costs: on a
    # shared, loaded machine one size alone can land on a bad moment.
    small_repeats, large_repeats = (50, 5) if quick else (500, 15)
    sizes = [1 << 18, 1 << 20] if quick else [1 << 20, 4 << 20, 16 << 20]

    topo = discover(comm)
    topo.close()
    near = topo.order[1] if topo.per_node[0] > 1 else 1  # rank 0's node is the first in order
    far = topo.order[topo.per_node[0]] if topo.nodes > 1 else None

    def one_way(nbytes: int, repeats: int, peer: int) -> float:
        buf = np.zeros(max(nbytes, 1), dtype=np.uint8)
        samples = []
        comm.Barrier()
        for _ in range(repeats + 2):  # 2 warm-up round trips
            start = time.perf_counter()
            if rank == 0:
                comm.Send(buf, dest=peer, tag=7)
                comm.Recv(buf, source=peer, tag=7)
            elif rank == peer:
                comm.Recv(buf, source=0, tag=7)
                comm.Send(buf, dest=0, tag=7)
            samples.append((time.perf_counter() - start) / 2)
        idle_barrier(comm)
        return comm.bcast(statistics.median(samples[2:]), root=0)

    def both_ways(nbytes: int, repeats: int, peer: int) -> float:
        send, recv = np.zeros(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8)
        tick, samples = np.zeros(1, dtype=np.uint8), []
        comm.Barrier()
        if rank in (0, peer):
            other = peer if rank == 0 else 0
            for _ in range(repeats + 2):  # 2 warm-ups
                comm.Sendrecv(tick, other, 8, recv[:1], other, 8)  # start together
                start = time.perf_counter()
                comm.Sendrecv(send, other, 9, recv, other, 9)
                samples.append(time.perf_counter() - start)
        idle_barrier(comm)
        return comm.bcast(statistics.median(samples[2:]) if rank == 0 else None, root=0)

    def link(peer: int) -> tuple[float, float]:
        alpha = one_way(1, small_repeats, peer)
        per_byte = (max(one_way(n, large_repeats, peer) - alpha, 1e-15) / n for n in sizes)
        return alpha, statistics.median(per_byte)

    alpha, beta = link(near)
    inter_alpha, inter_beta, one_way_beta = None, None, None
    if far is not None:
        inter_alpha, one_way_beta = link(far)
        inter_beta = statistics.median(
            max(both_ways(n, large_repeats, far) - inter_alpha, 1e-15) / n for n in sizes
        )
    gamma = None
    if rank == 0:
        gamma = statistics.median(_gamma(array, n, large_repeats) for n in sizes)
    gamma = comm.bcast(gamma)
    # All ranks at once: a figure of one machine (across nodes the links above say it).
    busy, partial = {}, {}
    if far is None:
        busy[comm.Get_size()] = _busy(comm, array, sizes, small_repeats, large_repeats)
        figures = _partial(comm, array, sizes, small_repeats, large_repeats)
        if figures is not None:
            partial[comm.Get_size()] = figures
    from mpi4py import MPI

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    meta = {
        "array": array,
        "ranks": comm.Get_size(),
        "host": socket.gethostname(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0].split(",")[0],
        "quick": quick,
        "sizes": sizes,
        "nodes": list(topo.per_node),
        "flush_bytes": flush_bytes(),
    }
    if one_way_beta is not None:
        meta["inter_beta_one_way"] = one_way_beta
    return Params(
        alpha,
        beta,
        gamma,
        cores,
        meta,
        busy=busy,
        inter_alpha=inter_alpha,
        inter_beta=inter_beta,
        partial=partial,
    )


def idle_barrier(comm: Any) -> None:
    """A barrier that sleeps between polls: ranks waiting here leave the cores to those at work."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.0005)


def _busy(comm: Any, array: str, sizes: Sequence[int], small: int, large: int) -> Busy:
    """alpha, beta, gamma with every rank at work at once, as in a ring step: each rank sends to
    its right neighbour while receiving from its left, then adds. Each sample is the slowest
    rank's time (a step waits for it); the figure is the median of the samples. ``cold`` is
    what the one-element call adds after each rank wrote `flush_bytes`, as a large call
    leaves the caches."""
    import numpy as np
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    flush = np.ones(flush_bytes() // 8)

    def slowest(run: Any, repeats: int, cold: bool = False) -> float:
        samples = np.empty(repeats + 2)
        for i in range(repeats + 2):  # 2 warm-ups
            if cold:
                flush.fill(float(i))
            comm.Barrier()
            start = time.perf_counter()
            run()
            samples[i] = time.perf_counter() - start
        comm.Allreduce(MPI.IN_PLACE, samples, op=MPI.MAX)
        return float(np.median(samples[2:]))

    def exchange(nbytes: int) -> Any:
        send, recv = np.ones(max(nbytes, 1), np.uint8), np.empty(max(nbytes, 1), np.uint8)
        return lambda: comm.Sendrecv(send, right, 9, recv, left, 9)

    latency = slowest(exchange(1), small)
    beta = statistics.median(max(slowest(exchange(n), large) - latency, 1e-15) / n for n in sizes)
    gamma = statistics.median(slowest(_adder(array, n), large) / n for n in sizes)

    import hpcring  # hpcring's own ring on one element: 2(p-1) steps that carry (next to) nothing

    one = np.ones(1, np.float32)

    def ring(check: bool) -> Any:
        return lambda: hpcring.allreduce(one, algorithm="ring", comm=comm, check=check)

    bare, checked = slowest(ring(False), small // 5), slowest(ring(True), small // 5)
    cold = slowest(ring(True), small // 5, cold=True)
    alpha = max(latency, bare / (2 * (size - 1)))
    return Busy(alpha, beta, gamma, max(checked - bare, 0.0), max(cold - checked, 0.0))


def _partial(comm: Any, array: str, sizes: Sequence[int], small: int, large: int) -> Busy | None:
    """`_busy` figures of the largest power of two below p of the p ranks while the others
    wait in a blocking receive, as Rabenseifner's folded ranks and the leaves of a
    binomial Bcast do (on shared cores they still spin); None below 3 ranks. The ranks at
    work are those of Rabenseifner's core where p is not a power of two, so that with
    ranks bound to cores they share cores as its steps do; else the lower half."""
    import numpy as np
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 3:
        return None
    extra = size - (1 << _log2_floor(size))
    ranks = [r for r in range(size) if r >= 2 * extra or r % 2] if extra else list(range(size // 2))
    tick = np.zeros(1, np.uint8)
    working = comm.Split(0 if rank in ranks else MPI.UNDEFINED, rank)
    figures = None
    if working != MPI.COMM_NULL:
        figures = _busy(working, array, sizes, small, large)
        working.Free()
        if rank == ranks[0]:
            for waiter in sorted(set(range(size)) - set(ranks)):
                comm.Send(tick, waiter, tag=10)
    else:
        comm.Recv(tick, ranks[0], tag=10)
    return comm.bcast(figures, root=ranks[0])


def _adder(array: str, nbytes: int) -> Any:
    """acc += other on float32 of ``nbytes`` with the array module in use, pages touched once."""
    import numpy as np

    from .arrays import adapter_named

    _check_array(array)
    backend = adapter_named(array)
    acc = backend.xp.ones(nbytes // 4, dtype=np.float32)
    other = backend.xp.ones(nbytes // 4, dtype=np.float32)

    def add() -> None:
        backend.xp.add(acc, other, out=acc)
        backend.synchronize()

    add()
    return add


def _gamma(array: str, nbytes: int, repeats: int) -> float:
    """Seconds per byte of acc += other (float32) with the array module in use, one rank alone."""
    return _median_time(_adder(array, nbytes), repeats) / nbytes


def validate(
    comm: Any, params: Params, sizes: Sequence[int], algorithms: Sequence[str], iterations: int, bcast: str
) -> list[dict[str, Any]]:
    """Time hpcring.allreduce per algorithm and size (max over ranks, median of iterations)."""
    import numpy as np
    from mpi4py import MPI

    import hpcring

    p = comm.Get_size()
    rows = []
    for nbytes in sizes:
        x = np.ones(nbytes // 4, dtype=np.float32)
        for algorithm in algorithms:
            samples = []
            for i in range(iterations + 2):  # 2 warm-ups: scratch buffers, the duplicate comm
                comm.Barrier()
                start = time.perf_counter()
                hpcring.allreduce(x, algorithm=algorithm, comm=comm)
                elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
                if i >= 2:
                    samples.append(elapsed)
                x.fill(1.0)
            measured = statistics.median(samples)
            predicted = predict(algorithm, x.nbytes, p, params, bcast=bcast)
            rows.append(
                {
                    "algorithm": algorithm,
                    "bytes": x.nbytes,
                    "ranks": p,
                    "predicted": predicted,
                    "measured": measured,
                    "ratio": predicted / measured,
                }
            )
    return rows


# ---------------------------------------------------------------------------------------------
# Command line


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'100M' -> 104857600: K, M, G, T are powers of 1024 (as in nccl-tests); 'B'/'iB' optional."""
    s = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = s[-1:] if s[-1:] in _UNITS else ""
    try:
        value = float(s[: len(s) - len(unit)])
    except ValueError:
        raise ModelError(f"bad size {text!r}: use a number with an optional K, M, G or T") from None
    nbytes = int(value * _UNITS[unit])
    if not nbytes > 0:
        raise ModelError(f"sizes must be positive, got {text!r}")
    return nbytes


def parse_ranks(text: str) -> list[int]:
    try:
        ranks = [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise ModelError(f"bad rank list {text!r}: use integers like 8,64,512") from None
    if not ranks or any(r <= 0 for r in ranks):
        raise ModelError(f"ranks must be positive integers, got {text!r}")
    return ranks


def human(nbytes: float) -> str:
    for unit in ("T", "G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return f"{int(nbytes)}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise ModelError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m hpcring.model",
        description="Alpha-beta-gamma cost model of hpcring's all-reduce algorithms.",
        epilog="Link presets (assumptions, see docs/scaling.md): "
        + "; ".join(f"{k}: {v.description}" for k, v in PRESETS.items()),
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--calibrate", action="store_true", help="measure alpha, beta, gamma (under mpiexec -n 2)"
    )
    mode.add_argument("--validate", action="store_true", help="measured vs predicted (under mpiexec)")
    parser.add_argument("--output", help="calibration file to write (default: $HPCRING_MODEL or ~/.cache)")
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (tests)")
    parser.add_argument("--array", default="numpy", help="array module gamma is measured with: numpy, cupy")
    parser.add_argument("--params", help="calibration file to read (default: $HPCRING_MODEL or ~/.cache)")
    parser.add_argument("--ranks", default="8,64,512,1000", help="rank counts, e.g. 8,64,512,1000")
    parser.add_argument("--bytes", default="100M,1G", help="sizes per rank, e.g. 1M,100M,1G (K/M/G = 1024^k)")
    parser.add_argument("--sizes", default="1M,4M,16M", help="--validate: sizes to time")
    parser.add_argument("--iterations", type=int, default=10, help="--validate: timed iterations per point")
    parser.add_argument("--algorithms", help="comma-separated (default: all that apply)")
    parser.add_argument("--link", help=f"interconnect preset: {', '.join(PRESETS)} (default: calibrated)")
    parser.add_argument("--alpha", type=float, help="seconds per message (overrides the link)")
    parser.add_argument("--beta", type=float, help="seconds per byte (overrides the link)")
    parser.add_argument("--gamma", type=float, help="seconds per byte reduced")
    parser.add_argument("--gpus-per-node", type=int, help="ranks per node: predict on a machine of nodes")
    parser.add_argument(
        "--intra",
        default=None,
        help="preset of the link inside a node (default: the calibrated one when the calibration "
        "spanned nodes, else nvlink4)",
    )
    parser.add_argument("--nic", choices=("shared", "per-gpu"), default="per-gpu", help="NICs per node")
    parser.add_argument(
        "--bcast", choices=BCAST_FORMS, default="binomial", help="ps: how MPI_Bcast is modelled"
    )
    parser.add_argument("--plot", metavar="FILE.png", help="draw time vs ranks")
    return parser


def _rank_from_env() -> int:
    """This process's rank without initializing MPI (predictions must not need mpiexec)."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ModelError(f"unknown link preset {name!r}; choose one of {', '.join(PRESETS)}") from None


def _positive(name: str, value: float | None) -> None:
    if value is not None and not 0 < value < math.inf:
        raise ModelError(f"--{name} must be a positive number, got {value!r}")


def _machine(args: argparse.Namespace) -> tuple[Link | Nodes, float, str]:
    """The machine the predictions are for, its gamma, and a line that says where they come from."""
    for name in ("alpha", "beta", "gamma"):
        _positive(name, getattr(args, name))
    calibrated_intra: Link | None = None  # from a calibration across nodes: the link inside one
    if args.link is None and (args.alpha is None or args.beta is None):
        params = load_params(args.params)
        inter = params.inter
        if inter is not None:  # calibrated across nodes: the predictions' network is that link
            calibrated_intra = params.link
            where_from = f"calibrated between nodes, {params.meta['path']}"
            base = Preset(inter.alpha, inter.beta, params.gamma, where_from)
        else:
            base = Preset(
                params.alpha, params.beta, params.gamma, f"calibrated, {params.meta['path']}, a core per rank"
            )
    else:
        base = _preset(args.link) if args.link else Preset(args.alpha, args.beta, 1e-12, "explicit")
    link = Link(args.alpha or base.alpha, args.beta or base.beta)
    gamma = args.gamma or base.gamma
    where = f"{base.description}: alpha {link.alpha * 1e6:.3g} us, {1 / link.beta / GB:.3g} GB/s"
    if args.gpus_per_node is None:
        return link, gamma, where + f", gamma {1 / gamma / GB:.3g} GB/s reduced"
    if args.gpus_per_node <= 0:
        raise ModelError(f"--gpus-per-node must be positive, got {args.gpus_per_node}")
    if args.intra is None and calibrated_intra is not None:
        inside, described = (
            calibrated_intra,
            (
                f"the calibrated link inside a node ({calibrated_intra.alpha * 1e6:.3g} us, "
                f"{1 / calibrated_intra.beta / GB:.3g} GB/s)"
            ),
        )
    else:
        intra = _preset(args.intra or "nvlink4")
        inside, described = Link(intra.alpha, intra.beta), intra.description
    nodes = Nodes(args.gpus_per_node, inside, link, args.nic == "shared")
    where = (
        f"{args.gpus_per_node} ranks per node on {described}; between nodes {where}, "
        f"NIC {args.nic}; gamma {1 / gamma / GB:.3g} GB/s reduced"
    )
    return nodes, gamma, where


def _names(args: argparse.Namespace, known: Sequence[str]) -> list[str]:
    if args.algorithms is None:
        return list(known)
    names = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    for name in names:
        if name not in known:
            raise ModelError(f"unknown algorithm {name!r}; choose one of {', '.join(known)}")
    return names


def _predictions(args: argparse.Namespace, out: Any) -> None:
    machine, gamma, where = _machine(args)
    ranks, sizes = parse_ranks(args.ranks), [parse_size(s) for s in args.bytes.split(",") if s.strip()]
    if not sizes:
        raise ModelError("--bytes needs at least one size")
    known = [*ALGORITHMS, "hierarchical"] if isinstance(machine, Nodes) else list(ALGORITHMS)
    algorithms = _names(args, known)
    if isinstance(machine, Nodes):
        for p in ranks:
            if p % machine.per_node:
                raise ModelError(f"{p} ranks do not fill nodes of {machine.per_node} (--gpus-per-node)")
    print(f"# hpcring.model: {where}; ps Bcast {args.bcast}", file=out)
    print(
        f"# {'ranks':>6} {'size':>8} {'algorithm':>13} {'time (us)':>14} {'algbw (GB/s)':>13} "
        f"{'busbw (GB/s)':>13}",
        file=out,
    )
    for p in ranks:
        for nbytes in sizes:
            for algorithm in algorithms:
                t = predict(algorithm, nbytes, p, machine, gamma=gamma, bcast=args.bcast)
                algbw = f"{nbytes / t / GB:13.3f}" if t > 0 else f"{'-':>13}"
                bus = f"{busbw(nbytes, p, t) / GB:13.3f}" if t > 0 else f"{'-':>13}"
                print(f"  {p:>6} {human(nbytes):>8} {algorithm:>13} {t * 1e6:14.1f} {algbw} {bus}", file=out)
    if args.plot and out is sys.stdout:
        _plot(args.plot, machine, gamma, ranks, sizes, algorithms, args.bcast, where)
        print(f"# plot: {args.plot}", file=out)


def _plot(
    path: str,
    machine: Link | Nodes,
    gamma: float,
    ranks: list[int],
    sizes: list[int],
    algorithms: list[str],
    bcast: str,
    where: str,
) -> None:
    """Time vs ranks, log-log: ring and rabenseifner flatten out, ps and naive climb linearly."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = machine.per_node if isinstance(machine, Nodes) else 1
    top = max(ranks)
    grid = sorted({*ranks, *(round(2 ** (k / 4)) * step for k in range(0, 4 * 14))})
    grid = [p for p in grid if step <= p <= top and p % step == 0]
    fig, ax = plt.subplots(figsize=(8, 5))
    styles = ["-", "--", ":", "-."]
    for i, nbytes in enumerate(sizes):
        for j, algorithm in enumerate(a for a in algorithms if a != "mpi"):
            times = [predict(algorithm, nbytes, p, machine, gamma=gamma, bcast=bcast) for p in grid]
            ax.plot(
                grid,
                times,
                styles[i % len(styles)],
                color=f"C{j}",
                label=f"{algorithm}, {human(nbytes)}{'iB' if nbytes >= 1024 else ' B'}",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ranks")
    ax.set_ylabel("predicted time per all-reduce (s)")
    ax.set_title(textwrap.fill(where, 110), fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _keep_busy(params: Params, path: Path) -> Params:
    """``params`` plus the busy figures for other rank counts already in ``path`` from this host:
    calibrating at 2, 3 and 4 ranks one after another builds one file."""
    try:
        old = load_params(path)
    except ModelError:
        return params
    if old.meta.get("host") != params.meta.get("host"):
        return params
    return dataclasses.replace(
        params, busy={**old.busy, **params.busy}, partial={**old.partial, **params.partial}
    )


def _mpi_main(args: argparse.Namespace) -> int:
    """--calibrate and --validate: collective; every rank returns the same exit code."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    # What each rank can check alone is checked, and agreed on, before any collective: a rank
    # that fails it must not leave the others waiting in the measurements.
    problem: str | None = None
    try:
        if args.calibrate:
            _check_array(args.array)
        else:
            params = load_params(args.params)
            import hpcring

            names = _names(args, [a for a in hpcring.ALGORITHMS if a in ALGORITHMS])
            sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
            if args.iterations <= 0:
                raise ModelError(f"--iterations must be positive, got {args.iterations}")
    except ModelError as error:
        problem = str(error)
    if _first_problem(comm, problem):
        return 2
    try:
        if args.calibrate:
            output = Path(args.output).expanduser() if args.output else default_path()
            params = calibrate(comm, quick=args.quick, array=args.array)
            if rank == 0:
                params = _keep_busy(params, output)
                save_params(params, output)
                print(
                    f"# calibrated on {comm.Get_size()} ranks ({params.meta['host']}, load "
                    f"{' '.join(f'{x:.2f}' for x in params.meta['load_average'])}): alpha "
                    f"{params.alpha * 1e6:.3g} us, beta {params.beta * 1e9:.4g} ns/B "
                    f"({1 / params.beta / GB:.3g} GB/s), gamma {params.gamma * 1e9:.4g} ns/B "
                    f"({1 / params.gamma / GB:.3g} GB/s)"
                    + (
                        f"; between nodes alpha {params.inter_alpha * 1e6:.3g} us, "
                        f"{1 / params.inter_beta / GB:.3g} GB/s both ways at once "
                        f"({1 / params.meta['inter_beta_one_way'] / GB:.3g} GB/s one way)"
                        if params.inter_beta
                        else ""
                    )
                    + f" -> {output}"
                )
                for p, b in sorted(params.busy.items()):
                    print(
                        f"#   all {p} ranks busy: alpha {b.alpha * 1e6:.3g} us, "
                        f"beta {b.beta * 1e9:.4g} ns/B ({1 / b.beta / GB:.3g} GB/s), "
                        f"gamma {b.gamma * 1e9:.4g} ns/B ({1 / b.gamma / GB:.3g} GB/s); a call "
                        f"{b.call * 1e6:.3g} us, {b.cold * 1e6:.3g} us more with cold caches"
                    )
                for p, b in sorted(params.partial.items()):
                    print(
                        f"#   {1 << _log2_floor(p - 1)} of {p} ranks busy, the rest waiting: alpha "
                        f"{b.alpha * 1e6:.3g} us, beta {b.beta * 1e9:.4g} ns/B ({1 / b.beta / GB:.3g} GB/s), "
                        f"gamma {b.gamma * 1e9:.4g} ns/B ({1 / b.gamma / GB:.3g} GB/s)"
                    )
        else:
            rows = validate(comm, params, sizes, names, args.iterations, args.bcast)
            if rank == 0:
                print(
                    f"# validate: {comm.Get_size()} ranks, {os.cpu_count()} cores, load "
                    f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; median of {args.iterations}, "
                    f"max over ranks; ps Bcast {args.bcast}; params {params.meta['path']}"
                )
                print(
                    f"# {'ranks':>5} {'size':>6} {'algorithm':>12} {'predicted (us)':>15} "
                    f"{'measured (us)':>14} {'ratio':>6}"
                )
                for r in rows:
                    flag = "" if 0.7 <= r["ratio"] <= 1.3 else "  off by >30%"
                    print(
                        f"  {r['ranks']:>5} {human(r['bytes']):>6} {r['algorithm']:>12} "
                        f"{r['predicted'] * 1e6:15.0f} {r['measured'] * 1e6:14.0f} {r['ratio']:6.2f}{flag}"
                    )
    except ModelError as error:
        problem = str(error)
    # Errors found on one rank (a file only rank 0 wrote, say) still give every rank exit 2.
    return 2 if _first_problem(comm, problem) else 0


def _first_problem(comm: Any, problem: str | None) -> bool:
    """Collective: whether any rank has a problem; rank 0 prints the first one."""
    first = next((p for p in comm.allgather(problem) if p is not None), None)
    if first is not None and comm.Get_rank() == 0:
        print(f"python -m hpcring.model: error: {first}", file=sys.stderr)
    return first is not None


def _check_array(array: str) -> None:
    """ModelError unless ``array`` (numpy, cupy) is usable in this process."""
    from .arrays import available

    if array not in available():
        raise ModelError(f"array module {array!r} is not usable here; choose one of {available()}")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (2 for any user error, after one line on stderr)."""
    try:
        args = _parser().parse_args(argv)
        if args.calibrate or args.validate:
            return _mpi_main(args)
        # Every rank checks the arguments (same exit code everywhere); only rank 0 prints.
        _predictions(args, sys.stdout if _rank_from_env() == 0 else io.StringIO())
        return 0
    except ModelError as error:
        if _rank_from_env() == 0:
            print(f"python -m hpcring.model: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
