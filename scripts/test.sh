#!/usr/bin/env bash
# The whole test suite, as CI runs it: tools, lint, unit and integration
# tests, docs, then the article's own `ab` check through the real binary.
#
# Two things keep it inside CI's time on a two-core machine:
# - the release build that the stack check measures starts first, in a
#   session of its own at the lowest priority (nice 19, and its scheduling
#   group's nice 19 where the kernel groups sessions), so it only takes the
#   CPU the other stages leave idle;
# - the hostile suite (one binary, about half the tests' time) runs beside
#   the other test binaries, each side's output printed whole when it ends.
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

stage "unit and integration tests: build"
cargo test --all-targets --no-fail-fast --no-run --quiet

# The hostile binary, then the pass with the kernel relay on, in one lane;
# the library's, the binary's and every other test file's tests in the other.
others=(--lib --bins --examples)
for target in tests/*.rs tests/*/main.rs; do
  name=${target#tests/}
  name=${name%/main.rs}
  name=${name%.rs}
  [ "$name" = hostile ] || others+=(--test "$name")
done
stage "unit and integration tests: the hostile suite and the relay's pass beside the others"
(cargo test --no-fail-fast --test hostile && scripts/kernel-relay-pass.sh) \
  >target/lane-hostile.log 2>&1 &
hostile_pid=$!
status=0
cargo test --no-fail-fast "${others[@]}" >target/lane-others.log 2>&1 || status=$?
hostile_status=0
wait "$hostile_pid" || hostile_status=$?
cat target/lane-others.log
stage "the hostile suite, then the pump's tests again with the kernel relay on (needs root)"
cat target/lane-hostile.log
if [ "$status" != 0 ] || [ "$hostile_status" != 0 ]; then
  echo "test.sh: tests failed (other tests: exit $status; hostile and relay pass: exit $hostile_status)" >&2
  exit 1
fi

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
