#!/usr/bin/env bash
# Runs every test of distcomm (what `make test` and .ci/run do):
#   1. installs missing system packages (Debian: apt-get as root, sudo otherwise)
#   2. cargo test --release (unit, in-process and header/ABI/export tests, strict: no skips)
#   3. a 256-rank job as threads of one process (examples/scale_threads.rs), both backends
#      make install PREFIX=<temporary prefix>
#   4. the C tests in c_tests/ built with CMake against the installed package, run by ctest
#   5. four of those C tests at 2 ranks under valgrind memcheck (errors and leaks fail)
#   6. 16 ranks in a private 64 MiB /dev/shm and in an 8 MiB one (scripts/small_shm_test.sh;
#      SKIP without root); the same C tests configured against a moved copy of the prefix
#   7. a C program built with `pkg-config --cflags --libs distcomm`
#   8. the Python package: `pip install ./python` into a venv (with numpy, pytest), then its
#      pytest suite (multi-process jobs through dcrun and by hand with launcher variables)
#      against the installed library (DISTCOMM_LIBRARY=<prefix>/lib/libdistcomm.so)
#      then distcomm.torch (the torch.distributed backend): torch from PyPI into the cached venv
#      build/venv-torch (made once; SKIP with a message when torch cannot be installed), the
#      package into it, python/tests/test_torch.py (Gloo comparisons, DDP, torchrun, dcrun)
#      with the native backend required (compiled once into build/torch-native), then every
#      call again on the Python backend alone and as a ProcessGroup subclass
#   9. scripts/multihost_test.sh: the C tests and Python examples over network-namespace
#      hosts, and 8 hosts x 16 ranks running every collective (prints SKIP and passes where it
#      lacks the privileges)
#  10. scripts/mpi_test.sh: the MPI library (libmpi_abi.so.1): its ABI against MPICH 5.0.2's
#      mpi_abi.h (installed from PyPI into build/venv-mpich if missing), its C tests at 1-4 ranks
#      through the installed mpicc/mpiexec, MPICH-built binaries on it and ours on MPICH
#  11. scripts/mpi4py_test.sh: mpi4py 4.1.2 built from its sdist with the installed mpicc (into
#      build/venv-mpi4py; rebuilt when mpi.h changes), 32 modules of its own test suite at 1, 2
#      and 3 ranks on our library (no failure, no error, only listed skips), and the same
#      binary on MPICH 5.0.2 beside it
#
# Release everywhere: the installed library must be a release build anyway, so one optimised
# build serves the tests and the install (a debug test build would compile everything twice).
# Environment: KEEP_PREFIX=1 keeps the temporary prefix; CARGO_TEST_ARGS adds cargo test args;
# PYTEST_ARGS adds pytest args; PYTHON picks the interpreter for the venv (default python3).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
STEP=0
banner() {
  STEP=$((STEP + 1))
  printf '\n======== [%d] %s (at %ds) ========\n' "$STEP" "$*" "$SECONDS"
}

# ---------------------------------------------------------------------------------------------
banner "system packages"
. scripts/packages.sh
ensure_packages cmake pkg-config cc c++ make nm readelf git libclang python3 pyvenv valgrind pyheaders
# Only the multi-host test needs these; it skips without them.
ensure_packages ip unshare || echo "note: could not install iproute2/util-linux; the multi-host test will skip"
cargo --version
cmake --version | head -1

TMP=$(mktemp -d "${TMPDIR:-/tmp}/distcomm-test.XXXXXX")
cleanup() {
  if [ "${KEEP_PREFIX:-0}" = 1 ]; then echo "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
PREFIX="$TMP/prefix"

# ---------------------------------------------------------------------------------------------
banner "cargo test --release"
# DC_TEST_STRICT=1: a test that would skip for a missing tool (libclang, nm, a C compiler) fails.
# Without the release profile's whole-program optimisation (Cargo.toml): it would be redone for
# every test binary. What is installed below (make install) and tested from C, MPI and Python
# is built with it.
# `cargo test` does not build capi's libdistcomm.so (a cdylib and staticlib only), which
# capi/tests/exports.rs reads: built here first, the same way.
CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 cargo build --release -p distcomm-c
# shellcheck disable=SC2086
CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
  DC_TEST_STRICT=1 cargo test --release ${CARGO_TEST_ARGS:-} 2>&1 | tee "$TMP/cargo.log"

banner "scale: 256 ranks as threads of one process (default backend, then sockets)"
# The scale check of scripts/scale.sh at the size CI affords: init, allreduce 16 B and 1 MiB,
# ring send/recv, barrier, destroy, every result checked (exit 1 on any failure).
cargo build --release --example scale_threads
for b in auto socket; do
  timeout 600 target/release/examples/scale_threads --ranks 256 --backend "$b" --iters 1
done

banner "make install PREFIX=$PREFIX"
make install PREFIX="$PREFIX"
ls -l "$PREFIX/lib" "$PREFIX/include"
[ -d "$PREFIX/bin" ] && ls -l "$PREFIX/bin"

# ---------------------------------------------------------------------------------------------
banner "C tests against the installed package"
rm -rf build/c_tests
cmake -S c_tests -B build/c_tests -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build/c_tests --parallel 2
(cd build/c_tests && ctest --output-on-failure) 2>&1 | tee "$TMP/ctest.log"

# ---------------------------------------------------------------------------------------------
banner "MPI library: ABI against MPICH 5.0.2, C tests through mpicc/mpiexec (scripts/mpi_test.sh)"
scripts/mpi_test.sh "$PREFIX" 2>&1 | tee "$TMP/mpi.log"
[ "${PIPESTATUS[0]}" -eq 0 ]

# ---------------------------------------------------------------------------------------------
banner "mpi4py's own test suite on the MPI library, MPICH 5.0.2 beside it (scripts/mpi4py_test.sh)"
scripts/mpi4py_test.sh "$PREFIX" 2>&1 | tee "$TMP/mpi4py.log"
[ "${PIPESTATUS[0]}" -eq 0 ]

# ---------------------------------------------------------------------------------------------
banner "C tests under valgrind (memcheck, 2 ranks)"
# Every rank runs under valgrind; any invalid access, use of uninitialised memory or leak
# (definite or possible) fails the step. The library frees everything at dc_comm_destroy;
# c_tests/valgrind.supp holds the only exception (Rust std's per-thread handle of the main
# thread, 48 bytes once), each entry documented there.
valgrind --version
VG=(valgrind --error-exitcode=1 --leak-check=full --show-leak-kinds=definite,possible --quiet)
[ -f c_tests/valgrind.supp ] && VG+=(--suppressions=c_tests/valgrind.supp)
for t in test_p2p test_groups test_errors test_collectives; do
  echo "valgrind: $t at 2 ranks"
  DC_TIMEOUT_MS=120000 "$PREFIX/bin/dcrun" -n 2 "${VG[@]}" "build/c_tests/$t" 2>&1 | tee "$TMP/valgrind-$t.log"
  # dcrun exits with the failing rank's status; valgrind's report is checked too.
  if grep -E "==[0-9]+== (Invalid|Conditional|Syscall param|Mismatched)|definitely lost: [1-9]|possibly lost: [1-9]" "$TMP/valgrind-$t.log"; then
    echo "valgrind reported errors in $t" >&2
    exit 1
  fi
done

# ---------------------------------------------------------------------------------------------
banner "small /dev/shm: 16 ranks in a private 64 MiB and 8 MiB tmpfs"
scripts/small_shm_test.sh "$PREFIX"

# ---------------------------------------------------------------------------------------------
banner "relocated package: configure and build against a moved copy of the prefix"
cp -a "$PREFIX" "$TMP/moved"
rm -rf build/c_tests_moved
cmake -S c_tests -B build/c_tests_moved -DCMAKE_PREFIX_PATH="$TMP/moved" >/dev/null
grep -q "$TMP/moved/lib/cmake/distcomm" build/c_tests_moved/CMakeCache.txt
cmake --build build/c_tests_moved --parallel 2 --target test_basics >/dev/null
build/c_tests_moved/test_basics
rm -rf build/c_tests_moved

# ---------------------------------------------------------------------------------------------
banner "pkg-config"
export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
echo "cflags: $(pkg-config --cflags distcomm)"
echo "libs:   $(pkg-config --libs distcomm)"
echo "static: $(pkg-config --static --libs distcomm)"
[ "$(pkg-config --modversion distcomm)" = "$(make -s version)" ]
cat > "$TMP/pc_check.c" <<'C'
#include <distcomm.h>
#include <stdio.h>
int main(void) {
  printf("pkg-config build: dc_version() = %u, %s\n", (unsigned)dc_version(),
         dc_status_name(DC_ERR_TIMEOUT));
  return dc_version() == 0;
}
C
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror "$TMP/pc_check.c" -o "$TMP/pc_check" \
   $(pkg-config --cflags --libs distcomm)
LD_LIBRARY_PATH="$PREFIX/lib" "$TMP/pc_check"

# ---------------------------------------------------------------------------------------------
banner "Python package: pip install ./python into a venv, pytest against the installed library"
# A venv under the temporary directory: works on PEP 668 ("externally managed") Debian pythons
# and leaves the system's packages alone. Wheels come from PyPI (pip's cache makes reruns quick).
PY=${PYTHON:-python3}
VENV="$TMP/venv"
"$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --disable-pip-version-check numpy pytest
"$VPY" -m pip install -q --disable-pip-version-check ml_dtypes ||
  echo "note: ml_dtypes is not installable here; the bfloat16 tests skip"
"$VPY" -m pip install -q --disable-pip-version-check ./python
rm -rf python/build python/distcomm.egg-info   # setuptools' leftovers in the source tree
export DISTCOMM_LIBRARY="$PREFIX/lib/libdistcomm.so"
(cd "$TMP" && "$VPY" -c 'import distcomm, numpy
print("distcomm", distcomm.__version__, "from", distcomm.__file__)
print("library", distcomm.library_path(), distcomm.library_version(), "numpy", numpy.__version__)
assert "site-packages" in distcomm.__file__, "not the installed package"')
# shellcheck disable=SC2086
DCRUN="$PREFIX/bin/dcrun" DC_TEST_STRICT=1 DISTCOMM_EXPECT_INSTALLED=1 \
  "$VPY" -m pytest -p no:cacheprovider -q -rs python/tests ${PYTEST_ARGS:-} 2>&1 | tee "$TMP/pytest.log"
[ "${PIPESTATUS[0]}" -eq 0 ]

# ---------------------------------------------------------------------------------------------
banner "distcomm.torch: torch.distributed's backend \"distcomm\" (torch in build/venv-torch)"
# torch is large (with its CUDA runtime packages from PyPI, also without a GPU): it goes into a
# venv under build/ that later runs reuse; only the package is reinstalled into it each time.
# --no-cache-dir: pip's cache would hold a second copy of its ~4 GB of wheels on the CI's disk.
TVENV="$ROOT/build/venv-torch"
torch_tests=skipped
if ! "$TVENV/bin/python" -c 'import torch, numpy, pytest' >/dev/null 2>&1; then
  rm -rf "$TVENV"
  if ! { "$PY" -m venv "$TVENV" &&
         "$TVENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir torch numpy pytest; }; then
    echo "SKIP: torch could not be installed from PyPI here; the distcomm.torch tests did not run"
    rm -rf "$TVENV"
  fi
fi
if [ -x "$TVENV/bin/python" ]; then
  "$TVENV/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps ./python
  rm -rf python/build python/distcomm.egg-info
  (cd "$TMP" && "$TVENV/bin/python" -c 'import torch, distcomm.torch
print("torch", torch.__version__, "distcomm.torch from", distcomm.torch.__file__)
assert "site-packages" in distcomm.torch.__file__, "not the installed package"')
  # The native backend (distcomm/torch/_native.cpp, compiled against this torch on first use)
  # is required here: failing to build it fails the tests instead of falling back. Its cache
  # lives under build/ (rebuilt when the source or torch changes).
  export DISTCOMM_TORCH_NATIVE_CACHE="$ROOT/build/torch-native"
  # shellcheck disable=SC2086
  DCRUN="$PREFIX/bin/dcrun" DC_TEST_STRICT=1 DISTCOMM_EXPECT_TORCH=1 DISTCOMM_TORCH_NATIVE=1 \
    "$TVENV/bin/python" -m pytest -p no:cacheprovider -q -rs python/tests/test_torch.py ${PYTEST_ARGS:-} 2>&1 | tee "$TMP/pytest-torch.log"
  [ "${PIPESTATUS[0]}" -eq 0 ]
  torch_tests=$(grep -Eo '[0-9]+ passed' "$TMP/pytest-torch.log" | tail -1 | awk '{ print $1 }')
  # The Python backend alone (where the native one cannot be built or is turned off): every
  # call against Gloo again.
  # shellcheck disable=SC2086
  DCRUN="$PREFIX/bin/dcrun" DC_TEST_STRICT=1 DISTCOMM_EXPECT_TORCH=1 DISTCOMM_TORCH_NATIVE=0 \
    "$TVENV/bin/python" -m pytest -p no:cacheprovider -q -rs python/tests/test_torch.py -k every_call ${PYTEST_ARGS:-}
  # The backend as a ProcessGroup subclass, what torch releases without a Python-constructible
  # c10d Backend (2.11, for one) get (no native backend there): every call against Gloo again.
  # shellcheck disable=SC2086
  DCRUN="$PREFIX/bin/dcrun" DC_TEST_STRICT=1 DISTCOMM_EXPECT_TORCH=1 DISTCOMM_TORCH_BASE=processgroup \
    "$TVENV/bin/python" -m pytest -p no:cacheprovider -q -rs python/tests/test_torch.py -k every_call ${PYTEST_ARGS:-}
fi

# ---------------------------------------------------------------------------------------------
banner "multi-host: C tests and Python examples over network-namespace hosts"
PYTHON="$VPY" C_TESTS_DIR=build/c_tests scripts/multihost_test.sh "$PREFIX" 2>&1 | tee "$TMP/multihost.log"
[ "${PIPESTATUS[0]}" -eq 0 ]

# Totals over the runners (only reached when everything passed).
passed=$(awk '/^test result:/ { for (i = 1; i <= NF; i++) if ($i ~ /^passed;?$/) s += $(i-1) } END { print s + 0 }' "$TMP/cargo.log")
ctests=$(awk '/tests passed, .* tests failed out of/ { print $NF }' "$TMP/ctest.log")
pytests=$(grep -Eo '[0-9]+ passed' "$TMP/pytest.log" | tail -1 | awk '{ print $1 }')
multihost=$(awk '/^multihost: all [0-9]+ jobs passed/ { print $3 }' "$TMP/multihost.log")
mpi4py_n=$(awk '/^mpi4py_test: .* tests passed/ { print $2 }' "$TMP/mpi4py.log")
mh_note=${multihost:+${multihost} jobs passed}
printf '\n======== all test steps passed (%ds) ========\n' "$SECONDS"
torch_n=0
torch_note=skipped
if [ "$torch_tests" != skipped ]; then torch_n=${torch_tests:-0}; torch_note="$torch_n passed"; fi
echo "cargo test: ${passed} passed; ctest: ${ctests:-0} passed; pytest: ${pytests:-0} passed; torch backend: ${torch_note}; mpi4py suite: ${mpi4py_n:-0} passed; multi-host: ${mh_note:-skipped}"
echo "summary: $((passed + ${ctests:-0} + ${pytests:-0} + torch_n + ${mpi4py_n:-0} + ${multihost:-0})) passed, 0 failed"
