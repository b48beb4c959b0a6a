"""The parallelism examples, in this process under mpiexec, each matching gloo in float64: pipeline
(GPipe and 1F1B, one stage per rank: 2, 3 and 4 stages), tensor (Colwise/Rowwise on a 1-D mesh),
expert (mixture of experts, uneven all-to-alls with autograd) and FSDP2 x TP (a 2 x 2 mesh, at 4
ranks). Each example trains the same model on hpcring's group and on gloo's; the test reads what
it printed: the digest line of each run on every rank, and rank 0's table, whose last column is
the largest difference between the two runs' final weights (<= 1e-12)."""

from __future__ import annotations

import importlib

import pytest
from helpers import everywhere
from mpi4py import MPI

pytest.importorskip("torch", reason="needs PyTorch: pip install -e '.[torch]' in hpcring's clone")

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD
G = WORLD.size

CASES = [
    # (example, its runs, the rank counts it runs at here, its flags)
    ("torch_pipeline", ["GPipe", "1F1B"], {2, 3, 4}, ["--steps", "3"]),
    ("torch_tensor", ["TP"], {2, 4}, ["--steps", "3"]),
    ("torch_moe", ["MoE"], {2, 3, 4}, ["--steps", "3"]),
    ("torch_2d", ["FSDP2 x TP"], {4}, ["--steps", "3"]),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("example", "runs", "ranks", "flags"), CASES, ids=[c[0] for c in CASES])
def test_the_example_matches_gloo(
    example: str, runs: list[str], ranks: set[int], flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    if G not in ranks:
        pytest.skip(f"{example} runs here at {sorted(ranks)} ranks")
    module = importlib.import_module(f"hpcring.examples.{example}")
    assert module.main(flags) == 0
    lines = capsys.readouterr().out.splitlines()
    ok = True
    for backend in ("hpcring", "gloo"):
        ok &= sum(f" on {backend}: weights " in line for line in lines) == len(runs)
    if WORLD.rank == 0:
        for run in runs:
            row = next((line for line in lines if line.startswith(f"| {run} |")), None)
            ok &= row is not None and float(row.split("|")[-2]) <= 1e-12
    assert everywhere(WORLD, ok), lines
