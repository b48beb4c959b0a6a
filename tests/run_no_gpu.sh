#!/usr/bin/env bash
# The tests that meet CuPy, on a machine where CuPy is installed but sees no GPU: the serial
# tests of the files that name CuPy or the GPU, then the device, bench and staging tests at 2
# ranks. Refuses to run where CuPy is
# missing or a GPU is visible, so a green run means this case was really tested.
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/launcher.sh  # MPIEXEC: Open MPI's or MPICH's, more ranks than cores allowed
export PYTHONUNBUFFERED=1
python - <<'PY'
import sys

from hpcring.gpu import cupy, gpu_problem

if cupy is None or not gpu_problem().startswith("CuPy sees no GPU"):
    sys.exit(f"tests/run_no_gpu.sh needs CuPy installed and no GPU; here: {gpu_problem() or 'a GPU'}")
print("CuPy", cupy.__version__, "installed;", gpu_problem())
PY
# The test files that meet CuPy or the GPU path (they name it), on two pytest-xdist workers as
# tests/run.sh runs the serial tests; the rest of the suite does not change with CuPy installed,
# and the main suite has run it. Not here either, though they name the GPU: the framework
# examples and the docs' commands (no GPU-path test; torch and the examples are run by the main
# suite), and the stall and flight-recorder jobs (mpiexec runs of NumPy arrays, about two
# minutes together).
mapfile -t files < <(grep -liE 'cupy|gpu' tests/test_*.py \
  | grep -vE 'test_(framework_examples|docs_commands|stall|flight)\.py$')
python -m pytest -q -n 2 --dist worksteal "${files[@]}" "$@"
timeout --signal=KILL 600 "${MPIEXEC[@]}" -n 2 python -m pytest -q --with-mpi -m mpi \
  tests/test_device.py tests/test_bench.py tests/test_staging.py "$@"
