"""Reproducible sums across ranks: every algorithm, in place and out of place, any split of the
same values over the ranks and any order of them gives the bits of the serial sum of that
multiset (COMM_SELF, one rank, every value added there), so one SHA-256 at any rank count.

Hypothesis runs derandomized and every input is built from the drawn seed, so every rank
draws and builds the same examples; each verdict is agreed across ranks before it is asserted.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from exact_cases import DTYPES, KINDS, values
from helpers import digest, everywhere, raises_everywhere
from mpi4py import MPI

import hpcring
from hpcring import config

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
REVERSED = WORLD.Split(0, WORLD.size - WORLD.rank)  # the same ranks, in the other order


def serial(rows: np.ndarray) -> str:
    """The digest of the multiset's sum at one rank."""
    acc = hpcring.ExactSum(like=rows[0])
    for row in rows:
        acc.add(row)
    return digest(acc.allreduce(comm=MPI.COMM_SELF))


@settings(max_examples=12, derandomize=True, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.sampled_from([0, 1, 5, 300]),
    dtype=st.sampled_from(DTYPES),
    kind=st.sampled_from(KINDS),
    algorithm=st.sampled_from(list(hpcring.ALGORITHMS)),
    in_place=st.booleans(),
    reverse=st.booleans(),
)
def test_one_value_per_rank_matches_the_serial_sum(
    seed: int, n: int, dtype: str, kind: str, algorithm: str, in_place: bool, reverse: bool
) -> None:
    comm = REVERSED if reverse else WORLD
    rows = values(seed, comm.size, n, dtype, kind)
    order = np.random.default_rng(seed).permutation(comm.size)  # which rank holds which value
    x = rows[order[comm.rank]].copy()
    if in_place:
        result = hpcring.allreduce(x, comm=comm, algorithm=algorithm, reproducible=True)
    else:
        result = hpcring.allreduce(x, comm=comm, algorithm=algorithm, reproducible=True, out=np.empty_like(x))
    assert everywhere(WORLD, digest(result) == serial(rows))


@settings(max_examples=12, derandomize=True, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    count=st.integers(1, 12),
    n=st.sampled_from([1, 7, 200]),
    dtype=st.sampled_from(DTYPES),
    kind=st.sampled_from(KINDS),
    algorithm=st.sampled_from(list(hpcring.ALGORITHMS)),
)
def test_exact_sum_of_any_split_and_order_matches_the_serial_sum(
    seed: int, count: int, n: int, dtype: str, kind: str, algorithm: str
) -> None:
    rows = values(seed, count, n, dtype, kind)
    rng = np.random.default_rng(seed)
    owner = rng.integers(0, WORLD.size, count)  # any split, some ranks with none
    acc = hpcring.ExactSum(like=rows[0])
    for i in rng.permutation(count):
        if owner[i] == WORLD.rank:
            acc.add(rows[i])
    result = acc.allreduce(comm=WORLD, algorithm=algorithm)
    assert everywhere(WORLD, digest(result) == serial(rows))


@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner"])
def test_one_contribution_per_rank_moves_the_plain_algorithms_bytes(algorithm: str) -> None:
    """On one node each rank's contribution goes to its segment's owner as it is
    (`hpcring.exact.gathers`): the reproducible call hands MPI the plain all-reduce's bytes, no
    codes and no words, in its first call (Python, the communicator's first) and its warm ones
    (the compiled table), with the serial sum's bits each time."""
    from hpcring import exact
    from hpcring.arrays import adapter_for
    from hpcring.comm import channel_for

    comm = WORLD.Dup()
    rows = values(5, comm.size, 1001, "float32", "cancel")
    x = rows[comm.rank]
    channel = channel_for(comm, adapter_for(x))
    gathered = exact.gathers(comm.size, channel.topology().nodes)
    want, sent, ok = serial(rows), [], True
    for reproducible in (True, False, True, True):  # the fresh communicator's first call: reproducible
        before = channel.bytes_sent
        got = hpcring.allreduce(
            x, comm=comm, algorithm=algorithm, reproducible=reproducible, check=False, out=np.empty_like(x)
        )
        sent.append(channel.bytes_sent - before)
        ok &= not reproducible or digest(got) == want
    ok &= len(set(sent)) == 1 if gathered else sent[0] > sent[1]
    assert everywhere(WORLD, ok), sent
    comm.Free()


@pytest.mark.parametrize("adds", [1, 20])
def test_an_exact_sum_gathers_where_its_rows_fit(adds: int) -> None:
    """An ExactSum with one contribution per rank hands MPI the plain all-reduce's bytes on one
    node, as the one-array call does; with 20 float64 contributions per rank the rows would not
    fit in the words' scratch and the sum goes along the steps. The serial sum's bits either way."""
    from hpcring import exact
    from hpcring.arrays import adapter_for
    from hpcring.comm import channel_for

    comm = WORLD.Dup()
    rows = values(11, comm.size * adds, 999, "float64", "cancel")
    acc = hpcring.ExactSum(like=rows[0])
    for row in rows[comm.rank * adds : (comm.rank + 1) * adds]:
        acc.add(row)
    channel = channel_for(comm, adapter_for(rows[0]))
    gathered = exact.gathers(comm.size, channel.topology().nodes) and adds == 1 and comm.size > 1
    before = channel.bytes_sent
    got = acc.allreduce(comm=comm, check=False)
    sent = channel.bytes_sent - before
    ok = digest(got) == serial(rows)
    before = channel.bytes_sent
    hpcring.allreduce(rows[comm.rank], comm=comm, check=False, out=np.empty_like(rows[0]))
    plain = channel.bytes_sent - before
    ok &= sent == plain if gathered else sent > plain or comm.size == 1
    assert everywhere(WORLD, ok), (sent, plain)
    comm.Free()


def test_mean_divides_the_reproducible_sum_by_the_rank_count() -> None:
    rows = values(7, WORLD.size, 100, "float32", "cancel")
    result = hpcring.allreduce(rows[WORLD.rank].copy(), op="mean", reproducible=True)
    want = hpcring.ExactSum(like=rows[0])
    for row in rows:
        want.add(row)
    expected = (want.allreduce(comm=MPI.COMM_SELF).astype(np.float64) / WORLD.size).astype(np.float32)
    # the mean divides the float64 value before its one rounding: within an ulp of sum / G
    assert everywhere(WORLD, np.allclose(result, expected, rtol=2**-22, atol=0))
    assert everywhere(WORLD, len(set(WORLD.allgather(digest(result)))) == 1)


def test_ranks_that_disagree_on_reproducible_are_told_so() -> None:
    if WORLD.size == 1:
        pytest.skip("needs two ranks to disagree")
    x = np.ones(4, np.float32)
    try:
        hpcring.allreduce(x, reproducible=WORLD.rank == 0)
    except ValueError as error:
        ok = "ranks disagree on op" in str(error) and "sum (reproducible=True) on rank 0" in str(error)
    else:
        ok = False
    assert everywhere(WORLD, ok)


@pytest.mark.parametrize("algorithm", list(hpcring.ALGORITHMS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_algorithm_in_and_out_of_place_and_iallreduce(algorithm: str, dtype: str) -> None:
    rows = values(11, WORLD.size, 1000, dtype, "cancel")
    want = serial(rows)
    mine = rows[WORLD.rank]
    inplace = hpcring.allreduce(mine.copy(), algorithm=algorithm, reproducible=True)
    out = hpcring.allreduce(mine, algorithm=algorithm, reproducible=True, out=np.empty_like(mine))
    request = hpcring.iallreduce(mine.copy(), algorithm=algorithm, reproducible=True)
    assert everywhere(WORLD, digest(inplace) == digest(out) == digest(request.wait()) == want)


def test_bench_puts_a_reproducible_row_beside_each_plain_one_and_counts_its_bytes(tmp_path_factory) -> None:
    from hpcring.bench.cli import main

    path = WORLD.bcast(str(tmp_path_factory.mktemp("bench") / "rows.json") if WORLD.rank == 0 else None)
    argv = ["-b", "64", "-e", "4K", "-f", "8", "-n", "2", "-w", "1", "-a", "ring,naive,auto"]
    argv.append("--reproducible")
    status = main([*argv, "--json", path])
    rows = []
    if WORLD.rank == 0:
        with open(path) as stream:
            rows = json.load(stream)["rows"]
    names = [row["algorithm"] for row in rows]
    counted = [row for row in rows if row["algorithm"] in ("ring+rep", "naive+rep")]
    ok = status == 0 and (WORLD.rank != 0 or ("ring+rep" in names and "auto+rep" in names))
    ok = ok and all(row["wrong"] == 0 and row["bytes_match"] for row in rows)
    ok = ok and all(row["bytes_sent"] is not None or WORLD.size == 1 for row in counted)
    assert everywhere(WORLD, ok), rows[:4]


def test_bench_refuses_reproducible_for_integers(capsys: pytest.CaptureFixture[str]) -> None:
    from hpcring.bench.cli import main

    assert main(["--reproducible", "-d", "int32"]) == 2
    err = capsys.readouterr().err
    assert WORLD.rank != 0 or "--reproducible: reproducible=True needs a float dtype" in err, err


def test_gradient_sync_passes_reproducible_to_every_bucket() -> None:
    rows = values(5, WORLD.size, 300, "float32", "cancel")
    templates = [np.zeros(100, np.float32), np.zeros(200, np.float32)]
    sizes = {"bucket_bytes": 512, "first_bucket_bytes": 256}  # two buckets
    sync = hpcring.GradientSync(templates, op="sum", reproducible=True, **sizes)
    sync.grads[0][...] = rows[WORLD.rank, :100]
    sync.grads[1][...] = rows[WORLD.rank, 100:]
    sync.ready_all()
    grads = sync.wait()
    got = digest(np.concatenate([g.reshape(-1) for g in grads]))
    assert everywhere(WORLD, got == serial(rows) and len(sync.buckets) > 1)


def test_memory_guard_prices_the_integer_words(monkeypatch) -> None:
    """9 bytes per float32 element of integer words (and the conversion's blocks) do not fit in
    64 KiB where the plain ring's scratch does: MemoryError on every rank, naming
    reproducible=True, before anything is allocated; the data left as it was."""
    monkeypatch.setenv("HPCRING_MEMORY_LIMIT", str(64 << 10))
    config.reload()
    comm = WORLD.Dup()  # a fresh channel: no scratch held from earlier tests
    x = np.full(4096, 1.5, np.float32)  # 16 KiB; the words alone are 32 KiB, the blocks 68 KiB
    kept = x.copy()
    call = lambda: hpcring.allreduce(x, comm=comm, reproducible=True)  # noqa: E731
    raises_everywhere(MemoryError, "reproducible=True with algorithm 'ring' needs", call)
    acc = hpcring.ExactSum(like=x)
    acc.add(x)
    raises_everywhere(MemoryError, "its integer words: 9 bytes per element", lambda: acc.allreduce(comm=comm))
    assert everywhere(WORLD, np.array_equal(x, kept) and comm_holds_nothing(comm))
    hpcring.allreduce(x, comm=comm)  # without reproducible=True it fits
    assert everywhere(WORLD, (x == 1.5 * WORLD.size).all())
    comm.Free()


def comm_holds_nothing(comm: MPI.Intracomm) -> bool:
    """No reproducible scratch was allocated on the communicator's channel."""
    from hpcring.arrays import NUMPY
    from hpcring.comm import state_of

    return not any("exact" in name for name in state_of(comm).channel(NUMPY)._scratch)
