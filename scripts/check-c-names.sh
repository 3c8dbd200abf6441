#!/usr/bin/env bash
# The English and the Portuguese guides to the article's C name the same C
# functions and constants. Every C name written in code style in
# docs/c-to-rust.md must also be in docs/pt-BR/guia.md, and the other way
# round; prints what is missing where, and exits 1 if anything is.
#
# A C name is what sits inside `backticks` and is either an identifier
# followed by `()` (`servers_entry()`, `exit()`; not a Rust path such as
# `Queue::close()`) or one of the C's constants, which start with an
# underscore and a capital (`_PORT`, `_MAX_THREAD_NUM`).
set -euo pipefail
cd "$(dirname "$0")/.."

english=docs/c-to-rust.md
portuguese=docs/pt-BR/guia.md

c_names() {
  # Fenced code blocks left out; lines joined, since a code span may
  # continue on the next line.
  awk '/^```/ { fenced = !fenced; next } !fenced' "$1" | tr '\n' ' ' |
    grep -o '`[^`]*`' |
    grep -oP '(?<![\w:.])[A-Za-z_]\w*\(\)|(?<!\w)_[A-Z][A-Z0-9_]*' |
    sort -u
}

missing=0
report() {
  local names
  names=$(comm -23 <(c_names "$1") <(c_names "$2"))
  if [[ -n $names ]]; then
    echo "named in $1 but not in $2:"
    sed 's/^/  /' <<<"$names"
    missing=1
  fi
}
report "$english" "$portuguese"
report "$portuguese" "$english"

if [[ $missing == 0 ]]; then
  echo "check-c-names: both guides name the same $(c_names "$english" | wc -l) C functions and constants"
fi
exit "$missing"
