#!/usr/bin/env bash
# The GPU check, on any machine with CuPy, a CUDA GPU and MPI (mpiexec on PATH):
#   tests/gpu/check.sh OUTDIR
# 1. facts: GPUs, CuPy, NCCL, hpcring.info() (CUDA-aware or host staging, and why), and the
#    pinned device-to-host bandwidth that bounds host staging;
# 2. the GPU tests (pytest -m gpu): serial, then under mpiexec at 1, 2 and 4 ranks (ranks share
#    the GPUs there are: device = node-local rank mod GPUs), matrix in float16/32/64;
# 3. python -m hpcring.bench --device gpu at 2 and 4 ranks: table, JSON and PNG per rank count.
# Everything lands in OUTDIR: check.log, bench-G.txt, bench-G.json, bench-G.png. Exit status 0
# when every step passed, else 1 (every step still runs). Knobs: HPCRING_GPU_RANKS (test rank
# counts, "1 2 4"), HPCRING_GPU_BENCH_RANKS ("2 4"), HPCRING_GPU_MAXBYTES (sweep top, 256M at
# 2 ranks, a quarter of it above), HPCRING_GPU_TESTS=0 skips step 2.
set -uo pipefail
out=${1:?usage: tests/gpu/check.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
source tests/launcher.sh  # MPIEXEC: Open MPI's or MPICH's, more ranks than cores allowed
export PYTHONUNBUFFERED=1
log=$out/check.log
maxbytes=${HPCRING_GPU_MAXBYTES:-256M}
status=0
started=$SECONDS

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log it (and to $copy), remember a failure
  local name=$1 limit=$2
  shift 2
  echo "== $name ($(date -u +%T), ${SECONDS}s in)" | tee -a "$log"
  timeout --signal=KILL "$limit" "$@" 2>&1 | grep -av "^hpcring.bench: [0-9]" | tee -a "$log" "${copy:-/dev/null}"
  local rc=${PIPESTATUS[0]}
  [[ $rc -eq 5 && $name == *tests* ]] && rc=0  # pytest: no GPU test selected here is not a failure
  echo "== $name: exit $rc" | tee -a "$log"
  [[ $rc -eq 0 ]] || status=1
}

step facts 120 python - <<'PY'
import json, subprocess
import cupy
import hpcring
from hpcring.gpu import pinned_d2h_bandwidth
print(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip())
print("cupy", cupy.__version__, "CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "devices", cupy.cuda.runtime.getDeviceCount())
try:
    from cupy.cuda import nccl
    print("nccl", nccl.get_version() if nccl.available else "not available")
except Exception as error:
    print("nccl not importable:", error)
print(json.dumps(hpcring.info(), indent=1))
print(f"pinned device-to-host copy: {pinned_d2h_bandwidth(256 << 20) / 1e9:.1f} GB/s (256 MiB, one process)")
PY

if [[ ${HPCRING_GPU_TESTS:-1} != 0 ]]; then
  pytest=(python -m pytest -q --color=no -p no:cacheprovider)
  step "GPU tests, serial" 300 "${pytest[@]}" -m "gpu and not mpi" tests
  for n in ${HPCRING_GPU_RANKS:-1 2 4}; do
    step "GPU tests at $n rank(s)" 500 "${MPIEXEC[@]}" -n "$n" "${pytest[@]}" --with-mpi \
      -m "mpi and gpu" -k "not test_matrix or float16 or float32 or float64" tests
  done
fi

for n in ${HPCRING_GPU_BENCH_RANKS:-2 4}; do
  top=$maxbytes
  [[ $n -gt 2 && -z ${HPCRING_GPU_MAXBYTES:-} ]] && top=64M  # more ranks share one GPU's copy engines
  copy=$out/bench-$n.txt step "bench at $n ranks" 300 "${MPIEXEC[@]}" -n "$n" \
    python -m hpcring.bench --device gpu -b 4K -e "$top" -f 4 -n 10 -w 3 --max-time 5 \
    --json "$out/bench-$n.json" --plot "$out/bench-$n.png"
done

echo "== check $([[ $status -eq 0 ]] && echo PASSED || echo FAILED) in $((SECONDS - started)) s" | tee -a "$log"
exit $status
