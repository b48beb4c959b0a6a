"""tools/call_cost.py runs at one rank and prints (and writes to JSON) every row it was asked for.

Tiny settings, as a subprocess: a smoke test of the script, not a timing (timings are the
script's job, on a quiet machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import launcher_env

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--sizes", "8,64", "-d", "float32,float64", "--passes", "1", "--iters", "5", "--warmup", "1"]


def call_cost(*args: str) -> str:
    env = launcher_env()
    env["PYTHONPATH"] = str(ROOT)  # this tree's hpcring, as the script's users pick theirs
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "call_cost.py"), *TINY, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def table(stdout: str) -> list[list[str]]:
    """The data lines of the table, split on whitespace (cells are ``us (ratio)`` pairs)."""
    return [line.split() for line in stdout.splitlines() if line and not line.startswith("#")]


def test_every_size_dtype_and_variant(tmp_path: Path) -> None:
    stdout = call_cost("--json", str(tmp_path / "rows.json"))
    lines = stdout.splitlines()
    assert lines[0].startswith("# call_cost: G=1  MPI: ") and str(ROOT / "hpcring") in lines[0], stdout
    assert lines[2].split()[1:] == ["size", "type", "iters", "bare", "mpi:nocheck", "mpi", "auto", "ring"]
    rows = table(stdout)
    expected = [[size, dtype] for dtype in ("float32", "float64") for size in ("8", "64")]
    assert [row[:2] for row in rows] == expected, stdout
    assert all(len(row) == 3 + 1 + 2 * 4 and row[5].endswith("x)") for row in rows), stdout
    report = json.loads((tmp_path / "rows.json").read_text())
    assert report["header"]["ranks"] == 1 and len(report["rows"]) == 4 * 5
    for row in report["rows"]:
        assert row["min_us"] <= row["median_us"] <= row["max_us"] and len(row["passes_us"]) == 1


def test_python_only_against_copyto() -> None:
    stdout = call_cost("--python-only", "--rows", "mpi:nocheck,mpi")
    assert stdout.splitlines()[2].split()[-3:] == ["copyto", "mpi:nocheck", "mpi"], stdout
    rows = table(stdout)
    assert len(rows) == 4 and all(row[5].startswith(("(+", "(-")) for row in rows), stdout
