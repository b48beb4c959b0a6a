#!/usr/bin/env bash
# The figures of docs/multinode.md: hierarchical vs flat ring vs Open MPI's default
# MPI_Allreduce (coll/han) on the emulated cluster, float32 sum, 16 and 64 MiB, links shaped
# to RATE. For each shape (HOSTSxRANKS), in one cluster: calibrate the two-level cost model
# (ping-pong inside a host; between hosts b_link is 1/inter_beta, both directions at once as
# in an all-reduce, measured in this run; the one-way ping-pong figure is shown beside it),
# then RUNS bench runs (each a median of ITERS iterations); the table reports the median
# of the runs' medians, next to the link bound 2(H-1)/H n / b_link and the model.
# Usage: tools/multinode_bench.sh [OUTDIR] (env: SHAPES="2x2 4x2", RUNS=3, ITERS=5, RATE=1gbit)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/hpcring-multinode-bench}
mkdir -p "$out"
cluster=tests/multinode/cluster.sh
trap 'bash "$cluster" down >/dev/null 2>&1 || true' EXIT
for shape in ${SHAPES:-2x2 4x2}; do
  hosts=${shape%x*} per=${shape#*x}
  bash "$cluster" up "$hosts" "${RATE:-1gbit}"
  export HPCRING_MODEL="$out/model-$shape.json"
  timeout 300 bash "$cluster" run "$per" -- python -m hpcring.model --calibrate --output "$HPCRING_MODEL" \
    | tee "$out/calibrate-$shape.txt"
  for run in $(seq 1 "${RUNS:-3}"); do
    timeout 600 bash "$cluster" run "$per" -- python -m hpcring.bench -b 16M -e 64M -f 4 \
      -a hierarchical,ring,mpi -n "${ITERS:-5}" -w 1 --max-time 0 --json "$out/bench-$shape-$run.json" \
      | tee "$out/bench-$shape-$run.txt"
  done
  bash "$cluster" down
done
python3 - "$out" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
print(f"{'shape':>5} {'size':>6} {'hierarchical':>13} {'ring':>8} {'mpi':>8} {'bound':>8} {'1-way':>7} "
      f"{'model hier':>10} {'model ring':>10} {'b_link MB/s':>11} {'one way':>8}  (ms, medians of runs)")
for model_file in sorted(glob.glob(f"{out}/model-*.json")):
    shape = model_file.rsplit("-", 1)[1][:-5]
    hosts = int(shape.split("x")[0])
    calibration = json.load(open(model_file))
    b_link, b_one_way = 1 / calibration["inter_beta"], 1 / calibration["inter_beta_one_way"]
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/bench-{shape}-*.json"))]
    for size in (16 << 20, 64 << 20):
        t, p = {}, {}
        for alg in ("hierarchical", "ring", "mpi"):
            rows = [r for run in runs for r in run["rows"] if r["size"] == size and r["algorithm"] == alg]
            t[alg] = statistics.median(r["time_us"] for r in rows) / 1e3
            p[alg] = rows[0]["predicted_us"] / 1e3 if rows[0]["predicted_us"] else float("nan")
            assert all(r["wrong"] == 0 for r in rows), (shape, size, alg)
        bound = 2 * (hosts - 1) / hosts * size / b_link * 1e3
        one_way = 2 * (hosts - 1) / hosts * size / b_one_way * 1e3  # the same with the ping-pong b
        print(f"{shape:>5} {size >> 20:>4}Mi {t['hierarchical']:13.1f} {t['ring']:8.1f} {t['mpi']:8.1f} "
              f"{bound:8.1f} {one_way:7.1f} {p['hierarchical']:10.1f} {p['ring']:10.1f} {b_link / 1e6:11.1f} "
              f"{b_one_way / 1e6:8.1f}")
PY
