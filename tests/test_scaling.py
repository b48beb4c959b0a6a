"""The scaling report: synthetic bench.json files in, table, JSON and PNG out. Serial, no MPI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpcring import scaling


def bench_file(path: Path, ranks: int, rows: list[tuple[str, int, float, float, int]], mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "header": {"ranks": ranks, "hosts": max(1, ranks // 8)},
        "rows": [{"algorithm": a, "size": s, "time_us": t, "busbw": b, "wrong": w} for a, s, t, b, w in rows],
    }
    path.write_text(json.dumps(data))
    os.utime(path, (mtime, mtime))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    for i, ranks in enumerate((8, 16, 32)):
        rows = [
            ("ring", 8, 10.0 * ranks, 0.0, 0),
            ("mpi", 8, 5.0 * ranks, 0.0, 0),
            ("ring", 1 << 20, 100.0 + ranks, 20.0 - i, 0),
            ("mpi", 1 << 20, 120.0 + ranks, 18.0 - i, 0),
        ]
        bench_file(tmp_path / f"hpcring-ring-{ranks}" / "bench.json", ranks, rows, 1000.0 + i)
    (tmp_path / "hpcring-ring-8" / "env.json").write_text(json.dumps({"world_size": 8}))
    return tmp_path


def test_report(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert scaling.main([str(sweep)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert "8 ranks on 1, 16 ranks on 2, 32 ranks on 4" in lines[1]
    ring_small = next(line for line in lines if line.split()[:2] == ["8", "ring"])
    assert ring_small.split()[3:6] == ["80.0", "160.0", "320.0"]
    assert (sweep / "scaling.txt").read_text() == text
    assert len(json.loads((sweep / "scaling.json").read_text())) == 12
    assert (sweep / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A second report over the same folder ignores its own scaling.json.
    assert scaling.main([str(sweep), "--no-plot"]) == 0


def test_later_run_at_same_ranks_wins(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench_file(sweep / "rerun" / "bench.json", 16, [("ring", 8, 1.5, 0.0, 0)], 2000.0)
    points, warnings = scaling.load(sweep)
    assert {p.time_us for p in points if p.ranks == 16} == {1.5}
    assert len(warnings) == 1 and "rerun" in warnings[0]


def test_wrong_elements_fail_the_report(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench_file(sweep / "bad" / "bench.json", 64, [("ring", 8, 1.0, 0.0, 3)], 3000.0)
    assert scaling.main([str(sweep), "--no-plot"]) == 1
    assert "WRONG" in capsys.readouterr().out


def test_empty_folder_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert scaling.main([str(tmp_path)]) == 1
    assert "no bench.json" in capsys.readouterr().err


def test_columns_line_up_with_the_bare_mpi_row() -> None:
    """The bare row's name (MPI_Allreduce, 13 characters) is wider than the default column."""
    from hpcring.scaling import Point, table

    points = [
        Point(ranks, 1, name, 1024, 10.0 * ranks, 0.5, 0, "x.json")
        for ranks in (2, 4)
        for name in ("ring", "MPI_Allreduce")
    ]
    lines = table(points).splitlines()[2:]
    assert len(lines) == 3 and len({line.index("|") for line in lines}) == 1
