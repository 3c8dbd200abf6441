#!/usr/bin/env bash
# The whole test suite, as CI runs it: tools, lint, unit and integration
# tests, docs, then the article's own `ab` check through the real binary.
#
# The release build that the stack check measures starts first, in a
# session of its own at the lowest priority (nice 19, and its scheduling
# group's nice 19 where the kernel groups sessions), so it only takes the
# CPU the other stages leave idle. The test binaries themselves run one
# after another: beside each other, their timing tests failed now and
# then.
set -euo pipefail
cd "$(dirname "$0")/.."

# One build of everything: incremental caches would double the disk it takes
# (set CARGO_INCREMENTAL=1 to keep them while working on the code).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# Each stage says when it starts, in seconds since the suite began, so a
# slow stage shows in CI's log.
stage() { echo "== [${SECONDS}s] $*"; }

scripts/install-test-tools.sh

mkdir -p target
release_log=target/release-build.log
setsid -w bash -c 'echo 19 > /proc/self/autogroup 2>/dev/null
  exec nice -n 19 cargo build --release --quiet' >"$release_log" 2>&1 &
release_pid=$!
trap 'kill -- -"$release_pid" 2>/dev/null || true' EXIT

stage "format and lint"
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings

stage "unit and integration tests"
cargo test --all-targets --no-fail-fast

stage "the pump's tests again with the kernel relay on (needs root)"
scripts/kernel-relay-pass.sh

stage "docs"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet
cargo test --doc --quiet

stage "docs agree"
scripts/check-c-names.sh

stage "the systemd unit"
scripts/unit-check.sh

stage "memory per idle connection: the worker stacks of the release build"
if ! wait "$release_pid"; then
  cat "$release_log" >&2
  echo "test.sh: the release build failed" >&2
  exit 1
fi
trap - EXIT
scripts/stack-check.sh

stage "the article's check: ab -n 1000 -c 100 through three python backends"
scripts/ab-article.sh
scripts/admin-check.sh
scripts/observability-check.sh
stage "done"
