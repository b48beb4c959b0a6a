"""auto: thresholds from the tuning file, defaults with one warning when it is unusable."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import everywhere, identical_everywhere
from mpi4py import MPI

import hpcring
from hpcring import algorithms, config, engine
from hpcring.algorithms import auto, tuning
from hpcring.arrays import adapter_for
from hpcring.comm import channel_for

CHOICES = [name for name in algorithms.portable() if name != "auto"]  # what auto may choose


def write(path, tables, fmt=tuning.FORMAT) -> None:
    path.write_text(json.dumps({"format": fmt, "tables": tables}))


def shared_tuning(tmp_path_factory, monkeypatch, tables) -> Path:
    """Collective: rank 0 writes ``tables`` to a tuning file every rank can see, and every rank's
    HPCRING_TUNING names it."""
    comm = MPI.COMM_WORLD
    path = Path(comm.bcast(str(tmp_path_factory.mktemp("tune")) if comm.rank == 0 else None)) / "tuning.json"
    if comm.rank == 0:
        write(path, tables)
    comm.Barrier()
    monkeypatch.setenv("HPCRING_TUNING", str(path))
    config.reload()
    return path


def test_choose() -> None:
    table = ((100, "mpi"), (1000, "rabenseifner"), (None, "ring"))
    assert [tuning.choose(n, table) for n in (0, 100, 101, 1000, 1001, 10**12)] == [
        "mpi",
        "mpi",
        "rabenseifner",
        "rabenseifner",
        "ring",
        "ring",
    ]


def test_missing_file_is_silent(tmp_path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuning.load(4, tmp_path / "none.json") == tuning.DEFAULT


def test_valid_file(tmp_path) -> None:
    path = tmp_path / "t.json"
    write(path, {"4": [[4096, "naive"], [None, "ps"]]})
    assert tuning.load(4, path) == ((4096, "naive"), (None, "ps"))


def test_two_level_tables_have_their_own_key_and_default(tmp_path) -> None:
    """On H nodes of L ranks auto reads the "HxL" table (tuned there), else the two-level default."""
    assert tuning.table_key(8, nodes=2, per_node=4) == "2x4"
    assert tuning.table_key(8) == tuning.table_key(8, nodes=8, per_node=1) == "8"  # flat: the rank count
    assert tuning.load("2x4", tmp_path / "none.json") == tuning.DEFAULT_TWO_LEVEL
    assert tuning.choose(64 << 20, tuning.DEFAULT_TWO_LEVEL) == "rabenseifner"  # G = 8: no fold
    assert tuning.choose(64 << 20, tuning.load("3x4", tmp_path / "none.json")) == "hierarchical"
    path = tmp_path / "t.json"
    write(path, {"8": [[None, "ring"]], "2x4": [[1024, "mpi"], [None, "hierarchical"]]})
    assert tuning.load("2x4", path) == ((1024, "mpi"), (None, "hierarchical"))
    assert tuning.load(8, path) == ((None, "ring"),)


def test_a_baseline_is_never_a_tuned_choice(tmp_path) -> None:
    path = tmp_path / "t.json"
    write(path, {"4": [[None, "nccl"]]})  # NCCL cannot run on NumPy arrays: not auto's to pick
    with pytest.warns(UserWarning, match="unknown algorithms"):
        assert tuning.load(4, path, known=CHOICES) == tuning.DEFAULT


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "ignoring tuning file"),
        (json.dumps({"format": 99, "tables": {}}), "format 99"),
        (json.dumps({"format": tuning.FORMAT, "tables": {"4": [[10, "tree"], [None, "ring"]]}}), "unknown"),
        (json.dumps({"format": tuning.FORMAT, "tables": {"4": [[10, "ring"]]}}), "open-ended"),
        (json.dumps({"format": tuning.FORMAT, "tables": {"8": [[None, "ring"]]}}), "no entry for 4 ranks"),
        (json.dumps([1, 2]), "ignoring tuning file"),
    ],
)
def test_unusable_file_warns_once_and_falls_back(tmp_path, content: str, match: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.warns(UserWarning, match=match) as caught:
        assert tuning.load(4, path, known=CHOICES) == tuning.DEFAULT
    assert len(caught) == 1


def test_a_missing_table_names_the_command_that_writes_it(tmp_path) -> None:
    """The warning for another collective's key, or a key of nodes, gives a command that runs: the
    rank count, not the key ("mpiexec -n reduce_scatter:4" once), and the bench's flags."""
    path = tmp_path / "t.json"
    write(path, {"8": [[None, "ring"]]})
    key = tuning.key_for(4, None, collective="reduce_scatter")
    with pytest.warns(UserWarning, match="no entry for table reduce_scatter:4") as caught:
        assert tuning.load(key, path) == tuning.default_table(key)
    assert "`mpiexec -n 4 python -m hpcring.bench --tune --collective reduce_scatter`" in str(
        caught[0].message
    )
    assert (
        tuning.tune_command("allgather:2x3")
        == "mpiexec -n 6 python -m hpcring.bench --tune --collective allgather"
    )
    assert tuning.tune_command("4-in-place") == "mpiexec -n 4 python -m hpcring.bench --tune --in-place"
    assert tuning.tune_command(4) == "mpiexec -n 4 python -m hpcring.bench --tune"


def test_a_path_that_cannot_even_be_tested_warns(tmp_path) -> None:
    """exists() raises for a name too long (it returns False only for some errors)."""
    with pytest.warns(UserWarning, match="ignoring tuning file"):
        assert tuning.load(4, tmp_path / ("x" * 300)) == tuning.DEFAULT


@pytest.mark.mpi
def test_only_rank_0_reads_the_tuning_file(tmp_path_factory, monkeypatch) -> None:
    """The other ranks take rank 0's table: what they would find themselves (here a path that
    raises on the last rank, which left rank 0 alone in the broadcast) does not matter."""
    comm = MPI.COMM_WORLD
    path = shared_tuning(tmp_path_factory, monkeypatch, {str(comm.size): [[None, "rabenseifner"]]})
    if comm.rank == comm.size - 1 and comm.size > 1:
        monkeypatch.setenv("HPCRING_TUNING", str(path.parent / ("x" * 300)))
        config.reload()
    private = comm.Dup()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no rank warns about a file it did not read
        chosen = auto.chosen(channel_for(private, adapter_for(np.ones(1))), 1 << 20)
    assert everywhere(comm, chosen == "rabenseifner")
    private.Free()


def test_in_place_calls_have_their_own_table_else_the_out_of_place_one(tmp_path) -> None:
    path = tmp_path / "t.json"
    write(path, {"4": [[None, "ring"]]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # falling back to the out-of-place table is quiet
        assert tuning.load("4-in-place", path, fallback="4") == ((None, "ring"),)
    write(path, {"4": [[None, "ring"]], "4-in-place": [[4 << 20, "mpi"], [None, "ring"]]})
    assert tuning.load("4-in-place", path, fallback="4") == ((4 << 20, "mpi"), (None, "ring"))


@pytest.mark.mpi
def test_auto_follows_the_in_place_table_in_place(tmp_path_factory, monkeypatch) -> None:
    comm = MPI.COMM_WORLD
    tables = {str(comm.size): [[None, "ring"]], f"{comm.size}-in-place": [[None, "rabenseifner"]]}
    shared_tuning(tmp_path_factory, monkeypatch, tables)
    private = comm.Dup()
    x = np.full(1000, comm.rank + 1, dtype=np.float64)
    out = hpcring.allreduce(x, algorithm="auto", comm=private, out=np.empty_like(x))
    hpcring.allreduce(x, algorithm="auto", comm=private)
    channel = channel_for(private, adapter_for(x))
    ok = (
        auto.chosen(channel, x.nbytes) == "ring"
        and auto.chosen(channel, x.nbytes, in_place=True) == "rabenseifner"
    )
    total = comm.size * (comm.size + 1) / 2
    ok = ok and bool((out == total).all() and (x == total).all()) and identical_everywhere(comm, x)
    assert everywhere(comm, ok)
    private.Free()


@pytest.mark.mpi
def test_auto_follows_the_tuning_file(tmp_path_factory, monkeypatch) -> None:
    """Every size band runs the algorithm the file names, with correct, identical results."""
    comm = MPI.COMM_WORLD
    table = [[64, "naive"], [512, "ps"], [4096, "rabenseifner"], [32768, "mpi"], [None, "ring"]]
    shared_tuning(tmp_path_factory, monkeypatch, {str(comm.size): table})
    private = comm.Dup()  # a fresh channel reads the file
    ok = True
    for count, want in ((8, "naive"), (64, "ps"), (1000, "mpi"), (100_000, "ring"), (500, "rabenseifner")):
        x = np.full(count, comm.rank + 1, dtype=np.float64)
        hpcring.allreduce(x, algorithm="auto", comm=private)
        same = identical_everywhere(comm, x)
        ran = auto.chosen(channel_for(private, adapter_for(x)), x.nbytes)
        ok &= ran == want and same and bool((x == comm.size * (comm.size + 1) / 2).all())
    assert everywhere(comm, ok)
    private.Free()


@pytest.mark.mpi
def test_a_size_auto_has_chosen_runs_and_is_priced_as_its_choice(tmp_path_factory, monkeypatch) -> None:
    """Once auto has chosen for a size, later calls run the choice directly, and the memory
    guard prices that choice (here `mpi`: no scratch), not the default table's."""
    comm = MPI.COMM_WORLD
    if comm.size == 1:
        pytest.skip("one rank never runs an algorithm")
    shared_tuning(tmp_path_factory, monkeypatch, {str(comm.size): [[None, "mpi"]]})
    monkeypatch.delenv("HPCRING_MEMORY_LIMIT", raising=False)
    config.reload()
    private = comm.Dup()
    x = np.full(100_000, comm.rank + 1, dtype=np.float64)  # the default table runs the ring here

    def runs(in_place: bool) -> str | None:
        """What the engine prices and runs for this call (None: auto has not chosen yet)."""
        made, _ = engine.prepare(
            engine.Options("allreduce", "sum", "auto"),
            x,
            None if in_place else np.empty_like(x),
            private,
            True,
        )
        return made.ran

    ok = runs(False) is None  # nothing chosen yet
    hpcring.allreduce(x, algorithm="auto", comm=private, out=np.empty_like(x))
    ok &= runs(False) == "mpi"
    ok &= runs(True) is None  # in place has a choice of its own, not made yet
    monkeypatch.setenv("HPCRING_MEMORY_LIMIT", "1")
    config.reload()
    out = hpcring.allreduce(x, algorithm="auto", comm=private, out=np.empty_like(x))
    ok &= bool((out == comm.size * (comm.size + 1) / 2).all()) and identical_everywhere(comm, out)
    with pytest.raises(MemoryError, match="'auto' needs"):  # a size not chosen yet: the default's price
        hpcring.allreduce(x[:-1], algorithm="auto", comm=private, out=np.empty_like(x[:-1]))
    assert everywhere(comm, ok)
    private.Free()


def test_untuned_defaults_follow_the_rank_count() -> None:
    """Rabenseifner where G is a power of two, the ring otherwise (its fold sends the whole
    buffer twice more), the library's own up to 64 KiB (on 2 ranks 32 KiB, where a checked
    call's data rides with the agreement; the all-reduce's table alone); across nodes
    Rabenseifner, and where G is not a power of two hierarchical from H MiB
    (tests/test_defaults_model.py)."""
    for key in (1, 4, "8", "16-in-place", 1024, "reduce_scatter:2"):
        assert tuning.default_table(key) == tuning.DEFAULT
    for key in (2, "2-in-place"):
        assert tuning.default_table(key) == tuning.DEFAULT_TWO_RANKS
        assert [tuning.choose(n, tuning.default_table(key)) for n in (32 << 10, 64 << 10)] == [
            "mpi",
            "rabenseifner",
        ]
    for key in (3, "6", "12-in-place", 1000):
        assert tuning.default_table(key) == tuning.DEFAULT_NOT_POWER_OF_TWO
    assert tuning.default_table("2x4") == tuning.DEFAULT_TWO_LEVEL
    assert tuning.default_table("125x8-in-place") == tuning.two_level_default(125, 8)
    assert [tuning.choose(n, tuning.default_table("125x8")) for n in (32 << 10, 125 << 20, 126 << 20)] == [
        "mpi",
        "rabenseifner",
        "hierarchical",
    ]
    assert [tuning.choose(n, tuning.DEFAULT) for n in (8, 64 << 10, (64 << 10) + 1)] == [
        "mpi",
        "mpi",
        "rabenseifner",
    ]
    assert tuning.choose(1 << 30, tuning.DEFAULT_NOT_POWER_OF_TWO) == "ring"
