# Sourced by the scripts: ensure_packages CMD... installs the Debian packages that provide the
# missing commands (apt-get as root, sudo otherwise). Command -> package names are below; the
# pseudo-commands libclang, pyvenv (python3's venv module with ensurepip) and pyheaders
# (python3's Python.h) are checked apart.
package_for() {
  case "$1" in
    cc | gcc) echo gcc ;;
    c++ | g++) echo g++ ;;
    nm | readelf) echo binutils ;;
    libclang) echo libclang-dev ;;
    pyvenv) echo python3-venv ;;
    ip) echo iproute2 ;;
    unshare) echo util-linux ;;
    valgrind) echo valgrind ;;
    mpicc.openmpi) echo libopenmpi-dev ;;
    mpirun.openmpi) echo openmpi-bin ;;
    mpicc.mpich) echo libmpich-dev ;;
    mpirun.mpich) echo mpich ;;
    *) echo "$1" ;;
  esac
}

libclang_present() {
  [ -n "${LIBCLANG_PATH:-}" ] && return 0
  ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/x86_64-linux-gnu/libclang*.so* \
     /usr/lib/aarch64-linux-gnu/libclang*.so* >/dev/null 2>&1 &&
    ls -d /usr/lib/llvm-*/lib/clang/*/include /usr/lib/clang/*/include >/dev/null 2>&1
}

ensure_packages() {
  local missing=() cmd
  for cmd in "$@"; do
    if [ "$cmd" = libclang ]; then
      libclang_present || missing+=(libclang-dev)
    elif [ "$cmd" = pyvenv ]; then
      # python3 -m venv needs ensurepip, which Debian ships separately (python3-venv)
      python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
    elif [ "$cmd" = pyheaders ]; then
      # Python.h, for extensions built against python3 (distcomm.torch's native backend)
      python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
        >/dev/null 2>&1 || missing+=(python3-dev)
    elif ! command -v "$cmd" >/dev/null 2>&1; then
      missing+=("$(package_for "$cmd")")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "installing missing packages: ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "not root and no sudo: install ${missing[*]} and run again" >&2; return 1; }
    sudo=(sudo -n)
  fi
  command -v apt-get >/dev/null 2>&1 || { echo "no apt-get: install ${missing[*]} and run again" >&2; return 1; }
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
  command -v cargo >/dev/null 2>&1 || { echo "cargo not found: install a Rust toolchain (rustup) first" >&2; return 1; }
}
