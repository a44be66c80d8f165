#!/usr/bin/env bash
# Starts N ranks of PROG the way a user without dcrun would: only RANK, WORLD_SIZE,
# MASTER_ADDR and MASTER_PORT set (rank 0 serves the store). Exits non-zero if any rank fails.
# Usage: launch_by_hand.sh N PROG [ARGS...]
set -u
n=$1
shift
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo $((20000 + RANDOM % 30000)))
pids=()
for ((r = 0; r < n; r++)); do
  env -u DC_TOKEN -u DC_LAUNCHER_STORE RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$@" &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do
  wait "$pid" || rc=1
done
exit $rc
