#!/usr/bin/env bash
# The Performance campaign of docs/benchmarking.md, in one command: for each rank count, tune
# `auto` into a fresh tuning file, then run the sweep several times and print the medians
# (tools/median_of_runs.py: busbw per size and algorithm, x the bare MPI_Allreduce, the ring against np.copyto,
# and at how many sizes `auto` is within 10% of the best). Run it on a quiet machine, from a
# snapshot of the code (`git archive HEAD | tar -x -C DIR`, PYTHONPATH=DIR) if you edit meanwhile.
#
#   tools/campaign.sh OUT [--in-place]
#
# OUT gets tuning.json, tune<G>.log, g<G>-r<i>.json and summary.txt. Knobs (environment):
# RANKS (default "2 3 4"), RUNS (5), PASSES (tuning passes, 5), SIZES ("-b 4K -e 256M -f 4").
# Open MPI or MPICH: the mpiexec on PATH (tests/launcher.sh).
set -euo pipefail
out=${1:?usage: tools/campaign.sh OUT [--in-place]}
placement=${2:-}
tools=$(cd "$(dirname "$0")" && pwd)
ranks=${RANKS:-2 3 4}
runs=${RUNS:-5}
read -r -a sizes <<< "${SIZES:--b 4K -e 256M -f 4}"
mkdir -p "$out"
export HPCRING_TUNING="$out/tuning.json"
rm -f "$HPCRING_TUNING"
source "$tools/../tests/launcher.sh"  # MPIEXEC: Open MPI's or MPICH's, more ranks than cores allowed
pass=()  # the variables every rank needs: Open MPI's -x; Hydra passes the whole environment
[[ $MPI_FLAVOUR == openmpi ]] && pass=(-x HPCRING_TUNING -x PYTHONPATH)
bench() { "${MPIEXEC[@]}" "${pass[@]}" -n "$1" python -m hpcring.bench "${@:2}"; }
for g in $ranks; do
  echo "# $(date -u +%H:%M:%S) tuning at $g ranks"
  bench "$g" "${sizes[@]}" -n 20 -w 3 --passes "${PASSES:-5}" --no-agree $placement \
    -a ps,ring,rabenseifner,mpi --tune > "$out/tune$g.log" 2>&1
done
for i in $(seq "$runs"); do
  for g in $ranks; do
    echo "# $(date -u +%H:%M:%S) run $i at $g ranks"
    bench "$g" "${sizes[@]}" -a ps,ring,rabenseifner,mpi,auto --no-agree $placement -c 0 -n 50 -w 3 \
      --json "$out/g$g-r$i.json" > "$out/g$g-r$i.log" 2>&1
  done
done
for g in $ranks; do python "$tools/median_of_runs.py" "$out"/g"$g"-r*.json; done | tee "$out/summary.txt"
