#!/usr/bin/env bash
# The whole test suite, as CI runs it: tools, lint, unit and integration
# tests, docs, then the article's own `ab` check through the real binary.
set -euo pipefail
cd "$(dirname "$0")/.."

# One build of everything: incremental caches would double the disk it takes
# (set CARGO_INCREMENTAL=1 to keep them while working on the code).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

scripts/install-test-tools.sh

echo "== format and lint"
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings

echo "== unit and integration tests"
cargo test --all-targets --no-fail-fast

echo "== the pump's tests again with the kernel relay on (needs root)"
scripts/kernel-relay-pass.sh

echo "== docs"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet
cargo test --doc --quiet

echo "== docs agree"
scripts/check-c-names.sh

echo "== the systemd unit"
scripts/unit-check.sh

echo "== memory per idle connection: the worker stacks of the release build"
scripts/stack-check.sh

echo "== the article's check: ab -n 1000 -c 100 through three python backends"
scripts/ab-article.sh
scripts/admin-check.sh
scripts/observability-check.sh
