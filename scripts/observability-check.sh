#!/usr/bin/env bash
# /metrics and the stats page through the real binary, read by real
# clients: the whole metrics text parsed by the Prometheus project's own
# Python parser (prometheus_client), every histogram's buckets checked for
# consistency; a real Prometheus server scraping rodizio every second,
# asked through its HTTP API, after real traffic, for the p99 of the
# connection duration, the queue wait and the health checks (under a
# second: the requests take milliseconds), and for the standard process_*
# series and each backend's weight and last change; and the stats page loaded in
# headless Chromium, its rendered DOM checked: a row per backend with the
# right state and every figure (peak, rate, errors by kind, the check's
# progress, downtime, a totals row, the chart), and a stopped backend shown
# DOWN within two check intervals.
#
#   scripts/observability-check.sh              check; screenshot in target/
#   SCREENSHOT=docs/stats-page.png scripts/observability-check.sh
#
# Ports are free ones picked at run time; everything it starts is stopped
# by its PID on exit; every wait is bounded. RODIZIO_BIN tests a given
# binary (default: `cargo build` then the debug binary).
set -euo pipefail
cd "$(dirname "$0")/.."

PROG=observability-check
. scripts/lib.sh
need_tools python3 curl timeout chromium prometheus
python3 -c 'import prometheus_client' 2>/dev/null ||
  fail "the Python prometheus_client is missing (scripts/install-test-tools.sh installs it)"

read -r p1 p2 lb_port admin_port prom_port < <(free_ports 5)

# promql QUERY: the value of the query's first sample (or "none" when it
# has none), from the Prometheus server started below; never fails.
promql() {
  { curl -s --max-time 2 "http://127.0.0.1:$prom_port/api/v1/query" \
    --data-urlencode "query=$1" || true; } | python3 -c '
import json, sys
try:
    result = json.load(sys.stdin)["data"]["result"]
except Exception:
    result = []
print(result[0]["value"][1] if result else "none")
'
}
# wait_query WHAT QUERY VALUE SECONDS: waits (at most SECONDS) until QUERY
# gives VALUE.
wait_query() {
  local got=none deadline=$((SECONDS + $4))
  while [ "$SECONDS" -lt "$deadline" ]; do
    got=$(promql "$2")
    [ "$got" = "$3" ] && return 0
    kill -0 "$prom_pid" 2>/dev/null || break
    sleep 0.2
  done
  tail -5 "$work/prometheus.err" >&2
  fail "Prometheus: $1: '$2' gave $got, not $3, within $4 s"
}

# Started first: this Prometheus applies its scrape targets only 5 s after
# it starts (a fixed tick of its scrape manager), so the build and the
# start-up below take their time from that wait instead of adding to it.
echo "== Prometheus on 127.0.0.1:$prom_port, scraping the admin listener every second"
mkdir -p "$work/prometheus"
cat >"$work/prometheus/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: rodizio
    static_configs:
      - targets: ["127.0.0.1:$admin_port"]
YML
(cd "$work/prometheus" && exec prometheus --config.file=prometheus.yml \
  --storage.tsdb.path="$work/prometheus/data" --web.listen-address="127.0.0.1:$prom_port") \
  >/dev/null 2>"$work/prometheus.err" &
prom_pid=$!
pids+=("$prom_pid")
debug_bin

echo "== demo backends on ports $p1 $p2"
backend_pids=()
for port in "$p1" "$p2"; do
  "$bin" backend --listen "127.0.0.1:$port" >"$work/backend$port.out" 2>&1 &
  pids+=("$!")
  backend_pids+=("$!")
  wait_line "$work/backend$port.out" "Demo backend listening" "$!"
done

interval_ms=500
echo "== rodizio on port $lb_port, admin on 127.0.0.1:$admin_port, checks every ${interval_ms}ms"
RUST_LOG=${RUST_LOG:-warn} "$bin" -l "127.0.0.1:$lb_port" -b "127.0.0.1:$p1" -b "127.0.0.1:$p2" \
  --health-check http --health-interval "${interval_ms}ms" --health-timeout 200ms --fall 1 \
  --rate-limit 1000/1s --admin "127.0.0.1:$admin_port" "${root_flag[@]}" \
  >"$work/rodizio.out" 2>"$work/rodizio.err" &
rodizio_pid=$!
pids+=("$rodizio_pid")
wait_line "$work/rodizio.out" "Load balancer listening on port $lb_port" "$rodizio_pid"

wait_line "$work/prometheus.err" "Server is ready to receive web requests" "$prom_pid"
# A scrape before the traffic, so that rate() has a point to start from.
wait_query "rodizio scraped" 'up{job="rodizio"}' 1 15

echo "== traffic: 40 requests"
for _ in $(seq 1 40); do
  curl -s --max-time 5 -o /dev/null "http://127.0.0.1:$lb_port/" || fail "a request failed"
done

echo "== /metrics, parsed whole by prometheus_client"
curl -s --max-time 5 "http://127.0.0.1:$admin_port/metrics" >"$work/metrics" || fail "GET /metrics failed"
python3 - "$work/metrics" "$p1" "$p2" <<'PY' || fail "the metrics did not parse or were wrong"
import sys
from prometheus_client.parser import text_string_to_metric_families
text = open(sys.argv[1]).read()
families = {f.name: f for f in text_string_to_metric_families(text)}
def value(name, **labels):
    for s in families[name].samples:
        if s.name.endswith(("_bucket", "_created")):
            continue
        if all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise SystemExit(f"no sample {name} {labels}")
assert families["rodizio_accepted"].type == "counter", families["rodizio_accepted"].type
assert value("rodizio_accepted") == 40, value("rodizio_accepted")
assert value("rodizio_completed") == 40, value("rodizio_completed")
total = sum(value("rodizio_backend_connections", backend=f"127.0.0.1:{p}") for p in sys.argv[2:])
assert total == 40, total
assert value("rodizio_active") == 0
assert families["rodizio_queue_wait_seconds"].type == "histogram"
assert value("rodizio_build_info") == 1
# The stats page's figures that Prometheus gets too: the peak, errors by
# kind, the time down.
assert families["rodizio_backend_connections_peak"].type == "gauge"
peak = sum(value("rodizio_backend_connections_peak", backend=f"127.0.0.1:{p}") for p in sys.argv[2:])
assert peak >= 1, peak
assert families["rodizio_backend_errors"].type == "counter"
for p in sys.argv[2:]:
    for kind in ["connect", "reset", "timeout"]:
        assert value("rodizio_backend_errors", backend=f"127.0.0.1:{p}", kind=kind) == 0, (p, kind)
assert families["rodizio_backend_down_seconds"].type == "counter"
# Every histogram: buckets cumulated once (never going down as le rises),
# le="+Inf" equal to _count. The parser checks the syntax, not this.
histograms = [f for f in families.values() if f.type == "histogram"]
assert len(histograms) >= 3, [f.name for f in histograms]
for f in histograms:
    buckets = [(float(s.labels["le"]), s.value) for s in f.samples if s.name.endswith("_bucket")]
    count = next(s.value for s in f.samples if s.name.endswith("_count"))
    bounds, values = [b for b, _ in buckets], [v for _, v in buckets]
    assert bounds == sorted(bounds) and values == sorted(values), (f.name, buckets)
    assert buckets[-1] == (float("inf"), count), (f.name, buckets, count)
print(f"parsed {len(families)} metric families, {sum(len(f.samples) for f in families.values())} samples")
PY

echo "== Prometheus: the scrapes and the p99s it computes from them"
wait_query "the traffic scraped" 'rodizio_completed_total{job="rodizio"}' 40 10
python3 - "$prom_port" <<'PY' || fail "Prometheus saw wrong histograms or an unhealthy scrape"
import json, sys, urllib.parse, urllib.request
api = f"http://127.0.0.1:{sys.argv[1]}/api/v1/"
def get(path):
    return json.load(urllib.request.urlopen(api + path, timeout=2))["data"]
def query(q):
    result = get("query?" + urllib.parse.urlencode({"query": q}))["result"]
    assert len(result) == 1, (q, result)
    return float(result[0]["value"][1])
for h in ["connection_duration", "queue_wait", "health_check_duration"]:
    name, sel = f"rodizio_{h}_seconds", '{job="rodizio"}'
    # One query, so both sides come from the same scrape.
    over = query(f"max({name}_bucket{sel}) - sum({name}_count{sel})")
    assert over == 0, f"{name}: the largest bucket minus the count is {over}, not 0"
    p99 = query(f"histogram_quantile(0.99, sum by (le) (rate({name}_bucket{sel}[30s])))")
    assert 0 < p99 < 1, f"{name}: p99 over the last 30 s is {p99} s, not under 1 s"
    print(f"{name}: p99 {p99 * 1000:.2f} ms ({query(f'sum({name}_count{sel})'):.0f} observed)")
# The page's series, scraped: the peak per backend, errors by 5 kinds each
# (connect, reset, timeout, killed_down, killed_removed).
assert query('count(rodizio_backend_connections_peak{job="rodizio"})') == 2
assert query('sum(rodizio_backend_connections_peak{job="rodizio"})') >= 1
assert query('count(rodizio_backend_errors_total{job="rodizio"})') == 10
assert query('count(rodizio_backend_down_seconds_total{job="rodizio"})') == 2
targets = get("targets")["activeTargets"]
assert len(targets) == 1, targets
t = targets[0]
assert t["health"] == "up" and t["lastError"] == "", t
PY

echo "== Prometheus: the process_* series, the backends' weights and last changes"
python3 - "$prom_port" "$p1" <<'PY' || fail "Prometheus saw wrong process or backend series"
import json, sys, urllib.parse, urllib.request
api = f"http://127.0.0.1:{sys.argv[1]}/api/v1/"
def query(q):
    url = api + "query?" + urllib.parse.urlencode({"query": q})
    result = json.load(urllib.request.urlopen(url, timeout=2))["data"]["result"]
    assert len(result) == 1, (q, result)
    return float(result[0]["value"][1])
sel = '{job="rodizio"}'
# Started within the last hour, and not in the future.
age = query(f"time() - process_start_time_seconds{sel}")
assert 0 <= age < 3600, f"process started {age} s ago"
fds, max_fds = query(f"process_open_fds{sel}"), query(f"process_max_fds{sel}")
assert 5 <= fds < max_fds, (fds, max_fds)
rss = query(f"process_resident_memory_bytes{sel}")
assert 1 << 20 < rss < 1 << 31, rss
assert query(f"process_virtual_memory_bytes{sel}") >= rss
assert query(f"process_threads{sel}") >= 3
assert query(f"process_cpu_seconds_total{sel}") >= 0
b = f'{{job="rodizio",backend="127.0.0.1:{sys.argv[2]}"}}'
assert query(f"rodizio_backend_weight{b}") == 1
changed = query(f"time() - rodizio_backend_last_change_seconds{b}")
assert -1 <= changed < 3600, f"last change {changed} s ago"
print(f"process: up {age:.0f} s, {fds:.0f} of {max_fds:.0f} descriptors, "
      f"{rss / 1048576:.1f} MiB resident; backend last changed {changed:.1f} s ago")
PY

# dom: the stats page as Chromium renders it.
dom() {
  timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$work/chromium" --dump-dom "http://127.0.0.1:$admin_port/" 2>/dev/null
}
# row_state PORT: the state shown in that backend's row.
row_state() {
  python3 -c '
import sys, html.parser
port = sys.argv[1]
class P(html.parser.HTMLParser):
    row = None; cell = None; state = None; rows = 0
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "data-backend" in a:
            P.rows += 1
            self.row = a["data-backend"].endswith(":" + port)
        if tag == "td" and self.row:
            self.cell = a.get("class")
    def handle_data(self, data):
        if self.row and self.cell == "state" and data.strip():
            P.state = data.strip()
    def handle_endtag(self, tag):
        if tag == "td":
            self.cell = None
p = P(); p.feed(sys.stdin.read())
print(P.rows, P.state)
' "$1"
}

echo "== the stats page in headless Chromium"
dom >"$work/dom.html" || fail "chromium could not load the page"
grep -q '<meta http-equiv="refresh"' "$work/dom.html" || fail "the page does not refresh itself"
read -r rows state < <(row_state "$p1" <"$work/dom.html")
[ "$rows" = 2 ] || fail "$rows backend rows, not 2"
[ "$state" = UP ] || fail "backend $p1 shows $state, not UP"
for item in '<th>peak</th>' '<th>rate/s</th>' '<th>resets</th>' '<th>timeouts</th>' \
  '<th>check</th>' '<th>checked</th>' '<th>downtime</th>' 'toward DOWN</td>' ' ago</td>' \
  '<tr class="totals"><th>total</th><th>2/2 up</th>' '<th>bytes in</th><th>bytes out</th><th>errors</th>' \
  '<svg class="chart"'; do
  grep -qF "$item" "$work/dom.html" || fail "the page shows no $item"
done
# The chart's lines come with its second sample (one every 5 s).
deadline=$((SECONDS + 20))
until [ "$(grep -o '<polyline' "$work/dom.html" | wc -l)" -ge 2 ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the chart has no lines after 20 s"
  sleep 0.5
  dom >"$work/dom.html" || true
done
grep -q '<script' "$work/dom.html" && fail "the page has a script"

echo "== stop backend $p2 (PID ${backend_pids[1]}): DOWN within two check intervals"
kill -TERM "${backend_pids[1]}"
wait "${backend_pids[1]}" 2>/dev/null || true
start=$(date +%s%N)
shown=""
while :; do
  dom >"$work/dom.html" || true
  read -r rows state < <(row_state "$p2" <"$work/dom.html")
  now=$(date +%s%N)
  if [ "$state" = DOWN ]; then
    shown=$(( (now - start) / 1000000 ))
    break
  fi
  # Two intervals, plus the check's timeout and one page load of slack.
  [ $(( (now - start) / 1000000 )) -lt $((2 * interval_ms + 2000)) ] || break
done
[ -n "$shown" ] || fail "backend $p2 still shows $state"
echo "backend $p2 shown DOWN after ${shown} ms (one page load included)"

shot=${SCREENSHOT:-target/stats-page.png}
mkdir -p "$(dirname "$shot")"
timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$work/chromium" --window-size=1600,700 --hide-scrollbars \
  --screenshot="$shot" "http://127.0.0.1:$admin_port/" >/dev/null 2>&1 || fail "no screenshot"
[ -s "$shot" ] || fail "the screenshot is empty"
echo "screenshot: $shot"
echo "observability-check: OK"
