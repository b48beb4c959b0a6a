"""Serial tests of the cost model: the formulas against hand-computed values, scaling, the CLI's errors.

Hand values use alpha = 1, beta = 0.01, gamma = 0.001 and n = 1000 bytes, so a message of
the whole buffer costs 1 + 10 and reducing it costs 1. They price the network alone
(`NO_SOFTWARE`); hpcring's software on top has tests of its own.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcring import algorithms, config
from hpcring.model.cli import main, parse_size
from hpcring.model.costs import (
    AGREEMENT_BYTES,
    COLD_FROM,
    DEFAULT_SOFTWARE,
    EXCHANGE_RANKS,
    EXCHANGE_RIDES_UP_TO,
    MODELLED,
    NO_SOFTWARE,
    PRESETS,
    RIDES_UP_TO,
    TWO_RANKS_RIDE_UP_TO,
    Busy,
    Link,
    ModelError,
    Nodes,
    Params,
    Software,
    modelled,
    predict,
    rides_up_to,
)
from hpcring.model.params import default_path, keep_busy, load_params, save_params
from hpcring.units import busbw, collective_title, input_bytes

LINK = Link(alpha=1.0, beta=0.01)
GAMMA = 1e-3
N = 1000


def t(algorithm: str, p: int, **kwargs) -> float:
    return predict(algorithm, N, p, LINK, gamma=GAMMA, software=NO_SOFTWARE, **kwargs)


# ring: 2(p-1) + 2(p-1)/p * 10 + (p-1)/p * 1; rabenseifner (p' = 2^floor(log2 p) < p: the
# whole buffer folded in, reduced, and sent back): (2 log2 p' + 2) + (2(p'-1)/p' + 2) * 10
# + ((p'-1)/p' + 1) * 1; naive: (p-1)(11) + (p-1) + 2
# (two copies); ps: (p-1)(11) + (p-1) + 2 + ceil(log2 p)(11) binomial or (p-1)(11) linear.
HAND = {
    "ring": {1: 0.0, 2: 12.5, 3: 4 + 40 / 3 + 2 / 3, 4: 21.75, 1000: 1998 + 19.98 + 0.999},
    "rabenseifner": {1: 0.0, 2: 12.5, 3: 35.5, 4: 19.75, 1000: 20 + 39.9609375 + 1.998046875},
    "naive": {1: 0.0, 2: 14.0, 3: 26.0, 4: 38.0, 1000: 11990.0},
    "ps": {1: 0.0, 2: 25.0, 3: 48.0, 4: 60.0, 1000: 10989 + 999 + 2 + 110.0},
}


@pytest.mark.parametrize("algorithm", list(HAND))
@pytest.mark.parametrize("p", [1, 2, 3, 4, 1000])
def test_formulas_match_hand_values(algorithm: str, p: int) -> None:
    assert t(algorithm, p) == pytest.approx(HAND[algorithm][p], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize(("p", "expected"), [(2, 25.0), (3, 48.0), (4, 71.0), (1000, 22979.0)])
def test_ps_with_a_linear_bcast(p: int, expected: float) -> None:
    assert t("ps", p, bcast="linear") == pytest.approx(expected)


def test_rabenseifner_power_of_two_is_the_closed_form() -> None:
    for p in (2, 8, 64, 1024):
        k = math.log2(p)
        closed = 2 * k * 1.0 + 2 * (p - 1) / p * N * 0.01 + (p - 1) / p * N * GAMMA
        assert t("rabenseifner", p) == pytest.approx(closed)


@pytest.mark.parametrize("p", [2, 3, 4, 7, 1000])
def test_mpi_is_the_cheaper_of_ring_and_rabenseifner(p: int) -> None:
    assert t("mpi", p) == min(t("ring", p), t("rabenseifner", p))


@pytest.mark.parametrize("p", [2, 3, 4, 1000])
def test_busbw_identity(p: int) -> None:
    assert busbw(N, p, 2.0) == pytest.approx(N / 2.0 * 2 * (p - 1) / p)
    # With no latency and no arithmetic the ring moves 2(p-1)/p n bytes over each link,
    # so its busbw is exactly the link bandwidth, whatever p is.
    pure = Link(alpha=0.0, beta=1e-9)
    assert busbw(N, p, predict("ring", N, p, pure, gamma=0.0, software=NO_SOFTWARE)) == pytest.approx(1e9)


def test_ring_stays_bounded_and_ps_grows_linearly() -> None:
    no_latency = Link(alpha=0.0, beta=0.01)
    bound = 2 * N * 0.01 + N * GAMMA
    ranks = [2, 16, 128, 1024, 8192]
    ring = [predict("ring", N, p, no_latency, gamma=GAMMA, software=NO_SOFTWARE) for p in ranks]
    ps = [predict("ps", N, p, no_latency, gamma=GAMMA, software=NO_SOFTWARE) for p in ranks]
    assert all(x < bound for x in ring)
    assert ring[-1] / ring[1] < 1.1
    # ps: each extra rank adds one buffer through the root's link and one reduction there.
    slope = (ps[-1] - ps[-2]) / (ranks[-1] - ranks[-2])
    assert slope == pytest.approx(N * 0.01 + N * GAMMA, rel=0.01)
    assert ps[-1] / ps[-2] == pytest.approx(ranks[-1] / ranks[-2], rel=0.01)


def test_hierarchical_by_hand() -> None:
    intra, inter = Link(1.0, 0.001), Link(10.0, 0.01)
    # 2 nodes of 4: intra RS and AG 3 * (1 + 250 * 0.001) each; inter ring of 250 bytes
    # over 2 nodes: 2 * (10 + 125 * 0.01), or 125 * 0.04 with 4 flows through one NIC.
    per_gpu = Nodes(4, intra, inter, nic_shared=False)
    shared = Nodes(4, intra, inter, nic_shared=True)
    net = {"gamma": 0.0, "software": NO_SOFTWARE}
    assert predict("hierarchical", N, 8, per_gpu, **net) == pytest.approx(30.0)
    assert predict("hierarchical", N, 8, shared, **net) == pytest.approx(37.5)
    # A flat ring over 8 ranks crosses the node boundary at every step: 14 steps of 125 bytes.
    assert predict("ring", N, 8, per_gpu, **net) == pytest.approx(14 * (10 + 1.25))
    with pytest.raises(ModelError, match="do not fill nodes"):
        predict("hierarchical", N, 6, per_gpu, gamma=0.0)


def test_hierarchical_beats_flat_ring_at_1000_gpus() -> None:
    nodes = Nodes(8, Link(1.5e-6, 1 / 450e9), Link(3e-6, 1 / 50e9), nic_shared=False)
    flat = predict("ring", 2**30, 1000, nodes, gamma=1e-12)
    assert predict("hierarchical", 2**30, 1000, nodes, gamma=1e-12) < flat


def test_oversubscribed_ranks_share_cores() -> None:
    params, net = Params(1.0, 0.01, GAMMA, cores=2), NO_SOFTWARE
    assert predict("ring", N, 2, params, software=net) == pytest.approx(t("ring", 2))
    assert predict("ring", N, 4, params, software=net) == pytest.approx(2 * t("ring", 4))
    assert predict("ring", N, 4, Params(1.0, 0.01, GAMMA), software=net) == pytest.approx(t("ring", 4))
    # ps at 4 ranks on 2 cores: the root gathers (33), reduces (3) and copies (2) alone, at full
    # speed; the binomial Bcast (2 steps of 11) involves every rank, so it runs at half speed.
    assert predict("ps", N, 4, params, software=net) == pytest.approx(33 + 3 + 2 + 2 * 22)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("ring", N, 0), "ranks must be a positive"),
        (("ring", N, -3), "ranks must be a positive"),
        (("ring", 0, 4), "size must be positive"),
        (("tree", N, 4), "unknown algorithm 'tree'"),
        (("hierarchical", N, 4), "needs a machine of nodes"),
    ],
)
def test_predict_rejects_bad_input(args: tuple, match: str) -> None:
    with pytest.raises(ModelError, match=match):
        predict(*args, Params(1.0, 0.01, GAMMA))


def test_params_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "model.json"
    save_params(Params(1e-6, 1e-10, 1e-11, cores=2, meta={"host": "h"}), path)
    loaded = load_params(path)
    assert (loaded.alpha, loaded.beta, loaded.gamma, loaded.cores) == (1e-6, 1e-10, 1e-11, 2)
    assert loaded.meta["host"] == "h"


def test_busy_figures_replace_the_pair_for_steps_every_rank_takes() -> None:
    """Measured with all p ranks busy: ring is 2(p-1) steps of (a_b + n/p b_b) plus (p-1)/p n g_b,
    with no oversubscription factor on top (the busy figures already hold it); ps keeps the
    pair figures for what its root does alone and the busy ones for the Bcast tree."""
    busy = Busy(2.0, 0.02, 0.004)
    params = Params(1.0, 0.01, GAMMA, cores=2, busy={4: busy})
    assert predict("ring", N, 4, params) == pytest.approx(6 * (2 + 250 * 0.02) + 750 * 0.004)
    assert predict("ps", N, 4, params) == pytest.approx(33 + 3 + 2 + 2 * (2 + 1000 * 0.02))
    no_busy = predict("ring", N, 3, params, software=NO_SOFTWARE)  # no busy figures for 3
    assert no_busy == pytest.approx(1.5 * t("ring", 3))


def test_partial_figures_price_the_phases_some_ranks_sit_out() -> None:
    """Rabenseifner at 3 ranks: every phase has a rank waiting (fold, core of 2, unfold), so all
    of it is priced at the partial figures; the ring keeps the all-busy ones. A binomial Bcast
    at 4 ranks: step 0 (one pair) partial, step 1 (two pairs) all busy."""
    busy, partial = Busy(2.0, 0.02, 0.004), Busy(3.0, 0.03, 0.005)
    params = Params(1.0, 0.01, GAMMA, cores=2, busy={3: busy, 4: busy}, partial={3: partial, 4: partial})
    fold, core = (3 + 1000 * 0.03) + 1000 * 0.005, 2 * (3 + 500 * 0.03) + 500 * 0.005
    assert predict("rabenseifner", N, 3, params) == pytest.approx(fold + core + (3 + 1000 * 0.03))
    assert predict("ring", N, 3, params) == pytest.approx(4 * (2 + N / 3 * 0.02) + 2 / 3 * N * 0.004)
    root = 33 + 3 + 2  # gather and reduce at the pair figures, as before
    assert predict("ps", N, 4, params) == pytest.approx(root + (3 + 1000 * 0.03) + (2 + 1000 * 0.02))


def test_a_large_call_starts_cold() -> None:
    """`cold` is charged in full from COLD_FROM bytes up, in proportion below."""
    busy = Busy(2.0, 0.0, 0.0, call=5.0, cold=40.0)
    params = Params(1.0, 1e-12, 1e-12, cores=2, busy={2: busy})
    full, quarter = COLD_FROM, COLD_FROM // 4
    assert predict("ring", full, 2, params) == pytest.approx(5 + 40 + 2 * 2)
    assert predict("ring", quarter, 2, params) == pytest.approx(5 + 10 + 2 * 2)
    assert predict("ring", 16 * full, 2, params) == pytest.approx(5 + 40 + 2 * 2)


# ---- hpcring's software on top of the network (`Software`) ----------------------------------

STEP, CALL = 0.5, 7.0  # a step's software and a call's, in LINK's units (a message costs 1 + n b)


def sw(algorithm: str, p: int, software: Software, machine: Link | Nodes = LINK, n: float = N) -> float:
    """What ``software`` adds to ``algorithm`` over the network alone."""
    net = predict(algorithm, n, p, machine, gamma=GAMMA, software=NO_SOFTWARE)
    return predict(algorithm, n, p, machine, gamma=GAMMA, software=software) - net


@pytest.mark.parametrize("p", [2, 3, 4, 7, 8, 1000])
def test_each_message_step_of_hpcrings_own_algorithms_pays_the_step(p: int) -> None:
    """The ring's 2(p-1) steps, Rabenseifner's 2 log2 p (two more where p is not a power of two),
    naive's p-1 exchanges: each pays ``step``; the library's own (mpi, and ps's Gather and Bcast)
    none; every algorithm pays ``call`` once."""
    software = Software(STEP, CALL, agreement=False)
    raben = 2 * (p.bit_length() - 1) + (0 if p & (p - 1) == 0 else 2)  # p' = 2^floor(log2 p)
    assert sw("ring", p, software) == pytest.approx(2 * (p - 1) * STEP + CALL)
    assert sw("rabenseifner", p, software) == pytest.approx(raben * STEP + CALL)
    assert sw("naive", p, software) == pytest.approx((p - 1) * STEP + CALL)
    assert sw("mpi", p, software) == pytest.approx(CALL)
    assert sw("ps", p, software) == pytest.approx(CALL)
    assert sw("ring", p, Software(STEP, 0.0, agreement=False)) == pytest.approx(2 * (p - 1) * STEP)


def test_the_step_pays_at_both_levels_of_a_two_level_algorithm() -> None:
    """hierarchical on H nodes of L: the ring's 2(L-1) steps inside and 2(H-1) across."""
    nodes = Nodes(8, Link(1.0, 0.001), Link(10.0, 0.01), nic_shared=False)
    software = Software(STEP, CALL, agreement=False)
    assert sw("hierarchical", 1000, software, nodes) == pytest.approx((14 + 248) * STEP + CALL)
    assert sw("ring", 1000, software, nodes) == pytest.approx(1998 * STEP + CALL)


@pytest.mark.parametrize("p", [2, 3, 5, 1000])
def test_a_checked_call_pays_the_agreements_collective_once(p: int) -> None:
    """The agreement is an MPI all-reduce of AGREEMENT_BYTES, priced as `mpi` is; an `mpi`
    all-reduce of up to RIDES_UP_TO bytes rides in it and costs nothing more, and where the ranks
    exchange messages one of up to EXCHANGE_RIDES_UP_TO bytes (TWO_RANKS_RIDE_UP_TO on two) rides,
    costing what its bytes add."""
    agreement = predict("mpi", AGREEMENT_BYTES, p, LINK, gamma=GAMMA, software=NO_SOFTWARE)
    checked = Software(0.0, CALL)
    for algorithm in ("ring", "rabenseifner", "naive", "ps", "mpi"):  # too large to ride
        assert sw(algorithm, p, checked, n=EXCHANGE_RIDES_UP_TO + 1) == pytest.approx(CALL + agreement)
    small = RIDES_UP_TO
    assert predict("mpi", small, p, LINK, gamma=GAMMA, software=checked) == pytest.approx(CALL + agreement)
    largest = rides_up_to(p)
    exchanged = EXCHANGE_RIDES_UP_TO if p <= EXCHANGE_RANKS else RIDES_UP_TO
    assert largest == (TWO_RANKS_RIDE_UP_TO if p == 2 else exchanged)
    if largest > small:  # exchanging ranks: a larger one rides too, its bytes added to the agreement's
        rides = predict("mpi", largest, p, LINK, gamma=GAMMA, software=checked)
        doubling, fold = int(math.log2(p)), p & (p - 1) != 0  # the ranks past a power of two fold in and out
        sent, reduced = (doubling + 2 * fold) * largest, (doubling + fold) * largest
        assert rides == pytest.approx(CALL + agreement + sent * LINK.beta + reduced * GAMMA, rel=1e-6)
    too_large = predict("mpi", largest + 1, p, LINK, gamma=GAMMA, software=checked)  # it moves after
    assert too_large == pytest.approx(
        CALL + agreement + predict("mpi", largest + 1, p, LINK, gamma=GAMMA, software=NO_SOFTWARE)
    )
    # other collectives agree too, and their data never rides
    assert (
        predict("mpi", small, p, LINK, gamma=GAMMA, software=checked, collective="allgather")
        > CALL + agreement
    )


def test_one_rank_pays_nothing_and_other_collectives_pay_their_steps() -> None:
    assert predict("ring", N, 1, LINK, gamma=GAMMA, software=Software(STEP, CALL)) == 0.0
    software = Software(STEP, CALL, agreement=False)
    net = predict("ring", N, 4, LINK, gamma=GAMMA, software=NO_SOFTWARE, collective="reduce_scatter")
    rs = predict("ring", N, 4, LINK, gamma=GAMMA, software=software, collective="reduce_scatter")
    assert rs - net == pytest.approx(3 * STEP + CALL)


def test_the_agreements_size_is_hpcring_agreements() -> None:
    """costs.py cannot import hpcring.agreement (NumPy, MPI): its figures are copied, and checked here."""
    from hpcring import agreement

    assert AGREEMENT_BYTES == 16 * agreement.WIDTH + agreement.SLOT
    assert RIDES_UP_TO == agreement.SLOT
    assert EXCHANGE_RIDES_UP_TO == agreement.PAIR_SLOT
    assert TWO_RANKS_RIDE_UP_TO == agreement.TWO_RANKS
    assert EXCHANGE_RANKS == agreement.EXCHANGE_RANKS
    for ranks in range(1, 12):
        assert rides_up_to(ranks) == agreement.slot_bytes(ranks)


def test_the_default_software_is_counted_unless_told_otherwise() -> None:
    """A Link or Nodes, and Params without software figures, get DEFAULT_SOFTWARE."""
    default = predict("ring", N, 8, LINK, gamma=GAMMA)
    assert default == pytest.approx(predict("ring", N, 8, LINK, gamma=GAMMA, software=DEFAULT_SOFTWARE))
    assert default > predict("ring", N, 8, LINK, gamma=GAMMA, software=NO_SOFTWARE)
    params = Params(1.0, 0.01, GAMMA)
    assert predict("ring", N, 8, params) == pytest.approx(default)


def test_calibrated_software_prices_the_rank_counts_it_does_not_cover() -> None:
    """Params.software: the figures of the largest rank count calibrated with a core per rank
    (else the smallest); used where no busy figures cover the rank count, ignored where they do
    (they hold the software already), and the library's steps lose it there."""
    two = Busy(2.0, 0.02, 0.004, call=5.0, step=0.5, overhead=3.0)
    four = Busy(9.0, 0.09, 0.004, call=20.0, step=4.0, overhead=1.0)
    params = Params(1.0, 0.01, GAMMA, cores=2, busy={2: two, 4: four})
    assert params.software == (2, Software(0.5, 3.0))
    assert Params(1.0, 0.01, GAMMA, cores=1, busy={2: two, 4: four}).software == (2, Software(0.5, 3.0))
    assert Params(1.0, 0.01, GAMMA, cores=8, busy={2: two, 4: four}).software == (4, Software(4.0, 1.0))
    assert Params(1.0, 0.01, GAMMA, busy={2: Busy(2.0, 0.02, 0.004)}).software is None
    software = Software(0.5, 3.0)
    assert predict("ring", N, 8, params) == pytest.approx(
        predict("ring", N, 8, Params(1.0, 0.01, GAMMA, cores=2), software=software)
    )
    # at 2 ranks the busy figures price the ring as before: 2 steps of (2 + 500 * 0.02) + the call
    assert predict("ring", N, 2, params) == pytest.approx(5 + 2 * (2 + 500 * 0.02) + 500 * 0.004)
    # mpi there: the same steps without hpcring's 0.5 of software each
    n = 2 * EXCHANGE_RIDES_UP_TO  # too large to ride in the agreement's exchange
    half = n / 2
    assert predict("mpi", n, 2, params) == pytest.approx(5 + 2 * (1.5 + half * 0.02) + half * 0.004)
    assert predict("mpi", RIDES_UP_TO, 2, params) == pytest.approx(5.0)  # it rides in the agreement


def test_software_figures_round_trip_and_old_files_still_load(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    busy = {2: Busy(2e-6, 2e-10, 2e-11, 3e-6, 4e-6, step=1e-7, overhead=9e-7), 3: Busy(5e-6, 5e-10, 5e-11)}
    save_params(Params(1e-6, 1e-10, 1e-11, 2, {"host": "h"}, busy), path)
    record = json.loads(path.read_text())
    assert record["busy"]["2"]["step"] == 1e-7 and "step" not in record["busy"]["3"]
    loaded = load_params(path)
    assert loaded.busy == busy and loaded.software == (2, Software(1e-7, 9e-7))
    # a file written before the software was measured apart: version 1, no step nor overhead
    old = {"version": 1, "alpha": 1e-6, "beta": 1e-10, "gamma": 1e-11, "cores": 2}
    old["busy"] = {"2": {"alpha": 2e-6, "beta": 2e-10, "gamma": 2e-11, "call": 3e-6, "cold": 4e-6}}
    path.write_text(json.dumps(old))
    loaded = load_params(path)
    assert loaded.busy[2] == Busy(2e-6, 2e-10, 2e-11, 3e-6, 4e-6) and loaded.software is None
    assert predict("ring", 1 << 20, 8, loaded) == pytest.approx(
        predict("ring", 1 << 20, 8, loaded, software=DEFAULT_SOFTWARE)
    )


@pytest.mark.parametrize("value", [-1e-6, "fast", True])
def test_corrupt_software_figures_are_a_user_error(tmp_path: Path, value: object) -> None:
    path = tmp_path / "model.json"
    entry = {"alpha": 1, "beta": 1, "gamma": 1, "step": value}
    path.write_text(json.dumps({"alpha": 1e-6, "beta": 1e-10, "gamma": 1e-11, "busy": {"2": entry}}))
    with pytest.raises(ModelError, match=r"busy\['2'\] step must be a number >= 0"):
        load_params(path)


def _rows(out: str) -> dict[tuple[str, str], float]:
    return {(r[1], r[2]): float(r[3]) for r in (line.split() for line in out.splitlines()) if r[0] != "#"}


def test_the_command_line_counts_the_software_it_is_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--software none: the network alone; STEP_US,CALL_US: the ring at 1000 ranks gains
    1998 steps and one call and agreement; default: DEFAULT_SOFTWARE; auto: the calibration
    file's figures, else the default."""
    monkeypatch.setenv("HPCRING_MODEL", str(tmp_path / "absent.json"))
    config.reload()

    def run(*args: str) -> str:
        base = ["--ranks", "1000", "--bytes", "1K,1G", "--link", "ndr400", "--algorithms", "ring,mpi"]
        assert main([*base, *args]) == 0
        return capsys.readouterr().out

    none, given = run("--software", "none"), run("--software", "2,5")
    assert "software: none" in none and "software: 2 us a step, 5 us a call" in given
    preset = PRESETS["ndr400"]
    link = Link(preset.alpha, preset.beta)
    agreement = predict("mpi", AGREEMENT_BYTES, 1000, link, gamma=preset.gamma, software=NO_SOFTWARE)
    off, on = _rows(none), _rows(given)
    for size in ("1K", "1G"):
        added = 1998 * 2e-6 + 5e-6 + agreement
        assert on[size, "ring"] - off[size, "ring"] == pytest.approx(added * 1e6, abs=0.1)
        assert on[size, "mpi"] - off[size, "mpi"] == pytest.approx((5e-6 + agreement) * 1e6, abs=0.1)
    auto, default = run(), run("--software", "default")
    assert _rows(auto) == _rows(default) and "(the default: the compiled core's" in auto
    calibrated = tmp_path / "model.json"
    busy = {2: Busy(2e-6, 2e-10, 2e-11, step=3e-6, overhead=4e-6)}
    save_params(Params(1e-6, 1e-10, 1e-11, 2, {"host": "h", "core": "c"}, busy), calibrated)
    mine = run("--params", str(calibrated))
    assert "software: 3 us a step, 4 us a call" in mine and "calibrated at 2 ranks, c core" in mine
    assert _rows(mine) == _rows(run("--software", "3,4"))
    monkeypatch.setenv("HPCRING_MODEL", str(calibrated))  # auto reads the default file too
    config.reload()
    assert _rows(run()) == _rows(mine)
    calibrated.write_text("{")  # and says so where it is there but unreadable
    assert main(["--ranks", "8", "--link", "ndr400"]) == 2
    assert "corrupt calibration file" in capsys.readouterr().err
    monkeypatch.delenv("HPCRING_MODEL")
    config.reload()


@pytest.mark.parametrize("value", ["fast", "-1", "1,2,3", "nan", "inf"])
def test_the_command_line_refuses_bad_software(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--ranks", "8", "--bytes", "1K", "--link", "ndr400", "--software", value]) == 2
    err = capsys.readouterr().err
    assert "--software" in err and len(err.strip().splitlines()) == 1


def test_busy_figures_round_trip_and_merge(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    two = Params(1e-6, 1e-10, 1e-11, 2, {"host": "h"}, {2: Busy(2e-6, 2e-10, 2e-11)})
    save_params(two, path)
    four = Params(3e-6, 3e-10, 3e-11, 2, {"host": "h"}, {4: Busy(4e-6, 4e-10, 4e-11)})
    merged = keep_busy(four, path)
    assert merged.busy == {2: Busy(2e-6, 2e-10, 2e-11), 4: Busy(4e-6, 4e-10, 4e-11)}
    assert merged.alpha == 3e-6  # the pair figures are the newest
    elsewhere = Params(3e-6, 3e-10, 3e-11, 2, {"host": "other"}, {4: Busy(4e-6, 4e-10, 4e-11)})
    assert set(keep_busy(elsewhere, path).busy) == {4}  # another host's figures are not mixed in
    save_params(merged, path)
    assert load_params(path).busy == merged.busy
    three = Params(1e-6, 1e-10, 1e-11, 2, {"host": "h"}, {3: Busy(5e-6, 5e-10, 5e-11, 1e-5, 2e-4)})
    three = keep_busy(dataclasses.replace(three, partial={3: Busy(6e-6, 6e-10, 6e-11)}), path)
    save_params(three, path)
    loaded = load_params(path)
    assert loaded.busy[3] == Busy(5e-6, 5e-10, 5e-11, 1e-5, 2e-4) and set(loaded.busy) == {2, 3, 4}
    assert loaded.partial == {3: Busy(6e-6, 6e-10, 6e-11)}


@pytest.mark.parametrize(
    "busy", [[1], {"x": {}}, {"1": {"alpha": 1, "beta": 1, "gamma": 1}}, {"2": {"alpha": -1}}]
)
def test_corrupt_busy_figures_are_a_user_error(tmp_path: Path, busy: object) -> None:
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"alpha": 1e-6, "beta": 1e-10, "gamma": 1e-11, "busy": busy}))
    with pytest.raises(ModelError, match="busy"):
        load_params(path)


@pytest.mark.parametrize(
    ("table", "value"),
    [
        ("partial", {"3": {"alpha": 1, "beta": 0, "gamma": 1}}),
        ("busy", {"2": {"alpha": 1, "beta": 1, "gamma": 1, "cold": -1}}),
    ],
)
def test_corrupt_partial_or_cold_figures_are_a_user_error(tmp_path: Path, table: str, value: object) -> None:
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"alpha": 1e-6, "beta": 1e-10, "gamma": 1e-11, table: value}))
    with pytest.raises(ModelError, match=table):
        load_params(path)


def test_unwritable_output_is_a_user_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ModelError, match="cannot write the calibration file"):
        save_params(Params(1e-6, 1e-10, 1e-11), blocker / "model.json")


def test_default_path_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HPCRING_MODEL", str(tmp_path / "m.json"))
    config.reload()
    assert default_path() == tmp_path / "m.json"
    monkeypatch.delenv("HPCRING_MODEL")
    config.reload()
    assert default_path() == Path.home() / ".cache" / "hpcring" / "model.json"


@pytest.mark.parametrize(("text", "nbytes"), [("1", 1), ("4K", 4096), ("100M", 100 << 20), ("1GiB", 1 << 30)])
def test_sizes_are_binary(text: str, nbytes: int) -> None:
    assert parse_size(text) == nbytes


@pytest.mark.parametrize(("text", "match"), [("0.3", "not a whole number"), ("-1", "sizes must be positive")])
def test_sizes_are_whole_positive_bytes(text: str, match: str) -> None:
    """hpcring.units' grammar: a fraction of a byte is refused, no longer truncated (0.3 was 0)."""
    with pytest.raises(ModelError, match=match):
        parse_size(text)
    assert parse_size("1.5K") == 1536  # a fraction that names whole bytes is fine


def test_the_cost_model_imports_without_mpi() -> None:
    """The bench and ``auto`` import the costs on every rank, and predictions need no mpiexec:
    importing them must not load mpi4py (which initializes MPI), NumPy or the calibration."""
    code = (
        "import sys, hpcring.model.costs, hpcring.model.params; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mpi4py', 'numpy') "
        "or m in ('hpcring.engine', 'hpcring.model.calibrate')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_predictions_at_1000_ranks_are_fast(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    start = time.perf_counter()
    assert main(["--ranks", "8,64,512,1000", "--bytes", "100M,1G", "--link", "ndr400"]) == 0
    assert time.perf_counter() - start < 1.0
    out = capsys.readouterr().out
    assert out.count("\n") == 2 + 4 * 2 * len(MODELLED)
    assert "rabenseifner" in out


def test_hierarchical_table_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plot = tmp_path / "t.png"
    args = [
        "--ranks",
        "8,1000",
        "--bytes",
        "1G",
        "--gpus-per-node",
        "8",
        "--link",
        "ndr400",
        "--plot",
        str(plot),
    ]
    assert main(args) == 0
    assert "hierarchical" in capsys.readouterr().out
    assert plot.read_bytes()[:4] == b"\x89PNG"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcring.model", *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    files = {
        "truncated": '{"alpha": 1e-6, "beta": ',
        "negative": json.dumps({"alpha": -1e-6, "beta": 1e-10, "gamma": 1e-11}),
        "missing": json.dumps({"alpha": 1e-6, "beta": 1e-10}),
        "list": "[1, 2, 3]",
    }
    for name, text in files.items():
        (root / f"{name}.json").write_text(text)
    return {name: root / f"{name}.json" for name in files} | {"absent": root / "absent.json"}


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--ranks", "0", "--link", "ndr400"], "ranks must be positive"),
        (["--ranks", "8,-1", "--link", "ndr400"], "ranks must be positive"),
        (["--ranks", "eight", "--link", "ndr400"], "bad rank list"),
        (["--bytes", "0", "--link", "ndr400"], "sizes must be positive"),
        (["--bytes", "lots", "--link", "ndr400"], "bad size"),
        (["--link", "token-ring"], "unknown link preset 'token-ring'"),
        (["--link", "ndr400", "--algorithms", "tree"], "unknown algorithm 'tree'"),
        (["--link", "ndr400", "--gpus-per-node", "8", "--ranks", "12"], "do not fill nodes"),
        (["--alpha", "-1", "--beta", "1e-9"], "--alpha must be a positive"),
        (["--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_cli_bad_input_exits_2(args: list[str], match: str) -> None:
    result = cli(*args)
    assert result.returncode == 2, result.stderr
    assert match in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_command_line_starts_no_mpi_unless_it_measures() -> None:
    """A prediction needs no MPI: starting it (a singleton MPI_Init, about a second here) is left
    to --calibrate and --validate."""
    code = "import sys, hpcring.model.cli; print('mpi4py.MPI' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False"], done.stderr


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("truncated", "corrupt calibration file"),
        ("negative", "alpha must be a positive number"),
        ("missing", "gamma must be a positive number"),
        ("list", "not a JSON object"),
        ("absent", "no calibration file"),
    ],
)
def test_cli_bad_calibration_file_exits_2(bad_files: dict[str, Path], name: str, match: str) -> None:
    result = cli("--params", str(bad_files[name]))
    assert result.returncode == 2, result.stderr
    assert match in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(ModelError, match=match):
        load_params(bad_files[name])


def test_inter_node_link_round_trips_and_makes_nodes(tmp_path: Path) -> None:
    """A calibration across nodes keeps both links; per_node then predicts on nodes of L ranks."""
    path = tmp_path / "model.json"
    params = Params(1e-6, 1e-10, 1e-11, cores=4, meta={"host": "h"}, inter_alpha=1e-5, inter_beta=1e-8)
    save_params(params, path)
    loaded = load_params(path)
    assert loaded.inter == Link(1e-5, 1e-8)
    assert loaded.nodes(2) == Nodes(2, Link(1e-6, 1e-10), Link(1e-5, 1e-8), nic_shared=True)
    assert loaded.nodes(1) is None and Params(1e-6, 1e-10, 1e-11).nodes(2) is None
    two_level = predict("ring", 1 << 20, 4, loaded, per_node=2)
    nodes = loaded.nodes(2)
    assert two_level == pytest.approx(predict("ring", 1 << 20, 4, nodes, gamma=1e-11))
    assert two_level > predict("ring", 1 << 20, 4, loaded)  # the slow link costs more than the fast
    assert predict("hierarchical", 1 << 20, 4, loaded, per_node=2) < two_level


def test_a_corrupt_inter_node_link_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"alpha": 1e-6, "beta": 1e-10, "gamma": 1e-11, "inter_beta": -1}))
    with pytest.raises(ModelError, match="inter_beta must be a positive number"):
        load_params(path)


def test_cli_predicts_on_the_calibrated_two_level_machine(tmp_path: Path) -> None:
    """A calibration across nodes answers the 1000-GPU question on its own two links."""
    path = tmp_path / "two.json"
    path.write_text(
        json.dumps({"alpha": 1e-6, "beta": 1e-10, "gamma": 1e-10, "inter_alpha": 3e-5, "inter_beta": 9e-9})
    )
    args = [
        "--params",
        str(path),
        "--ranks",
        "64",
        "--bytes",
        "1G",
        "--gpus-per-node",
        "8",
        "--nic",
        "shared",
    ]
    result = cli(*args, "--algorithms", "ring,hierarchical")
    assert result.returncode == 0, result.stderr
    assert "calibrated link inside a node (1 us, 10 GB/s)" in result.stdout
    assert "between nodes calibrated between nodes" in result.stdout
    times = {line.split()[2]: float(line.split()[3]) for line in result.stdout.splitlines()[2:]}
    assert times["hierarchical"] < times["ring"]
    assert "NVLink" in cli(*args, "--intra", "nvlink4").stdout  # an explicit preset still wins


# ---- the other collectives: their algorithms' declared phases against the closed forms of
# Thakur, Rabenseifner & Gropp (2005) and nccl-tests, in the hand units above (n = 1000 bytes:
# each rank's input; an all-gather's is one rank's row).

B = 0.01  # LINK's beta


def tc(collective: str, algorithm: str, p: int, n: float = N) -> float:
    return predict(algorithm, n, p, LINK, gamma=GAMMA, collective=collective, software=NO_SOFTWARE)


def _core(p: int) -> tuple[int, int]:
    """(p' = 2^floor(log2 p), log2 p')."""
    k = p.bit_length() - 1
    return 1 << k, k


@pytest.mark.parametrize("p", [1, 2, 3, 4, 7, 8, 1000])
def test_reduce_scatter_closed_forms(p: int) -> None:
    """ring: (p-1) steps of one n/p segment, each added in; naive: the same messages at once, then
    p-1 additions and 2 copies of a part; rabenseifner: log2 p halving steps, (p-1)/p n sent and
    added (p' < p: the whole buffer folded in and added, the folded rank's part sent back)."""
    ring = (p - 1) * (1 + N / p * B) + (p - 1) / p * N * GAMMA
    naive = (p - 1) * (1 + N / p * B) + ((p - 1) / p * N + 2 * N / p) * GAMMA if p > 1 else 0.0
    core, k = _core(p)
    rab = k + (core - 1) / core * N * B + (core - 1) / core * N * GAMMA
    if core != p:
        rab += (1 + N * B + N * GAMMA) + (1 + N / p * B)
    assert tc("reduce_scatter", "ring", p) == pytest.approx(ring, rel=1e-12, abs=1e-12)
    assert tc("reduce_scatter", "naive", p) == pytest.approx(naive, rel=1e-12, abs=1e-12)
    assert tc("reduce_scatter", "rabenseifner", p) == pytest.approx(rab, rel=1e-12, abs=1e-12)
    assert tc("reduce_scatter", "mpi", p) == min(tc("reduce_scatter", a, p) for a in ("ring", "rabenseifner"))


@pytest.mark.parametrize("p", [1, 2, 3, 4, 7, 8, 1000])
def test_allgather_closed_forms(p: int) -> None:
    """ring: (p-1) steps passing one n-byte row on; naive: the same p-1 messages of n, each to
    another rank; rabenseifner: log2 p doubling steps of the p·n output, (p-1)·n sent (p' < p:
    the folded rank's row in, the whole output back)."""
    ring = (p - 1) * (1 + N * B)
    core, k = _core(p)
    rab = k + (1 - 1 / core) * p * N * B
    if core != p:
        rab += (1 + N * B) + (1 + p * N * B)
    assert tc("allgather", "ring", p) == pytest.approx(ring, rel=1e-12, abs=1e-12)
    assert tc("allgather", "naive", p) == pytest.approx(ring, rel=1e-12, abs=1e-12)
    assert tc("allgather", "rabenseifner", p) == pytest.approx(rab, rel=1e-12, abs=1e-12)
    assert tc("allgather", "mpi", p) == min(tc("allgather", a, p) for a in ("ring", "rabenseifner"))


@pytest.mark.parametrize("p", [1, 2, 3, 4, 7, 8, 1000])
@pytest.mark.parametrize("n", [N, 5 << 20])  # one chunk; ten chunks of 512 KiB
def test_broadcast_closed_forms(p: int, n: int) -> None:
    """naive: the root sends n to each of the p-1 others in turn; binomial: ceil(log2 p) rounds of
    the whole buffer; ring: a chain of p-2+k pipelined chunks of n/k (k = n / 512 KiB, rounded up),
    about n·beta for large n whatever p is; mpi: the cheaper of binomial and ring."""
    k = -(-n // (512 << 10))
    assert tc("broadcast", "naive", p, n) == pytest.approx((p - 1) * (1 + n * B), rel=1e-12, abs=1e-12)
    rounds = math.ceil(math.log2(p))
    assert tc("broadcast", "binomial", p, n) == pytest.approx(rounds * (1 + n * B), rel=1e-12, abs=1e-12)
    ring = (p - 2 + k) * (1 + n / k * B) if p > 1 else 0.0
    assert tc("broadcast", "ring", p, n) == pytest.approx(ring, rel=1e-12, abs=1e-12)
    assert tc("broadcast", "mpi", p, n) == min(tc("broadcast", a, p, n) for a in ("binomial", "ring"))


@pytest.mark.parametrize("p", [2, 3, 4, 1000])
def test_busbw_of_the_bandwidth_optimal_schedules_is_the_link(p: int) -> None:
    """nccl-tests' factors make an ideal algorithm's busbw the link bandwidth whatever p is: the
    ring's reduce-scatter and all-gather with no latency and no arithmetic reach it exactly (size:
    the whole buffer, an all-gather's input a p-th of it), the pipelined broadcast within (p-2+k)/k."""
    pure, net = Link(alpha=0.0, beta=1e-9), {"gamma": 0.0, "software": NO_SOFTWARE}
    size = 1 << 30
    for collective in ("reduce_scatter", "allgather"):
        seconds = predict("ring", input_bytes(size, p, collective), p, pure, collective=collective, **net)
        assert busbw(size, p, seconds, collective) == pytest.approx(1e9)
    seconds = predict("ring", size, p, pure, collective="broadcast", **net)
    k = size // (512 << 10)
    assert busbw(size, p, seconds, "broadcast") == pytest.approx(1e9 * k / (p - 2 + k))


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "broadcast"])
def test_the_command_line_predicts_each_collective(
    collective: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--collective X`: one row per rank count, size and algorithm of X's table that declares its
    phases, size the whole buffer (an all-gather's input a G-th of it), busbw by X's factor."""
    argv = ["--collective", collective, "--ranks", "4,1000", "--bytes", "1M,1G", "--link", "ndr400"]
    argv += ["--software", "default"]  # not a calibration file this machine may hold
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if not line.startswith("#")]
    names = list(modelled(collective))
    assert [r[2] for r in rows] == names * 4 and set(names) == set(algorithms.table(collective)) - {"auto"}
    preset = PRESETS["ndr400"]
    link = Link(preset.alpha, preset.beta)
    for ranks, size, name, us, algbw, bus in rows:
        p, nbytes = int(ranks), parse_size(size)
        mine = input_bytes(nbytes, p, collective)
        seconds = predict(name, mine, p, link, gamma=preset.gamma, collective=collective)
        assert float(us) == pytest.approx(seconds * 1e6, abs=0.06)
        assert float(algbw) == pytest.approx(nbytes / seconds / 1e9, abs=1e-3)
        assert float(bus) == pytest.approx(busbw(nbytes, p, seconds, collective) / 1e9, abs=1e-3)
    assert lines[1].startswith(f"# {collective_title(collective)}: size = the whole buffer")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--collective", "allgather", "--wire", "bfloat16"], "--wire: all-reduce predictions only"),
        (["--collective", "broadcast", "--algorithms", "ps"], "unknown algorithm 'ps'"),
        (["--collective", "reduce_scatter", "--validate"], "--calibrate and --validate time all-reduces"),
        (["--collective", "allgather", "--ranks", "1000", "--bytes", "512"], "less than a byte from each"),
    ],
)
def test_the_command_line_refuses_what_a_collective_has_no_use_for(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*args, "--link", "ndr400"]) == 2
    assert said in capsys.readouterr().err
