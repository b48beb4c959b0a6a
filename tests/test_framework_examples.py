"""The PyTorch and JAX examples at 2 ranks, as subprocesses (a serial test launches the jobs), and
``import hpcring`` never importing either framework.

torch_ddp: the final weights are the same line on every rank; with the hpcring hook they equal
DDP's own gloo all-reduce to float32 tolerance, and in float64 a one-process run of the same
global batch to 1e-12."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import mpiexec, run_example

needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")


def test_import_hpcring_imports_no_framework() -> None:
    code = (
        "import sys, hpcring, hpcring.collectives, hpcring.training, hpcring.nonblocking\n"
        "import hpcring.arrays as a\n"
        "a.available()\n"
        "assert not {'torch', 'jax', 'jaxlib'} & set(sys.modules), sorted(sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@needs_mpiexec
@pytest.mark.timeout(900)
def test_torch_ddp_hook_matches_gloo_and_one_process(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="needs PyTorch: pip install -e '.[torch]' in hpcring's clone")
    pytest.importorskip("sklearn", reason="needs scikit-learn: pip install -e '.[train]' in hpcring's clone")
    common = ["--steps", "5", "--dtype", "float64"]
    weights = {}
    for name, flags, ranks in [
        ("hook", ["--algorithm", "ring"], 2),
        ("gloo", ["--gloo"], 2),
        ("alone", [], 1),
    ]:
        lines = run_example(
            "torch_ddp", *common, *flags, "--save", str(tmp_path / f"{name}.npy"), ranks=ranks
        )
        digests = [line for line in lines if line.startswith("torch_ddp: weights ")]
        assert len(digests) == ranks and len(set(digests)) == 1, lines  # the same weights on every rank
        assert any(line.startswith("loss: ") and "ms per step" in line for line in lines), lines
        weights[name] = np.load(tmp_path / f"{name}.npy")
    assert np.allclose(weights["hook"], weights["gloo"], rtol=1e-5, atol=1e-6)
    assert np.max(np.abs(weights["hook"] - weights["alone"])) < 1e-12


@needs_mpiexec
@pytest.mark.timeout(300)
def test_jax_step_gives_the_same_weights_on_every_rank() -> None:
    pytest.importorskip("jax", reason="needs JAX: pip install -e '.[jax]' in hpcring's clone")
    lines = run_example("jax_step", "--steps", "10")
    digests = [line for line in lines if line.startswith("jax_step: weights ")]
    assert len(digests) == 2 and len(set(digests)) == 1, lines
    assert any(line.startswith("loss: ") for line in lines), lines


@needs_mpiexec
@pytest.mark.timeout(300)
def test_jax_train_matches_the_numpy_example() -> None:
    """jax.jit around the whole step, hpcring.jax.allreduce inside: the NumPy example's weights
    (float64: to rounding), the same on every rank, and mpi4jax's where it is installed."""
    pytest.importorskip("jax", reason="needs JAX: pip install -e '.[jax]' in hpcring's clone")
    pytest.importorskip("sklearn", reason="needs scikit-learn: pip install -e '.[train]' in hpcring's clone")
    lines = run_example("jax_train", "--steps", "12", "--dtype", "float64", "--algorithm", "ring")
    gaps = {
        line.split(" - ")[1].split(":")[0]: float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("largest weight difference")
    }
    assert gaps.get("numpy example", 1.0) < 1e-6, lines
    assert all(gap < 1e-6 for gap in gaps.values()), lines
    assert "weights identical on every rank: True" in lines, lines
    assert any(line.startswith("hpcring.jax (ring)") and "median step" in line for line in lines), lines


@needs_mpiexec
@pytest.mark.timeout(600)
def test_torch_fsdp_on_hpcring_matches_gloo() -> None:
    """DDP and FSDP2 with no hook on the hpcring backend end with gloo's weights (float64, 1e-12),
    the same on every rank, and the table of step times is printed."""
    pytest.importorskip("torch", reason="needs PyTorch: pip install -e '.[torch]' in hpcring's clone")
    pytest.importorskip("sklearn", reason="needs scikit-learn: pip install -e '.[train]' in hpcring's clone")
    lines = run_example("torch_fsdp", "--steps", "4", "--hidden", "32")
    for strategy in ("DDP", "FSDP2"):
        for backend in ("hpcring", "gloo"):
            runs = {line for line in lines if line.startswith(f"torch_fsdp: {strategy} on {backend}: ")}
            assert len(runs) == 1, lines  # every rank printed the same digest
        row = next(line for line in lines if line.startswith(f"| {strategy} |"))
        assert float(row.split("|")[4]) <= 1e-12, row
