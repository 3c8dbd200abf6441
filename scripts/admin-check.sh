#!/usr/bin/env bash
# The admin API through the real binary and curl: two demo backends
# (`rodizio backend`), rodizio in front with `--admin 127.0.0.1:PORT`, then
# each endpoint, a few errors, and the start-up refusal of a non-loopback
# admin address. Fails at the first answer that is not the expected one.
#
# Ports are free ones picked at run time; everything it starts is stopped
# by its PID on exit; every wait is bounded.
#
# Environment: RODIZIO_BIN to test a given binary (default: `cargo build`
# then the debug binary).
set -euo pipefail
cd "$(dirname "$0")/.."

PROG=admin-check
. scripts/lib.sh
need_tools python3 curl timeout

read -r p1 p2 p3 lb_port admin_port < <(free_ports 5)
debug_bin

echo "== demo backends one, two, three on ports $p1 $p2 $p3"
names=(one two three)
ports=("$p1" "$p2" "$p3")
for i in 0 1 2; do
  "$bin" backend --listen "127.0.0.1:${ports[$i]}" --name "${names[$i]}" \
    >"$work/backend$i.out" 2>&1 &
  pids+=("$!")
  wait_line "$work/backend$i.out" "Demo backend listening" "$!"
done

echo "== rodizio on port $lb_port, admin API on 127.0.0.1:$admin_port"
RUST_LOG=${RUST_LOG:-warn} "$bin" -l "127.0.0.1:$lb_port" -b "127.0.0.1:$p1" -b "127.0.0.1:$p2" \
  --admin "127.0.0.1:$admin_port" "${root_flag[@]}" >"$work/rodizio.out" 2>"$work/rodizio.err" &
rodizio_pid=$!
pids+=("$rodizio_pid")
wait_line "$work/rodizio.out" "Load balancer listening on port $lb_port" "$rodizio_pid"

admin="http://127.0.0.1:$admin_port"
# api METHOD PATH EXPECTED_STATUS [BODY]: the answer's body goes to
# $work/body; a status other than the expected one fails.
api() {
  local method=$1 path=$2 want=$3 body=${4:-}
  local args=(-s -o "$work/body" -w '%{http_code}' --max-time 5 -X "$method")
  [ -z "$body" ] || args+=(-H 'Content-Type: application/json' --data "$body")
  local got
  got=$(curl "${args[@]}" "$admin$path") || fail "curl $method $path failed"
  [ "$got" = "$want" ] || fail "$method $path: $got, not $want: $(cat "$work/body")"
  echo "$method $path -> $got $(head -c 160 "$work/body")"
}
has() {
  grep -q -- "$1" "$work/body" || fail "the answer lacks $1: $(cat "$work/body")"
}
served_by() {
  curl -s --max-time 5 "http://127.0.0.1:$lb_port/" | sed -n 's/^Handled by server //p'
}

echo "== the endpoints"
api GET /backends 200
has "\"address\":\"127.0.0.1:$p1\""
has '"state":"up"'
api POST /backends 201 "{\"address\": \"127.0.0.1:$p3\", \"weight\": 2}"
has '"weight":2'
api POST /backends 409 "{\"address\": \"127.0.0.1:$p3\"}"
api PUT "/backends/127.0.0.1:$p1" 200 '{"state": "drain"}'
has '"state":"draining"'
for _ in 1 2 3 4 5 6; do
  [ "$(served_by)" != one ] || fail "a client reached the draining backend"
done
api PUT "/backends/127.0.0.1:$p1" 200 '{"state": "maint"}'
has '"state":"maint"'
api PUT "/backends/127.0.0.1:$p1" 200 '{"state": "ready", "weight": 3}'
has '"state":"up"'
has '"weight":3'
api DELETE "/backends/127.0.0.1:$p3" 202
has '"removing":true'
gone=""
for _ in $(seq 1 50); do
  api GET /backends 200 >/dev/null
  if ! grep -q "127.0.0.1:$p3" "$work/body"; then
    gone=1
    break
  fi
  sleep 0.1
done
[ -n "$gone" ] || fail "127.0.0.1:$p3 was not removed within 5s"
# Without a config file a reload keeps what runs (the API's changes
# too) and reads the TLS files again: nothing to change here.
api POST /reload 200
has 'no change'
api GET /config 200
has "\"admin_listen\":\"127.0.0.1:$admin_port\""

echo "== errors"
api GET /nope 404
api DELETE /backends 405
api POST /backends 400 'not json'
api PUT /backends/127.0.0.1:1 404 '{"state": "drain"}'
[ -n "$(served_by)" ] || fail "the proxy stopped answering"

echo "== a non-loopback admin address is refused at start-up"
set +e
timeout 10 "$bin" -b "127.0.0.1:$p1" --admin "0.0.0.0:$admin_port" \
  >"$work/refused.out" 2>"$work/refused.err" </dev/null
code=$?
set -e
[ "$code" = 2 ] || fail "exit code $code, not 2: $(cat "$work/refused.err")"
[ "$(wc -l <"$work/refused.err")" = 1 ] || fail "not one line: $(cat "$work/refused.err")"
grep -q 'admin-allow-remote' "$work/refused.err" || fail "$(cat "$work/refused.err")"
cat "$work/refused.err"

echo "== POST /reload applies the config file, as SIGHUP does"
read -r lb2_port admin2_port < <(free_ports 2)
printf '{"listen": "127.0.0.1:%s", "admin_listen": "127.0.0.1:%s", "backends": ["127.0.0.1:%s"]}\n' \
  "$lb2_port" "$admin2_port" "$p1" >"$work/rodizio.json"
RUST_LOG=${RUST_LOG:-warn} "$bin" "${root_flag[@]}" -c "$work/rodizio.json" >"$work/rodizio2.out" 2>"$work/rodizio2.err" &
rodizio2_pid=$!
pids+=("$rodizio2_pid")
wait_line "$work/rodizio2.out" "Load balancer listening on port $lb2_port" "$rodizio2_pid"
printf '{"listen": "127.0.0.1:%s", "admin_listen": "127.0.0.1:%s", "backends": ["127.0.0.1:%s"]}\n' \
  "$lb2_port" "$admin2_port" "$p2" >"$work/rodizio.json"
admin="http://127.0.0.1:$admin2_port"
api POST /reload 200
has "127.0.0.1:$p2"
printf '{"backends": ' >"$work/rodizio.json"
api POST /reload 422
has 'line 1'
api GET /backends 200
has "\"address\":\"127.0.0.1:$p2\""
admin="http://127.0.0.1:$admin_port"

echo "== stopping rodizio (PID $rodizio_pid)"
kill -TERM "$rodizio_pid"
stopped=""
for _ in $(seq 1 100); do
  if ! kill -0 "$rodizio_pid" 2>/dev/null; then
    stopped=1
    break
  fi
  sleep 0.1
done
[ -n "$stopped" ] || fail "rodizio did not stop within 10s of SIGTERM"
set +e
wait "$rodizio_pid"
code=$?
set -e
[ "$code" = 0 ] || fail "rodizio exited with $code: $(cat "$work/rodizio.err")"
if curl -s --max-time 2 "$admin/backends" >/dev/null; then
  fail "the admin API still answers after the stop"
fi

echo "admin-check: OK"
