#!/usr/bin/env bash
# bench/mpi_vcoll.sh: bench/mpi_vcoll.c (gather(v), scatter(v), allgather(v), alltoall(v)) built once
# with MPICH 5.0.2's mpicc_abi, run in interleaved rounds on MPICH's libmpi_abi.so.1 (its
# mpiexec, FI_PROVIDER=shm) and on distcomm's (our mpiexec); prints the median over rounds of
# distcomm's time / MPICH's per op and block size (below 1: distcomm faster).
#   bench/mpi_vcoll.sh [--ranks N] [--rounds R] [--largest BYTES] [--prefix DISTCOMM_PREFIX]
# The prefix defaults to build/bench/prefix, installed (make install) if missing; MPICH comes
# from PyPI into $MPICH_VENV (default build/venv-mpich), installed if missing.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RANKS=2 ROUNDS=3 LARGEST=4194304 PREFIX=$ROOT/build/bench/prefix
while [ $# -gt 0 ]; do
  case $1 in
    --ranks) RANKS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --largest) LARGEST=$2; shift 2 ;;
    --prefix) PREFIX=$2; shift 2 ;;
    *) sed -n '2,8p' "$0" >&2; exit 2 ;;
  esac
done
MPICH_VENV=${MPICH_VENV:-$ROOT/build/venv-mpich}
if [ ! -x "$MPICH_VENV/bin/mpicc_abi" ]; then
  python3 -m venv "$MPICH_VENV" && "$MPICH_VENV/bin/pip" install -q mpich==5.0.2
fi
[ -x "$PREFIX/bin/mpiexec" ] || make -C "$ROOT" install PREFIX="$PREFIX" >/dev/null
# Where ranks outnumber the cores MPICH polls and yields for milliseconds a call by default;
# a usleep(1) after each empty poll is its better setting there (as bench/compare.sh runs it).
MPICH_ENV=(FI_PROVIDER=shm)
if [ "$RANKS" -gt "$(nproc)" ]; then
  MPICH_ENV+=(MPIR_CVAR_CH4_PROGRESS_THROTTLE=1 MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT=1)
fi
OUT=$(mktemp -d /tmp/dc-vcoll.XXXXXX)
"$MPICH_VENV/bin/mpicc_abi" -O2 -std=c11 -Wall -o "$OUT/mpi_vcoll" "$ROOT/bench/mpi_vcoll.c"
for r in $(seq "$ROUNDS"); do
  env "${MPICH_ENV[@]}" LD_LIBRARY_PATH="$MPICH_VENV/lib" "$MPICH_VENV/bin/mpiexec" -n "$RANKS" "$OUT/mpi_vcoll" "$LARGEST" > "$OUT/mpich.$r.csv"
  LD_LIBRARY_PATH="$PREFIX/lib" "$PREFIX/bin/mpiexec" -n "$RANKS" "$OUT/mpi_vcoll" "$LARGEST" > "$OUT/distcomm.$r.csv"
done
python3 - "$OUT" "$ROUNDS" "$RANKS" <<'PY'
import statistics, sys
out, rounds, ranks = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(p):
    rows = {}
    for line in open(p):
        f = line.strip().split(',')
        if len(f) >= 3:
            if len(f) > 3:
                sys.exit(f"{p}: wrong results at {f[0]} {f[1]}")
            rows[(f[0], int(f[1]))] = float(f[2])
    return rows
runs = [(load(f"{out}/distcomm.{r}.csv"), load(f"{out}/mpich.{r}.csv")) for r in range(1, rounds + 1)]
keys = list(runs[0][0])
sizes = sorted({k[1] for k in keys})
print(f"# {ranks} ranks, {rounds} rounds: median of distcomm time / MPICH time (results in {out})")
print("| op | " + " | ".join(str(s) for s in sizes) + " |")
print("|---|" + "---|" * len(sizes))
for op in dict.fromkeys(k[0] for k in keys):
    cells = [f"{statistics.median(d[(op, s)] / m[(op, s)] for d, m in runs):.2f}" for s in sizes]
    print(f"| {op} | " + " | ".join(cells) + " |")
PY
