#!/usr/bin/env bash
# Checks contrib/rodizio.service with `systemd-analyze verify` (Debian
# package systemd). verify also checks that each command exists, so the
# copy checked runs the binary just built instead of /usr/local/bin/rodizio.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "unit-check: systemd-analyze is missing (Debian package systemd; scripts/install-test-tools.sh installs it)" >&2
  exit 1
fi
cargo build --quiet
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s|/usr/local/bin/rodizio|$PWD/target/debug/rodizio|g" contrib/rodizio.service \
  >"$tmp/rodizio.service"
# verify exits 0 after some warnings (an unknown key, say): any line about
# the unit counts as a failure.
if ! out=$(systemd-analyze verify "$tmp/rodizio.service" 2>&1) ||
  grep -q "rodizio.service" <<<"$out"; then
  echo "unit-check: contrib/rodizio.service:" >&2
  echo "$out" >&2
  exit 1
fi
echo "unit-check: contrib/rodizio.service verified"
