#!/usr/bin/env bash
# scripts/scale.sh: distcomm at scale on this one machine, and Open MPI beside it where it runs.
#
#   1. ranks as threads of one process (examples/scale_threads.rs, tcp:// rendezvous on
#      loopback), for each N and backend: init time (slowest rank), descriptors the process holds
#      per rank after init and after the operations, the most /dev/shm held meanwhile, and the
#      16 B / 1 MiB allreduce, ring send/recv and barrier times (slowest rank, median of runs);
#      every result is checked
#   2. N processes on this host: the whole job (start to last exit) and the 16 B allreduce of
#      dc-bench under dcrun and under a plain env:// launcher (no binding, as torchrun), against
#      Open MPI's mpirun with bench/mpi_bench.c, interleaved (ABC CBA ...) over ROUNDS rounds;
#      medians
# Prints a Markdown table of each; --out DIR also writes threads.csv, procs.csv and results.md.
#
# usage: scripts/scale.sh [--threads "64 256 1024"] [--backends "auto socket"] [--procs 64]
#                         [--rounds 3] [--iters 5] [--out DIR] [--no-mpi]
# Installs Open MPI (apt) if missing, unless --no-mpi. Needs ~2 GiB of memory at 1024 threads.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

THREADS="64 256 1024"
BACKENDS="auto socket"
PROCS=64
ROUNDS=3
ITERS=5
OUT=""
MPI=1
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS=$2; shift 2 ;;
    --backends) BACKENDS=$2; shift 2 ;;
    --procs) PROCS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-mpi) MPI=0; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "scale.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/distcomm-scale.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
[ -n "$OUT" ] && mkdir -p "$OUT"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

cargo build --release --bins --example scale_threads
BIN=target/release

# ---- 1. threads -------------------------------------------------------------------------------
TCSV="$WORK/threads.csv"
for n in $THREADS; do
  for b in $BACKENDS; do
    echo "threads: $n ranks, backend $b" >&2
    if ! timeout 900 "$BIN/examples/scale_threads" --ranks "$n" --backend "$b" --iters "$ITERS" --csv "$TCSV"; then
      echo "ranks=$n backend=$b: FAILED" >&2
      [ -s "$TCSV" ] || echo "ranks,backend,ok" > "$TCSV"
      echo "$n,$b,false" >> "$TCSV"
    fi
  done
done

# ---- 2. processes -----------------------------------------------------------------------------
PCSV="$WORK/procs.csv"
echo "launcher,round,wall_s,allreduce_16B_us" > "$PCSV"
have_mpi=0
if [ "$MPI" = 1 ]; then
  if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
    . scripts/packages.sh
    ensure_packages mpicc.openmpi mpirun.openmpi bc || echo "note: Open MPI could not be installed; processes without it" >&2
  fi
  if command -v mpicc >/dev/null && mpicc -O2 -std=c11 -o "$WORK/mpi_bench" bench/mpi_bench.c -lm; then
    have_mpi=1
  fi
fi
BENCH=(-o allreduce -b 16 -e 16 -n 200 -w 20 -c 1)
# The time column (time_us) of the one row a bench CSV holds.
csv_time() { awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "time_us") c = i } NR == 2 { print $c }' "$1"; }
now() { date +%s.%N; }
run_dcrun() { timeout 600 "$BIN/dcrun" -n "$PROCS" "$BIN/dc-bench" "${BENCH[@]}" --csv "$1" >/dev/null; }
run_env() {
  local port=$((20000 + RANDOM % 20000)) pids=()
  for ((r = 0; r < PROCS; r++)); do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=$PROCS RANK=$r DC_TOKEN=scale-$port \
      timeout 600 "$BIN/dc-bench" "${BENCH[@]}" --csv "$1.$r" >/dev/null &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ -f "$1.0" ] && mv "$1.0" "$1"
  rm -f "$1".*
  return $rc
}
run_mpi() {
  local extra=()
  [ "$(id -u)" = 0 ] && extra+=(--allow-run-as-root)
  timeout 600 mpirun "${extra[@]}" --oversubscribe -np "$PROCS" "$WORK/mpi_bench" "${BENCH[@]}" --csv "$1" >/dev/null
}
LAUNCHERS="dcrun env"
[ "$have_mpi" = 1 ] && LAUNCHERS="dcrun env openmpi"
for ((k = 0; k < ROUNDS; k++)); do
  order=$LAUNCHERS
  [ $((k % 2)) = 1 ] && order=$(echo "$LAUNCHERS" | tr ' ' '\n' | tac | tr '\n' ' ')
  for l in $order; do
    echo "processes: $PROCS ranks, $l, round $k" >&2
    csv="$WORK/$l.$k.csv"
    t0=$(now)
    if "run_${l/openmpi/mpi}" "$csv"; then
      t1=$(now)
      echo "$l,$k,$(echo "$t1 - $t0" | bc -l),$(csv_time "$csv")" >> "$PCSV"
    else
      echo "$l,$k,FAILED," >> "$PCSV"
    fi
  done
done

# ---- tables -----------------------------------------------------------------------------------
{
  echo "### Ranks as threads of one process ($(nproc) cores)"
  echo
  echo "| ranks | backend | ok | init s | fds/rank after init | fds/rank after ops | /dev/shm peak MiB | allreduce 16 B us | allreduce 1 MiB us | ring send/recv us | barrier us |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  [ -s "$TCSV" ] && awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    { printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $c["ranks"], $c["backend"], $c["ok"], $c["init_s"], $c["fds_per_rank_init"], $c["fds_per_rank_ops"], $c["shm_peak_MiB"], $c["allreduce_16B_us"], $c["allreduce_1MiB_us"], $c["ring_sendrecv_us"], $c["barrier_us"] }' "$TCSV"
  echo
  echo "### $PROCS processes on this host (medians of $ROUNDS interleaved rounds)"
  echo
  echo "| launcher | whole job s | allreduce 16 B us | runs |"
  echo "|---|---|---|---|"
  for l in $LAUNCHERS; do
    awk -F, -v l="$l" 'function med(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t } return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
      $1 == l && $3 != "FAILED" { n++; w[n] = $3; t[n] = $4 } $1 == l && $3 == "FAILED" { f++ }
      END { if (n) printf "| %s | %.2f | %.1f | %d ok, %d failed |\n", l, med(w, n), med(t, n), n, f; else printf "| %s | - | - | 0 ok, %d failed |\n", l, f }' "$PCSV"
  done
} | tee "$WORK/results.md"
if [ -n "$OUT" ]; then cp "$TCSV" "$PCSV" "$WORK/results.md" "$OUT/"; fi
