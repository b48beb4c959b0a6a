#!/usr/bin/env bash
# An emulated cluster on one machine: N "hosts" as network namespaces, each with its own
# address and hostname, joined by a bridge, their links shaped by tc tbf. Open MPI runs one
# job across them: shared memory inside a host, TCP between hosts (docs/multinode.md).
#
#   tests/multinode/cluster.sh up HOSTS [RATE]     e.g. up 2 1gbit (RATE: tc syntax; default 1gbit)
#   tests/multinode/cluster.sh run RANKS_PER_HOST [MPIRUN_ARGS...] -- COMMAND...
#   tests/multinode/cluster.sh counters            bytes each host's eth0 sent (tc -s), one line per host
#   tests/multinode/cluster.sh kill HOST           SIGKILL every process of host HOST (h1: its daemon, its ranks)
#   tests/multinode/cluster.sh kill-ranks HOST     SIGKILL the MPI ranks of host HOST (its daemon lives on)
#   tests/multinode/cluster.sh link HOST down|up   take host HOST's network link down (or up again)
#   tests/multinode/cluster.sh down                remove every namespace, end leftover daemons by PID
#   tests/multinode/cluster.sh check               exit 0 if this machine can host the cluster, else say why (exit 3)
#
# Nothing is created in the root namespace: a namespace hpcr-br holds the bridge, hpcr-hX
# holds host hX (10.77.0.(10+X)/24 on eth0, the other end of its veth on the bridge).
# Every process of host hX runs under `ip netns exec hpcr-hX unshare --uts` with hostname hX:
# Open MPI names its shared-memory segments by hostname, and two "hosts" with one name
# collide. mpirun runs in h0 and starts the others' daemons through a stand-in for ssh
# (--prtemca plm_ssh_agent) that enters their namespaces. Needs root and `ip netns`;
# without them `check` (and every command) says so and exits 3, which tests turn into a skip.
# HPCRING_CLUSTER_MAP=node places ranks round-robin over hosts (default slot: host by host).
# HPCRING_CLUSTER_BTL: Open MPI's transports (default tcp,sm,self; tcp,self for a fault-tolerant
# job, whose failures shared memory does not report: docs/elastic.md).
# State (hostfile, ssh stand-in): $HPCRING_CLUSTER_DIR, default /tmp/hpcring-cluster.
set -euo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
state=${HPCRING_CLUSTER_DIR:-/tmp/hpcring-cluster}
prefix=hpcr
subnet=10.77.0

cannot() {
  echo "tests/multinode/cluster.sh: cannot emulate a cluster here: $1" >&2
  exit 3
}

check() {
  [[ $EUID -eq 0 ]] || cannot "needs root (network namespaces, tc)"
  command -v ip >/dev/null || cannot "no 'ip' command (iproute2)"
  command -v tc >/dev/null || cannot "no 'tc' command (iproute2)"
  command -v unshare >/dev/null || cannot "no 'unshare' command (util-linux)"
  ip netns add "${prefix}-probe" 2>/dev/null || cannot "'ip netns add' fails (no network namespaces)"
  ip netns del "${prefix}-probe"
}

hosts() { # the hosts that are up, in order
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}-h[0-9]+$" | sed "s/^${prefix}-//" | sort -V
}

up() {
  local count=${1:?usage: up HOSTS [RATE]} rate=${2:-1gbit}
  [[ $count =~ ^[1-9][0-9]*$ ]] || cannot "HOSTS must be a positive integer, got '$count'"
  check
  down >/dev/null 2>&1 || true
  mkdir -p "$state"
  ip netns add "${prefix}-br"
  ip -n "${prefix}-br" link add br0 type bridge
  ip -n "${prefix}-br" link set br0 up
  ip -n "${prefix}-br" link set lo up
  for ((i = 0; i < count; i++)); do
    local ns="${prefix}-h$i"
    ip netns add "$ns"
    ip link add "veth$i" netns "${prefix}-br" type veth peer name eth0 netns "$ns"
    ip -n "${prefix}-br" link set "veth$i" master br0 up
    ip -n "$ns" addr add "$subnet.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    # The host's sending side is shaped: every byte between hosts leaves some eth0.
    tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 5ms
  done
  write_launcher "$count"
  echo "$rate" >"$state/rate"
  echo "cluster up: $count hosts (h0..h$((count - 1))), $subnet.0/24, links shaped to $rate"
}

write_launcher() {
  local count=$1
  # The ssh stand-in: PRTE calls it as `agent [options] HOST COMMAND...`.
  cat >"$state/ssh" <<EOF
#!/usr/bin/env bash
while [[ \$1 == -* ]]; do shift; done
host=\$1; shift
case \$host in
  $subnet.*) host=h\$(( \${host##*.} - 10 )) ;;
esac
exec ip netns exec "${prefix}-\$host" unshare --uts sh -c 'hostname "\$0"; exec sh -c "\$1"' "\$host" "\$*"
EOF
  chmod +x "$state/ssh"
  : >"$state/hostfile"
}

run() {
  local per_host=${1:?usage: run RANKS_PER_HOST [MPIRUN_ARGS...] -- COMMAND...}
  shift
  check
  local -a names
  mapfile -t names < <(hosts)
  [[ ${#names[@]} -gt 0 ]] || cannot "no cluster is up (run: cluster.sh up HOSTS)"
  : >"$state/hostfile"
  for name in "${names[@]}"; do echo "$name slots=$per_host" >>"$state/hostfile"; done
  local -a extra=()
  while [[ $# -gt 0 && $1 != -- ]]; do extra+=("$1"); shift; done
  [[ ${1:-} == -- ]] && shift
  [[ $# -gt 0 ]] || cannot "run: no command after --"
  local mpirun=${MPIRUN:-$(command -v mpirun)}
  # Its flags are Open MPI's (--prtemca, --mca, -x); MPICH's Hydra rejects them: say so, not a usage error.
  "$mpirun" --version 2>/dev/null | grep -q "Open MPI" \
    || cannot "run needs Open MPI's mpirun (PRRTE's ssh agent starts the hosts' daemons); $mpirun is not"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
  # Every host's ranks share this machine's cores: hpcring's pipelined waits sleep 50 us
  # between polls instead of spinning (ring.wait_nap), as Open MPI's yield_when_idle below.
  export HPCRING_WAIT_SLEEP_US=${HPCRING_WAIT_SLEEP_US-50}
  # Transports pinned to the emulated network: TCP between hosts, shared memory inside.
  # Ranks outnumber cores here, so waiting ranks yield the CPU (without it a 16 MiB
  # all-reduce over 8 ranks took 1.9 s instead of 29 ms) and nothing is bound.
  local -a args=(
    -n $((per_host * ${#names[@]})) --hostfile "$state/hostfile" --map-by "${HPCRING_CLUSTER_MAP:-slot}"
    --prtemca plm_ssh_agent "$state/ssh" --prtemca oob_tcp_if_include "$subnet.0/24"
    --mca pml ob1 --mca btl "${HPCRING_CLUSTER_BTL:-tcp,sm,self}" --mca btl_tcp_if_include "$subnet.0/24"
    --mca mpi_yield_when_idle 1 --bind-to none -x HPCRING_WAIT_SLEEP_US
  )
  ip netns exec "${prefix}-h0" unshare --uts sh -c 'hostname h0; exec "$@"' sh \
    "$mpirun" "${args[@]}" "${extra[@]}" "$@"
}

counters() { # host, bytes sent through its shaped eth0
  for name in $(hosts); do
    local sent
    sent=$(tc -s -n "${prefix}-$name" qdisc show dev eth0 | awk '/Sent/ {print $2; exit}')
    echo "$name ${sent:-0}"
  done
}

kill_host() { # a host that dies: every process in its namespace (the job's daemon, its ranks), SIGKILL;
  # with "ranks", only the MPI ranks (an out-of-memory kill, a GPU fault: the daemon lives on)
  # Every PID is found first and all are killed by one `kill`, as a host's ranks die together.
  # Killed one by one, each after a look at its environment (two forked processes), they died
  # that much apart, and a run once recovered twice (4 -> 3 -> 2 ranks) from one host's loss.
  local host=${1:?usage: kill HOST} which=${2:-all} pid pids=()
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "${prefix}-$host" || cannot "no host $host is up"
  for pid in $(ip netns pids "${prefix}-$host" 2>/dev/null); do
    if [[ $which == ranks ]] && ! tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -q '^OMPI_COMM_WORLD_RANK='; then
      continue
    fi
    pids+=("$pid")
  done
  ((${#pids[@]})) && kill -KILL "${pids[@]}" 2>/dev/null || true
}

link() { # a host whose network goes: its eth0 down (nothing leaves or reaches it), or back up
  local host=${1:?usage: link HOST down|up} state=${2:?usage: link HOST down|up}
  [[ $state == up || $state == down ]] || cannot "link: the state must be up or down, got '$state'"
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "${prefix}-$host" || cannot "no host $host is up"
  ip -n "${prefix}-$host" link set eth0 "$state"
}

down() {
  # Daemons of an aborted job: any prted or prterun still inside our namespaces, by PID.
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}-"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      kill -TERM "$pid" 2>/dev/null || true
    done
  done
  sleep 0.2
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}-"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns"
  done
  echo "cluster down"
}

case ${1:-} in
  up) shift; up "$@" ;;
  down) check; down ;;
  run) shift; run "$@" ;;
  counters) counters ;;
  kill) shift; check; kill_host "${1:-}" all ;;
  kill-ranks) shift; check; kill_host "${1:-}" ranks ;;
  link) shift; check; link "$@" ;;
  check) check; echo "ok: root, ip netns, tc and unshare are available" ;;
  *) echo "usage: $0 up HOSTS [RATE] | run RANKS_PER_HOST [MPIRUN_ARGS...] -- COMMAND... | counters | kill HOST | kill-ranks HOST | link HOST down|up | down | check" >&2; exit 2 ;;
esac
