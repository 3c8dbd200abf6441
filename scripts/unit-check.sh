#!/usr/bin/env bash
# Checks contrib/rodizio.service and contrib/rodizio.socket with
# `systemd-analyze verify` (Debian package systemd). verify also checks that
# each command exists, so the copies checked run the binary just built
# instead of /usr/local/bin/rodizio.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "unit-check: systemd-analyze is missing (Debian package systemd; scripts/install-test-tools.sh installs it)" >&2
  exit 1
fi
cargo build --quiet
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for unit in rodizio.service rodizio.socket; do
  sed "s|/usr/local/bin/rodizio|$PWD/target/debug/rodizio|g" "contrib/$unit" >"$tmp/$unit"
done
# verify exits 0 after some warnings (an unknown key, say): any line about
# the units counts as a failure. The socket is verified with its service
# beside it, as systemd finds it.
if ! out=$(systemd-analyze verify "$tmp/rodizio.service" "$tmp/rodizio.socket" 2>&1) ||
  grep -q "rodizio\.s" <<<"$out"; then
  echo "unit-check: contrib/rodizio.service or contrib/rodizio.socket:" >&2
  echo "$out" >&2
  exit 1
fi
echo "unit-check: contrib/rodizio.service and contrib/rodizio.socket verified"
