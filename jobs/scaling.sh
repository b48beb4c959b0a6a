#!/usr/bin/env bash
# A scaling study: submit jobs/ring.slurm once per allocation size, same sizes and knobs for
# all, every run's folder under one directory, then one dependent job that runs
# `python -m hpcring.scaling DIR` (scaling.txt, scaling.json, scaling.png) when they are done.
# Run it on a login node, from the repository root:
#
#   bash jobs/scaling.sh                    # 1 2 4 8 16 nodes at the template's 8 GPUs per node
#   bash jobs/scaling.sh 1 2 4 8 16 32 64 125
#   bash jobs/scaling.sh 1x1 1x2 1x4 1x8 2 4    # NxT: N nodes with T ranks (and T GPUs) per node
#
# Knobs (environment variables; every ring.slurm knob passes through to the runs too):
#   HPCRING_SCALING_DIR   where all runs go (default: runs/scaling-<date>-<time>)
#   HPCRING_SBATCH_ARGS   extra sbatch flags for every job, e.g. --account=... --partition=...
#                         (they come last, so they win over the NxT flags)
#   HPCRING_VENV          Python environment, also used by the report job
#
# Different sizes need different allocations, so this is one job per size rather than a job
# array (whose tasks all share one resource request). The report runs afterany: a failed run
# leaves a gap in the table, not a missing report. Prints the report job's id last.
set -euo pipefail
cd "$(dirname "$0")/.."

specs=("$@")
((${#specs[@]})) || specs=(1 2 4 8 16)
dir=${HPCRING_SCALING_DIR:-$PWD/runs/scaling-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
read -ra extra <<<"${HPCRING_SBATCH_ARGS:-}"
# One folder for every run; ring.slurm makes <job name>-<job id> inside it.
export HPCRING_OUT=$dir

ids=()
for spec in "${specs[@]}"; do
  if [[ $spec =~ ^([0-9]+)x([0-9]+)$ ]]; then
    nodes=${BASH_REMATCH[1]} per_node=${BASH_REMATCH[2]}
    shape=(--nodes="$nodes" --ntasks-per-node="$per_node" --gpus-per-node="$per_node")
  elif [[ $spec =~ ^[0-9]+$ ]]; then
    shape=(--nodes="$spec")
  else
    echo "scaling.sh: '$spec' is neither N (nodes) nor NxT (nodes x ranks per node)" >&2
    exit 2
  fi
  id=$(sbatch --parsable --job-name="hpcring-scale-$spec" --output="$dir/hpcring-scale-$spec-%j.out" \
    "${shape[@]}" "${extra[@]}" jobs/ring.slurm)
  ids+=("${id%%;*}")
  echo "scaling.sh: $spec -> job ${id%%;*}"
done

activate=${HPCRING_VENV:+. "$HPCRING_VENV/bin/activate" && } # --wrap runs /bin/sh
report=$(sbatch --parsable --job-name=hpcring-scaling-report --dependency="afterany:$(
  IFS=:
  echo "${ids[*]}"
)" \
  --nodes=1 --ntasks=1 --time=00:10:00 --output="$dir/report-%j.out" "${extra[@]}" \
  --wrap="${activate}python -m hpcring.scaling '$dir'")
echo "scaling.sh: report job ${report%%;*} (after ${ids[*]}): $dir/scaling.txt and scaling.png"
echo "${report%%;*}"
