#!/usr/bin/env bash
# Builds distcomm, installs it into ./_install, builds the C example against the installed
# package with CMake (find_package), and trains on 4 ranks through dcrun. Installs missing
# Debian packages (cmake, compilers) first. Usage: scripts/example.sh [RANKS]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/packages.sh
ensure_packages cmake make gcc
RANKS=${1:-4}
PREFIX="$(pwd)/_install"

echo "== building and installing distcomm into $PREFIX"
make install PREFIX="$PREFIX"
echo "== building the example with find_package(distcomm)"
cmake -S examples -B build/examples -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/examples
echo "== dcrun -n $RANKS build/examples/train_linear"
exec "$PREFIX/bin/dcrun" -n "$RANKS" build/examples/train_linear
