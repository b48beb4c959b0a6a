#!/usr/bin/env bash
# The tests that meet CuPy, on a machine where CuPy is installed but sees no GPU: the serial
# suite, then the device, bench and staging tests at 2 ranks. Refuses to run where CuPy is
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
# The framework examples are not GPU-path tests, and the main suite has run them (there torch's
# abort at exit, a gloo thread needing the GIL as the interpreter ends, is what
# hpcring.torch.destroy_process_group's pause prevents).
# The docs' commands, and the stall and flight-recorder jobs (mpiexec runs of NumPy arrays, about
# two minutes together), are not GPU-path tests either: the main suite runs them.
# Two pytest-xdist workers, as tests/run.sh runs the serial tests.
python -m pytest -q -n 2 --ignore=tests/test_framework_examples.py --ignore=tests/test_docs_commands.py \
  --ignore=tests/test_stall.py --ignore=tests/test_flight.py "$@"
timeout --signal=KILL 600 "${MPIEXEC[@]}" -n 2 python -m pytest -q --with-mpi -m mpi \
  tests/test_device.py tests/test_bench.py tests/test_staging.py "$@"
