#!/usr/bin/env bash
# The whole test suite, as CI runs it: tools, lint, unit and integration
# tests, docs, then the article's own `ab` check through the real binary.
set -euo pipefail
cd "$(dirname "$0")/.."

# One build of everything: incremental caches would double the disk it takes
# (set CARGO_INCREMENTAL=1 to keep them while working on the code).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# Each stage says when it starts, in seconds since the suite began, so a
# slow stage shows in CI's log.
stage() { echo "== [${SECONDS}s] $*"; }

scripts/install-test-tools.sh

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
scripts/stack-check.sh

stage "the article's check: ab -n 1000 -c 100 through three python backends"
scripts/ab-article.sh
scripts/admin-check.sh
scripts/observability-check.sh
stage "done"
