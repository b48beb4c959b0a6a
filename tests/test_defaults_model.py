"""`auto`'s untuned defaults across nodes, the cost model and the advice of docs/choosing.md agree.

Three statements of one answer: the table `auto` runs untuned on nodes ("HxL",
`tuning.two_level_default`), what `python -m hpcring.model` predicts fastest on GPU clusters
(its presets), and what docs/choosing.md tells a user. These tests fail where any two part:
a default that the model prices well below its best choice, or a page whose table of untuned
choices no longer says what `tuning` holds. Serial: the model is pure arithmetic.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpcring.algorithms import tuning
from hpcring.model.costs import PRESETS, Link, Nodes, predict
from hpcring.units import format_size

ROOT = Path(__file__).resolve().parent.parent
SIZES = [1 << k for k in range(10, 31)]  # 1 KiB .. 1 GiB per rank
NODE_COUNTS = (2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 64, 100, 125, 128, 250, 256, 500)
GAMMA = 1e-12  # the presets' reduction speed (docs/scaling.md)
# What auto may run across nodes; `mpi` is priced as the better of the ring and Rabenseifner.
CANDIDATES = ("mpi", "rabenseifner", "hierarchical", "ring")


def _link(name: str) -> Link:
    return Link(PRESETS[name].alpha, PRESETS[name].beta)


def _machines() -> list[tuple[str, Nodes, int, int]]:
    """GPU clusters as the presets describe them: NVLink 4 inside nodes of 4 or 8, NDR or HDR
    InfiniBand or 100 Gb/s RoCE between them, one NIC per GPU or one per node."""
    found = []
    for network in ("ndr400", "hdr200", "roce100"):
        for shared in (False, True):
            for per_node in (4, 8):
                machine = Nodes(per_node, _link("nvlink4"), _link(network), nic_shared=shared)
                for nodes in NODE_COUNTS:
                    where = f"{nodes}x{per_node} {network} NIC per {'node' if shared else 'GPU'}"
                    found.append((where, machine, nodes, per_node))
    return found


def _ratios() -> list[tuple[float, str]]:
    """For every machine and size: the model's best time over the default's choice's (1: the
    default is the best), with where it was."""
    ratios = []
    for where, machine, nodes, per_node in _machines():
        table = tuning.default_table(tuning.table_key(nodes * per_node, nodes, per_node))
        for nbytes in SIZES:
            times = {a: predict(a, nbytes, nodes * per_node, machine, gamma=GAMMA) for a in CANDIDATES}
            chosen = tuning.choose(nbytes, table)
            ratios.append((min(times.values()) / times[chosen], f"{where}, {format_size(nbytes)}B: {chosen}"))
    return ratios


def test_the_untuned_default_across_nodes_is_what_the_model_finds_fastest() -> None:
    """Every choice within 0.75x of the model's best, and 99% of them within 0.9x (the former
    default, hierarchical from 32 KiB, fell to 0.02x at 500 nodes: 2(H-1) steps across them)."""
    ratios = sorted(_ratios())
    worst, where = ratios[0]
    assert worst >= 0.75, f"the default is {worst:.2f}x the model's best at {where}"
    percentile = ratios[len(ratios) // 100][0]
    assert percentile >= 0.9, f"1% of the defaults are below {percentile:.2f}x the model's best"


def test_the_thousand_gpu_question() -> None:
    """The sizes docs/choosing.md quotes: 125 nodes x 8 GPUs, NDR 400 with a NIC per GPU."""
    machine = Nodes(8, _link("nvlink4"), _link("ndr400"), nic_shared=False)
    table = tuning.default_table("125x8")
    for nbytes, expected in ((1 << 10, "mpi"), (25 << 20, "rabenseifner"), (1 << 30, "hierarchical")):
        assert tuning.choose(nbytes, table) == expected
        times = {a: predict(a, nbytes, 1000, machine, gamma=GAMMA) for a in CANDIDATES}
        assert times[expected] <= 1.01 * min(times.values()), (nbytes, times)


def _threshold(table: tuple[tuple[int | None, str], ...], index: int) -> str:
    """A table's limit as the pages write it: 64 KiB, 1 MiB."""
    text = format_size(table[index][0])
    return f"{text[:-1]} {text[-1]}iB" if text[-1] in "KMGT" else f"{text} B"


def test_choosing_page_states_the_defaults() -> None:
    """docs/choosing.md's table of what untuned `auto` picks says what `tuning` holds."""
    page = (ROOT / "docs" / "choosing.md").read_text()
    one, other = tuning.DEFAULT, tuning.DEFAULT_NOT_POWER_OF_TWO
    two = tuning.DEFAULT_TWO_RANKS
    rows = {
        "one node, 2 ranks": f"`{two[0][1]}` up to {_threshold(two, 0)}, `{two[1][1]}` above",
        "one node, G a power of two": f"`{one[0][1]}` up to {_threshold(one, 0)}, `{one[1][1]}` above",
        "one node, G not a power of two": f"`{other[0][1]}` up to {_threshold(other, 0)}, "
        f"`{other[1][1]}` above",
        "nodes, G a power of two": f"`mpi` up to {_threshold(tuning.DEFAULT_TWO_LEVEL, 0)}, "
        f"`{tuning.DEFAULT_TWO_LEVEL[1][1]}` above",
        "H nodes, G not a power of two": f"`mpi` up to {_threshold(tuning.two_level_default(3, 2), 0)}, "
        f"`rabenseifner` up to H x {_threshold(((tuning.HIERARCHICAL_PER_NODE, ''),), 0)}, "
        "`hierarchical` above",
    }
    for label, choice in rows.items():
        assert re.search(rf"^\| {re.escape(label)} \| {re.escape(choice)} \|", page, re.M), (label, choice)
    # the non-power-of-two table is what the row says
    assert tuning.two_level_default(3, 2)[1:] == (
        (3 * tuning.HIERARCHICAL_PER_NODE, "rabenseifner"),
        (None, "hierarchical"),
    )


@pytest.mark.parametrize("key", ["2x2", "4x8", "2x4-in-place"])
def test_power_of_two_nodes_take_rabenseifner(key: str) -> None:
    assert tuning.default_table(key) == tuning.DEFAULT_TWO_LEVEL
