#!/usr/bin/env bash
# Tests of distcomm's MPI library (libmpi_abi.so.1, the MPI 5.0 standard ABI; mpi/):
#   1. include/mpi.h and mpi/src/abi_gen.rs are what mpi/abi/gen.py makes of the table
#   2. MPICH 5.0.2 from PyPI in a venv (installed if missing: $MPICH_VENV, default
#      build/venv-mpich), the reference for the next steps
#   3. every constant, predefined handle and sizeof printed by one program built with our mpi.h
#      and with MPICH's mpi_abi.h: identical; every prototype of the table compiled against
#      MPICH's header (-Werror: a differing prototype is a conflicting-types error)
#   4. the installed library: soname libmpi_abi.so.1, every function of the table exported as
#      MPI_x and PMPI_x, nothing of the engine's dc_* exported
#   5. mpi/tests/*.c built with the installed mpicc (one also with mpicxx as C++), run by the
#      installed mpiexec at 1 to 4 ranks, and t_env/t_coll as singletons (no launcher);
#      DC_DEBUG=WARN names an unsupported function; ERRORS_ARE_FATAL and MPI_Abort end the job;
#      a rank that dies gives the others MPIX_ERR_PROC_FAILED (t_proc_failed, ours only);
#      a sendrecv with a stopped peer ends within one timeout (t_timeout, ours only);
#      mpiexec's host placement (-hosts, -host, hostfiles: -dry-run plans and errors) and two
#      dcruns in its multi-node form on this machine (-launcher fork)
#   6. the same sources built with MPICH's mpicc_abi, run on our library (LD_LIBRARY_PATH) by
#      our mpiexec; our library started by MPICH's Hydra mpiexec (PMI-1); and our binaries
#      run on MPICH's library by MPICH's mpiexec
#   7. bench/mpi_bench.c (bench/compare.sh's benchmark) built with our mpicc: every op, checked,
#      on our library and on MPICH's
#
# usage: scripts/mpi_test.sh [PREFIX]   (PREFIX: an installed distcomm; default: make install
#                                        into a temporary prefix)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/distcomm-mpi-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
step() { printf '\n---- mpi: %s (at %ds)\n' "$*" "$SECONDS"; }
fail() { echo "mpi_test: FAIL: $*" >&2; exit 1; }

PREFIX=${1:-}
if [ -z "$PREFIX" ]; then
  step "make install into a temporary prefix"
  PREFIX="$TMP/prefix"
  make install PREFIX="$PREFIX" >/dev/null
fi
PREFIX=$(cd "$PREFIX" && pwd)
[ -f "$PREFIX/lib/libmpi_abi.so.1" ] || fail "$PREFIX/lib/libmpi_abi.so.1 is not installed"

step "generated files are current"
python3 mpi/abi/gen.py --check

step "MPICH 5.0.2 (PyPI) for the comparisons"
MPICH_VENV=${MPICH_VENV:-$ROOT/build/venv-mpich}
if [ ! -x "$MPICH_VENV/bin/mpicc_abi" ]; then
  rm -rf "$MPICH_VENV"
  "${PYTHON:-python3}" -m venv "$MPICH_VENV"
  "$MPICH_VENV/bin/python" -m pip install -q --disable-pip-version-check mpich==5.0.2
fi
MPICH_INC="$MPICH_VENV/include"
[ -f "$MPICH_INC/mpi_abi.h" ] || fail "no mpi_abi.h in $MPICH_INC"
"$MPICH_VENV/bin/python" -m pip show mpich 2>/dev/null | grep -E '^(Name|Version)'

step "constants and sizes: our mpi.h against MPICH's mpi_abi.h"
python3 mpi/abi/gen.py --constants-program "$TMP/consts.c"
cc -std=c11 -Wall -Werror -I"$PREFIX/include" "$TMP/consts.c" -o "$TMP/consts_ours"
cc -std=c11 -Wall -Werror -I"$MPICH_INC" -DMPI_HEADER='"mpi_abi.h"' "$TMP/consts.c" -o "$TMP/consts_mpich"
"$TMP/consts_ours" > "$TMP/consts_ours.txt"
"$TMP/consts_mpich" > "$TMP/consts_mpich.txt"
diff -u "$TMP/consts_mpich.txt" "$TMP/consts_ours.txt" || fail "constants differ from MPICH's mpi_abi.h"
echo "$(wc -l < "$TMP/consts_ours.txt") constants and sizes identical"
# Our header in C++ too.
c++ -Wall -Werror -I"$PREFIX/include" -x c++ "$TMP/consts.c" -o "$TMP/consts_cxx"
cmp -s <("$TMP/consts_cxx") "$TMP/consts_ours.txt" || fail "mpi.h gives other values in C++"

step "prototypes: the table against MPICH's mpi_abi.h"
python3 mpi/abi/gen.py --prototypes "$TMP/protos.c"
cc -std=c11 -Wall -Werror -c -I"$MPICH_INC" -DMPI_HEADER='"mpi_abi.h"' "$TMP/protos.c" -o "$TMP/protos.o"
cc -std=c11 -Wall -Werror -c -I"$PREFIX/include" -DMPI_HEADER='<mpi.h>' "$TMP/protos.c" -o "$TMP/protos.o"
echo "$(grep -c '^[a-zA-Z].*(.*);$' "$TMP/protos.c") declarations agree"

step "exports of libmpi_abi.so.1"
LIB="$PREFIX/lib/libmpi_abi.so.1"
readelf -d "$LIB" | grep -q 'Library soname: \[libmpi_abi.so.1\]' || fail "soname is not libmpi_abi.so.1"
[ "$(readlink "$PREFIX/lib/libmpi_abi.so")" = libmpi_abi.so.1 ] || fail "lib/libmpi_abi.so is not a link to libmpi_abi.so.1"
nm -D --defined-only "$LIB" | awk '$2 == "T" { print $3 }' | sort > "$TMP/exported.txt"
awk '$1 == "fn" || $1 == "extfn" { print $3; print "P" $3 }' mpi/abi/mpi_abi.txt | sort > "$TMP/table.txt"
missing=$(comm -23 "$TMP/table.txt" "$TMP/exported.txt")
[ -z "$missing" ] || fail "not exported: $(echo $missing | head -c 400)"
extra=$(comm -13 "$TMP/table.txt" "$TMP/exported.txt")
[ -z "$extra" ] || fail "exported beyond the table: $(echo $extra | head -c 400)"
echo "$(wc -l < "$TMP/exported.txt") functions exported (MPI_ and PMPI_), nothing else"

step "wrappers"
"$PREFIX/bin/mpicc" -show -c x.c | grep -q -- "-I$PREFIX/include" || fail "mpicc -show"
"$PREFIX/bin/mpicc" -show -c x.c | grep -q -- "-lmpi_abi" && fail "mpicc -c must not link"
"$PREFIX/bin/mpicc" -show x.c -o x | grep -q -- "-Wl,-rpath,$PREFIX/lib -lmpi_abi" || fail "mpicc -show (link)"
"$PREFIX/bin/mpicxx" -show x.cc | grep -q -- "-lmpi_abi" || fail "mpicxx -show"
"$PREFIX/bin/mpicc" -show -pthread x.c | grep -q -- " -pthread " || fail "mpicc does not pass -pthread through"
# autoconf's `CC=mpicc ./configure` exports CC=mpicc: the wrapper must not call itself through it
printf 'int main(void) { return 0; }\n' > "$TMP/cc_env.c"
CC="$PREFIX/bin/mpicc" CXX="$PREFIX/bin/mpicxx" timeout 60 "$PREFIX/bin/mpicc" -c "$TMP/cc_env.c" -o "$TMP/cc_env.o" ||
  fail "mpicc with CC=mpicc in the environment (autoconf) did not compile"
MPICC_CC="$PREFIX/bin/mpicc" timeout 60 "$PREFIX/bin/mpicc" -c "$TMP/cc_env.c" -o "$TMP/cc_env.o" ||
  fail "mpicc with MPICC_CC=mpicc did not compile"
[ -x "$PREFIX/bin/mpirun" ] || fail "no mpirun"

step "C tests built with the installed mpicc"
TESTS=(t_env t_comm t_comm2 t_intercomm t_p2p t_coll t_coll2 t_pcoll t_topo t_greq t_misc t_errors t_probe t_threads t_dtype t_win t_file t_io t_session t_ops2 t_partitioned)
mkdir -p "$TMP/ours" "$TMP/mpich"
for t in "${TESTS[@]}" t_fatal t_proc_failed t_timeout; do
  "$PREFIX/bin/mpicc" -std=c11 -Wall -Wextra -Werror -O1 -g -pthread "mpi/tests/$t.c" -o "$TMP/ours/$t"
done
"$PREFIX/bin/mpicxx" -Wall -Werror -x c++ "mpi/tests/t_env.c" -o "$TMP/ours/t_env_cxx"
readelf -d "$TMP/ours/t_env" | grep -q 'NEEDED.*\[libmpi_abi.so.1\]' || fail "binary does not need libmpi_abi.so.1"

export DC_TIMEOUT_MS=${DC_TIMEOUT_MS:-60000}
run() { # run LABEL EXPECTED_PASS_LINES COMMAND...
  local label=$1 want=$2
  shift 2
  if ! timeout 120 "$@" > "$TMP/out.txt" 2>&1; then
    cat "$TMP/out.txt"
    fail "$label"
  fi
  local got
  got=$(grep -c ' passed ' "$TMP/out.txt" || true)
  [ "$got" = "$want" ] || { cat "$TMP/out.txt"; fail "$label: $got of $want ranks passed"; }
  echo "ok $label"
}

step "C tests on distcomm: mpiexec at 1 to 4 ranks, singletons"
for t in "${TESTS[@]}"; do
  for n in 1 2 3 4; do
    run "$t -n $n" "$n" env EXPECT_DISTCOMM=1 "$PREFIX/bin/mpiexec" -n "$n" "$TMP/ours/$t"
  done
done
run "t_env (C++) -n 2" 2 env EXPECT_DISTCOMM=1 "$PREFIX/bin/mpirun" -np 2 "$TMP/ours/t_env_cxx"
for t in t_env t_coll t_p2p; do
  run "$t singleton" 1 env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT EXPECT_DISTCOMM=1 "$TMP/ours/$t"
done

step "mpiexec across hosts: -hosts, -host, hostfiles (the plan), then two dcruns here (-launcher fork)"
# (A refused plan is an answer too: its message is what is checked.)
plan() { { "$PREFIX/bin/mpiexec" -dry-run "$@" ./prog 2>&1 || true; } | sed -E 's/:[0-9]{4,5}/:PORT/g'; }
plan_has() { # plan_has PATTERN MPIEXEC-ARGS...
  local pat=$1 out
  shift
  out=$(plan "$@")
  grep -q -- "$pat" <<<"$out" || fail "mpiexec -dry-run $*: no line matching $pat in
$out"
}
expect_plan() { # expect_plan "WANTED LINES" MPIEXEC-ARGS...
  local want=$1 got
  shift
  got=$(plan "$@" | sed -E "s/^(host [^:]*: ranks [0-9-]*): .*--node-rank' '([0-9]+)'.*/\\1 node \\2/")
  [ "$got" = "$want" ] || fail "mpiexec -dry-run $*: got
$got
expected
$want"
}
expect_plan $'host hA: ranks 0-1 node 0\nhost hB: ranks 2-3 node 1' -n 4 -hosts hA:2,hB:2
expect_plan $'host a: ranks 0-1 node 0\nhost b: ranks 2-3 node 1' -n 4 -host a,b
expect_plan $'host a: ranks 0-2 node 0\nhost b: ranks 3-5 node 1\nhost c: ranks 6-8 node 2' -n 9 -hosts a,b,c:5 -ppn 3
expect_plan $'host a: ranks 0-1 node 0\nhost b: ranks 2-3 node 1' -n 4 -hosts a:2,b:2,c:2
printf '# comment\n\nhA slots=2  # first\n  hB:2\nhC\n' >"$TMP/hostfile"
expect_plan $'host hA: ranks 0-1 node 0\nhost hB: ranks 2-3 node 1' -n 4 -f "$TMP/hostfile"
expect_plan $'host hA: ranks 0-1 node 0\nhost hB: ranks 2-3 node 1\nhost hC: ranks 4-5 node 2' -n 6 -machinefile "$TMP/hostfile" -ppn 2
plan_has "a:2 b:1 (host:ranks); dcrun runs the same number" -n 3 -hosts a,b
printf 'hA slots\n' >"$TMP/badhosts"
plan_has "cannot read 'hA slots'" -hostfile "$TMP/badhosts"
plan_has "^host hB: ranks 1-1: /opt/agent hB 'cd' " -n 2 -hosts hA,hB -launcher-exec /opt/agent
plan_has "^host hB: ranks 1-1: ssh -x hB .*'--master' 'hA:PORT'" -n 2 -hosts hA,hB
plan_has "^host localhost: ranks 0-1: here: .*dcrun -n 2 " -n 2 -hosts localhost:2
# A remote dcrun gets DC_* and -genv on its line, the token on its standard input only.
plan_has "exec env .*'DC_TIMEOUT_MS=[0-9]*'.*'X=1' '/" -n 2 -hosts hA,hB -genv X 1
plan -n 2 -hosts hA,hB | grep -q "DC_TOKEN=" && fail "mpiexec puts DC_TOKEN on a command line"
plan_has "'--keep-going'" -n 2 -hosts hA,hB -disable-auto-cleanup
plan_has "host 0 is localhost: the other hosts could not reach" -n 2 -hosts localhost,hB
echo "ok plans"
run "t_p2p -n 4 -hosts hA:2,hB:2 -launcher fork" 4 env EXPECT_DISTCOMM=1 "$PREFIX/bin/mpiexec" -launcher fork -n 4 -hosts hA:2,hB:2 "$TMP/ours/t_p2p"
run "t_threads -n 4 -hosts hA,hB -launcher fork" 4 env EXPECT_DISTCOMM=1 "$PREFIX/bin/mpiexec" -launcher fork -n 4 -hosts hA,hB "$TMP/ours/t_threads"

step "DC_DEBUG=WARN names the function that failed"
DC_DEBUG=WARN EXPECT_DISTCOMM=1 "$PREFIX/bin/mpiexec" -n 2 "$TMP/ours/t_errors" > "$TMP/warn.txt" 2>&1 || { cat "$TMP/warn.txt"; fail "t_errors with DC_DEBUG=WARN"; }
grep -q 'WARN MPI_Close_port: MPI_ERR_UNSUPPORTED_OPERATION' "$TMP/warn.txt" || { cat "$TMP/warn.txt"; fail "no WARN line naming MPI_Close_port"; }
grep -q 'WARN MPI_Send: MPI_ERR_RANK' "$TMP/warn.txt" || fail "no WARN line naming MPI_Send"
echo "ok"

step "MPI_ERRORS_ARE_FATAL and MPI_Abort end the job"
for mode in fatal abort; do
  set +e
  timeout 60 "$PREFIX/bin/mpiexec" -n 3 "$TMP/ours/t_fatal" "$mode" > "$TMP/fatal.txt" 2>&1
  rc=$?
  set -e
  cat "$TMP/fatal.txt"
  [ "$rc" != 124 ] || fail "t_fatal $mode: the job did not end (timeout)"
  grep -q "never reached" "$TMP/fatal.txt" && fail "t_fatal $mode: a rank went on"
  if [ "$mode" = abort ]; then
    [ "$rc" = 3 ] || fail "t_fatal abort: exit status $rc, expected 3 (MPI_Abort's code)"
    grep -q "MPI_Abort" "$TMP/fatal.txt" || fail "t_fatal abort: no message"
  else
    [ "$rc" != 0 ] || fail "t_fatal: exit status 0"
    grep -q "fatal MPI error: MPI_Send: MPI_ERR_RANK" "$TMP/fatal.txt" || fail "t_fatal: no message naming MPI_Send"
  fi
  echo "ok t_fatal $mode (exit $rc)"
done
# MPIEXEC_TIMEOUT (as MPICH's mpiexec): a job still running then is stopped, status 124.
set +e
start=$SECONDS
MPIEXEC_TIMEOUT=2 timeout 60 "$PREFIX/bin/mpiexec" -n 2 "$TMP/ours/t_fatal" stuck > "$TMP/fatal.txt" 2>&1
rc=$?
set -e
[ "$rc" = 124 ] && [ $((SECONDS - start)) -lt 30 ] || { cat "$TMP/fatal.txt"; fail "MPIEXEC_TIMEOUT=2: exit status $rc after $((SECONDS - start)) s, expected 124 within seconds"; }
grep -q "time limit of 2 s" "$TMP/fatal.txt" || { cat "$TMP/fatal.txt"; fail "MPIEXEC_TIMEOUT: no message"; }
echo "ok MPIEXEC_TIMEOUT ends a stuck job (exit $rc)"

step "a failed process: MPIX_ERR_PROC_FAILED on the survivors (distcomm only)"
# Rank 1 exits 0 at once (the launcher leaves the others running), then is killed (SIGKILL)
# under -disable-auto-cleanup: the job's status is then the killed rank's.
run "t_proc_failed -n 3 (rank 1 exits)" 2 env EXPECT_DISTCOMM=1 "$PREFIX/bin/mpiexec" -n 3 "$TMP/ours/t_proc_failed" exit
grep -q "MPI_Recv: MPIX_ERR_PROC_FAILED: rank 1 is lost" "$TMP/out.txt" || { cat "$TMP/out.txt"; fail "t_proc_failed: no message naming rank 1"; }
set +e
timeout 120 "$PREFIX/bin/mpiexec" -disable-auto-cleanup -n 3 "$TMP/ours/t_proc_failed" > "$TMP/out.txt" 2>&1
rc=$?
set -e
[ "$rc" = 137 ] && [ "$(grep -c 't_proc_failed: rank [02] of 3 passed' "$TMP/out.txt")" = 2 ] ||
  { cat "$TMP/out.txt"; fail "t_proc_failed with SIGKILL: exit status $rc (expected 137) or the survivors did not pass"; }
echo "ok t_proc_failed -n 3 (rank 1 killed, -disable-auto-cleanup: exit 137)"
echo "(t_proc_failed is not built by MPICH's mpicc_abi nor run on MPICH: MPIX_ERR_PROC_FAILED is"
echo " distcomm's extension, not in MPICH's standard-ABI mpi_abi.h)"

step "timeouts: a sendrecv with a stopped peer ends within one DC_TIMEOUT_MS (distcomm only)"
# Rank 1 stops itself (SIGSTOP) and rank 0 continues it after its sendrecvs timed out.
run "t_timeout -n 2" 2 env EXPECT_DISTCOMM=1 DC_TIMEOUT_MS=1000 "$PREFIX/bin/mpiexec" -n 2 "$TMP/ours/t_timeout"

step "standard-ABI binaries built by MPICH's mpicc_abi, run on distcomm's library"
for t in "${TESTS[@]}"; do
  "$MPICH_VENV/bin/mpicc_abi" -std=c11 -Wall -Wextra -Werror -O1 -pthread "mpi/tests/$t.c" -o "$TMP/mpich/$t"
done
# (ldd's output whole first: grep -q stops reading at its match, and under pipefail the
# SIGPIPE that ldd may then get would fail the check.)
LDD_OUT=$(LD_LIBRARY_PATH="$PREFIX/lib" ldd "$TMP/mpich/t_env")
grep -q "libmpi_abi.so.1 => $PREFIX/lib/libmpi_abi.so.1" <<<"$LDD_OUT" ||
  fail "the MPICH-built binary does not load our library"
for t in "${TESTS[@]}"; do
  for n in 1 2 4; do
    run "MPICH-built $t -n $n on distcomm" "$n" env LD_LIBRARY_PATH="$PREFIX/lib" EXPECT_DISTCOMM=1 "$PREFIX/bin/mpiexec" -n "$n" "$TMP/mpich/$t"
  done
done

step "distcomm's library started by MPICH's Hydra mpiexec (PMI-1)"
for t in "${TESTS[@]}"; do
  for n in 1 3; do
    run "$t -n $n under Hydra" "$n" env LD_LIBRARY_PATH="$PREFIX/lib" EXPECT_DISTCOMM=1 "$MPICH_VENV/bin/mpiexec" -n "$n" "$TMP/ours/$t"
  done
done
set +e
LD_LIBRARY_PATH="$PREFIX/lib" timeout 60 "$MPICH_VENV/bin/mpiexec" -n 3 "$TMP/ours/t_fatal" abort > "$TMP/fatal.txt" 2>&1
rc=$?
set -e
[ "$rc" = 3 ] || { cat "$TMP/fatal.txt"; fail "MPI_Abort under Hydra: exit status $rc, expected 3"; }
echo "ok t_fatal abort under Hydra (exit 3)"

step "our binaries on MPICH's library (its mpiexec, FI_PROVIDER=shm)"
for t in "${TESTS[@]}"; do
  run "$t -n 2 on MPICH" 2 env LD_LIBRARY_PATH="$MPICH_VENV/lib" FI_PROVIDER=shm "$MPICH_VENV/bin/mpiexec" -n 2 "$TMP/ours/$t"
done

step "bench/mpi_bench.c (compare.sh's benchmark): every op checked, one binary on both libraries"
"$PREFIX/bin/mpicc" -O2 -std=c11 -Wall -Wextra -Werror bench/mpi_bench.c -o "$TMP/ours/mpi_bench" -lm
# (MPICH at 2 ranks only: with more ranks than these 2 cores it takes milliseconds per call.)
for job in "distcomm 3" "distcomm 2" "mpich 2"; do
  read -r lib n <<<"$job"
  if [ "$lib" = distcomm ]; then
    cmd=(env LD_LIBRARY_PATH="$PREFIX/lib" "$PREFIX/bin/mpiexec" -n "$n")
  else
    cmd=(env LD_LIBRARY_PATH="$MPICH_VENV/lib" FI_PROVIDER=shm "$MPICH_VENV/bin/mpiexec" -n "$n")
  fi
  timeout 300 "${cmd[@]}" "$TMP/ours/mpi_bench" -o all -d int8,int32,half,double --redop sum,max -b 8 -e 1M -f 32 \
    -r $((n - 1)) -n 2 -w 1 -c 2 > "$TMP/bench.txt" 2>&1 || { cat "$TMP/bench.txt"; fail "mpi_bench -n $n on $lib"; }
  grep -q '^# wrong elements: 0 (OK)' "$TMP/bench.txt" || { cat "$TMP/bench.txt"; fail "mpi_bench -n $n on $lib: wrong results"; }
  ops=$(grep -c '^# op: ' "$TMP/bench.txt")
  [ "$ops" = 12 ] || { cat "$TMP/bench.txt"; fail "mpi_bench -n $n on $lib ran $ops ops, not 12"; }
  echo "ok mpi_bench -n $n on $lib: 12 ops, $(grep -c '^ ' "$TMP/bench.txt") rows, every element right"
done

printf '\nmpi_test: all passed (%ds)\n' "$SECONDS"
