#!/usr/bin/env bash
# bench/busy_table.sh: the busy-machine table of the README (issue 15) in one go: bench/compare.sh
# against Open MPI (or the MPI that `-- --mpi ...` names) at 2 ranks with 0, 1 and 2 busy
# processes beside both libraries, each with
# dcrun's binding (against mpirun's default) and with the plain env:// launcher (against
# `--bind-to none`), then one markdown table of the six columns (median over the rounds of
# distcomm time / Open MPI time, and the range over the rounds) and, per column, in how many
# cells distcomm's spread over the rounds (slowest / fastest round) is no wider than Open MPI's.
#
# Usage: bench/busy_table.sh [--out DIR] [--loads "0 1 2"] [--launchers "dcrun plain"]
#                            [-- any bench/compare.sh options]
# Defaults: --out build/bench/busy, and compare.sh's -o allreduce,broadcast,allgather,sendrecv
# --sizes "16 4K 64K 1M 16M" --rounds 5 unless given after `--`. Writes DIR/L_X/ (compare.sh's
# output for each column), DIR/table.md, and prints the table. Needs Open MPI (compare.sh
# installs it) and a machine that is otherwise quiet: the busy processes are the load.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/build/bench/busy"
LOADS="0 1 2"
LAUNCHERS="dcrun plain"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --loads) LOADS="$2"; shift 2 ;;
    --launchers) LAUNCHERS="$2"; shift 2 ;;
    --) shift; break ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "busy_table.sh: unknown option $1 (compare.sh's options go after --)" >&2; exit 2 ;;
  esac
done
EXTRA=("$@")
[ ${#EXTRA[@]} -gt 0 ] || EXTRA=(-o allreduce,broadcast,allgather,sendrecv --sizes "16 4K 64K 1M 16M" --rounds 5)
mkdir -p "$OUT"
# Build and install once; the columns then reuse it.
built=0
for load in $LOADS; do
  for launcher in $LAUNCHERS; do
    build=(--no-build); [ $built = 1 ] || build=()
    echo "== load $load, launcher $launcher"
    "$ROOT/bench/compare.sh" "${build[@]}" --ranks 2 --load "$load" --launcher "$launcher" "${EXTRA[@]}" \
      --out "$OUT/${load}_$launcher" > "$OUT/${load}_$launcher.log" 2>&1 ||
      { echo "busy_table.sh: compare.sh failed, see $OUT/${load}_$launcher.log" >&2; exit 1; }
    built=1
  done
done
python3 - "$OUT" "$LOADS" "$LAUNCHERS" <<'PY' | tee "$OUT/table.md"
import collections, csv, statistics, sys
out, loads, launchers = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
cols = [(l, x) for l in loads for x in launchers]
def name(b):
    for unit, n in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= n and b % n == 0:
            return f"{b // n}{unit}"
    return str(b)
ratios, spreads, points, peers = {}, {}, [], set()
for col in cols:
    runs = collections.defaultdict(dict)       # (op, bytes, round) -> impl -> time
    times = collections.defaultdict(lambda: collections.defaultdict(list))
    for row in csv.DictReader(open(f"{out}/{col[0]}_{col[1]}/rounds.csv")):
        if row["inplace"] != "0":
            continue
        key, t = (row["op"], int(row["bytes"])), float(row["time_us"])
        runs[key + (row["round"],)][row["impl"]] = t
        peers.add(row["impl"])
        times[key][row["impl"]].append(t)
        if key not in points:
            points.append(key)
    # The peer is whatever compare.sh compared with (Open MPI unless `-- --mpi ...` said otherwise).
    peer = next(iter(peers - {"distcomm"}), "openmpi")
    r = collections.defaultdict(list)
    for (op, b, _), v in runs.items():
        if "distcomm" in v and v.get(peer, 0) > 0:
            r[(op, b)].append(v["distcomm"] / v[peer])
    ratios[col] = r
    spreads[col] = {k: (max(v["distcomm"]) / min(v["distcomm"]), max(v[peer]) / min(v[peer]))
                    for k, v in times.items() if v.get("distcomm") and v.get(peer) and min(v["distcomm"]) > 0 and min(v[peer]) > 0}
print("| op | size | " + " | ".join(f"load {l}, {x}" for l, x in cols) + " |")
print("|---|---:|" + "---:|" * len(cols))
above = 0
for op, b in points:
    cells = []
    for col in cols:
        v = ratios[col].get((op, b))
        if not v:
            cells.append("-")
            continue
        m = statistics.median(v)
        above += m > 1
        cells.append((f"**{m:.2f}**" if m > 1 else f"{m:.2f}") + f" ({min(v):.2f}-{max(v):.2f})")
    print(f"| {op} | {name(b)} | " + " | ".join(cells) + " |")
print()
print(f"Time ratios distcomm / {peer}. Cells with the median above 1 (distcomm slower): {above}.")
print(f"Spread (slowest / fastest round), cells where distcomm's is no wider than {peer}'s, per column: "
      + ", ".join(f"load {l} {x}: {sum(a <= o for a, o in spreads[(l, x)].values())}/{len(spreads[(l, x)])}"
                  f" (ours at most {max(a for a, _ in spreads[(l, x)].values()):.1f}x, {peer}'s {max(o for _, o in spreads[(l, x)].values()):.1f}x)"
                  for l, x in cols if spreads[(l, x)]) + ".")
PY
