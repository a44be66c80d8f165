#!/usr/bin/env bash
# GPU check of the NCCL backend (quick: a few minutes on one GPU).
#
#   1. skips cleanly (exit 0) on a machine without an NVIDIA GPU / driver
#   2. finds NCCL (libnccl.so.2 on the loader path, or pip's nvidia-nccl-cu* next to PyTorch)
#   3. builds the library (cargo build --release; a prebuilt target/release is used when cargo
#      cannot build here, e.g. a machine without network access to fetch crates)
#   4. compiles c_tests/gpu/gpu_check.c and runs every collective and point-to-point call on
#      device buffers at world size 1 (dcrun -n 1), then 2 processes on one GPU (dcrun -n 2)
#      if NCCL allows two ranks per GPU; results are checked against a host computation
#   5. the Python checks on CUDA tensors (python/tests/gpu/torch_cuda_check.py: the torch backend
#      and the package's API at 1 rank; CUDA refused by 2 ranks sharing the GPU) and the torch
#      backend's suite against Gloo on this machine's torch, when torch with CUDA is there
#   6. times dc_allreduce against torch.distributed.all_reduce (NCCL) on the same sizes when
#      torch with CUDA is importable (skipped otherwise)
#
# Prints a summary; exits non-zero if any check failed.
# Environment: GPU_CHECK_SKIP_BUILD=1 uses target/release as it is (build it elsewhere with
# `cargo build --release` and bring target/release/libdistcomm.so and target/release/dcrun);
# GPU_CHECK_NP2=0 skips the two-rank run; GPU_CHECK_BENCH=0 skips the timing.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${GPU_CHECK_OUT:-$ROOT/target/gpu_check}
mkdir -p "$OUT"
declare -a SUMMARY=()
FAILED=0
note() { SUMMARY+=("$1"); echo "---- $1"; }
fail() { SUMMARY+=("FAIL: $1"); FAILED=1; echo "---- FAIL: $1"; }
finish() {
  echo
  echo "======== gpu_check summary ========"
  for l in "${SUMMARY[@]}"; do echo "  $l"; done
  if [ "$FAILED" = 0 ]; then echo "gpu_check: all checks passed"; else echo "gpu_check: FAILED"; fi
  exit "$FAILED"
}

# ---- 1. a GPU? ------------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: SKIP: no NVIDIA GPU here (nvidia-smi missing or finds no device)"
  exit 0
fi
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' && [ ! -e /usr/lib/x86_64-linux-gnu/libcuda.so.1 ]; then
  echo "gpu_check: SKIP: no CUDA driver library libcuda.so.1"
  exit 0
fi
nvidia-smi -L | sed 's/^/gpu: /'
NGPU=$(nvidia-smi -L | grep -c '^GPU')
note "GPUs: $NGPU ($(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1))"

# ---- 2. NCCL --------------------------------------------------------------------------------
PY=$(command -v python3 || true)
NCCL_DIR=""
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
  if [ -n "$PY" ]; then
    NCCL_DIR=$("$PY" - <<'EOF' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
# pip's nvidia-nccl-cu12 puts it in nvidia/nccl/lib; later wheels use other folders under nvidia/.
for r in roots:
    for p in sorted(glob.glob(os.path.join(r, "nvidia", "**", "libnccl.so.2"), recursive=True)):
        print(os.path.dirname(p)); sys.exit(0)
EOF
)
  fi
  if [ -z "$NCCL_DIR" ]; then
    note "SKIP: no libnccl.so.2 (neither on the loader path nor pip's nvidia-nccl-cu*): device checks not run"
    finish
  fi
  export LD_LIBRARY_PATH="$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  note "NCCL from $NCCL_DIR"
else
  note "NCCL from the loader path: $(ldconfig -p | grep 'libnccl\.so\.2' | head -1 | awk '{print $NF}')"
fi

# ---- 3. build -------------------------------------------------------------------------------
LIB=target/release/libdistcomm.so
DCRUN=target/release/dcrun
if [ "${GPU_CHECK_SKIP_BUILD:-0}" != 1 ] && command -v cargo >/dev/null 2>&1; then
  echo "building (cargo build --release) ..."
  if ! cargo build --release --offline 2>&1 | tail -3; then
    # Online only when there is nothing prebuilt (a machine without network would just wait).
    if [ -f "$LIB" ] || ! cargo build --release 2>&1 | tail -3; then
      echo "cargo build failed; using the prebuilt $LIB if there is one"
    fi
  fi
fi
if [ ! -f "$LIB" ] || [ ! -x "$DCRUN" ]; then
  fail "no $LIB / $DCRUN (build them with cargo build --release and carry target/release)"
  finish
fi
note "library: $LIB ($(stat -c %y "$LIB" | cut -d. -f1))"
CC=${CC:-cc}
if ! $CC -O2 -std=c11 -Wall -Wextra -Werror -Iinclude c_tests/gpu/gpu_check.c -o "$OUT/gpu_check" \
    -L"$ROOT/target/release" -ldistcomm -ldl -lm -Wl,-rpath,"$ROOT/target/release"; then
  fail "compiling c_tests/gpu/gpu_check.c"
  finish
fi

# ---- 4. checks ------------------------------------------------------------------------------
export DC_TIMEOUT_MS=${DC_TIMEOUT_MS:-120000}
run_np() { # run_np NP LOG [args...]
  local np=$1 log=$2
  shift 2
  timeout 240 "$DCRUN" -n "$np" "$OUT/gpu_check" "$@" >"$log" 2>&1
}
echo "world size 1 ..."
run_np 1 "$OUT/np1.log"
rc=$?
cat "$OUT/np1.log"
if [ $rc = 0 ]; then
  note "np1: $(grep -h 'passed, .* failed' "$OUT/np1.log" | head -1)"
else
  fail "np1: exit $rc ($(grep -h 'passed, .* failed' "$OUT/np1.log" | head -1)); see $OUT/np1.log"
fi

NP2_OK=0
if [ "${GPU_CHECK_NP2:-1}" = 1 ]; then
  echo "2 processes on one GPU ..."
  # Both ranks on device 0 (LOCAL_RANK % GPUs would spread them on a multi-GPU machine).
  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} DC_GPU_CHECK_INIT_MAY_FAIL=1 run_np 2 "$OUT/np2.log"
  rc=$?
  cat "$OUT/np2.log"
  if [ $rc = 0 ]; then
    NP2_OK=1
    note "np2 (one GPU): $(grep -h 'passed, .* failed' "$OUT/np2.log" | tr '\n' ' ')"
  elif [ $rc = 77 ]; then
    note "np2 (one GPU): SKIPPED: NCCL refused two ranks on one GPU: $(grep -h 'dc_init' "$OUT/np2.log" | head -1 | cut -c1-200)"
  else
    fail "np2 (one GPU): exit $rc; see $OUT/np2.log"
  fi
fi

# ---- 4b. the Python package and the torch backend on CUDA tensors ---------------------------
if [ -n "$PY" ] && "$PY" -c 'import torch, numpy, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  PYCHECK=python/tests/gpu/torch_cuda_check.py
  echo "Python: the torch backend and the package's API on CUDA tensors (1 rank) ..."
  PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" DISTCOMM_LIBRARY="$ROOT/$LIB" \
    timeout 300 "$DCRUN" -n 1 --rank0-store "$PY" "$PYCHECK" >"$OUT/py_np1.log" 2>&1
  rc=$?
  cat "$OUT/py_np1.log"
  summary=$(grep -h 'torch_cuda_check: .* passed' "$OUT/py_np1.log" | head -1)
  if [ $rc = 0 ]; then note "python np1: $summary"; else fail "python np1: exit $rc ($summary); see $OUT/py_np1.log"; fi
  grep -h 'TIMING' "$OUT/py_np1.log" | sed 's/^\[[0-9]*\] //' | while read -r l; do echo "---- $l"; done
  echo "Python: 2 ranks on one GPU (no NCCL): CUDA tensors refused ..."
  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" DISTCOMM_LIBRARY="$ROOT/$LIB" \
    timeout 180 "$DCRUN" -n 2 --rank0-store "$PY" "$PYCHECK" refusal >"$OUT/py_np2.log" 2>&1
  rc=$?
  cat "$OUT/py_np2.log"
  summary=$(grep -h 'torch_cuda_check: .* passed' "$OUT/py_np2.log" | tr '\n' ' ')
  if [ $rc = 0 ]; then note "python np2 (one GPU, no NCCL): $summary"; else fail "python np2: exit $rc ($summary); see $OUT/py_np2.log"; fi
  # The torch backend's CPU suite on this machine's torch (GPU machines often carry another
  # release than CI's: the backend's base class differs between them).
  if "$PY" -c 'import pytest' 2>/dev/null; then
    echo "Python: the torch backend against Gloo, every call, on this torch ..."
    PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" DISTCOMM_LIBRARY="$ROOT/$LIB" DCRUN="$ROOT/$DCRUN" \
      timeout 300 "$PY" -m pytest -p no:cacheprovider -q python/tests/test_torch.py -k every_call >"$OUT/py_torch_suite.log" 2>&1
    rc=$?
    tail -3 "$OUT/py_torch_suite.log"
    summary=$(grep -E '^[0-9]+ (passed|failed)' "$OUT/py_torch_suite.log" | tail -1)
    if [ $rc = 0 ]; then note "torch backend suite: $summary"; else fail "torch backend suite: exit $rc ($summary); see $OUT/py_torch_suite.log"; fi
  fi
else
  note "Python checks SKIPPED: no python3 with torch and CUDA"
fi

# ---- 5. timing against PyTorch --------------------------------------------------------------
if [ "${GPU_CHECK_BENCH:-1}" = 1 ]; then
  run_np 1 "$OUT/bench_dc_np1.log" --bench || fail "dc bench np1 (see $OUT/bench_dc_np1.log)"
  if [ $NP2_OK = 1 ]; then
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} run_np 2 "$OUT/bench_dc_np2.log" --bench || fail "dc bench np2"
  fi
  if [ -n "$PY" ] && "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() and torch.distributed.is_nccl_available() else 1)' 2>/dev/null; then
    cat >"$OUT/torch_bench.py" <<'EOF'
import os, sys, time, torch, torch.distributed as dist
import torch.multiprocessing as mp
SIZES = [4096, 65536, 1 << 20, 16 << 20, 64 << 20]
def work(rank, world, port):
    torch.cuda.set_device(0 if world > 1 else rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    for b in SIZES:
        t = torch.ones(b // 4, dtype=torch.float32, device="cuda")
        iters = 20 if b >= (16 << 20) else 100
        for _ in range(5): dist.all_reduce(t)
        torch.cuda.synchronize(); dist.barrier(); torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
            torch.cuda.synchronize()   # like the blocking dc_allreduce: wait for completion each time
        us = (time.perf_counter() - t0) / iters * 1e6
        if rank == 0: print(f"BENCH torch {b} {us:.1f}", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    world = int(sys.argv[1]); port = int(sys.argv[2])
    if world == 1: work(0, 1, port)
    else: mp.spawn(work, args=(world, port), nprocs=world)
EOF
    port=$((29000 + RANDOM % 2000))
    timeout 240 "$PY" "$OUT/torch_bench.py" 1 $port >"$OUT/bench_torch_np1.log" 2>&1 || { cat "$OUT/bench_torch_np1.log"; fail "torch bench np1"; }
    if [ $NP2_OK = 1 ]; then
      CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout 240 "$PY" "$OUT/torch_bench.py" 2 $((port + 1)) >"$OUT/bench_torch_np2.log" 2>&1 \
        || { tail -20 "$OUT/bench_torch_np2.log"; note "torch bench np2 failed (see $OUT/bench_torch_np2.log)"; }
    fi
  else
    note "timing against PyTorch SKIPPED: torch with CUDA/NCCL is not importable"
  fi
  for np in 1 2; do
    [ -f "$OUT/bench_dc_np$np.log" ] || continue
    echo
    echo "allreduce float32 sum, $np rank(s), microseconds per blocking call (lower is better):"
    printf '  %12s %12s %12s\n' bytes distcomm torch
    sed 's/^\[[0-9]*\] //' "$OUT/bench_dc_np$np.log" | grep '^BENCH dc' | while read -r _ _ bytes us; do
      t=$(grep -h "^BENCH torch $bytes " "$OUT/bench_torch_np$np.log" 2>/dev/null | awk '{print $4}')
      printf '  %12s %12s %12s\n' "$bytes" "$us" "${t:--}"
    done
  done
  for np in 1 2; do
    [ -f "$OUT/bench_dc_np$np.log" ] || continue
    while read -r _ _ bytes us; do
      t=$(grep -h "^BENCH torch $bytes " "$OUT/bench_torch_np$np.log" 2>/dev/null | awk '{print $4}')
      note "bench np$np $bytes B: distcomm ${us} us, torch ${t:--} us"
    done < <(sed 's/^\[[0-9]*\] //' "$OUT/bench_dc_np$np.log" | grep '^BENCH dc')
  done
fi
finish
