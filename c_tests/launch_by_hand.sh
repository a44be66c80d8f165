#!/usr/bin/env bash
# Starts N ranks of PROG the way a user without dcrun would: only RANK, WORLD_SIZE,
# MASTER_ADDR and MASTER_PORT set (rank 0 serves the store). Exits non-zero if any rank fails.
# With --as LAUNCHER, RANK and WORLD_SIZE are replaced by that launcher's variables, as its
# launcher sets them: slurm (srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), openmpi (mpirun:
# OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK) or hydra (MPICH mpiexec: PMI_RANK, PMI_SIZE).
# Usage: launch_by_hand.sh [--as slurm|openmpi|hydra] N PROG [ARGS...]
set -u
launcher=torch
if [ "${1:-}" = --as ]; then
  launcher=$2
  shift 2
fi
n=$1
shift
rank_vars() { # rank_vars R: the variables that tell rank R who it is
  case $launcher in
    torch) echo "RANK=$1 WORLD_SIZE=$n" ;;
    slurm) echo "SLURM_PROCID=$1 SLURM_NTASKS=$n SLURM_LOCALID=$1 SLURM_JOB_ID=1" ;;
    openmpi) echo "OMPI_COMM_WORLD_RANK=$1 OMPI_COMM_WORLD_SIZE=$n OMPI_COMM_WORLD_LOCAL_RANK=$1" ;;
    hydra) echo "PMI_RANK=$1 PMI_SIZE=$n" ;;
    *) echo "launch_by_hand.sh: unknown launcher $launcher" >&2; exit 2 ;;
  esac
}
rank_vars 0 >/dev/null || exit 2
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo $((20000 + RANDOM % 30000)))
pids=()
for ((r = 0; r < n; r++)); do
  # shellcheck disable=SC2046
  env -u DC_TOKEN -u DC_LAUNCHER_STORE -u RANK -u WORLD_SIZE -u LOCAL_RANK $(rank_vars $r) \
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$@" &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do
  wait "$pid" || rc=1
done
exit $rc
