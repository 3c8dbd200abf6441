#!/usr/bin/env bash
# The second pass of `make test`: the tests that speak about bytes, ends,
# timeouts, drains, resets, half-closes, caps and reloads, again with the
# kernel relay on from the start (RODIZIO_TEST_KERNEL_RELAY=0) and after a
# promotion (=4). This list is the one place that names them (`make
# test-kernel-relay` runs it too); each file's balancers read the variable
# through tests/common (`config`, `TestBalancer::with`) or, for the
# binary, `child::kernel_relay_flags`, and fail if the program does not
# load rather than pass on the copy pump.
#
# Needs root, as the relay's program does; CI runs as root. Without it the
# pass is not run and says so: it fails, unless RODIZIO_SKIP_KERNEL_RELAY=1
# says to skip it (printed, never silent). As root where the kernel refuses
# the program, the tests themselves fail, naming the cause.
set -euo pipefail
cd "$(dirname "$0")/.."

FILES=(
  duplex half_close keep_alive early_reply idle_timeout client_reset
  connection_end drain max_connections per_client reload fd_leak
  many_connections workers_limit emfile
)

if [ "$(id -u)" != 0 ]; then
  if [ "${RODIZIO_SKIP_KERNEL_RELAY:-}" = 1 ]; then
    echo "kernel relay pass: SKIPPED (not root, RODIZIO_SKIP_KERNEL_RELAY=1)" >&2
    exit 0
  fi
  echo "kernel relay pass: needs root to load the program;" \
    "run as root, or set RODIZIO_SKIP_KERNEL_RELAY=1 to skip it knowingly" >&2
  exit 1
fi

args=()
for f in "${FILES[@]}"; do
  args+=(--test "$f")
done
for after in 0 4; do
  echo "== the same tests with the kernel relay on, kernel_relay_after $after"
  RODIZIO_TEST_KERNEL_RELAY=$after cargo test --quiet --no-fail-fast "${args[@]}"
done
