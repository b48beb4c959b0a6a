"""The benchmark: size parsing, the busbw factor and byte formulas serially; the bench itself under MPI.

MPI tests run the bench in-process with tiny sizes, and every verdict goes through
`everywhere`, so a failure on one rank fails the test on all of them instead of
leaving the others waiting in a collective.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import everywhere, launch, launcher_env, mpiexec, run_job
from mpi4py import MPI

from hpcring import ALGORITHMS, algorithms, config, exchange
from hpcring.algorithms import tuning
from hpcring.algorithms.tuning import tuning_table
from hpcring.bench import main, measure
from hpcring.bench.collectives import COLLECTIVES, Buffers
from hpcring.bench.data import (
    expected_bytes_sent,
    expected_result,
    gathered_rows,
    row_input,
    sweep,
    verifiable_input,
)
from hpcring.bench.measure import BARE, Device, Row, bare_call, median_rows
from hpcring.bench.report import (
    algorithm_width,
    format_footer,
    format_header,
    format_row,
    line_styles,
    noisy,
    size_ticks,
    summarize,
)
from hpcring.gpu import gpu_problem
from hpcring.ops import DTYPES, OPS, check_op
from hpcring.partition import segment_bounds
from hpcring.units import busbw, busbw_factor, input_bytes, parse_size

# The bench in-process is the same program at any rank count (the algorithms it times are tested
# at every count elsewhere): its MPI tests run at one count (tests/conftest.py).
pytestmark = pytest.mark.one_count

CHOICES = [name for name in ALGORITHMS if name != "auto"]  # what auto may choose

TINY = ["-b", "8", "-e", "64", "-n", "2", "-w", "1"]  # 4 sizes, a few ms a row


# ---------------------------------------------------------------------------------------
# Serial: pure functions.


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("8", 8),
        ("0", 0),
        ("64K", 64 << 10),
        ("64k", 64 << 10),
        ("16M", 16 << 20),
        ("16MB", 16 << 20),
        ("16MiB", 16 << 20),
        ("1G", 1 << 30),
        ("1.5K", 1536),
        (" 2T ", 2 << 40),
    ],
)
def test_parse_size(text: str, nbytes: int) -> None:
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "K", "12Q", "-1", "1.3", "1e3", "8 8", "0x10", "16 MB B"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_busbw_factor_is_nccl_tests_all_reduce_factor() -> None:
    assert busbw_factor(1) == 0.0
    assert busbw_factor(2) == 1.0
    assert busbw_factor(4) == 1.5
    assert busbw_factor(8) == 1.75
    assert busbw_factor(1000) == pytest.approx(2 * 999 / 1000)


def test_sweep_rounds_to_whole_elements_without_repeats() -> None:
    assert sweep(8, 64, 2, 4) == [8, 16, 32, 64]
    assert sweep(1, 8, 2, 4) == [4, 8]  # 1 and 2 bytes hold no float32; 4 appears once
    assert sweep(8, 16 << 20, 2, 4)[-1] == 16 << 20
    assert len(sweep(8, 16 << 20, 2, 4)) == 22
    assert sweep(10, 40, 1.5, 2) == [10, 14, 22, 32, 40]  # -e is inclusive
    assert sweep(1 << 10, 1 << 20, 8, 4) == [1 << 10, 8 << 10, 64 << 10, 512 << 10, 1 << 20]
    assert sweep(3, 3, 2, 8) == []
    assert sweep(0, 8, 2, 4) == [4, 8]  # 0 B is skipped, and the sweep still grows


@pytest.mark.parametrize("size", range(1, 10))
def test_expected_bytes_sent_closed_forms(size: int) -> None:
    for itemsize in (1, 2, 8):
        for count in range(0, 3 * size + 2):
            nbytes = count * itemsize
            naive = [expected_bytes_sent("naive", nbytes, size, r, itemsize) for r in range(size)]
            ps = [expected_bytes_sent("ps", nbytes, size, r, itemsize) for r in range(size)]
            ring = [expected_bytes_sent("ring", nbytes, size, r, itemsize) for r in range(size)]
            assert naive == [(size - 1) * nbytes] * size
            assert ps == [(size - 1) * nbytes] + [nbytes if size > 1 else 0] * (size - 1)
            # The ring sends every segment 2(G-1) times in all, and each rank within two
            # elements of its textbook share 2(G-1)/G * N (within one for G <= 4).
            assert sum(ring) == 2 * (size - 1) * nbytes
            slack = itemsize if size <= 4 else 2 * itemsize
            assert all(abs(r - 2 * (size - 1) / size * nbytes) <= slack for r in ring)
            assert expected_bytes_sent("mpi", nbytes, size, 0, itemsize) is None
            rab = [expected_bytes_sent("rabenseifner", nbytes, size, r, itemsize) for r in range(size)]
            if size & (size - 1) == 0 and count % size == 0:  # power of two, even split: the textbook
                assert rab == [2 * (size - 1) * nbytes // size] * size
            # The 2^k core moves 2(core-1)·N in all; each fold pair sends the buffer once each way.
            core = 1 << (size.bit_length() - 1)
            assert sum(rab) == 2 * (core - 1) * nbytes + 2 * (size - core) * nbytes


def test_each_collective_has_nccl_tests_busbw_factor_and_size() -> None:
    """nccl-tests' factors (its doc/PERFORMANCE.md): 2(G-1)/G, (G-1)/G, (G-1)/G, 1, (G-1)/G; and its
    size, the whole buffer: an all-gather's input is a G-th of it."""
    factors = {
        "allreduce": lambda g: 2 * (g - 1) / g,
        "reduce_scatter": lambda g: (g - 1) / g,
        "allgather": lambda g: (g - 1) / g,
        "broadcast": lambda g: 1.0,
        "alltoall": lambda g: (g - 1) / g,
    }
    assert set(factors) == set(algorithms.COLLECTIVES) == set(COLLECTIVES)
    for name, factor in factors.items():
        for g in (1, 2, 3, 4, 8, 1000):
            assert busbw_factor(g, name) == pytest.approx(factor(g))
        assert busbw(1000, 4, 2.0, name) == pytest.approx(500 * factor(4))
        assert input_bytes(4096, 4, name) == (1024 if name == "allgather" else 4096)
    assert busbw_factor(4) == busbw_factor(4, "allreduce") == 1.5  # the default is the all-reduce's


@pytest.mark.parametrize("size", range(1, 10))
def test_expected_bytes_sent_of_the_other_collectives(size: int) -> None:
    """Per rank, by each algorithm's own formula: the reduce-scatter sends every part but its own
    once, (G-1)/G·N (ring, naive); the all-gather passes G-1 rows of n on (ring, naive); every
    broadcast moves n to each of the G-1 others once in all, the ring's tail sending nothing.
    Rabenseifner at any G: the power-of-two core's (G'-1)·N, plus each fold pair's traffic."""
    core = 1 << (size.bit_length() - 1)
    folded = range(0, 2 * (size - core), 2)  # the even ranks of the fold pairs
    for itemsize in (1, 2, 8):
        for count in range(0, 3 * size + 2):
            n = count * itemsize
            mine = [(stop - start) * itemsize for start, stop in segment_bounds(count, size)]

            def sent(collective: str, name: str, n: int = n, itemsize: int = itemsize, **root: int) -> list:
                return [
                    expected_bytes_sent(name, n, size, r, itemsize, collective=collective, **root)
                    for r in range(size)
                ]

            rs, ag = sent("reduce_scatter", "ring"), sent("allgather", "ring")
            assert rs == sent("reduce_scatter", "naive") == [n - m for m in mine]
            assert ag == sent("allgather", "naive") == [(size - 1) * n] * size
            rab_rs, rab_ag = sent("reduce_scatter", "rabenseifner"), sent("allgather", "rabenseifner")
            if count == 0 or size == 1:
                assert rab_rs == rab_ag == [0] * size
            else:
                assert sum(rab_rs) == (core - 1) * n + (size - core) * n + sum(mine[r] for r in folded)
                assert sum(rab_ag) == (core - 1) * size * n + (size - core) * (n + size * n)
            if core == size:
                assert rab_rs == rs and rab_ag == ag
            for root in {0, size - 1, size // 2}:
                for name in ("naive", "ring", "binomial"):
                    assert sum(sent("broadcast", name, root=root)) == (size - 1) * n
                assert sent("broadcast", "naive", root=root)[root] == (size - 1) * n
                assert size == 1 or sent("broadcast", "ring", root=root)[(root - 1) % size] == 0
                assert sent("broadcast", "mpi", root=root) == [None] * size
            assert sent("reduce_scatter", "mpi") == sent("allgather", "mpi") == [None] * size
            # The all-to-all (count a multiple of G: equal blocks): pairwise sends every block but
            # its own once, (G-1)/G·N; Bruck the blocks whose index has bit k set at step k.
            if count % size == 0:
                block = n // size
                assert sent("alltoall", "pairwise") == [(size - 1) * block] * size
                moved = sum(bin(i).count("1") for i in range(size))  # each block once per bit of its index
                assert sent("alltoall", "bruck") == [moved * block] * size
                assert sent("alltoall", "mpi") == [None] * size


def test_gathered_rows_differ_by_rank_and_are_exact_in_every_dtype() -> None:
    for dtype in DTYPES:
        rows = gathered_rows(np, 300, dtype, 5)
        assert rows.shape == (5, 300) and rows.dtype == dtype
        assert all(np.array_equal(rows[r], row_input(np, 300, dtype, r)) for r in range(5))
        assert len({rows[r].tobytes() for r in range(5)}) == 5  # a row out of place is seen
        exact = row_input(np, 300, np.dtype("int64"), 3)
        real = rows[3].real if dtype.kind == "c" else rows[3]
        assert np.array_equal(real.astype(np.float64), exact)  # the integers themselves, in every dtype


def test_header_of_another_collective_says_what_its_size_and_busbw_are() -> None:
    kind = COLLECTIVES["reduce_scatter"]
    facts = _header_facts(
        collective=kind.name,
        baseline=kind.bare,
        busbw_formula=kind.busbw_formula,
        busbw_factor=0.5,
        size_is=kind.size_is,
        placement=kind.placement(False),
    )
    text = format_header(facts)
    assert text.startswith("# hpcring 0 reduce-scatter benchmark")
    assert "# MPI_Reduce_scatter: the bare library call, mpi4py's comm.Reduce_scatter_block" in text
    assert "through hpcring.reduce_scatter)" in text
    assert "# size: the whole buffer, each rank's input (G parts" in text
    assert "busbw = algbw * (G-1)/G = algbw * 0.5;" in text
    assert "(bytes of each rank's input)" in text  # what auto's thresholds count
    assert "--link ndr400 --collective reduce_scatter" in text
    plain = format_header(_header_facts())
    assert "# size:" not in plain and "busbw = algbw * 2(G-1)/G" in plain
    # The bare row's longer name widens the algorithm column, header and rows alike.
    columns = text.splitlines()[-2]
    row = Row(8, 2, "float32", "sum", kind.bare, 1, 1.0, 1.0, 1.0, 1.0, 1.0, None, None, None, None, 0)
    line = format_row(row, algorithm_width(facts))
    assert (
        len(line) == len(columns) and line.index(kind.bare) + len(kind.bare) == columns.index("algorithm") + 9
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", list(OPS))
def test_verifiable_data_is_exact_in_any_order(dtype: np.dtype, op: str) -> None:
    """Inputs reduced forwards, backwards, or pairwise give exactly the expected result."""
    try:
        check_op(OPS[op], dtype)
    except TypeError:
        pytest.skip(f"{op} does not apply to {dtype}")
    count = 150
    ufunc = getattr(np, OPS[op].ufunc)
    for size in (1, 2, 3, 4, 7, 64, 1024):
        inputs = [verifiable_input(np, count, dtype, op, r) for r in range(size)]
        expected = expected_result(np, count, dtype, op, size)
        assert expected.dtype == dtype and expected.shape == (count,)
        orders = [inputs, inputs[::-1]]
        for order in orders:
            acc = order[0].copy()
            for other in order[1:]:
                ufunc(acc, other, out=acc)
            if op == "mean" and size > 1:
                np.true_divide(acc, size, out=acc)
            assert np.array_equal(acc, expected), (size, order is inputs)
        level = list(inputs)  # a tree, as a recursive-doubling MPI_Allreduce adds
        while len(level) > 1:
            level = [ufunc(a, b) for a, b in zip(level[::2], level[1::2], strict=False)] + (
                [level[-1]] if len(level) % 2 else []
            )
        if op == "mean" and size > 1:
            level[0] = np.true_divide(level[0], size).astype(dtype)
        assert np.array_equal(level[0], expected)


def test_bad_input_in_process_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["--bogus"],
        ["-b", "12Q"],
        ["-b", "1M", "-e", "1K"],
        ["-a", "ring,foo"],
        ["-d", "float8"],
        ["-a", "nccl", "--device", "cpu"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        if MPI.COMM_WORLD.Get_rank() == 0:
            assert err.count("error:") == 1, err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--collective", "allgather", "--wire", "bfloat16"], "--wire: all-reduce rows only"),
        (["--collective", "reduce_scatter", "--reproducible"], "--reproducible: all-reduce rows only"),
        (["--collective", "broadcast", "--in-place"], "the broadcast is always in place"),
        (["--collective", "reduce_scatter", "--in-place", "--tune"], "auto keeps one reduce-scatter table"),
        (["--collective", "allgather", "-o", "max"], "-o: the all-gather reduces nothing"),
        (["--collective", "reduce_scatter", "-r", "0", "-r", "1"], "the reduce-scatter has no root"),
        (["--collective", "broadcast", "-r", "4096"], "-r/--root 4096: there are"),
        (
            ["--collective", "broadcast", "-a", "ring,ps"],
            "unknown algorithm 'ps'; choose from naive, ring, binomial",
        ),
        (["--collective", "allreduce", "-a", "binomial"], "unknown algorithm 'binomial'"),
        (["--collective", "alltoallv"], "invalid choice: 'alltoallv'"),
        (["--collective", "alltoall", "--in-place"], "the all-to-all has no in-place form"),
        (["--framework", "torch", "--json", "x.json"], "--framework torch prints its own table: no --json"),
    ],
)
def test_what_a_collective_has_no_use_for_is_refused(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The all-reduce's options (wire=, reproducible=), a placement or an op or root that does not
    apply, another collective's algorithm: a usage error naming it, exit 2, nothing run."""
    assert main([*argv, "-b", "8", "-e", "8"]) == 2
    captured = capsys.readouterr()
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert captured.err.count("error:") == 1 and said in captured.err, captured.err
    assert "# hpcring" not in captured.out


def test_matplotlib_is_imported_only_for_plot() -> None:
    code = "import sys, hpcring.bench; print('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


BAD_INPUTS = {
    "unknown-flag": ["--bogus"],
    "bad-size": ["-b", "12Q"],
    "min-gt-max": ["-b", "1M", "-e", "1K"],
    "unknown-algorithm": ["-a", "naive,foo"],
    "unknown-dtype": ["-d", "float8"],
    "op-dtype": ["-o", "mean", "-d", "int32"],
    **({"gpu-without-one": ["--device", "gpu"]} if gpu_problem() else {}),
}


def _header_facts(**changes: object) -> dict:
    """A header as `measure.header_facts` and `guidance_facts` make it, for 2 ranks on one CPU node."""
    facts = {
        "collective": "allreduce",
        "baseline": BARE,
        "busbw_formula": "2(G-1)/G",
        "size_is": None,
        "root": None,
        "hpcring": "0",
        "mpi_library": "Open MPI",
        "mpi4py": "4",
        "ranks": 2,
        "hosts": 1,
        "ranks_per_host": 2,
        "device": "cpu",
        "cuda_aware": False,
        "cuda_aware_reason": "-",
        "topology": {"describe": "1 node x 2 ranks", "two_level": False, "ring_order": "rank order"},
        "baseline_call": "host buffers",
        "dtype": "float32",
        "op": "sum",
        "iters": 20,
        "max_time_s": 1.0,
        "warmup": 5,
        "passes": 1,
        "check": True,
        "agree": True,
        "placement": "out-of-place",
        "time": "median",
        "busbw_factor": 1.0,
        "algorithms": ["ring", "auto"],
        "model": None,
        "model_path": "/home/u/.cache/hpcring/model.json",
        "auto": {
            "tuned": False,
            "why": "no tuning file at /home/u/.cache/hpcring/tuning.json",
            "path": "/home/u/.cache/hpcring/tuning.json",
            "key": None,
            "table": [[65536, "mpi"], [None, "rabenseifner"]],
        },
    }
    facts.update(changes)
    return facts


def test_header_says_auto_is_untuned_and_how_to_fill_predicted() -> None:
    text = format_header(_header_facts())
    assert "# auto: untuned built-in defaults (no tuning file at /home/u/.cache/hpcring/tuning.json)" in text
    assert "mpi up to 64K, rabenseifner above" in text and "--tune" in text
    assert "# predicted: empty (-), no calibrated cost model at /home/u/.cache/hpcring/model.json" in text
    assert "python -m hpcring.model --calibrate" in text and "--ranks 2 --bytes 1M --link ndr400" in text


def test_header_says_which_all_to_all_blocks_auto_sends_ahead() -> None:
    """On 2-4 ranks auto's all-to-all sends equal NumPy blocks ahead of the check (pairwise's
    pattern) before any table applies: the header says up to which size, or that none do."""
    ahead = {**_header_facts()["auto"], "ahead": 256 << 10}
    text = format_header(_header_facts(auto=ahead, collective="alltoall"))
    assert "# auto: equal NumPy blocks up to 256K per rank leave ahead of the check and run pairwise" in text
    text = format_header(_header_facts(auto={**ahead, "ahead": None}, collective="alltoall"))
    assert "equal NumPy blocks of any size leave ahead" in text
    assert "leave ahead" not in format_header(_header_facts(collective="alltoall"))
    assert [exchange.ahead_upto(g) for g in (1, 2, 3, 4, 5)] == [False, None, 256 << 10, 256 << 10, False]


def test_header_says_where_a_tuned_table_and_the_model_come_from() -> None:
    tuned = {
        "tuned": True,
        "why": None,
        "path": "/t.json",
        "key": "2",
        "table": [[4096, "mpi"], [None, "ring"]],
    }
    text = format_header(_header_facts(auto=tuned, model="/m.json"))
    assert "# auto: tuned here, table 2 of /t.json: mpi up to 4K, ring above" in text
    assert "# predicted: the cost model calibrated in /m.json" in text
    assert "untuned" not in text and "empty" not in text
    plain = format_header(_header_facts(algorithms=["ring"]))  # no auto row: nothing to say of it
    assert "# auto:" not in plain and "# predicted: empty" in plain


def test_plot_lines_differ_in_marker_and_style_and_ticks_read_as_sizes() -> None:
    names = [BARE, *ALGORITHMS, "ring+repro", "mpi+repro", "nccl"]
    styles = line_styles(names)
    shapes = [(s["marker"], s["linestyle"], s.get("color")) for s in styles.values()]
    assert len(names) >= 9 and len(set(shapes)) == len(names)
    assert len({s["marker"] for s in styles.values()}) == len(names)  # each marker once up to 12 lines
    assert styles[BARE]["color"] == "black"
    assert size_ticks([8, 64, 512, 4096, 32768, 1 << 18, 1 << 20]) == (
        [8, 64, 512, 4096, 32768, 1 << 18, 1 << 20],
        ["8", "64", "512", "4K", "32K", "256K", "1M"],
    )
    _, labels = size_ticks(sweep(8, 16 << 20, 2, 4))  # 22 sizes: every second one, 1K's among them
    assert labels == ["16", "64", "256", "1K", "4K", "16K", "64K", "256K", "1M", "4M", "16M"]


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
def test_bad_input_exits_2_on_all_ranks_and_says_so_once() -> None:
    """Each bad command line under mpiexec -n 2: status 2, one usage error, no hang (all run at once)."""
    command = [*launch(2), sys.executable, "-m", "hpcring.bench"]
    jobs = {
        name: subprocess.Popen(
            [*command, *bad], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=launcher_env()
        )
        for name, bad in BAD_INPUTS.items()
    }
    failures = {}
    for name, job in jobs.items():
        try:
            stdout, stderr = job.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            job.kill()
            stdout, stderr = job.communicate()
            failures[name] = "hung"
            continue
        if (
            job.returncode != 2
            or stderr.count("python -m hpcring.bench: error:") != 1
            or "# hpcring" in stdout  # nothing ran
        ):
            failures[name] = f"status {job.returncode}\n{stdout}{stderr}"
    assert not failures, failures


# ---------------------------------------------------------------------------------------
# MPI: the bench in-process, at whatever rank count the suite runs.

COMM = MPI.COMM_WORLD


def _shared_dir() -> str:
    """One temporary folder named by rank 0, so every rank knows where rank 0 wrote."""
    return COMM.bcast(tempfile.mkdtemp(prefix="hpcring-bench-") if COMM.Get_rank() == 0 else None)


def _run(argv: list[str], **hook: int) -> tuple[int, dict | None]:
    """main() on every rank; returns its status and, on every rank, rank 0's JSON."""
    folder = _shared_dir()
    path = os.path.join(folder, "bench.json")
    status = main([*argv, "--json", path], **hook)
    report = None
    if COMM.Get_rank() == 0 and os.path.exists(path):
        with open(path) as stream:
            report = json.load(stream)
        shutil.rmtree(folder, ignore_errors=True)
    return status, COMM.bcast(report)


@pytest.mark.mpi
def test_bench_runs_and_writes_every_row() -> None:
    folder = _shared_dir()
    plot = os.path.join(folder, "bench.png")
    status, report = _run([*TINY, "--plot", plot])
    ok = status == 0 and report is not None
    if ok:
        rows = report["rows"]
        cells = {(r["size"], r["algorithm"]) for r in rows}
        ok = (
            len(rows) == 4 * (len(ALGORITHMS) + 1)  # and the bare library call at every size
            and cells == {(s, a) for s in (8, 16, 32, 64) for a in (BARE, *ALGORITHMS)}
            and report["header"]["ranks"] == COMM.Get_size()
            and all(r["wrong"] == 0 and r["iters"] == 2 for r in rows)
            and all(r["time_us_min"] <= r["time_us"] <= r["time_us_max"] for r in rows)
            and all(r["busbw"] == pytest.approx(r["algbw"] * busbw_factor(COMM.Get_size())) for r in rows)
            and [e["size"] for e in report["summary"]] == [8, 16, 32, 64]
            and report["header"]["copyto_GBps"] > 0  # the yardstick of the same run, on the CPU
        )
    if COMM.Get_rank() == 0:
        with open(plot, "rb") as stream:
            ok = ok and stream.read(8) == b"\x89PNG\r\n\x1a\n"
        shutil.rmtree(folder, ignore_errors=True)
    assert everywhere(COMM, ok)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", ["float16", "float64", "bf16"])
def test_measured_bytes_equal_formulas(dtype: str) -> None:
    """What the Channel counted equals the textbook formula on every rank, at odd counts too
    (and every element is right: bfloat16, nccl-tests' bf16, through every algorithm and mpi)."""
    status, report = _run(["-b", "2", "-e", "200", "-f", "1.7", "-n", "2", "-w", "0", "-d", dtype])
    size, itemsize = COMM.Get_size(), np.dtype("bfloat16" if dtype == "bf16" else dtype).itemsize
    problems = [] if status == 0 and report else ["bench failed"]
    for row in (report or {}).get("rows", []):
        n, measured = row["size"], row["bytes_sent_per_rank"]
        ran = row["chosen"] or row["algorithm"]  # what auto picked, else the algorithm itself
        core = 1 << (size.bit_length() - 1)
        if ran in ("mpi", BARE):
            ok = measured is None and row["bytes_sent"] is None
        elif ran == "naive":
            ok = measured == [(size - 1) * n] * size
        elif ran == "ps":
            ok = measured == [(size - 1) * n] + [n] * (size - 1)
        elif ran == "rabenseifner" and core != size:  # each fold pair moves the buffer both ways
            ok = sum(measured) == 2 * (core - 1) * n + 2 * (size - core) * n
        else:
            textbook = 2 * (size - 1) / size * n
            ok = sum(measured) == 2 * (size - 1) * n and all(abs(m - textbook) <= itemsize for m in measured)
        ok = ok and row["bytes_match"] and row["bytes_sent_per_rank"] == row["bytes_expected_per_rank"]
        if not ok:
            problems.append(row)
    assert everywhere(COMM, not problems), problems[:3]


@pytest.mark.mpi
def test_a_corrupted_result_is_counted_and_fails_the_run() -> None:
    last = COMM.Get_size() - 1
    status, report = _run(TINY, corrupt_rank=last)
    ok = status == 1 and report is not None and all(r["wrong"] == 1 for r in report["rows"])
    ok = ok and sum(r["algorithm"] == BARE for r in report["rows"]) == 4  # the bare rows are checked too
    assert everywhere(COMM, ok)


@pytest.mark.mpi
def test_the_bare_call_is_a_checked_row_at_every_size_and_the_footers_yardstick() -> None:
    """Whatever -a says, each size has one MPI_Allreduce row, checked like the others; the
    footer's ratios are busbw / the bare row's busbw (times at one rank, where busbw is 0);
    the JSON has min <= median <= p99 <= max over the per-iteration maxima of every row."""
    status, report = _run([*TINY, "-a", "ring,mpi"])
    ok = status == 0 and report is not None
    problems = [] if ok else ["bench failed"]
    rows = (report or {}).get("rows", [])
    bare = {r["size"]: r for r in rows if r["algorithm"] == BARE}
    if sorted(bare) != [8, 16, 32, 64] or sum(r["algorithm"] == BARE for r in rows) != 4:
        problems.append(("bare rows", sorted(bare)))
    for row in bare.values():
        if row["wrong"] != 0 or row["bytes_sent"] is not None or row["bytes_expected"] is not None:
            problems.append(("bare row", row))
    if report and report["header"]["baseline"] != BARE:
        problems.append(("header", report["header"]["baseline"]))
    for row in rows:
        stats = (row["time_us_min"], row["time_us_median"], row["time_us_p99"], row["time_us_max"])
        if not (stats[0] <= stats[1] <= stats[2] <= stats[3]) or row["time_us_median"] != row["time_us"]:
            problems.append(("statistics", row))
    factor = busbw_factor(COMM.Get_size())
    for entry in (report or {}).get("summary", []):
        base = bare[entry["size"]]
        cells = [r for r in rows if r["size"] == entry["size"]]
        ratios = entry["busbw_vs_baseline"]
        expect = {
            r["algorithm"]: r["busbw"] / base["busbw"] if factor else base["time_us"] / r["time_us"]
            for r in cells
        }
        if (
            entry["baseline"] != BARE
            or set(ratios) != {BARE, "ring", "mpi"}
            or any(ratios[name] != pytest.approx(value, rel=1e-9) for name, value in expect.items())
            or entry["best"] != min(cells, key=lambda r: r["time_us"])["algorithm"]
        ):
            problems.append(("summary", entry))
    status, report = _run([*TINY, "-a", "ring"])
    names = [r["algorithm"] for r in (report or {}).get("rows", [])]
    if status != 0 or names != [BARE, "ring"] * 4:
        problems.append(("-a ring", status, names))
    assert everywhere(COMM, not problems), problems[:3]


@pytest.mark.mpi
def test_a_dtype_mpi_lacks_goes_as_words_with_a_user_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a library without MPI_SHORT_FLOAT: the bare row sends float16 as uint16 words with a
    user-defined op, says so in the header, and every element is right (bfloat16 always goes so)."""
    monkeypatch.setattr(measure, "has_datatype", lambda dtype: dtype != np.float16)
    status, report = _run([*TINY, "-a", "mpi", "-d", "float16", "-o", "max"])
    ok = status == 0 and report is not None
    ok = ok and "user-defined op" in report["header"]["baseline_call"]
    ok = ok and all(r["wrong"] == 0 for r in report["rows"]) and len(report["rows"]) == 8
    assert everywhere(COMM, ok)


def test_median_rows_keeps_the_median_pass_per_row() -> None:
    def row(size: int, algorithm: str, time_us: float) -> Row:
        return Row(size, size // 4, "float32", "sum", algorithm, 1, time_us, time_us, time_us, 1.0, 1.0,
                   None, None, None, None, None)  # fmt: skip

    passes = [
        [row(8, "ring", 5.0), row(8, "mpi", 1.0)],
        [row(8, "ring", 9.0), row(8, "mpi", 3.0)],
        [row(8, "ring", 7.0), row(8, "mpi", 2.0)],
    ]
    assert [(r.algorithm, r.time_us) for r in median_rows(passes)] == [("ring", 7.0), ("mpi", 2.0)]
    assert [r.time_us for r in median_rows(passes[:2])] == [9.0, 3.0]  # even: the upper one
    assert median_rows([passes[0]]) == passes[0]


def test_tuning_table_changes_algorithm_only_past_the_noise() -> None:
    def row(size: int, algorithm: str, time_us: float) -> Row:
        return Row(size, size // 4, "float32", "sum", algorithm, 1, time_us, time_us, time_us, 1.0, 1.0,
                   None, None, None, None, None)  # fmt: skip

    times = {  # size: (mpi, ring, rabenseifner), us
        4: (1.0, 3.0, 2.0),
        8: (1.0, 3.0, 1.04),  # rabenseifner 4% behind mpi: mpi stays
        16: (2.0, 3.0, 1.0),  # rabenseifner ahead by 2x: a new band
        32: (9.0, 5.0, 4.0),
        64: (20.0, 9.9, 10.0),  # the ring 1% ahead: rabenseifner stays
        128: (40.0, 10.0, 20.0),  # the ring ahead by 2x
        256: (80.0, 20.0, 19.5),  # rabenseifner 2.5% ahead: the ring stays, open-ended
    }
    names = ("mpi", "ring", "rabenseifner")
    rows = [row(size, name, t) for size, cell in times.items() for name, t in zip(names, cell, strict=True)]
    rows.append(row(16, "auto", 0.1))  # what auto measured is never a choice
    assert tuning_table(rows, CHOICES) == [[8, "mpi"], [64, "rabenseifner"], [None, "ring"]]
    no_tie = [[8, "mpi"], [32, "rabenseifner"], [128, "ring"], [None, "rabenseifner"]]
    assert tuning_table(rows, CHOICES, tie=0.0) == no_tie  # the fastest at each size, as measured


def test_tuning_table_never_writes_the_bare_call() -> None:
    """auto cannot run the bare library call: its rows are left out even where fastest (`mpi`,
    the same call through hpcring, stands in for it), and the table is the one without them."""

    def row(size: int, algorithm: str, time_us: float) -> Row:
        return Row(size, size // 4, "float32", "sum", algorithm, 1, time_us, time_us, time_us, 1.0, 1.0,
                   None, None, None, None, None)  # fmt: skip

    rows = [row(8, "mpi", 5.0), row(8, "ring", 9.0), row(64, "mpi", 9.0), row(64, "ring", 4.0)]
    bare = [row(8, BARE, 1.0), row(64, BARE, 3.0)]
    assert tuning_table(rows + bare, CHOICES) == tuning_table(rows, CHOICES) == [[8, "mpi"], [None, "ring"]]


def test_the_footer_reads_every_row_against_the_bare_call() -> None:
    def row(size: int, algorithm: str, time_us: float) -> Row:
        return Row(size, size // 4, "float32", "sum", algorithm, 1, time_us, time_us, time_us, 1.0, 1.0,
                   None, None, None, None, 0)  # fmt: skip

    rows = [
        row(8, BARE, 2.0),
        row(8, "mpi", 8.0),
        row(8, "ring", 10.0),
        row(64, BARE, 8.0),
        row(64, "ring", 4.0),
    ]
    summary = summarize(rows)
    assert [e["best"] for e in summary] == [BARE, "ring"]
    assert summary[0]["busbw_vs_baseline"] == {BARE: 1.0, "mpi": 0.25, "ring": 0.2}
    assert summary[1]["busbw_vs_baseline"] == {BARE: 1.0, "ring": 2.0}
    footer = format_footer(rows, summary).splitlines()
    assert (
        footer[1] == f"# best per size, and busbw relative to {BARE} (>1: faster than the bare library call)"
    )
    assert footer[2].split()[1:] == ["size", "best", BARE, "mpi", "ring"]
    assert footer[3].split()[1:] == ["8", BARE, "1.00", "0.25", "0.20"]
    assert footer[4].split()[1:] == ["64", "ring", "1.00", "-", "2.00"]
    assert not any("~" in line for line in footer)


def test_the_footer_marks_rows_too_noisy_to_compare() -> None:
    """The committed sample run once read 2341x for Rabenseifner at 4 KiB: MPI_Allreduce's row there
    took 53 ms, against 38 us at 32 KiB. Such rows, and ratios to them, print `~`."""

    def row(size: int, algorithm: str, time_us: float, fastest: float | None = None) -> Row:
        return Row(size, size // 4, "float32", "sum", algorithm, 20, time_us, fastest or time_us, time_us,
                   1.0, 1.0, None, None, None, None, 0)  # fmt: skip

    rows = [
        row(4096, BARE, 52956.6, 25144.2),  # slower than 32 KiB by 1400x: the whole row was held up
        row(4096, "rabenseifner", 22.6),
        row(32768, BARE, 37.7),
        row(32768, "rabenseifner", 2090.1, 40.8),  # median 51x its fastest iteration
        row(32768, "ring", 68.4, 42.5),  # 1.6x: an ordinary spread
    ]
    assert noisy(rows) == {(4096, BARE), (32768, "rabenseifner")}
    footer = format_footer(rows, summarize(rows)).splitlines()
    assert footer[3].split()[1:] == ["4K", "rabenseifner", "~", "~", "-"]
    assert footer[4].split()[1:] == ["32K", BARE, "1.00", "~", "0.55"]
    assert footer[5].startswith("# ~: 2 of 5 rows too noisy to compare")


class _DeviceArray(np.ndarray):
    """A NumPy array with CuPy's copies to and from the host, to run the GPU path's logic here."""

    def get(self, out: np.ndarray) -> np.ndarray:
        np.copyto(out, self)
        return out

    def set(self, host: np.ndarray) -> None:
        np.copyto(self, host)


@pytest.mark.parametrize("aware", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
def test_bare_call_on_a_gpu_copies_through_the_host_unless_cuda_aware(aware: bool, in_place: bool) -> None:
    """The GPU path's logic without a GPU: NumPy arrays with CuPy's get/set and a fake stream."""
    synced: list[int] = []
    stream = SimpleNamespace(synchronize=lambda: synced.append(1))
    xp = SimpleNamespace(true_divide=np.true_divide, cuda=SimpleNamespace(get_current_stream=lambda: stream))
    dev = Device("gpu", xp, cuda_aware=aware)
    x = np.arange(1.0, 5.0).view(_DeviceArray)
    out = x if in_place else np.zeros(4).view(_DeviceArray)
    call, result = bare_call(
        MPI.COMM_SELF, dev, COLLECTIVES["allreduce"], Buffers(x, out, out), in_place, "mean"
    )
    call()
    assert result is out and np.array_equal(out, np.arange(1.0, 5.0))  # one rank: the input itself
    assert bool(synced) == aware  # straight to MPI only after the stream's work is done
    assert measure.bare_description(dev, np.dtype("float32")).startswith("device buffers straight") == aware


@pytest.mark.parametrize("name", ["reduce_scatter", "allgather", "broadcast"])
@pytest.mark.parametrize("in_place", [False, True])
def test_every_bare_call_on_a_gpu_carries_its_buffers_through_the_host(name: str, in_place: bool) -> None:
    """Each collective's bare call, staged as on a GPU without CUDA-aware MPI: what MPI wrote comes
    back to the device buffer that holds the result (one rank: the input itself, or the root's)."""
    kind = COLLECTIVES[name]
    if in_place and kind.in_place_only:
        pytest.skip("always in place")
    stream = SimpleNamespace(synchronize=lambda: None)
    xp = SimpleNamespace(
        empty=lambda *shape, **kw: np.empty(*shape, **kw).view(_DeviceArray),
        empty_like=lambda a: np.empty_like(a).view(_DeviceArray),
        true_divide=np.true_divide,
        cuda=SimpleNamespace(get_current_stream=lambda: stream),
    )
    x = np.arange(1.0, 6.0).view(_DeviceArray)
    b = kind.buffers(xp, x, in_place, 0, 1)
    op = "mean" if kind.reduces else None
    call, result = bare_call(MPI.COMM_SELF, Device("gpu", xp), kind, b, in_place, op)
    if not np.shares_memory(b.out, b.x):
        b.out[...] = -1  # stale
    call()
    assert np.array_equal(np.asarray(result).reshape(-1), np.arange(1.0, 6.0))


@pytest.mark.mpi
def test_tune_writes_a_table_auto_reads(monkeypatch) -> None:
    """`--tune` measures, writes this rank count's table (merged into the file), and auto loads it."""
    folder = _shared_dir()
    path = Path(folder) / "tuning.json"
    if COMM.Get_rank() == 0:
        path.write_text(json.dumps({"format": tuning.FORMAT, "tables": {"999": [[None, "ps"]]}}))
    COMM.Barrier()
    monkeypatch.setenv("HPCRING_TUNING", str(path))
    config.reload()
    before, untuned = _run([*TINY, "-a", "auto"])
    status, _ = _run([*TINY, "-a", "ring,mpi", "--passes", "2", "--tune"])
    after, tuned = _run([*TINY, "-a", "auto"])
    ok = status == before == after == 0 and untuned is not None and tuned is not None
    if ok:  # the header says which table auto ran: the defaults while none for this count, then the tuned
        size = str(COMM.Get_size())
        was, now = untuned["header"]["auto"], tuned["header"]["auto"]
        ok = not was["tuned"] and f"no entry for {size} ranks" in was["why"]
        ok = ok and now["tuned"] and now["key"] == size and now["path"] == str(path) and now["why"] is None
    if COMM.Get_rank() == 0:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a table for this rank count is there: no fallback
            table = tuning.load(COMM.Get_size(), path)
        names = {name for _, name in table}
        kept = tuning.load(999, path) == ((None, "ps"),)  # other rank counts' tables stay
        ok = ok and kept and table[-1][0] is None and names <= {"ring", "mpi"}
        shutil.rmtree(folder, ignore_errors=True)
    assert everywhere(COMM, ok)


@pytest.mark.mpi
def test_passes_keep_every_pass_and_one_row_per_cell() -> None:
    status, report = _run([*TINY, "-a", "ring,mpi", "--passes", "3"])
    ok = status == 0 and report is not None
    if ok:
        cells = [(r["size"], r["algorithm"]) for r in report["rows"]]
        ok = (
            report["header"]["passes"] == 3
            and len(report["passes"]) == 3
            and all([(r["size"], r["algorithm"]) for r in one] == cells for one in report["passes"])
            and all(
                sorted(one[i]["time_us"] for one in report["passes"])[1] == report["rows"][i]["time_us"]
                for i in range(len(cells))
            )
        )
    assert everywhere(COMM, ok)


@pytest.mark.mpi
def test_interleaved_cells_keep_their_own_rows_traffic_and_checks() -> None:
    """--interleave times a size's cells call by call in turn: the same cells in the same order,
    each row's bytes its own calls' (counted per cell, so the rows that share a channel do not
    add up each other's traffic: the formulas would disagree), every row checked, in place too,
    and a wrong element caught in every row."""
    cells = ["ring", "naive", "mpi", "auto"]
    status, report = _run([*TINY, "-a", ",".join(cells), "--interleave", "--passes", "2"])
    ok = status == 0 and report is not None and report["header"]["interleaved"] is True
    if ok:
        rows = report["rows"]
        ok = [r["algorithm"] for r in rows] == [BARE, *cells] * 4 and len(report["passes"]) == 2
        ok = ok and all(r["wrong"] == 0 and r["bytes_match"] and r["iters"] == 2 for r in rows)
        sized = [r for r in rows if r["algorithm"] in ("ring", "naive") and COMM.Get_size() > 1]
        ok = ok and all(r["bytes_sent"] for r in sized)  # counted, not zero
    status, report = _run([*TINY, "-a", "ring,mpi", "--interleave", "--in-place"], corrupt_rank=0)
    ok = ok and status == 1 and report is not None and all(r["wrong"] == 1 for r in report["rows"])
    assert everywhere(COMM, ok)


@pytest.mark.mpi
def test_in_place_rows_are_checked_from_the_input_each_time() -> None:
    """In place every algorithm's result is checked (each call starts from the input again,
    or the sums would compound), and a corrupted element is still caught."""
    status, report = _run([*TINY, "--in-place"])
    ok = status == 0 and report is not None
    ok = ok and report["header"]["placement"].startswith("in place")
    ok = (
        ok
        and all(r["wrong"] == 0 for r in report["rows"])
        and len(report["rows"]) == 4 * (len(ALGORITHMS) + 1)
    )
    status, report = _run([*TINY, "--in-place", "-a", "ring"], corrupt_rank=0)
    ok = ok and status == 1 and report is not None and all(r["wrong"] == 1 for r in report["rows"])
    assert everywhere(COMM, ok)


@pytest.mark.mpi
def test_check_off_reports_nothing_wrong() -> None:
    status, report = _run([*TINY, "-c", "0", "-a", "ring,mpi"], corrupt_rank=0)
    ok = status == 0 and report is not None and all(r["wrong"] is None for r in report["rows"])
    assert everywhere(COMM, ok and len(report["rows"]) == 12)  # ring, mpi and the bare call, 4 sizes


@pytest.mark.mpi
def test_nccl_that_cannot_run_is_reported_not_run() -> None:
    """On the CPU (or GPUs shared by ranks) the bench says why NCCL did not run, and runs the rest."""
    status, report = _run([*TINY, "-a", "ring,nccl", "--device", "auto"])
    ok = status == 0 and report is not None
    if ok and report["header"]["device"] == "cpu":
        ok = report["header"]["not_run"] == {"nccl": "needs --device gpu"}
    ok = ok and {r["algorithm"] for r in report["rows"]} <= {BARE, "ring", "nccl"}
    ran = any(r["algorithm"] == "nccl" for r in report["rows"]) if ok else False
    ok = ok and ("nccl" in report["header"]["not_run"]) != ran
    assert everywhere(COMM, ok)


@pytest.mark.mpi
def test_bad_input_returns_2_everywhere_printed_by_rank_0_only(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["-b", "1M", "-e", "1K"])
    err = capsys.readouterr().err
    printed = err.count("error: minbytes") == 1
    assert everywhere(COMM, status == 2 and printed == (COMM.Get_rank() == 0))


@pytest.mark.mpi
@pytest.mark.gpu  # runs everywhere; marked so that tests/gpu/check.sh runs it where it matters
def test_the_device_is_agreed_when_one_rank_may_not_use_a_gpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 0 alone told HPCRING_DEVICE=cpu: `--device gpu` fails on every rank (rank 0 says
    which rank and why), and `auto` runs on the CPU everywhere, instead of some ranks entering
    select_device's collective while the others start the sweep. On a machine with GPUs this is
    the mixed case; without one every rank agrees anyway."""
    if COMM.Get_rank() == 0:
        monkeypatch.setenv("HPCRING_DEVICE", "cpu")
        config.reload()
    status = main([*TINY, "-a", "ring", "--device", "gpu"])
    err = capsys.readouterr().err
    said = err.count("error: --device gpu: HPCRING_DEVICE=cpu is set (rank 0;") == (COMM.Get_rank() == 0)
    ok = status == 2 and said
    status, report = _run([*TINY, "-a", "ring", "--device", "auto"])
    ok = ok and status == 0 and report is not None and report["header"]["device"] == "cpu"
    assert everywhere(COMM, ok)


@pytest.mark.mpi
def test_a_usage_error_on_one_rank_stops_every_rank(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--plot where only the last rank lacks matplotlib: every rank returns 2 and rank 0 says
    why (the last rank returned alone and rank 0 went on into the sweep, and hung)."""
    if COMM.Get_rank() == COMM.Get_size() - 1:
        monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed here
    folder = _shared_dir()
    status = main([*TINY, "-a", "ring", "--plot", os.path.join(folder, "never.png")])
    said = capsys.readouterr().err.count("error: --plot needs matplotlib") == (COMM.Get_rank() == 0)
    assert everywhere(COMM, status == 2 and said)


# ---------------------------------------------------------------------------------------
# MPI: the other collectives (--collective), each against its own bare library call.

OTHERS = ["reduce_scatter", "allgather", "broadcast"]
WITH_ALLTOALL = [*OTHERS, "alltoall"]


def _swept(collective: str, low: int = 8, high: int = 64, factor: float = 2, itemsize: int = 4) -> list[int]:
    """The sizes the bench sweeps for ``collective`` here (an all-gather's: G whole inputs)."""
    return sweep(low, high, factor, COLLECTIVES[collective].granule(itemsize, COMM.Get_size()))


@pytest.mark.mpi
@pytest.mark.parametrize("collective", WITH_ALLTOALL)
def test_each_collective_has_its_rows_checked_and_read_against_its_bare_call(collective: str) -> None:
    """Every algorithm of the collective's table and its bare call at every size, every element
    right, bytes on the formula, busbw = algbw x nccl-tests' factor with algbw = size / time (size:
    the whole buffer), and the footer's ratios against the bare row of the same run."""
    kind, size = COLLECTIVES[collective], COMM.Get_size()
    status, report = _run([*TINY, "--collective", collective])
    rows = (report or {}).get("rows", [])
    names = (kind.bare, *algorithms.portable(collective))
    sizes = _swept(collective)
    problems = [] if status == 0 and report else [("status", status)]
    if {(r["size"], r["algorithm"]) for r in rows} != {(n, a) for n in sizes for a in names} or len(
        rows
    ) != len(sizes) * len(names):
        problems.append(("cells", [(r["size"], r["algorithm"]) for r in rows]))
    header = (report or {}).get("header", {})
    if (header.get("collective"), header.get("baseline")) != (collective, kind.bare) or header.get(
        "busbw_factor"
    ) != busbw_factor(size, collective):
        problems.append(("header", header))
    factor = busbw_factor(size, collective)
    for row in rows:
        visible = (row["chosen"] or row["algorithm"]) not in (kind.bare, "mpi")  # MPI's traffic is not
        if (
            row["wrong"] != 0
            or not row["bytes_match"]
            or (row["bytes_sent"] is not None) != visible
            or row["count"] != kind.count(row["size"], size, 4)
            or row["op"] != ("sum" if kind.reduces else "none")
            or row["algbw"] != pytest.approx(row["size"] / row["time_us"] / 1e3)
            or row["busbw"] != pytest.approx(row["algbw"] * factor)
        ):
            problems.append(("row", row))
    for entry in (report or {}).get("summary", []):
        cells = {r["algorithm"]: r for r in rows if r["size"] == entry["size"]}
        bare = cells[kind.bare]["time_us"]
        expect = {name: bare / r["time_us"] for name, r in cells.items()}
        ratios = entry["busbw_vs_baseline"]
        if entry["baseline"] != kind.bare or set(ratios) != set(expect):
            problems.append(("summary", entry))
        elif any(ratios[name] != pytest.approx(value) for name, value in expect.items()):
            problems.append(("ratios", entry))
    assert everywhere(COMM, not problems), problems[:3]


@pytest.mark.mpi
@pytest.mark.parametrize("collective", WITH_ALLTOALL)
def test_bytes_of_every_collective_equal_their_closed_forms(collective: str) -> None:
    """What the Channel counted, at odd sizes in float16 and, for the broadcast, from the last rank:
    the reduce-scatter sends every part but its own (ring, naive), the all-gather G-1 rows (ring,
    naive, Rabenseifner at a power of two), every broadcast G-1 buffers in all, the all-to-all
    G-1 blocks (pairwise) or each block once per bit of its index (bruck); MPI's own: nothing
    visible. Every element is right too."""
    size = COMM.Get_size()
    root = ["-r", str(size - 1)] if collective == "broadcast" else []
    argv = [
        "--collective",
        collective,
        "-b",
        "2",
        "-e",
        "200",
        "-f",
        "1.7",
        "-n",
        "2",
        "-w",
        "0",
        "-d",
        "float16",
    ]
    status, report = _run([*argv, *root])
    core = 1 << (size.bit_length() - 1)
    problems = [] if status == 0 and report else ["bench failed"]
    for row in (report or {}).get("rows", []):
        measured, ran = row["bytes_sent_per_rank"], row["chosen"] or row["algorithm"]
        n = row["count"] * 2  # each rank's input, in bytes
        if ran in ("mpi", COLLECTIVES[collective].bare):
            ok = measured is None
        elif collective == "reduce_scatter" and (ran != "rabenseifner" or core == size):
            ok = measured == [n - (stop - start) * 2 for start, stop in segment_bounds(row["count"], size)]
        elif collective == "allgather" and (ran != "rabenseifner" or core == size):
            ok = measured == [(size - 1) * n] * size
        elif collective == "broadcast":
            ok = sum(measured) == (size - 1) * n and (ran != "naive" or measured[size - 1] == (size - 1) * n)
        elif (
            collective == "alltoall"
        ):  # every block but its own (pairwise); once per bit of its index (bruck)
            moved = (size - 1) if ran == "pairwise" else sum(bin(i).count("1") for i in range(size))
            ok = measured == [moved * n // size] * size
        else:  # Rabenseifner's fold pairs: the formula of the module, checked serially against closed forms
            ok = measured is not None
        if not (ok and row["bytes_match"] and row["wrong"] == 0):
            problems.append(row)
    assert everywhere(COMM, not problems), problems[:3]


@pytest.mark.mpi
def test_uneven_all_to_all_rows_against_mpi_alltoallv() -> None:
    """--uneven: every algorithm that runs uneven blocks beside MPI_Alltoallv, every element right,
    pairwise's bytes every block but its own; bruck, equal blocks only, is refused by name."""
    size = COMM.Get_size()
    status, report = _run([*TINY, "--collective", "alltoall", "--uneven"])
    rows = (report or {}).get("rows", [])
    names = {r["algorithm"] for r in rows}
    ok = status == 0 and names == {"MPI_Alltoallv", "pairwise", "mpi", "auto"}
    ok = ok and report["header"]["baseline"] == "MPI_Alltoallv"
    for row in rows:
        ok = ok and row["wrong"] == 0 and row["bytes_match"]
        if row["algorithm"] == "pairwise":
            own = row["count"] * 1 // (size * (size + 1) // 2)  # part[0]: a 1/(1+...+G) share
            ok = ok and row["bytes_sent_per_rank"] == [(row["count"] - own) * 4] * size
    assert everywhere(COMM, ok)
    assert main([*TINY, "--collective", "alltoall", "--uneven", "-a", "bruck"]) == 2


@pytest.mark.mpi
@pytest.mark.parametrize("collective", OTHERS)
def test_a_wrong_element_of_any_collective_fails_the_run(collective: str) -> None:
    """Rank 0 spoils one element of its result after each checked call: every row counts it, the
    bare call's too, and the exit status is 1. In place (where there is a choice) likewise, and
    without the spoiling every in-place row is right."""
    kind = COLLECTIVES[collective]
    status, report = _run([*TINY, "--collective", collective, "-a", "ring"], corrupt_rank=0)
    rows = (report or {}).get("rows", [])
    ok = status == 1 and len(rows) == 2 * len(_swept(collective)) and all(r["wrong"] == 1 for r in rows)
    if not kind.in_place_only:
        status, report = _run([*TINY, "--collective", collective, "--in-place", "-a", "ring,mpi"])
        rows = (report or {}).get("rows", [])
        ok = ok and status == 0 and all(r["wrong"] == 0 and r["bytes_match"] for r in rows)
        ok = (
            ok
            and report["header"]["placement"].startswith("in place")
            and len(rows) == 3 * len(_swept(collective))
        )
        status, report = _run([*TINY, "--collective", collective, "--in-place", "-a", "ring"], corrupt_rank=0)
        ok = ok and status == 1 and all(r["wrong"] == 1 for r in report["rows"])
    assert everywhere(COMM, ok)


@pytest.mark.mpi
@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
def test_tune_writes_the_collectives_table_that_auto_reads(
    collective: str, monkeypatch: pytest.MonkeyPatch, fresh_world: MPI.Intracomm
) -> None:
    """`--tune --collective X` writes the table "X:G" beside the others, by each rank's input
    bytes (an all-gather's a G-th of the row's size); the bench's header then says auto runs it,
    and auto on a communicator that had not read the file yet chooses from it at every size swept.
    (Not the bench's own auto rows here: COMM_WORLD keeps the table it read first, and earlier
    tests of this process ran auto on it; a bench run is a process of its own.)"""
    folder = _shared_dir()
    path = Path(folder) / "tuning.json"
    size = COMM.Get_size()
    if COMM.Get_rank() == 0:
        path.write_text(json.dumps({"format": tuning.FORMAT, "tables": {str(size): [[None, "ps"]]}}))
    COMM.Barrier()
    monkeypatch.setenv("HPCRING_TUNING", str(path))
    config.reload()
    status, _ = _run([*TINY, "--collective", collective, "-a", "ring,naive", "--passes", "2", "--tune"])
    after, tuned = _run([*TINY, "--collective", collective, "-a", "auto"])
    key = f"{collective}:{size}"
    ok = status == after == 0 and tuned is not None
    table = None
    if COMM.Get_rank() == 0:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # both tables are there: no fallback, no warning
            table = tuning.load(key, path)
            ok = ok and tuning.load(size, path) == ((None, "ps"),)  # the all-reduce's table is kept
    table = COMM.bcast(table)
    ok = ok and {name for _, name in table} <= {"ring", "naive"} and table[-1][0] is None
    if ok:
        facts = tuned["header"]["auto"]
        ok = facts["tuned"] and facts["key"] == key and [tuple(t) for t in facts["table"]] == list(table)
    from hpcring.algorithms import auto
    from hpcring.arrays import adapter_for
    from hpcring.comm import channel_for

    channel = channel_for(fresh_world, adapter_for(np.empty(0)))  # collective: its first use
    for nbytes in _swept(collective):
        mine = input_bytes(nbytes, size, collective)  # what auto chooses by: each rank's input
        fresh = auto.chosen(channel, mine, False, collective, algorithms.choices(collective))
        ok = ok and fresh == tuning.choose(mine, table)
    if COMM.Get_rank() == 0:
        shutil.rmtree(folder, ignore_errors=True)
    assert everywhere(COMM, ok)


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
def test_a_tuned_all_gather_runs_its_table_in_the_next_bench(tmp_path: Path) -> None:
    """The whole loop, as a user runs it: `--tune --collective allgather`, then a bench of auto in a
    new job; each auto row ran what the table says for its input (a G-th of the row's size)."""
    env = {**launcher_env(), "HPCRING_TUNING": str(tmp_path / "tuning.json")}
    bench = [*launch(2), sys.executable, "-m", "hpcring.bench", *TINY, "--collective", "allgather"]
    for extra in (["-a", "ring,naive", "--tune"], ["-a", "auto", "--json", str(tmp_path / "auto.json")]):
        done = subprocess.run([*bench, *extra], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
    table = tuning.load("allgather:2", tmp_path / "tuning.json")
    rows = json.loads((tmp_path / "auto.json").read_text())["rows"]
    chosen = [(r["size"], r["chosen"]) for r in rows if r["algorithm"] == "auto"]
    assert chosen == [
        (r["size"], tuning.choose(r["count"] * 4, table)) for r in rows if r["algorithm"] == "auto"
    ]
    assert len(chosen) == 4 and {name for _, name in chosen} <= {"ring", "naive"}


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
def test_startup_and_step_loop_modes() -> None:
    """--startup prints the first call beside MPI's; --step-loop a table of its four rows, quiet
    and beside a busy process, each with its ratio to the bare row (exit 0: the modes time,
    they check nothing)."""
    startup = run_job(["-m", "hpcring.bench", "--startup"])
    assert len(startup) == 1 and startup[0].startswith("# first call: hpcring's import and first auto")
    assert "the bare first MPI_Allreduce" in startup[0]
    lines = run_job(["-m", "hpcring.bench", "--step-loop", "--steps", "20", "--passes", "1", "--busy", "1"])
    assert lines[0].startswith("# step loop: 2 ranks, 20 steps")
    assert all(row in lines[1] for row in ("MPI_Allreduce", "hpcring", "check=False", "plan"))
    quiet, busy = lines[2], lines[3]
    assert quiet.split()[0] == "quiet" and busy.startswith("  beside 1 busy")
    assert quiet.count("x)") == busy.count("x)") == 4 and "(1.00x)" in quiet
