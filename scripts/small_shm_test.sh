#!/usr/bin/env bash
# Jobs in a small /dev/shm, as in a container: each runs in a new mount namespace with a private
# tmpfs of a few MiB mounted on /dev/shm (the host's /dev/shm is untouched), through dcrun and
# dc-bench, a few seconds each.
#   1. 16 ranks in 64 MiB (Docker's default): arena and point-to-point rings both fit (about
#      42 MiB), every rank uses them, no WARN line, every element right.
#   2. 16 ranks in 8 MiB: the arena (11.6 MiB) cannot be reserved: a WARN line naming the bytes
#      needed and free, collectives over sockets, every element still right, no SIGBUS.
#   3. the same under DC_TRANSPORT=shm: the job fails with that reason.
# Needs root (mount namespaces, tmpfs mounts): prints SKIP and exits 0 without it.
# Usage: scripts/small_shm_test.sh PREFIX_OR_TARGETDIR   (an install prefix with bin/dcrun and
# bin/dc-bench, a cargo target dir with release/, or the release dir itself)
set -euo pipefail
DIR=${1:?usage: $0 PREFIX_OR_TARGETDIR}
BIN=
for d in "$DIR/bin" "$DIR/release" "$DIR"; do
  if [ -x "$d/dcrun" ] && [ -x "$d/dc-bench" ]; then BIN=$(cd "$d" && pwd); break; fi
done
[ -n "$BIN" ] || { echo "no dcrun and dc-bench under $DIR (bin/, release/ or itself)" >&2; exit 1; }
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null || ! unshare -m true 2>/dev/null; then
  echo "SKIP: small_shm_test needs root and unshare -m (mount namespaces)"
  exit 0
fi
if ! unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs /dev/shm' 2>/dev/null; then
  echo "SKIP: small_shm_test cannot mount a tmpfs in a new mount namespace"
  exit 0
fi
RANKS=16
TMP=$(mktemp -d "${TMPDIR:-/tmp}/distcomm-smallshm.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; echo "---- log:" >&2; cat "$LOG" >&2; exit 1; }

# run SIZE LOG ENV... : the job in a private /dev/shm of SIZE; its exit status in $RC.
run() {
  local size=$1; LOG=$2; shift 2
  set +e
  env "$@" timeout 120 unshare -m sh -c 'mount -t tmpfs -o size="$0" tmpfs /dev/shm && exec "$@"' "$size" \
    "$BIN/dcrun" -n "$RANKS" "$BIN/dc-bench" -o allreduce,allgather,alltoall,sendrecv \
    -b 8 -e 1M -f 16 -w 1 -n 2 -c 1 >"$LOG" 2>&1
  RC=$?
  set -e
}

echo "== $RANKS ranks in a 64 MiB /dev/shm: shared memory for everything"
run 64m "$TMP/64m.log" DC_DEBUG=INFO
[ "$RC" = 0 ] || fail "exit status $RC"
grep -q "wrong elements: 0 (OK)" "$LOG" || fail "wrong elements"
! grep -q " WARN " "$LOG" || fail "WARN lines"
[ "$(grep -c "collectives use shm" "$LOG")" = "$RANKS" ] || fail "not every rank's collectives on shared memory"
[ "$(grep -c "point-to-point rings: $((RANKS - 1)) of" "$LOG")" = "$RANKS" ] || fail "not every rank with rings"
grep -m1 "point-to-point rings:" "$LOG" | sed 's/^/   /'
grep -m1 "shared memory, $RANKS ranks" "$LOG" | sed 's/^/   /'

echo "== $RANKS ranks in an 8 MiB /dev/shm: no room for the arena, sockets"
run 8m "$TMP/8m.log" DC_DEBUG=WARN
[ "$RC" = 0 ] || fail "exit status $RC"
grep -q "wrong elements: 0 (OK)" "$LOG" || fail "wrong elements"
grep -E " WARN .*no shared-memory arena, collectives over sockets: .* needed, .* free" "$LOG" >/dev/null || fail "no WARN line for the arena"
grep -m1 "no shared-memory arena" "$LOG" | sed 's/^/   /'
grep -m1 "no point-to-point rings for this rank" "$LOG" | sed 's/^/   /' || true

echo "== the same under DC_TRANSPORT=shm: an error that says why"
run 8m "$TMP/8m-shm.log" DC_TRANSPORT=shm
[ "$RC" != 0 ] || fail "succeeded without the arena"
[ "$RC" != 124 ] || fail "timed out"
grep -q 'backend "shm": rank 0 could not reserve the shared-memory arena' "$LOG" || fail "no error naming the arena"
grep -m1 'could not reserve' "$LOG" | sed 's/^/   /'
echo "small_shm_test: OK"
