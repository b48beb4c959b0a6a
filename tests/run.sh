#!/usr/bin/env bash
# The whole test suite: serial tests, then the MPI tests under mpiexec at 1, 2, 3 and 4 ranks
# (HPCRING_TEST_RANKS="2 3" runs those counts only). Works as root and on 2 cores (oversubscribed),
# with Open MPI or MPICH (the mpiexec on PATH, the venv's). Extra arguments go to every pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--full" ]; then  # the long cases too (marked full: soaks, many examples, large sizes)
  shift
  export HPCRING_TEST_FULL=1
fi
source tests/launcher.sh  # MPIEXEC: Open MPI's or MPICH's, more ranks than cores allowed
export PYTHONUNBUFFERED=1
python -m pytest -q "$@"
for ranks in ${HPCRING_TEST_RANKS:-1 2 3 4}; do
  echo "== MPI tests at $ranks rank(s)"
  # pytest-timeout ends a stuck test (and with it the job); `timeout` is the last resort.
  timeout --signal=KILL 1500 "${MPIEXEC[@]}" -n "$ranks" \
    python -m pytest -q --with-mpi -m mpi "$@"
done
