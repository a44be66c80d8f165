#!/usr/bin/env bash
# Multi-host jobs on one machine: K "hosts" (network namespaces, each with its own hostname and a
# private /dev/shm) on two bridged networks, one dcrun per host:
#
#   ctl net   10.231.0.0/24  eth0 on every host; node0's 10.231.0.10 serves the store (--master)
#   data net  10.232.0.0/24  data0 on every host; chosen for data with DC_SOCKET_IFNAME=data0
#
# Both bridges live in a namespace of their own, so nothing is added to this machine's network
# and names and ports cannot clash with other jobs. What runs across the hosts:
#   1. the C test suite (every test_* binary in C_TESTS_DIR) over 2 and 3 hosts
#   2. the Python examples (train_dp, objects_demo, torch_api_tour) over 3 hosts
#   3. DC_SOCKET_IFNAME: data0 puts the data connections on the data net, unset leaves them on
#      the store's net, a name that does not exist fails with a message naming the interfaces
# With DC_DEBUG=INFO every rank logs "rank S at ADDR: transport T" per peer; pairs on different
# hosts must use the socket transport (and, once a shared-memory transport exists, pairs on one
# host may use it: which one they use is reported).
#
# Usage: scripts/multihost_test.sh PREFIX
#   PREFIX       install prefix (bin/dcrun, lib/libdistcomm.so)
#   C_TESTS_DIR  built C tests (default build/c_tests); skipped with a note if absent
#   PYTHON       python with numpy and the distcomm package (default python3); the Python part is
#                skipped with a note if it cannot import them
#   NODES        hosts for the Python examples (default 3); RANKS_PER_NODE (default 2)
#   MPI_ONLY=1   only the MPI jobs (our mpiexec across 2 hosts; needs mpicc in PREFIX)
# Without the privileges (root or CAP_NET_ADMIN + CAP_SYS_ADMIN, ip, unshare) it prints SKIP and
# exits 0. Namespaces and processes are removed on exit, also on failure or Ctrl-C.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
PREFIX=${1:-${PREFIX:-}}
C_TESTS_DIR=${C_TESTS_DIR:-build/c_tests}
[ -d "$C_TESTS_DIR" ] && C_TESTS_DIR=$(cd "$C_TESTS_DIR" && pwd)
PYTHON=${PYTHON:-python3}
NODES=${NODES:-3}
RPN=${RANKS_PER_NODE:-2}

skip() {
  echo "SKIP multihost: $*"
  exit 0
}

[ -n "$PREFIX" ] || { echo "usage: $0 PREFIX" >&2; exit 2; }
PREFIX=$(cd "$PREFIX" && pwd)
DCRUN="$PREFIX/bin/dcrun"
LIB="$PREFIX/lib/libdistcomm.so"
[ -x "$DCRUN" ] || { echo "no dcrun at $DCRUN" >&2; exit 1; }
[ -e "$LIB" ] || { echo "no library at $LIB" >&2; exit 1; }

[ "$(uname -s)" = Linux ] || skip "needs Linux network namespaces"
command -v ip >/dev/null 2>&1 || skip "no ip command (iproute2)"
command -v unshare >/dev/null 2>&1 || skip "no unshare command (util-linux)"
if [ "$(id -u)" -ne 0 ]; then
  skip "needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces; run as root to test"
fi

TAG="dcmh$$"
SW="$TAG-sw"
HOSTS=()
TMP=$(mktemp -d "${TMPDIR:-/tmp}/distcomm-multihost.XXXXXX")
PIDS=()

cleanup() {
  local rc=$?
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  for h in "${HOSTS[@]}"; do ip netns del "$h" 2>/dev/null || true; done
  ip netns del "$SW" 2>/dev/null || true
  if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "logs kept in $TMP"; else rm -rf "$TMP"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the hosts ---------------------------------------------------------------------------------
if ! ip netns add "$SW" 2>"$TMP/err"; then
  skip "cannot create a network namespace ($(cat "$TMP/err")); needs CAP_NET_ADMIN and CAP_SYS_ADMIN"
fi
ip -n "$SW" link set lo up
for br in brctl brdata; do
  ip -n "$SW" link add name "$br" type bridge
  ip -n "$SW" link set "$br" up
done
# The scale job (4.) runs SCALE_NODES hosts of SCALE_RPN ranks (0 hosts: skipped).
SCALE_NODES=${SCALE_NODES:-8}
SCALE_RPN=${SCALE_RPN:-16}
MAXN=$((NODES > 2 ? NODES : 2))
MAXN=$((SCALE_NODES > MAXN ? SCALE_NODES : MAXN))
for ((i = 0; i < MAXN; i++)); do
  h="$TAG-node$i"
  ip netns add "$h"
  HOSTS+=("$h")
  ip -n "$h" link set lo up
  # Each veth is created in the switch namespace with its peer directly in the host's.
  ip -n "$SW" link add name "c$i" type veth peer name eth0 netns "$h"
  ip -n "$SW" link add name "d$i" type veth peer name data0 netns "$h"
  ip -n "$SW" link set "c$i" master brctl up
  ip -n "$SW" link set "d$i" master brdata up
  ip -n "$h" addr add "10.231.0.$((10 + i))/24" dev eth0
  ip -n "$h" addr add "10.232.0.$((10 + i))/24" dev data0
  ip -n "$h" link set eth0 up
  ip -n "$h" link set data0 up
done

# on_host I CMD...: runs CMD on host I: its network namespace, hostname nodeI, a private /dev/shm.
on_host() {
  local i=$1
  shift
  ip netns exec "$TAG-node$i" unshare --uts --mount --propagation private \
    sh -c 'hostname "$0" && mount -t tmpfs -o size=256m,mode=1777 tmpfs /dev/shm && exec "$@"' "node$i" "$@"
}

# Each host has its own name and /dev/shm, and reaches the others on both nets.
for ((i = 0; i < MAXN; i++)); do
  on_host "$i" sh -c "touch /dev/shm/$TAG-mark; hostname; ls /dev/shm" >"$TMP/host$i" 2>&1 || {
    cat "$TMP/host$i"
    skip "cannot set a hostname or mount a private /dev/shm in a namespace (needs CAP_SYS_ADMIN)"
  }
  [ "$(head -1 "$TMP/host$i")" = "node$i" ] || { echo "host $i: hostname is $(head -1 "$TMP/host$i")" >&2; exit 1; }
  [ "$(tail -n +2 "$TMP/host$i")" = "$TAG-mark" ] || { echo "host $i: /dev/shm is not private:" >&2; cat "$TMP/host$i" >&2; exit 1; }
done
[ ! -e "/dev/shm/$TAG-mark" ] || { echo "a host's /dev/shm leaked into this machine's" >&2; exit 1; }
for ((i = 1; i < MAXN; i++)); do
  ip netns exec "$TAG-node$i" ping -c1 -W2 10.231.0.10 >/dev/null 2>&1 &&
    ip netns exec "$TAG-node$i" ping -c1 -W2 10.232.0.10 >/dev/null 2>&1 ||
    { command -v ping >/dev/null 2>&1 && { echo "host $i cannot reach node0" >&2; exit 1; }; }
done
echo "multihost: $MAXN hosts (network namespaces with their own hostname and /dev/shm) on two bridged nets"

# ---- running jobs --------------------------------------------------------------------------------
export DC_TOKEN
DC_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export DISTCOMM_LIBRARY="$LIB" DC_TIMEOUT_MS=${DC_TIMEOUT_MS:-60000} PYTHONUNBUFFERED=1
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT DC_LAUNCHER_STORE DC_SOCKET_IFNAME DC_TRANSPORT
PASSED=0
JOB=0

# job NAME NODES EXPECT(ok|fail) ENV... -- PROG ARGS...: one dcrun per host; logs in $TMP/NAME.nodeI.
job() {
  local name=$1 nodes=$2 expect=$3
  shift 3
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  JOB=$((JOB + 1))
  local port=$((29500 + JOB)) i pids=() rcs=() rc
  for ((i = 0; i < nodes; i++)); do
    on_host "$i" env DC_DEBUG=INFO "${envs[@]}" "$DCRUN" --nnodes "$nodes" --node-rank "$i" \
      --master "10.231.0.10:$port" -n "${JOB_RPN:-$RPN}" "$@" >"$TMP/$name.node$i" 2>&1 &
    pids+=($!)
    PIDS+=($!)
  done
  for p in "${pids[@]}"; do
    rc=0
    wait "$p" || rc=$?
    rcs+=("$rc")
  done
  PIDS=()
  local allzero=1 bad=0
  for rc in "${rcs[@]}"; do [ "$rc" = 0 ] || allzero=0; done
  if { [ "$expect" = ok ] && [ $allzero = 0 ]; } || { [ "$expect" = fail ] && [ $allzero = 1 ]; }; then bad=1; fi
  if [ $bad = 1 ]; then
    echo "FAIL multihost $name: exit statuses ${rcs[*]} (expected $expect)" >&2
    for ((i = 0; i < nodes; i++)); do
      echo "---- node$i:" >&2
      grep -v 'distcomm INFO\|distcomm TRACE' "$TMP/$name.node$i" | tail -40 >&2
    done
    exit 1
  fi
}

# transports NAME NODES SUBNET: every rank logged a transport for every peer; pairs on different
# hosts use sockets, to the peer's address on SUBNET (10.231.0 or 10.232.0).
transports() {
  local name=$1 nodes=$2 subnet=$3
  cat "$TMP/$name".node* | "$CHECK_PY" -c '
import re, sys
nodes, rpn, subnet = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
world = nodes * rpn
seen, shm, errors = {}, 0, []
for line in sys.stdin:
    m = re.search(r"^\[(\d+)\] (\S+?):\d+:r(\d+) distcomm INFO rank (\d+) at ([0-9.]+):\d+: transport (\w+)", line)
    if not m:
        continue
    r, host, peer, addr, kind = int(m.group(3)), m.group(2), int(m.group(4)), m.group(5), m.group(6)
    if host != "node%d" % (r // rpn):
        errors.append("rank %d logged from host %s" % (r, host))
    seen[(r, peer)] = kind
    same = r // rpn == peer // rpn
    if not same:
        if kind != "socket":
            errors.append("ranks %d and %d are on different hosts but use %s" % (r, peer, kind))
        want = "%s.%d" % (subnet, 10 + peer // rpn)
        if addr != want:
            errors.append("rank %d reaches rank %d at %s, expected %s" % (r, peer, addr, want))
    elif kind == "shm":
        shm += 1
missing = [(r, p) for r in range(world) for p in range(world) if r != p and (r, p) not in seen]
if missing:
    errors.append("no transport logged for %d pairs, e.g. %s" % (len(missing), missing[:4]))
if errors:
    print("\n".join(errors[:20]))
    sys.exit(1)
cross = sum(1 for (r, p) in seen if r // rpn != p // rpn)
local = len(seen) - cross
print("%d cross-host pairs on sockets via %s.x; %d same-host pairs (%d on shm)" % (cross, subnet, local, shm))
' "$nodes" "$RPN" "$subnet"
}

CHECK_PY=$(command -v python3 || true)
[ -n "$CHECK_PY" ] || CHECK_PY=$PYTHON

# 0. MPI across hosts: our mpiexec places ranks in blocks on the hosts of -hosts / a hostfile and
# starts one dcrun per host through a launcher agent (here `ip netns exec` into the host's
# namespace, standing in for ssh). MPI_ONLY=1 runs only this part.
MPICC="$PREFIX/bin/mpicc"
if [ -x "$MPICC" ] && [ -x "$PREFIX/bin/mpiexec" ] && [ -e "$PREFIX/lib/libmpi_abi.so.1" ]; then
  # The agent, called as `AGENT HOST LINE` like ssh: HOST is node I's 10.231.0.(10+I).
  cat >"$TMP/agent" <<EOF2
#!/bin/sh
i=\$((\${1##*.} - 10))
exec ip netns exec "$TAG-node\$i" unshare --uts --mount --propagation private \\
  sh -c 'hostname "\$0" && mount -t tmpfs -o size=256m,mode=1777 tmpfs /dev/shm && exec sh -c "\$1"' "node\$i" "\$2"
EOF2
  chmod +x "$TMP/agent"
  cat >"$TMP/where.c" <<'EOF2'
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
  int rank, size, len, sum = 0;
  char host[MPI_MAX_PROCESSOR_NAME];
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Get_processor_name(host, &len);
  MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  printf("rank %d of %d on %s: sum %s\n", rank, size, host, sum == size * (size - 1) / 2 ? "ok" : "WRONG");
  MPI_Finalize();
  return 0;
}
EOF2
  "$MPICC" -O1 "$TMP/where.c" -o "$TMP/where"
  "$MPICC" -std=c11 -O1 -pthread "$ROOT/mpi/tests/t_threads.c" -o "$TMP/t_threads"
  mpijob() { # mpijob NAME MPIEXEC-ARGS...: runs, fails the harness on a non-zero status
    local name=$1
    shift
    if ! (cd "$TMP" && timeout 120 "$PREFIX/bin/mpiexec" -launcher-exec "$TMP/agent" -genv DC_SOCKET_IFNAME data0 "$@") >"$TMP/$name.out" 2>&1; then
      echo "FAIL multihost $name: mpiexec $*" >&2
      tail -40 "$TMP/$name.out" >&2
      exit 1
    fi
  }
  mpijob mpi-where -n 4 -hosts 10.231.0.10:2,10.231.0.11:2 ./where
  for r in 0 1 2 3; do
    grep -q "^rank $r of 4 on node$((r / 2)): sum ok" "$TMP/mpi-where.out" || { echo "FAIL multihost mpi-where: rank $r not on node$((r / 2)) or wrong sum:" >&2; cat "$TMP/mpi-where.out" >&2; exit 1; }
  done
  printf '# two hosts\n10.231.0.10 slots=2\n10.231.0.11:2\n' >"$TMP/hostfile"
  mpijob mpi-threads -f "$TMP/hostfile" -genv EXPECT_DISTCOMM 1 ./t_threads
  [ "$(grep -c 't_threads: rank . of 4 passed' "$TMP/mpi-threads.out")" = 4 ] || { echo "FAIL multihost mpi-threads:" >&2; cat "$TMP/mpi-threads.out" >&2; exit 1; }
  PASSED=$((PASSED + 2))
  echo "multihost: mpiexec -n 4 -hosts A:2,B:2 (agent: ip netns exec): ranks 0-1 on node0, 2-3 on node1; mpi/tests/t_threads.c from a hostfile: passed"
else
  echo "multihost: NOTE no mpicc/mpiexec/libmpi_abi.so.1 in $PREFIX; MPI across hosts skipped"
fi
if [ "${MPI_ONLY:-0}" = 1 ]; then
  echo "multihost: MPI_ONLY=1: the other parts skipped; all $PASSED jobs passed"
  exit 0
fi

# 1. the C test suite across hosts
if [ -d "$C_TESTS_DIR" ] && ls "$C_TESTS_DIR"/test_* >/dev/null 2>&1; then
  for nodes in 2 3; do
    [ "$nodes" -le "$MAXN" ] || continue
    for t in "$C_TESTS_DIR"/test_*; do
      [ -x "$t" ] && [ -f "$t" ] || continue
      n=$(basename "$t")
      job "c-$n-$nodes" "$nodes" ok DC_SOCKET_IFNAME=data0 -- "$t"
      PASSED=$((PASSED + 1))
    done
    echo "multihost: C tests over $nodes hosts x $RPN ranks: passed ($(cd "$C_TESTS_DIR" && ls test_* | tr '\n' ' '))"
  done
  echo "multihost: c-test_collectives over 3 hosts: $(transports c-test_collectives-3 3 10.232.0)"
else
  echo "multihost: NOTE no C tests in $C_TESTS_DIR (build them: see scripts/test.sh); skipped"
fi

# 2. Python examples across hosts
if "$PYTHON" -c 'import numpy, distcomm' >/dev/null 2>&1; then
  EX="$ROOT/examples/python"
  job py-train "$NODES" ok DC_SOCKET_IFNAME=data0 -- "$PYTHON" "$EX/train_dp.py" --steps 40
  grep -q "trained on $((NODES * RPN)) ranks: OK" "$TMP/py-train.node0" || { echo "FAIL: train_dp did not report OK" >&2; cat "$TMP/py-train.node0" >&2; exit 1; }
  echo "multihost: train_dp.py over $NODES hosts: OK; $(transports py-train "$NODES" 10.232.0)"
  job py-objects "$NODES" ok DC_SOCKET_IFNAME=data0 -- "$PYTHON" "$EX/objects_demo.py"
  for ((i = 0; i < NODES; i++)); do
    grep -q "runs on node$i as pid" "$TMP/py-objects.node0" || { echo "FAIL: objects_demo saw no rank on node$i" >&2; cat "$TMP/py-objects.node0" >&2; exit 1; }
  done
  echo "multihost: objects_demo.py over $NODES hosts: OK (ranks report hosts $(grep -o 'runs on node[0-9]*' "$TMP/py-objects.node0" | awk '{print $3}' | sort -u | tr '\n' ' '))"
  job py-torch "$NODES" ok -- "$PYTHON" "$EX/torch_api_tour.py"
  echo "multihost: torch_api_tour.py over $NODES hosts: OK; without DC_SOCKET_IFNAME: $(transports py-torch "$NODES" 10.231.0)"
  PASSED=$((PASSED + 3))
else
  echo "multihost: NOTE $PYTHON cannot import numpy and distcomm; Python examples skipped"
fi

# 3. DC_SOCKET_IFNAME naming no interface fails on every rank, saying which ones exist.
if [ -x "$C_TESTS_DIR/test_collectives" ]; then
  probe=("$C_TESTS_DIR/test_collectives")
else
  probe=("$PYTHON" -c 'import distcomm; distcomm.init_process_group()')
fi
job ifname-bad 2 fail DC_SOCKET_IFNAME=nosuch0 -- "${probe[@]}"
grep -q "DC_SOCKET_IFNAME=nosuch0: no interface of that name.*data0" "$TMP/ifname-bad.node0" ||
  { echo "FAIL: no clear DC_SOCKET_IFNAME error:" >&2; cat "$TMP/ifname-bad.node0" >&2; exit 1; }
PASSED=$((PASSED + 1))
echo "multihost: DC_SOCKET_IFNAME=nosuch0 fails with: $(grep -o 'DC_SOCKET_IFNAME=nosuch0: [^)]*)' "$TMP/ifname-bad.node0" | head -1)"

# 4. Scale: SCALE_NODES hosts x SCALE_RPN ranks. Every collective at a few sizes, every result
# checked (dc-bench exits 3 on a wrong element); allreduce goes hierarchical (reduce within each
# host, allreduce among one leader per host, broadcast back). Then an allreduce-only job whose
# processes must hold few connections (they are made on demand): at most 4 on average.
# (Skipped without dc-bench in PREFIX or the C tests.)
DCBENCH="$PREFIX/bin/dc-bench"
if [ "$SCALE_NODES" -gt 0 ] && [ -x "$DCBENCH" ] && [ -x "$C_TESTS_DIR/test_allreduce_barrier" ]; then
  world=$((SCALE_NODES * SCALE_RPN))
  JOB_RPN=$SCALE_RPN job scale-all "$SCALE_NODES" ok DC_SOCKET_IFNAME=data0 -- "$DCBENCH" -o all -b 1K -e 256K -f 16 -n 2 -w 1 -c 1
  # (Not dc-bench: it gathers every rank's host name, an allgather the step does not make.)
  JOB_RPN=$SCALE_RPN job scale-allreduce "$SCALE_NODES" ok DC_SOCKET_IFNAME=data0 -- "$C_TESTS_DIR/test_allreduce_barrier"
  conns=$(cat "$TMP"/scale-allreduce.node* | grep -o 'socket transport: [0-9]* connections' | awk '{ s += $3; n++; if ($3 > m) m = $3 } END { if (n) printf "%d %.2f %d", n, s / n, m }')
  read -r nproc avg most <<<"${conns:-0 0 0}"
  [ "$nproc" = "$world" ] || { echo "FAIL multihost scale: $nproc of $world processes reported their connections" >&2; exit 1; }
  awk -v a="$avg" 'BEGIN { exit !(a <= 4) }' || { echo "FAIL multihost scale: $avg connections per process on average after an allreduce (bound 4)" >&2; exit 1; }
  PASSED=$((PASSED + 2))
  echo "multihost: $SCALE_NODES hosts x $SCALE_RPN ranks: every collective correct; after allreduce 16 B and 1 MiB and barrier: $avg connections per process on average, at most $most (of $((world - 1)))"
fi

# 5. Silent peers across hosts (one rank per host, DC_PEER_TIMEOUT_MS=2000; see
# scripts/multihost_faults.py): idle connections live on heartbeats; a frozen host and a cut
# data network are noticed within the peer timeout, not at the operation timeout. Then a flood:
# a fast sender, a slow receiver, the receiver's memory bounded (flow control).
if "$PYTHON" -c 'import numpy, distcomm' >/dev/null 2>&1; then
  FAULTS="$ROOT/scripts/multihost_faults.py"
  JOB_RPN=1 job faults-idle 2 ok DC_SOCKET_IFNAME=data0 DC_PEER_TIMEOUT_MS=2000 -- "$PYTHON" "$FAULTS" idle 7
  [ "$(cat "$TMP"/faults-idle.node* | grep -c 'idle: OK')" = 2 ] || { echo "FAIL multihost faults-idle" >&2; cat "$TMP"/faults-idle.node* >&2; exit 1; }
  JOB_RPN=1 job faults-freeze 2 fail DC_SOCKET_IFNAME=data0 DC_PEER_TIMEOUT_MS=2000 -- "$PYTHON" "$FAULTS" freeze
  grep -q 'lost: rank 0 after .*rank 1 .*is lost' "$TMP/faults-freeze.node0" || { echo "FAIL multihost faults-freeze: rank 0 did not lose rank 1" >&2; cat "$TMP"/faults-freeze.node* >&2; exit 1; }
  JOB_RPN=1 job faults-cut 2 ok DC_SOCKET_IFNAME=data0 DC_PEER_TIMEOUT_MS=2000 -- "$PYTHON" "$FAULTS" cut
  grep -q 'lost: rank 0 after' "$TMP/faults-cut.node0" && grep -q 'lost: rank 1 after' "$TMP/faults-cut.node1" ||
    { echo "FAIL multihost faults-cut: a rank did not see the cut" >&2; cat "$TMP"/faults-cut.node* >&2; exit 1; }
  ip -n "$TAG-node1" link set dev data0 up
  # A fast sender and a slow receiver across the hosts: 10 GiB in order and intact, the
  # receiver's peak memory within 64 MiB of what it had (DC_MAX_UNEXPECTED_BYTES is 16 MiB).
  JOB_RPN=1 job faults-flood 2 ok DC_SOCKET_IFNAME=data0 -- "$PYTHON" "$FAULTS" flood "${FLOOD_GB:-10}" 64
  grep -q 'flood: OK' "$TMP/faults-flood.node1" || { echo "FAIL multihost faults-flood" >&2; cat "$TMP"/faults-flood.node* >&2; exit 1; }
  PASSED=$((PASSED + 4))
  echo "multihost: $(grep -ho 'flood: received.*' "$TMP/faults-flood.node1"); $(grep -ho 'flood: sent.*' "$TMP/faults-flood.node0")"
  echo "multihost: idle 7 s on heartbeats: OK; $(grep -o 'lost: rank 0 after [0-9.]* s' "$TMP/faults-freeze.node0") when its peer host froze; cut data net: $(grep -ho 'lost: rank [01] after [0-9.]* s' "$TMP"/faults-cut.node* | tr '\n' ';')"
else
  echo "multihost: NOTE $PYTHON cannot import numpy and distcomm; silent-peer jobs skipped"
fi

# 6. Encryption between hosts (DC_ENCRYPT=1): the C tests and the Python examples over 2 hosts
# pass encrypted; then the cost: dc-bench allreduce of 16 MiB, one rank per host, sockets, clear and
# encrypted in interleaved rounds (the median ratio of their bus bandwidths is printed).
if [ -d "$C_TESTS_DIR" ] && ls "$C_TESTS_DIR"/test_* >/dev/null 2>&1; then
  for t in "$C_TESTS_DIR"/test_*; do
    [ -x "$t" ] && [ -f "$t" ] || continue
    job "enc-$(basename "$t")" 2 ok DC_SOCKET_IFNAME=data0 DC_ENCRYPT=1 -- "$t"
    PASSED=$((PASSED + 1))
  done
  echo "multihost: C tests over 2 hosts x $RPN ranks with DC_ENCRYPT=1: passed"
fi
if "$PYTHON" -c 'import numpy, distcomm' >/dev/null 2>&1; then
  job enc-py-train 2 ok DC_SOCKET_IFNAME=data0 DC_ENCRYPT=1 -- "$PYTHON" "$ROOT/examples/python/train_dp.py" --steps 20
  grep -q "trained on $((2 * RPN)) ranks: OK" "$TMP/enc-py-train.node0" || { echo "FAIL: train_dp did not report OK encrypted" >&2; cat "$TMP/enc-py-train.node0" >&2; exit 1; }
  job enc-py-objects 2 ok DC_SOCKET_IFNAME=data0 DC_ENCRYPT=1 -- "$PYTHON" "$ROOT/examples/python/objects_demo.py"
  job enc-py-torch 2 ok DC_SOCKET_IFNAME=data0 DC_ENCRYPT=1 -- "$PYTHON" "$ROOT/examples/python/torch_api_tour.py"
  PASSED=$((PASSED + 3))
  echo "multihost: train_dp.py, objects_demo.py, torch_api_tour.py over 2 hosts with DC_ENCRYPT=1: OK"
fi
if [ -x "$DCBENCH" ] && [ "${ENC_ROUNDS:-5}" -gt 0 ]; then
  for ((r = 1; r <= ${ENC_ROUNDS:-5}; r++)); do
    for enc in 0 1; do
      JOB_RPN=1 job "enc-bench-$enc-$r" 2 ok DC_SOCKET_IFNAME=data0 DC_ENCRYPT=$enc -- "$DCBENCH" -o allreduce -b 16M -e 16M -n 20 -w 2 -c 1 --csv "$TMP/enc-$enc-$r.csv"
    done
  done
  ratio=$(for ((r = 1; r <= ${ENC_ROUNDS:-5}; r++)); do
    c=$(awk -F, 'NR == 2 { print $8 }' "$TMP/enc-0-$r.csv"); e=$(awk -F, 'NR == 2 { print $8 }' "$TMP/enc-1-$r.csv")
    awk -v c="$c" -v e="$e" 'BEGIN { printf "%.3f\n", c / e }'
  done | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  echo "multihost: allreduce 16 MiB between 2 hosts: encrypted bus bandwidth $ratio x clear text (median of ${ENC_ROUNDS:-5} interleaved rounds)"
fi

echo "multihost: all $PASSED jobs passed"
