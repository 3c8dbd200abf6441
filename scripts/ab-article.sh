#!/usr/bin/env bash
# The article's own check, through the real binary: three
# `python3 -m http.server` backends, rodizio in front of them fed through its
# prompt, then `ab -n 1000 -c 100`. Fails unless all 1000 requests complete,
# none fails, and each backend served at least 20% of them.
#
# Ports are free ones picked at run time; everything it starts is killed on
# exit; every wait is bounded.
#
# Environment: RODIZIO_BIN to test a given binary (default: `cargo build`
# then the debug binary); REQUESTS and CONCURRENCY (default 1000 and 100).
set -euo pipefail
cd "$(dirname "$0")/.."

REQUESTS=${REQUESTS:-1000}
CONCURRENCY=${CONCURRENCY:-100}

PROG=ab-article
. scripts/lib.sh
need_tools ab python3 curl timeout

# Four free ports on loopback.
read -r p1 p2 p3 lb_port < <(free_ports 4)
backend_ports=("$p1" "$p2" "$p3")

mkdir "$work/www"
echo "hello from the article's backends" >"$work/www/index.html"

echo "== three python3 -m http.server backends on ports ${backend_ports[*]}"
for i in 0 1 2; do
  python3 -m http.server "${backend_ports[$i]}" --bind 127.0.0.1 --directory "$work/www" \
    >/dev/null 2>"$work/backend$i.log" &
  pids+=("$!")
done

# Wait until each answers (bounded), then note how many log lines that took,
# so the readiness probes are not counted as balanced requests.
probe_lines=()
for i in 0 1 2; do
  url="http://127.0.0.1:${backend_ports[$i]}/"
  ok=""
  for _ in $(seq 1 100); do
    if curl -fs -o /dev/null --max-time 1 "$url"; then
      ok=1
      break
    fi
    sleep 0.1
  done
  [ -n "$ok" ] || fail "backend $url did not answer within 10s"
  probe_lines+=("$(grep -c '"GET / ' "$work/backend$i.log" || true)")
done

debug_bin

echo "== rodizio on port $lb_port, backends typed into its prompt"
{
  echo 3
  for port in "${backend_ports[@]}"; do
    echo 127.0.0.1
    echo "$port"
  done
} >"$work/answers"
RUST_LOG=${RUST_LOG:-warn} "$bin" -l "127.0.0.1:$lb_port" "${root_flag[@]}" <"$work/answers" \
  >"$work/rodizio.out" 2>&1 &
pids+=("$!")
rodizio_pid=$!
wait_line "$work/rodizio.out" "Load balancer listening on port $lb_port" "$rodizio_pid"

echo "== ab -n $REQUESTS -c $CONCURRENCY http://127.0.0.1:$lb_port/"
if ! timeout 120 ab -n "$REQUESTS" -c "$CONCURRENCY" "http://127.0.0.1:$lb_port/" >"$work/ab.out" 2>&1; then
  cat "$work/ab.out" >&2
  fail "ab failed or timed out"
fi
grep -E '^(Complete requests|Failed requests|Requests per second|Time per request|Time taken)' "$work/ab.out"

complete=$(awk '/^Complete requests:/ {print $3}' "$work/ab.out")
failed=$(awk '/^Failed requests:/ {print $3}' "$work/ab.out")
[ "$complete" = "$REQUESTS" ] || fail "$complete of $REQUESTS requests completed"
[ "$failed" = "0" ] || fail "$failed requests failed"
kill -0 "$rodizio_pid" 2>/dev/null || fail "rodizio is no longer running"

# python's http.server logs one line per request on stderr, after it has
# answered: give the last lines a moment (bounded) to reach the logs.
count_served() {
  local lines
  lines=$(grep -c '"GET / ' "$work/backend$1.log" || true)
  echo $((lines - probe_lines[$1]))
}
for _ in $(seq 1 50); do
  total=0
  for i in 0 1 2; do
    total=$((total + $(count_served "$i")))
  done
  [ "$total" -lt "$REQUESTS" ] || break
  sleep 0.1
done

echo "== requests per backend"
min=$((REQUESTS / 5))
for i in 0 1 2; do
  served=$(count_served "$i")
  echo "backend 127.0.0.1:${backend_ports[$i]}: $served requests"
  [ "$served" -ge "$min" ] || fail "backend ${backend_ports[$i]} served $served, less than 20% ($min)"
done
[ "$total" -eq "$REQUESTS" ] || fail "the backends logged $total requests, not $REQUESTS"

# For comparison only (no pass/fail): the same load straight to one backend,
# in the same run, so the balancer's cost can be read off the two rates.
echo "== for comparison: the same ab straight to backend 127.0.0.1:${backend_ports[0]}"
if timeout 120 ab -n "$REQUESTS" -c "$CONCURRENCY" "http://127.0.0.1:${backend_ports[0]}/" >"$work/ab-direct.out" 2>&1; then
  grep -E '^(Failed requests|Requests per second)' "$work/ab-direct.out"
else
  echo "(ab straight to the backend failed: python's http.server listens with a backlog of 5 and drops connections under this load at times)"
fi

echo "ab-article: OK ($complete complete, $failed failed)"
