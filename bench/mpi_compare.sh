#!/usr/bin/env bash
# bench/mpi_compare.sh: distcomm as an MPI library, measured two ways with one standard-ABI binary
# (bench/mpi_bench.c built once with MPICH 5.0.2's mpicc_abi):
#   1. against MPICH 5.0.2: the binary on MPICH's libmpi_abi.so.1 (its mpiexec, FI_PROVIDER=shm)
#      and on distcomm's (our mpiexec), interleaved rounds (bench/compare.sh --mpi mpich-abi
#      --distcomm-mpi);
#   2. the MPI layer's own cost: the binary on distcomm's library against dc-bench, the same op
#      through the engine's C entry points, interleaved rounds (bench/compare.sh --peer
#      distcomm-mpi).
# Then one table per rank count: median over rounds of distcomm-MPI time / MPICH time (target:
# at most 1) and of distcomm-MPI time / dc-bench time (target: at most 1.10), misses marked.
# Every run checks its results (a wrong result fails the script).
#
#   bench/mpi_compare.sh [--ranks "2 4"] [-o OPS] [--sizes "16 4K 64K 1M 16M 64M"] [--rounds 5]
#                        [--out DIR] [--prefix DIR] [--no-build] [-- more bench/compare.sh options]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RANKS="2 4" OPS=all SIZES="16 4K 64K 1M 16M 64M" ROUNDS=5 OUT="" BUILD=() PREFIX_ARGS=() MORE=()
while [ $# -gt 0 ]; do
  case $1 in
    --ranks) RANKS=$2; shift 2 ;;
    -o | --ops) OPS=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --prefix) PREFIX_ARGS=(--prefix "$2"); shift 2 ;;
    --no-build) BUILD=(--no-build); shift ;;
    --) shift; MORE=("$@"); break ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "mpi_compare.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || OUT=$(mktemp -d "${TMPDIR:-/tmp}/dc-mpi-compare.XXXXXX")
mkdir -p "$OUT"
COMMON=(--ranks "$RANKS" -o "$OPS" --sizes "$SIZES" --rounds "$ROUNDS" "${PREFIX_ARGS[@]}" "${MORE[@]}")

echo "== distcomm's libmpi_abi.so.1 against MPICH 5.0.2's"
"$ROOT/bench/compare.sh" --mpi mpich-abi --distcomm-mpi "${COMMON[@]}" "${BUILD[@]}" --out "$OUT/vs-mpich"
echo "== the MPI layer's cost: distcomm's libmpi_abi.so.1 against dc-bench"
"$ROOT/bench/compare.sh" --peer distcomm-mpi "${COMMON[@]}" --no-build --out "$OUT/layer"

python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import collections, csv, statistics, sys
out = sys.argv[1]

def ratios(path, num, den):
    """Median over rounds of time(num) / time(den) per (ranks, op, bytes), out-of-place rows."""
    times = collections.defaultdict(dict)
    for r in csv.DictReader(open(path)):
        if r["inplace"] != "0":
            continue
        times[(int(r["ranks"]), r["op"], int(r["bytes"]), r["round"])][r["impl"]] = float(r["time_us"])
    per = collections.defaultdict(list)
    for (ranks, op, size, _), t in times.items():
        if t.get(num, 0) > 0 and t.get(den, 0) > 0:
            per[(ranks, op, size)].append(t[num] / t[den])
    return {k: statistics.median(v) for k, v in per.items()}

vs_mpich = ratios(f"{out}/vs-mpich/rounds.csv", "distcomm", "mpich-abi")
layer = ratios(f"{out}/layer/rounds.csv", "distcomm-mpi", "distcomm")

def size(b):
    for unit, n in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= n and b % n == 0:
            return f"{b // n} {unit}iB"
    return f"{b} B"

def cell(v, limit):
    if v is None:
        return "-"
    return f"**{v:.2f}**" if v > limit else f"{v:.2f}"

keys = sorted(set(vs_mpich) | set(layer))
sizes = sorted({k[2] for k in keys if k[1] != "barrier"})
# In the order the runs went (bench/compare.sh's order of ops).
ops = list(dict.fromkeys(r["op"] for r in csv.DictReader(open(f"{out}/vs-mpich/rounds.csv"))))
ops += [op for op in dict.fromkeys(k[1] for k in keys) if op not in ops]
misses = [0, 0]
print("Each cell: distcomm-MPI time / MPICH 5 time, then / dc-bench time (medians over rounds;")
print("targets at most 1 and at most 1.10; misses in bold).\n")
for ranks in sorted({k[0] for k in keys}):
    print(f"{ranks} ranks\n")
    print("| op | " + " | ".join(size(s) for s in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for op in ops:
        row = []
        for s in ([0] if op == "barrier" else sizes):
            a, b = vs_mpich.get((ranks, op, s)), layer.get((ranks, op, s))
            if a is None and b is None:
                row.append("")
                continue
            misses[0] += a is not None and a > 1.0
            misses[1] += b is not None and b > 1.10
            row.append(f"{cell(a, 1.0)} / {cell(b, 1.10)}")
        print(f"| {op} | " + " | ".join(row) + " |")
    print()
print(f"points behind MPICH: {misses[0]}; points where the layer costs over 10%: {misses[1]}")
PY
echo "results: $OUT/{summary.md,vs-mpich,layer}"
