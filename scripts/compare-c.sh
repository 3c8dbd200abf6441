#!/usr/bin/env bash
# The article's C program beside rodizio: the same six checks against each,
# and a table of what each one did.
#
#   scripts/compare-c.sh [C_DIR]     (or: make compare-c C_DIR=...)
#
# C_DIR is a directory holding the article's C sources (the file with
# main(), queue.c, queue.h). They are not part of this repository: the
# article links to its author's GitHub repository at the end of the part on
# main(), in the sentence "Quer o código completo? Acesse o repositório desse
# projeto no meu Github." Clone it and give its directory. Without C_DIR,
# only rodizio's side runs, and the script says so.
#
# The C is copied to a temporary directory and built with gcc after two
# changes, so that it runs like rodizio here, on loopback and on a free port:
# `#define _PORT 8080` becomes a port read from $LB_PORT, and INADDR_ANY
# becomes INADDR_LOOPBACK. Nothing else in it is touched. C_SOURCES (default:
# every *.c file in C_DIR) names the files to build if the directory holds
# other programs too.
#
# The checks (scripts/compare-c/checks.py, python3 clients and backends):
#   binary      a request with zero bytes in it comes back whole
#   keep-alive  20 HTTP/1.1 requests on one connection
#   redis       150 Redis-like round trips (SET, GET, PING) on one connection
#   refused     the first of two backends refuses; 6 clients in a row
#   conn-4096   4097 connections in a row (bounded: 120 s)
#   reset       a client resets mid-transfer while another transfer is in flight
# Each check starts a fresh balancer (so one that exits does not spoil the
# next check), on a free port picked at run time, and stops it by its PID.
# Every reply is awaited at most 4 s; every process this script starts is
# stopped on exit.
#
# rodizio is the release binary (`cargo build --release`), or RODIZIO_BIN.
# Exits 1 if a check fails on rodizio's side (the C failing is the point).
set -euo pipefail
cd "$(dirname "$0")/.."

c_dir=${1:-${C_DIR:-}}
checks_py=scripts/compare-c/checks.py

PROG=compare-c
. scripts/lib.sh
need_tools python3

# ------------------------------------------------------------- the binaries

c_bin=
if [[ -n $c_dir ]]; then
  [[ -d $c_dir ]] || fail "$c_dir is not a directory"
  command -v gcc >/dev/null 2>&1 || fail "gcc is missing (apt-get install gcc)"
  mkdir "$work/c"
  if [[ -n ${C_SOURCES:-} ]]; then
    for f in $C_SOURCES; do cp "$c_dir/$f" "$work/c/"; done
  else
    cp "$c_dir"/*.c "$work/c/" 2>/dev/null || fail "no .c file in $c_dir"
  fi
  cp "$c_dir"/*.h "$work/c/" 2>/dev/null || true
  main_c=$(grep -l '#define _PORT' "$work"/c/*.c | head -n 1) ||
    fail "no file in $c_dir defines _PORT: is it the article's program?"
  sed -i -e 's/#define _PORT 8080/#define _PORT (atoi(getenv("LB_PORT")))/' \
    -e 's/s_addr = INADDR_ANY;/s_addr = htonl(INADDR_LOOPBACK);/' "$main_c"
  grep -q 'getenv("LB_PORT")' "$main_c" || fail "could not move _PORT to a free port in $main_c"
  grep -q 'INADDR_LOOPBACK' "$main_c" || fail "could not bind $main_c to loopback"
  echo "== building the C from $c_dir (port from \$LB_PORT, loopback only)"
  gcc -O2 -pthread -o "$work/c/balancer" "$work"/c/*.c >"$work/gcc.log" 2>&1 ||
    { cat "$work/gcc.log" >&2; fail "gcc failed"; }
  c_bin=$work/c/balancer
else
  echo "== no C program given: running rodizio's side only"
  echo "   (the article links to the C at the end of its part on main():"
  echo "   \"Acesse o repositório desse projeto no meu Github\"; clone it and run"
  echo "   scripts/compare-c.sh DIR, or make compare-c C_DIR=DIR)"
fi

if [[ -n ${RODIZIO_BIN:-} ]]; then
  rodizio=$RODIZIO_BIN
else
  echo "== cargo build --release"
  cargo build --release --quiet
  rodizio=target/release/rodizio
fi
[[ -x $rodizio ]] || fail "$rodizio is not an executable"

# ------------------------------------------------------------- the backends

python3 "$checks_py" backends "$work/backends" &
pids+=($!)
for _ in $(seq 100); do
  [[ -s $work/backends ]] && break
  sleep 0.1
done
[[ -s $work/backends ]] || fail "the test backends did not start"
line_port=$(awk '$1 == "line" { print $2 }' "$work/backends")
http_port=$(awk '$1 == "http" { print $2 }' "$work/backends")
# A port where nothing listens: connecting to it is refused.
read -r closed_port < <(python3 "$checks_py" ports 1)

# ------------------------------------------------------------- the checks

# start IMPL PORT BACKEND_PORT...: starts a balancer, sets $balancer_pid.
start() {
  local impl=$1 port=$2
  shift 2
  local log=$work/$impl-$port.log
  if [[ $impl == rodizio ]]; then
    local flags=()
    for b in "$@"; do flags+=(-b "127.0.0.1:$b"); done
    RUST_LOG=warn "$rodizio" --listen "127.0.0.1:$port" "${flags[@]}" "${root_flag[@]}" </dev/null >"$log" 2>&1 &
  else
    # The article's prompt: how many servers, then address and port of each.
    {
      echo "$#"
      for b in "$@"; do printf '127.0.0.1\n%s\n' "$b"; done
    } >"$work/input-$port"
    LB_PORT=$port "$c_bin" <"$work/input-$port" >"$log" 2>&1 &
  fi
  balancer_pid=$!
  pids+=("$balancer_pid")
}

# stop PID: stops one process this script started, and forgets it.
stop() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  local kept=() p
  for p in "${pids[@]}"; do [[ $p == "$1" ]] || kept+=("$p"); done
  pids=("${kept[@]}")
}

# run IMPL CHECK: runs CHECK against a fresh IMPL, sets $outcome.
run() {
  local impl=$1 check=$2 port
  read -r port < <(python3 "$checks_py" ports 1)
  case $check in
    keep-alive) start "$impl" "$port" "$http_port" ;;
    refused) start "$impl" "$port" "$closed_port" "$line_port" ;;
    *) start "$impl" "$port" "$line_port" ;;
  esac
  if ! python3 "$checks_py" wait-listen "$port" 10; then
    outcome="FAIL: did not start listening"
  else
    outcome=$(python3 "$checks_py" check "$check" "$port") || true
  fi
  if ! kill -0 "$balancer_pid" 2>/dev/null; then
    outcome="$outcome; the program exited"
  fi
  stop "$balancer_pid"
}

names=(binary keep-alive redis refused conn-4096 reset)
declare -A what=(
  [binary]="binary data with a zero byte"
  [keep-alive]="HTTP keep-alive, 20 requests"
  [redis]="Redis-like session, 150 round trips"
  [refused]="a refused backend"
  [conn-4096]="4097 connections in a row"
  [reset]="a client reset mid-transfer"
)
declare -A c_out r_out
failed=0
for check in "${names[@]}"; do
  echo "== $check"
  if [[ -n $c_bin ]]; then
    run c "$check"
    c_out[$check]=$outcome
    echo "   the C:   ${c_out[$check]}"
  else
    c_out[$check]="not run (no C program given)"
  fi
  run rodizio "$check"
  r_out[$check]=$outcome
  echo "   rodizio: ${r_out[$check]}"
  [[ ${r_out[$check]} == ok ]] || failed=1
done

echo
printf '| %s | %s | %s |\n' "check" "the article's C" "rodizio"
printf '|---|---|---|\n'
for check in "${names[@]}"; do
  printf '| %s | %s | %s |\n' "${what[$check]}" "${c_out[$check]}" "${r_out[$check]}"
done
[[ -n $c_bin ]] || echo "(rodizio's side only: give the C program's directory to compare)"
exit "$failed"
