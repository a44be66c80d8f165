#!/usr/bin/env bash
# bench/plain_launch.sh NP CMD...: starts NP ranks of CMD on this host the way a plain env://
# launcher does (torchrun without binding): the rendezvous variables only, every rank free to
# run on any core. Exits with the first failing rank's status.
set -u
np=$1
shift
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for ((r = 0; r < np; r++)); do
  env MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" RANK="$r" WORLD_SIZE="$np" LOCAL_RANK="$r" LOCAL_WORLD_SIZE="$np" "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do
  wait "$p" || { s=$?; [ "$rc" -ne 0 ] || rc=$s; }
done
exit "$rc"
