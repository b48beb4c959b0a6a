"""The pure cost model: links, machines, the phases each algorithm declares, predictions.

No MPI, no NumPy and nothing of hpcring's communication here: the bench and ``auto`` import
this for `predict` on every rank, and predictions for 1000 ranks need no mpiexec. Each
algorithm states what it does as phases in its own module (`hpcring.algorithms.base.Spec`:
``phases``, ``modelled_as``, ``levels``); this module prices them on a machine. The
formulas are in the package's docstring (`hpcring.model`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from .. import algorithms
from ..algorithms import ALLREDUCE, Spec
from ..algorithms.base import Phase


def modelled(collective: str = ALLREDUCE, two_level: bool = False) -> tuple[str, ...]:
    """The algorithms of ``collective`` the model prices on any machine (``two_level``: those it
    prices only on a machine of nodes)."""
    specs = algorithms.table(collective).items()
    if two_level:
        return tuple(name for name, spec in specs if spec.levels)
    return tuple(name for name, spec in specs if spec.phases or spec.modelled_as)


# The all-reduces the model prices on any machine; the two-level ones only on a machine of
# nodes. Not hpcring.ALGORITHMS, which names what hpcring runs.
MODELLED = modelled(ALLREDUCE)
TWO_LEVEL = modelled(ALLREDUCE, two_level=True)
BCAST_FORMS = ("binomial", "linear")


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

    ``step`` and ``overhead`` split the same figures into hpcring's software and the MPI under
    it, so that they carry to other rank counts and machines (`Software`): ``step``, what a
    step of hpcring's ring takes beyond the exchange latency measured beside it; ``overhead``,
    what a checked call takes beyond its messages and the agreement's collective. None in files
    written before they were measured.
    """

    alpha: float
    beta: float
    gamma: float
    call: float = 0.0
    cold: float = 0.0  # what a call adds when it starts with cold caches (see COLD_FROM)
    step: float | None = None
    overhead: float | None = None

    @property
    def software(self) -> Software | None:
        """hpcring's software as measured here, where the calibration measured it."""
        if self.step is None or self.overhead is None:
            return None
        return Software(self.step, self.overhead)


# The agreement's collective (`hpcring.agreement`): one all-reduce of a 16 * WIDTH-byte header
# and a SLOT of 512 bytes on every checked call; an `mpi` all-reduce of up to SLOT bytes rides
# in it. From 2 to EXCHANGE_RANKS ranks the agreement is an exchange of messages instead
# (recursive doubling), in which an `mpi` all-reduce of up to EXCHANGE_RIDES_UP_TO bytes rides
# (TWO_RANKS_RIDE_UP_TO on two ranks; an out-of-place call's figure: in place rides less there),
# its bytes in every step (tests/test_model.py checks these against hpcring.agreement, which this
# module does not import: it loads NumPy and MPI).
AGREEMENT_BYTES = 768
RIDES_UP_TO = 512
EXCHANGE_RANKS = 4
EXCHANGE_RIDES_UP_TO = 64 << 10
TWO_RANKS_RIDE_UP_TO = 32 << 10


def exchange_phases(nbytes: float, ranks: int) -> list[Phase]:
    """The agreement's exchange (`hpcring.agreement.steps`) with ``nbytes`` of payload: recursive
    doubling, the whole payload in each of its log2 p steps, where p is the largest power of two
    up to ``ranks``; the ranks past p fold in first and get the result last."""
    p = 1 << (ranks.bit_length() - 1)
    steps = [Phase(1, nbytes, nbytes, 1 << s, "xor") for s in range(p.bit_length() - 1)]
    if p == ranks:
        return steps
    return [Phase(1, nbytes, nbytes, 1, "xor", True), *steps, Phase(1, nbytes, 0.0, 1, "xor", True)]


def rides_up_to(ranks: int) -> int:
    """The bytes of an `mpi` all-reduce that ride in a checked call's agreement on ``ranks``."""
    if ranks == 2:
        return TWO_RANKS_RIDE_UP_TO
    return EXCHANGE_RIDES_UP_TO if 2 < ranks <= EXCHANGE_RANKS else RIDES_UP_TO


@dataclass(frozen=True)
class Software:
    """hpcring's own cost around what MPI does: the network's figures (a `Link`'s alpha is an
    MPI latency) leave it out.

    ``step``: seconds each message step of hpcring's own algorithms adds to the MPI latency
    (the compiled core's or Python's work around the message); not for the steps that run
    inside the library (`mpi`; ps's Gather and Bcast, `Spec.library_steps`). ``call``: seconds
    a checked call adds once, besides its messages and the agreement's collective (entering
    hpcring, building and checking the row). ``agreement``: the call agrees first
    (``check=True``, the default): its collective, an MPI all-reduce of AGREEMENT_BYTES, is
    priced on the machine as `mpi` is, and a small `mpi` all-reduce rides in it.
    """

    step: float = 0.0
    call: float = 0.0
    agreement: bool = True


# What the network alone costs: the figures before hpcring's software was counted (check=False,
# and steps as cheap as MPI's own).
NO_SOFTWARE = Software(0.0, 0.0, agreement=False)
# Measured with the compiled core (`python -m hpcring.model --calibrate`, 2 ranks on a 2-core
# AMD EPYC virtual machine, Open MPI 5.0.11 wheel, shared memory; docs/scaling.md): what
# predictions assume where no calibration says otherwise.
DEFAULT_SOFTWARE = Software(step=0.0, call=0.85e-6)


# A call that moves this much data per rank leaves the per-core caches cold: the interpreter
# and mpi4py then reload their own state, which more than doubled the fixed cost of a call
# here (a one-element call at 2 ranks after a 4 MiB write: 67 -> 156-176 us). Below it,
# a share of `cold`, in proportion.
COLD_FROM = 1 << 20


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

    @property
    def software(self) -> tuple[int, Software] | None:
        """hpcring's software measured here, and the rank count it was measured at: the largest
        calibrated with a core per rank (as the presets assume), else the smallest."""
        measured = sorted((p, b.software) for p, b in self.busy.items() if b.software is not None)
        if not measured:
            return None
        fitting = [m for m in measured if self.cores is None or m[0] <= self.cores]
        return fitting[-1] if fitting else measured[0]

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


def log2_floor(p: int) -> int:
    """floor(log2 p): 2**this is the power-of-two core of p ranks (Rabenseifner's)."""
    return p.bit_length() - 1


def spec_of(algorithm: str, collective: str = ALLREDUCE) -> Spec:
    """The Spec the model prices; ModelError for a name it has no formula for."""
    try:
        spec = algorithms.spec(collective, algorithm)
    except ValueError:
        spec = None
    if spec is None or not (spec.phases or spec.modelled_as or spec.levels):
        known = ", ".join((*modelled(collective), *modelled(collective, True)))
        raise ModelError(f"unknown algorithm {algorithm!r}; choose one of {known}")
    return spec


def phases(
    algorithm: str, nbytes: float, ranks: int, *, bcast: str = "binomial", collective: str = ALLREDUCE
) -> list[Phase]:
    """What ``algorithm`` does for ``nbytes`` on ``ranks``, as its module declares it (not a
    library's choice among several, which `predict` prices). ``bcast``: how a library's MPI_Bcast
    inside it is modelled, where it has one (ps)."""
    spec = spec_of(algorithm, collective)
    if spec.phases is None:
        raise ModelError(f"{algorithm!r} is priced as the cheapest of {', '.join(spec.modelled_as)}")
    if bcast != BCAST_FORMS[0]:  # not the default form
        try:
            return spec.phases(nbytes, ranks, bcast=bcast)  # type: ignore[call-arg]
        except TypeError:
            pass  # no library broadcast inside it
    return spec.phases(nbytes, ranks)


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
    software: float = 0.0,
) -> float:
    """The time of ``steps``: each phase on the link its messages cross, shared by the flows that
    cross at once; phases in which every rank works are ``slowdown`` times slower (`oversubscription`),
    or, where ``busy`` figures were measured for these ranks, cost what those say (``partial``
    ones for phases that some ranks sit out, where measured); steps that cross between nodes
    are not slowed: they wait on the network, not on the cores. ``software``: seconds each
    message adds (`Software.step`; the busy figures hold it already)."""
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
            cost += step.messages * (link.alpha + software + step.nbytes * link.beta * share)
        total += cost * (slowdown if step.pattern in CONCURRENT and not flows else 1.0)
    return total


# Bytes per element of each wire dtype (`hpcring.wire.WIRES`; this module imports no NumPy).
WIRE_ITEMSIZE = {"bfloat16": 2, "float16": 2}


def on_wire(steps: Iterable[Phase], ratio: float) -> list[Phase]:
    """``steps`` with every message ``ratio`` times as large (wire=: narrowed payloads), the
    reductions unchanged: they run in the input dtype."""
    return [step._replace(nbytes=step.nbytes * ratio) for step in steps]


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
    wire: str | None = None,
    itemsize: int = 4,
    collective: str = ALLREDUCE,
    software: Software | None = None,
) -> float:
    """Predicted seconds of one ``collective`` (default the all-reduce) on ``ranks`` ranks, whose
    input is ``nbytes`` on each rank: the buffer, which for an all-gather is one rank's row
    (`hpcring.units.input_bytes` turns nccl-tests' size, the gathered output, into it).

    ``wire`` ("bfloat16", "float16"; elements of ``itemsize`` bytes) makes every message that
    fraction of its size, as `hpcring.allreduce(wire=...)` sends; the conversions themselves are
    not priced (docs/compression.md measures them).

    ``params`` is calibrated `Params` (a flat machine, gamma included), or a `Link` or
    `Nodes` with ``gamma`` given. Algorithms: those of ``collective``'s table that declare phases
    (`modelled`; the all-reduce's naive, ps, ring, rabenseifner, mpi, and on `Nodes` also
    hierarchical). ``per_node`` with `Params` calibrated across nodes (they
    hold the inter-node link too) predicts on nodes of that many ranks, ranks in blocks.

    ``software`` is hpcring's own cost on top of the network's (`Software`; `NO_SOFTWARE`: the
    network alone). Default: the calibration's figures (`Params.software`), else
    `DEFAULT_SOFTWARE`. Where `Params` hold busy figures for ``ranks`` ranks on one machine,
    those are used as measured instead: they hold the software already.
    """
    _check_size(nbytes, ranks)
    spec = spec_of(algorithm, collective)
    ratio = 1.0
    if wire is not None:
        if wire not in WIRE_ITEMSIZE or spec.narrowings is None:
            raise ModelError(
                f"wire={wire!r}: choose one of {', '.join(WIRE_ITEMSIZE)}, with an algorithm that narrows"
            )
        ratio = WIRE_ITEMSIZE[wire] / itemsize
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
        if software is None:
            calibrated = params.software
            software = DEFAULT_SOFTWARE if calibrated is None else calibrated[1]
    else:
        machine = params
        if gamma is None:
            raise ModelError("predict: gamma is needed with a Link or Nodes")
        if software is None:
            software = DEFAULT_SOFTWARE
    # What the call pays once, and each of hpcring's message steps.
    if busy is not None:  # measured at this rank count: the default call agrees first (check=True),
        call = busy.call + busy.cold * min(1.0, nbytes / COLD_FROM)  # and large ones start cold
        checked, step = True, 0.0  # busy.alpha holds the step's software
    else:  # one rank alone has nothing to agree on with anyone: every cost is 0 there
        checked, step = software.agreement, software.step
        call = software.call if ranks > 1 else 0.0
        if checked and ranks > 1:
            call += _library(AGREEMENT_BYTES, ranks, machine, gamma, slowdown, busy, partial)
    if spec.library_steps:
        step = 0.0
    if spec.modelled_as:  # the library's choice: the cheaper of those it chooses between
        if checked and spec.rides and collective == ALLREDUCE and nbytes <= rides_up_to(ranks):
            if nbytes <= RIDES_UP_TO:
                return call  # the data is reduced inside the agreement's own bytes
            # an exchange's larger payload: its bytes in every step of the exchange
            on = (machine, gamma, ranks, slowdown, busy, partial)
            rode = seconds(exchange_phases(nbytes, ranks), *on)
            return call + rode - seconds(exchange_phases(0, ranks), *on)
        if busy is not None and busy.step is not None:  # the library's steps lack hpcring's software
            busy = replace(busy, alpha=max(busy.alpha - busy.step, 0.0))
        return call + _library(nbytes, ranks, machine, gamma, slowdown, busy, partial, spec, collective)
    if spec.levels is not None:
        if not isinstance(machine, Nodes):
            raise ModelError(f"{algorithm} needs a machine of nodes (--gpus-per-node)")
        return call + _two_level(spec, nbytes, ranks, machine, gamma, slowdown, ratio, step)
    steps = on_wire(phases(algorithm, nbytes, ranks, bcast=bcast, collective=collective), ratio)
    return call + seconds(steps, machine, gamma, ranks, slowdown, busy, partial, step)


def _library(
    nbytes: float,
    ranks: int,
    machine: Link | Nodes,
    gamma: float,
    slowdown: float,
    busy: Busy | None,
    partial: Busy | None,
    spec: Spec | None = None,
    collective: str = ALLREDUCE,
) -> float:
    """The library's own ``collective`` (``spec``: its `modelled_as`; default the all-reduce's):
    the cheapest of the algorithms it chooses between, with no software of hpcring's."""
    names = (spec or spec_of("mpi")).modelled_as
    return min(
        seconds(
            phases(a, nbytes, ranks, collective=collective), machine, gamma, ranks, slowdown, busy, partial
        )
        for a in names
    )


def oversubscription(ranks: int, cores: int | None) -> float:
    """How much slower a step in which every rank works gets when ``ranks`` ranks share ``cores``.

    Such a step waits for its slowest peer, and a rank without a core of its own runs only
    cores/ranks of the time. Steps of one rank alone (the root of ps gathering and reducing)
    keep their speed: the others sleep in MPI. None: one core (or GPU) per rank.
    """
    return max(1.0, ranks / cores) if cores else 1.0


def _two_level(
    spec: Spec,
    nbytes: float,
    ranks: int,
    machine: Nodes,
    gamma: float,
    slowdown: float = 1.0,
    ratio: float = 1.0,
    software: float = 0.0,
) -> float:
    """A two-level algorithm (`Spec.levels`): its phases inside a node on the node's link, those
    across nodes on the network (L flows at once where the NIC is shared).

    ``slowdown`` (ranks sharing cores) applies inside the node; across, the ranks wait on the NIC.
    ``software``: seconds each message step adds, at both levels."""
    per_node = machine.per_node
    if ranks % per_node:
        raise ModelError(f"{ranks} ranks do not fill nodes of {per_node}")
    nodes = ranks // per_node
    share = per_node if machine.nic_shared else 1
    inter = Link(machine.inter.alpha, machine.inter.beta * share)
    assert spec.levels is not None
    inside, across = spec.levels(nbytes, ranks, per_node)
    return seconds(
        on_wire(inside, ratio), machine.intra, gamma, per_node, slowdown, software=software
    ) + seconds(on_wire(across, ratio), inter, gamma, nodes, software=software)
