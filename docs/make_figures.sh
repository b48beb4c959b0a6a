#!/usr/bin/env bash
# Regenerate the step-by-step pictures of docs/algorithms.md from real traced runs,
# then the sample bench run of docs/benchmarking.md and the model's figures (end of file):
# 4 ranks, 8 float32 (4 segments a-d of 2 elements), one in-place call per algorithm.
#   bash docs/make_figures.sh        (needs the mpi and docs extras: mpiexec, matplotlib)
# Run it on a quiet machine (`uptime`: a load average below the core count): the sample
# bench run is timed, and its footer marks with ~ the rows that the load made meaningless.
# Not published on the site (mkdocs.yml, exclude_docs).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for algorithm in ring naive ps rabenseifner; do
  HPCRING_TRACE="$work/$algorithm.json" mpiexec --oversubscribe -n 4 python -c "
import numpy as np, hpcring
from mpi4py import MPI
x = np.full(8, MPI.COMM_WORLD.rank + 1, dtype=np.float32)
hpcring.allreduce(x, algorithm='$algorithm')
assert (x == 10).all(), x
"
  python -m hpcring.viz "$work/$algorithm.json" --out docs/img --algorithms "$algorithm"
done
# The pages show each algorithm's whole picture; of the single steps only the ring's step 3
# (README, index.md) is kept.
find docs/img -name '*-step*.png' ! -name ring-step3.png -delete
cp "$work/ring.json" docs/img/trace-ring-4ranks.json  # a sample to open in Perfetto

# The sample run of docs/benchmarking.md (its table, plot and JSON): 2 ranks, small sizes.
uptime >&2  # the load the sample run was measured under: say it where the run is shown
mpiexec --oversubscribe -n 2 python -m hpcring.bench -b 8 -e 1M -f 8 \
  --json docs/img/bench-cpu-2ranks.json --plot docs/img/bench-cpu-2ranks.png >docs/img/bench-cpu-2ranks.txt

# The cost model's 1000-GPU figures quoted in docs/choosing.md, docs/scaling.md and docs/slurm.md,
# with hpcring's software at the default figures (--software default: what a machine without a
# calibration file gets, not this one's file), the first also without it (none) and with the
# pure-Python core's figures measured here (3.3 us a step, 16 us a call).
{
  for software in default none 3.3,16; do
    python -m hpcring.model --ranks 1000 --bytes 1K,1M,25M,64M,128M,256M,1G --gpus-per-node 8 --intra nvlink4 \
      --link ndr400 --software $software
  done
  python -m hpcring.model --ranks 1000 --bytes 1G --gpus-per-node 8 --intra nvlink4 --link ndr400 --nic shared \
    --software default
  python -m hpcring.model --ranks 1000 --bytes 1G --link ndr400 --software default
  python -m hpcring.model --ranks 8,64,512,1000 --bytes 1M,64M,1G --gpus-per-node 8 --intra nvlink4 --link ndr400 \
    --software default
} >docs/img/model-1000-gpus.txt
# docs/scaling.md's picture: predicted time against ranks, 100 MiB and 1 GiB, nodes of 8 GPUs.
python -m hpcring.model --ranks 8,1000 --bytes 100M,1G --gpus-per-node 8 --intra nvlink4 --link ndr400 \
  --nic per-gpu --software default --plot docs/img/scaling-1000-gpus.png >/dev/null
