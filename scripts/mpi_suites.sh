#!/usr/bin/env bash
# scripts/mpi_suites.sh: the OSU micro-benchmarks and the Intel MPI Benchmarks, built unmodified
# with distcomm's installed mpicc/mpicxx and run by its mpiexec; prints one line per program
# (exit status, last result line) and exits 1 if one that should run did not.
#
#   scripts/mpi_suites.sh --prefix DIR [--osu SRC] [--imb SRC] [--ranks "2 4"] [--out DIR]
#
# SRC: an unpacked source tree (OSU: the release tarball's or a git copy, any version with
# ./configure; IMB: github.com/intel/mpi-benchmarks). Neither is fetched here (CI machines reach
# only package registries), nor copied into this repository: run it where you have them.
# DIR: a `make install PREFIX=DIR` of this repository.
set -uo pipefail
PREFIX="" OSU="" IMB="" RANKS="2 4" OUT=$(mktemp -d /tmp/mpi_suites.XXXXXX)
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) PREFIX=$2; shift 2 ;;
    --osu) OSU=$2; shift 2 ;;
    --imb) IMB=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --out) OUT=$2; mkdir -p "$OUT"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$PREFIX/bin/mpicc" ] || { echo "--prefix must be a distcomm install (bin/mpicc)" >&2; exit 2; }
MPICC=$PREFIX/bin/mpicc MPICXX=$PREFIX/bin/mpicxx MPIEXEC=$PREFIX/bin/mpiexec
FAILED=0
report() { # name ranks rc log
  local last verdict=ok
  last=$(grep -v '^#' "$4" | grep -v '^$' | tail -1 | cut -c1-90)
  if [ "$3" != 0 ]; then verdict=FAILED; FAILED=1; fi
  printf '%-26s n=%-2s %-11s %s\n' "$1" "$2" "$verdict" "$last"
}

if [ -n "$OSU" ]; then
  B=$OUT/osu; rm -rf "$B"; cp -a "$OSU" "$B"  # -a: timestamps kept, or make reruns automake
  echo "== OSU micro-benchmarks ($B)"
  if ! (cd "$B" && ./configure CC="$MPICC" CXX="$MPICXX" >"$OUT/osu_configure.log" 2>&1 && make -j2 >"$OUT/osu_make.log" 2>&1); then
    echo "OSU did not build (see $OUT/osu_*.log)"; FAILED=1
  else
    for n in $RANKS; do
      for p in $(cd "$B" && find mpi -type f -perm -u+x -name 'osu_*' | sort); do
        name=$(basename "$p")
        case $p in
          */one-sided/*)
            [ "$n" != 2 ] && continue  # "This test requires exactly two processes"
            for s in default fence pscw; do
              args=(); [ $s != default ] && args=(-s $s)
              log=$OUT/${name}_${s}_$n.log
              timeout 300 "$MPIEXEC" -n "$n" "$B/$p" "${args[@]}" >"$log" 2>&1
              report "$name ($s)" "$n" $? "$log"
            done ;;
          */pt2pt/*)
            [ "$n" != 2 ] && case $name in osu_latency|osu_bw|osu_bibw|osu_latency_mt) continue ;; esac
            log=$OUT/${name}_$n.log; timeout 300 "$MPIEXEC" -n "$n" "$B/$p" >"$log" 2>&1; report "$name" "$n" $? "$log" ;;
          *)
            log=$OUT/${name}_$n.log; timeout 300 "$MPIEXEC" -n "$n" "$B/$p" >"$log" 2>&1; report "$name" "$n" $? "$log" ;;
        esac
      done
    done
  fi
fi

if [ -n "$IMB" ]; then
  B=$OUT/imb; rm -rf "$B"; cp -a "$IMB" "$B"
  echo "== Intel MPI Benchmarks ($B)"
  if ! (cd "$B" && make CC="$MPICC" CXX="$MPICXX" IMB-MPI1 IMB-NBC IMB-P2P IMB-EXT IMB-RMA IMB-IO >"$OUT/imb_make.log" 2>&1); then
    echo "IMB did not build (see $OUT/imb_make.log)"; FAILED=1
  else
    for n in $RANKS; do
      for p in IMB-MPI1 IMB-NBC IMB-P2P IMB-EXT IMB-RMA IMB-IO; do
        log=$OUT/${p}_$n.log
        # From its own folder: IMB-IO writes its scratch files (IMB_out_*) where it runs.
        (cd "$B" && timeout 900 "$MPIEXEC" -n "$n" "$B/$p" -msglog 0:18 -time 0.2 -npmin "$n" >"$log" 2>&1)
        rc=$?
        printf '%-26s n=%-2s %s benchmarks run\n' "$p" "$n" "$(grep -c '# Benchmarking' "$log")"
        report "$p" "$n" $rc "$log"
      done
    done
  fi
fi
echo "logs: $OUT"
exit $FAILED
