#!/usr/bin/env bash
# rodizio beside HAProxy and nginx's stream module, in one run on loopback.
#
#   scripts/bench.sh            full run (5 rounds, about 10 minutes)
#   scripts/bench.sh --quick    3 short rounds, under 4 minutes
#   scripts/bench.sh --rounds N
#   RODIZIO_FLAGS="--yield-before-poll --defer-accept" scripts/bench.sh --quick
#                               every rodizio instance gets these flags too
#
# It installs what is missing (apt-get), builds rodizio in release mode,
# starts the backends (nginx serving a 612-byte and a 1 MiB file on three
# ports, redis-server, iperf3) and the proxies in front of them (rodizio,
# HAProxy in mode tcp, nginx stream, and "direct": no proxy at all), runs
# each workload through each proxy in interleaved rounds (A B C D, A B C D,
# ...) so the machine's drift hits all alike, and stops everything it
# started, by PID, on exit or Ctrl-C.
#
# Raw results and logs go to bench-out/; the final table goes to
# docs/benchmarks.md and the chart to docs/benchmarks.png.
#
# Never part of `make test`: a shared machine gives noisy numbers, so
# numbers come from this script, never from timed tests.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

# ---------------------------------------------------------------- options
# Extra flags for every rodizio instance (off-by-default fast paths).
read -ra RODIZIO_EXTRA <<<"${RODIZIO_FLAGS:-}"
# Started as root, rodizio serves as root only when told to.
if [ "$(id -u)" -eq 0 ]; then
  RODIZIO_EXTRA+=(--allow-root)
fi
QUICK=0
ROUNDS=5
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; ROUNDS=3 ;;
    --rounds) ROUNDS=$2; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
  shift
done

if [ "$QUICK" -eq 1 ]; then
  SHORT_N=5000; WRK_SECS=2; BULK_N=200; IPERF_SECS=2; REDIS_N=5000; IDLE_N=1000
else
  SHORT_N=20000; WRK_SECS=5; BULK_N=1000; IPERF_SECS=5; REDIS_N=20000; IDLE_N=1000
fi

OUT=$ROOT/bench-out
DOCS=$ROOT/docs
PROXIES=(rodizio haproxy nginx direct)
# rodizio --splice runs the bulk workloads too (the small-message ones see
# no difference from zero copy, and the run stays short).
BULK_PROXIES=(rodizio rodizio-splice haproxy nginx direct)
WORKLOADS=(short keepalive bulk iperf redis)

# Ports (loopback only). Backends, then one front port per proxy and kind.
B1=18081; B2=18082; B3=18083; REDIS=18379; IPERF=18520
declare -A HTTP_PORT=([rodizio]=18101 [haproxy]=18102 [nginx]=18103 [rodizio-splice]=18104 [direct]=$B1)
declare -A REDIS_PORT=([rodizio]=18201 [haproxy]=18202 [nginx]=18203 [direct]=$REDIS)
declare -A IPERF_PORT=([rodizio]=18301 [haproxy]=18302 [nginx]=18303 [rodizio-splice]=18304 [direct]=$IPERF)

log() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
info() { printf '   %s\n' "$*"; }

# ---------------------------------------------------------------- tools
install_missing() {
  local need=()
  command -v haproxy >/dev/null || need+=(haproxy)
  command -v nginx >/dev/null || need+=(nginx)
  stream_module >/dev/null || need+=(libnginx-mod-stream)
  command -v redis-server >/dev/null || need+=(redis-server)
  command -v redis-benchmark >/dev/null || need+=(redis-tools)
  command -v iperf3 >/dev/null || need+=(iperf3)
  command -v wrk >/dev/null || need+=(wrk)
  command -v ab >/dev/null || need+=(apache2-utils)
  command -v gnuplot >/dev/null || need+=(gnuplot-nox)
  command -v python3 >/dev/null || need+=(python3)
  if [ ${#need[@]} -gt 0 ]; then
    log "installing: ${need[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    # policy-rc.d-free installs may start the system services: the bench
    # never uses their ports, and leaves them alone.
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  fi
}

stream_module() {
  local f
  for f in /usr/lib/nginx/modules/ngx_stream_module.so \
           /usr/lib64/nginx/modules/ngx_stream_module.so \
           /usr/share/nginx/modules/ngx_stream_module.so; do
    [ -f "$f" ] && { echo "$f"; return 0; }
  done
  return 1
}

# ---------------------------------------------------------------- processes
STARTED=()          # every PID this script started, stopped on exit
declare -A PIDS     # proxy -> comma-separated PIDs to measure
declare -A IDLE_PIDS

cleanup() {
  local pid
  trap - EXIT INT TERM
  for pid in "${STARTED[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${STARTED[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM

# start NAME CMD...: runs CMD in the background, logging to $OUT/NAME.log.
start() {
  local name=$1; shift
  "$@" >"$OUT/$name.log" 2>&1 &
  STARTED+=($!)
  LAST_PID=$!
}

# stop PID: TERM, wait up to 5s, then KILL; forgotten by the exit trap.
stop() {
  local pid=$1 keep=() p
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  for p in "${STARTED[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
  STARTED=("${keep[@]}")
}

# nginx_pids MASTER: the master and its two workers, comma-separated (their
# CPU and memory are summed).
nginx_pids() {
  local master=$1
  for _ in $(seq 100); do
    [ "$(pgrep -P "$master" | wc -l)" -ge 2 ] && break
    sleep 0.1
  done
  echo "$master" $(pgrep -P "$master") | tr ' ' ','
}

wait_listen() {
  local port=$1 i
  for i in $(seq 100); do
    if ss -ltnH "sport = :$port" | grep -q LISTEN; then return 0; fi
    sleep 0.1
  done
  echo "nothing listens on port $port after 10s; see $OUT/*.log" >&2
  exit 1
}

port_free() {
  ! ss -ltnH "sport = :$1" | grep -q LISTEN
}

# Sum of user+system CPU ticks of the given PIDs (all their threads).
cpu_ticks() {
  local pid total=0 t
  for pid in ${1//,/ }; do
    t=$(sed 's/^.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}')
    total=$((total + t))
  done
  echo "$total"
}

# Sum of a /proc/PID/status field (kB or count) over the given PIDs.
status_sum() {
  local pid total=0 v
  for pid in ${1//,/ }; do
    v=$(awk -v f="$2:" '$1 == f {print $2}' "/proc/$pid/status")
    total=$((total + ${v:-0}))
  done
  echo "$total"
}

# ---------------------------------------------------------------- workloads
# Each run_* prints: throughput p99_ms errors units
#   units = requests (short, keepalive, redis) or bytes (bulk, iperf),
#   the denominator of the CPU-per-unit figure.

run_short() {
  local f=$1 port=$2
  timeout 120 ab -q -n "$SHORT_N" -c 100 -r "http://127.0.0.1:$port/small.html" >"$f" 2>&1 || true
  awk -v n="$SHORT_N" '
    /^Complete requests:/ {c=$3} /^Failed requests:/ {e=$3} /^Non-2xx responses:/ {x=$3}
    /^Requests per second:/ {r=$4} /^ +99%/ {p=$2}
    END {printf "%s %s %d %d\n", (r==""?0:r), (p==""?"nan":p), (n-c)+e+x, c}' "$f"
}

run_keepalive() {
  local f=$1 port=$2
  timeout $((WRK_SECS + 30)) wrk -t2 -c100 -d"${WRK_SECS}s" --latency \
    "http://127.0.0.1:$port/small.html" >"$f" 2>&1 || true
  awk '
    function ms(v) { if (v ~ /us$/) return v/1000; if (v ~ /ms$/) return v+0;
                     if (v ~ /m$/) return v*60000; if (v ~ /s$/) return v*1000; return v }
    /^Requests\/sec:/ {r=$2} /^ +99%/ {p=ms($2)} / requests in / {n=$1}
    /Socket errors:/ {gsub(",", ""); e=$4+$6+$8+$10}
    /Non-2xx or 3xx responses:/ {x=$5}
    END {printf "%s %s %d %d\n", (r==""?0:r), (p==""?"nan":p), e+x, n}' "$f"
}

run_bulk() {
  local f=$1 port=$2
  timeout 120 ab -q -n "$BULK_N" -c 10 -r "http://127.0.0.1:$port/1m.bin" >"$f" 2>&1 || true
  awk -v n="$BULK_N" '
    /^Complete requests:/ {c=$3} /^Failed requests:/ {e=$3} /^Non-2xx responses:/ {x=$3}
    /^Time taken for tests:/ {t=$5} /^Total transferred:/ {b=$3} /^ +99%/ {p=$2}
    END {printf "%.1f %s %d %d\n", (t>0 ? b/1e6/t : 0), (p==""?"nan":p), (n-c)+e+x, b}' "$f"
}

run_iperf() {
  local f=$1 port=$2
  timeout $((IPERF_SECS + 20)) iperf3 -c 127.0.0.1 -p "$port" -t "$IPERF_SECS" -J >"$f" 2>&1 || true
  python3 - "$f" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    r = d["end"]["sum_received"]
    print(f'{r["bits_per_second"] / 8e6:.1f} nan 0 {int(r["bytes"])}')
except Exception:
    print("0 nan 1 0")
EOF
}

run_redis() {
  local f=$1 port=$2
  timeout 120 redis-benchmark -h 127.0.0.1 -p "$port" -n "$REDIS_N" -c 50 -t set,get --csv >"$f" 2>&1 || true
  # CSV: "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",
  #      "p95_latency_ms","p99_latency_ms","max_latency_ms"
  # Throughput over both tests together; p99 the worse of the two.
  awk -F'"' -v n="$REDIS_N" '
    $2 == "SET" || $2 == "GET" {k++; t += n/$4; if ($14 > p) p = $14}
    END {if (k == 2) printf "%.0f %s 0 %d\n", 2*n/t, p, 2*n; else print "0 nan 1 0"}' "$f"
}

port_for() {  # workload proxy
  case $1 in
    redis) echo "${REDIS_PORT[$2]}" ;;
    iperf) echo "${IPERF_PORT[$2]}" ;;
    *) echo "${HTTP_PORT[$2]}" ;;
  esac
}

# PIDs measured for a workload: rodizio runs one instance per kind.
pids_for() {  # workload proxy
  if [ "$2" = rodizio ]; then
    case $1 in
      redis) echo "$RODIZIO_REDIS" ;;
      iperf) echo "$RODIZIO_IPERF" ;;
      *) echo "$RODIZIO_HTTP" ;;
    esac
  elif [ "$2" = rodizio-splice ]; then
    case $1 in
      iperf) echo "$SPLICE_IPERF" ;;
      *) echo "$SPLICE_HTTP" ;;
    esac
  else
    echo "${PIDS[$2]:-}"
  fi
}

measure() {  # round workload proxy
  local round=$1 wl=$2 proxy=$3 port pids before after res hwm thr
  port=$(port_for "$wl" "$proxy")
  pids=$(pids_for "$wl" "$proxy")
  before=0; [ -n "$pids" ] && before=$(cpu_ticks "$pids")
  res=$("run_$wl" "$OUT/logs/$wl-$proxy-r$round.txt" "$port")
  after=0; hwm=0; thr=0
  if [ -n "$pids" ]; then
    after=$(cpu_ticks "$pids")
    hwm=$(status_sum "$pids" VmHWM)
    thr=$(status_sum "$pids" Threads)
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$wl" "$proxy" \
    "$(echo "$res" | tr ' ' '\t')" "$((after - before))" "$hwm" "$thr" >>"$OUT/raw.tsv"
  read -r thr_v p99 errs _ <<<"$res"
  printf '   r%-2s %-9s %-14s %12s  p99 %-8s errors %s\n' "$round" "$wl" "$proxy" "$thr_v" "$p99" "$errs"
}

# ---------------------------------------------------------------- main
T0=$(date +%s)
install_missing
STREAM_MODULE=$(stream_module) || { echo "nginx stream module not found" >&2; exit 1; }

log "building rodizio (release)"
cargo build --release --quiet
RODIZIO=$ROOT/target/release/rodizio

rm -rf "$OUT"
mkdir -p "$OUT/logs" "$OUT/backend/www" "$OUT/backend/tmp" "$OUT/stream"
chmod 755 "$OUT" "$OUT/backend" "$OUT/backend/www"
# Up to 1000 idle connections through each proxy, two sockets each.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

for p in $B1 $B2 $B3 $REDIS $IPERF 181{01..04} 182{01..03} 183{01..04} 184{01..03} 184{12,13,22,23}; do
  port_free "$p" || { echo "port $p is in use; stop what holds it first" >&2; exit 1; }
done

# The files: 612 bytes (nginx's own index.html size) and 1 MiB.
head -c 612 /dev/zero | tr '\0' 'x' >"$OUT/backend/www/small.html"
head -c 1048576 /dev/urandom >"$OUT/backend/www/1m.bin"
chmod 644 "$OUT/backend/www/"*

USER_NAME=$(id -un)
subst() {  # template output prefix
  sed -e "s|@PREFIX@|$3|g" -e "s|@USER@|$USER_NAME|g" -e "s|@STREAM_MODULE@|$STREAM_MODULE|g" \
      -e "s|@B1@|$B1|g" -e "s|@B2@|$B2|g" -e "s|@B3@|$B3|g" \
      -e "s|@REDIS@|$REDIS|g" -e "s|@IPERF@|$IPERF|g" \
      -e "s|@HTTP_PORT@|$4|g" -e "s|@REDIS_PORT@|$5|g" -e "s|@IPERF_PORT@|$6|g" \
      "$ROOT/scripts/bench/$1" >"$2"
}

log "starting backends"
subst nginx-backend.conf.in "$OUT/backend/nginx.conf" "$OUT/backend" 0 0 0
start nginx-backend nginx -p "$OUT/backend" -c "$OUT/backend/nginx.conf" -e "$OUT/backend/error.log"
start redis redis-server --bind 127.0.0.1 --port "$REDIS" --save '' --appendonly no \
  --protected-mode no --dir "$OUT" --daemonize no
start iperf3 iperf3 -s -B 127.0.0.1 -p "$IPERF"
for p in $B1 $B2 $B3 $REDIS $IPERF; do wait_listen "$p"; done
info "nginx on $B1 $B2 $B3, redis on $REDIS, iperf3 on $IPERF"

log "starting proxies"
export RUST_LOG=warn
start rodizio-http "$RODIZIO" "${RODIZIO_EXTRA[@]}" -l "127.0.0.1:${HTTP_PORT[rodizio]}" \
  -b "127.0.0.1:$B1" -b "127.0.0.1:$B2" -b "127.0.0.1:$B3" --idle-timeout 120s
RODIZIO_HTTP=$LAST_PID
start rodizio-redis "$RODIZIO" "${RODIZIO_EXTRA[@]}" -l "127.0.0.1:${REDIS_PORT[rodizio]}" -b "127.0.0.1:$REDIS" --idle-timeout 120s
RODIZIO_REDIS=$LAST_PID
start rodizio-iperf "$RODIZIO" "${RODIZIO_EXTRA[@]}" -l "127.0.0.1:${IPERF_PORT[rodizio]}" -b "127.0.0.1:$IPERF" --idle-timeout 120s
RODIZIO_IPERF=$LAST_PID
PIDS[rodizio]=$RODIZIO_HTTP
start rodizio-splice-http "$RODIZIO" "${RODIZIO_EXTRA[@]}" --splice -l "127.0.0.1:${HTTP_PORT[rodizio-splice]}" \
  -b "127.0.0.1:$B1" -b "127.0.0.1:$B2" -b "127.0.0.1:$B3" --idle-timeout 120s
SPLICE_HTTP=$LAST_PID
start rodizio-splice-iperf "$RODIZIO" "${RODIZIO_EXTRA[@]}" --splice -l "127.0.0.1:${IPERF_PORT[rodizio-splice]}" \
  -b "127.0.0.1:$IPERF" --idle-timeout 120s
SPLICE_IPERF=$LAST_PID

subst haproxy.cfg.in "$OUT/haproxy.cfg" "$OUT" "${HTTP_PORT[haproxy]}" "${REDIS_PORT[haproxy]}" "${IPERF_PORT[haproxy]}"
start haproxy haproxy -f "$OUT/haproxy.cfg" -db
PIDS[haproxy]=$LAST_PID

subst nginx-stream.conf.in "$OUT/stream/nginx.conf" "$OUT/stream" "${HTTP_PORT[nginx]}" "${REDIS_PORT[nginx]}" "${IPERF_PORT[nginx]}"
start nginx-stream nginx -p "$OUT/stream" -c "$OUT/stream/nginx.conf" -e "$OUT/stream/error.log"
PIDS[nginx]=$(nginx_pids "$LAST_PID")
for p in 181{01..04} 182{01..03} 183{01..04}; do wait_listen "$p"; done
info "rodizio pids $RODIZIO_HTTP (http) $RODIZIO_REDIS (redis) $RODIZIO_IPERF (iperf3), --splice $SPLICE_HTTP $SPLICE_IPERF"
info "haproxy pid ${PIDS[haproxy]}, nginx pids ${PIDS[nginx]}"

# Sanity: each proxy serves the small file.
for proxy in "${BULK_PROXIES[@]}"; do
  size=$(timeout 10 curl -s -o /dev/null -w '%{size_download}' \
    "http://127.0.0.1:${HTTP_PORT[$proxy]}/small.html" || echo 0)
  [ "$size" = 612 ] || { echo "$proxy does not serve the small file (got $size bytes)" >&2; exit 1; }
done

# ---- memory per idle connection, on fresh processes of their own
# (so the 1000 idle connections leave no trace, such as rodizio's 1000
# spawned workers, in the rounds' figures), stopped once measured.
log "memory per idle connection ($IDLE_N connections held through each proxy)"
: >"$OUT/idle.tsv"
mkdir -p "$OUT/idle-stream"
start idle-rodizio "$RODIZIO" "${RODIZIO_EXTRA[@]}" -l "127.0.0.1:18401" \
  -b "127.0.0.1:$B1" -b "127.0.0.1:$B2" -b "127.0.0.1:$B3" --idle-timeout 120s
IDLE_PIDS[rodizio]=$LAST_PID
subst haproxy.cfg.in "$OUT/idle-haproxy.cfg" "$OUT" 18402 18412 18422
start idle-haproxy haproxy -f "$OUT/idle-haproxy.cfg" -db
IDLE_PIDS[haproxy]=$LAST_PID
subst nginx-stream.conf.in "$OUT/idle-stream/nginx.conf" "$OUT/idle-stream" 18403 18413 18423
start idle-nginx nginx -p "$OUT/idle-stream" -c "$OUT/idle-stream/nginx.conf" -e "$OUT/idle-stream/error.log"
IDLE_PIDS[nginx]=$(nginx_pids "$LAST_PID")
declare -A IDLE_PORT=([rodizio]=18401 [haproxy]=18402 [nginx]=18403)
for p in 18401 18402 18403; do wait_listen "$p"; done
for proxy in rodizio haproxy nginx; do
  res=$(timeout 120 python3 "$ROOT/scripts/bench/idle_conns.py" --port "${IDLE_PORT[$proxy]}" \
    --count "$IDLE_N" --pids "${IDLE_PIDS[$proxy]}" --backend-ports "$B1,$B2,$B3" \
    2>"$OUT/logs/idle-$proxy.err" || echo "0 0 nan 0")
  printf '%s\t%s\n' "$proxy" "$(echo "$res" | tr ' ' '\t')" >>"$OUT/idle.tsv"
  read -r before after per thr <<<"$res"
  info "$(printf '%-8s RSS %s KiB -> %s KiB: %s KiB per connection (%s threads)' "$proxy" "$before" "$after" "$per" "$thr")"
  stop "${IDLE_PIDS[$proxy]%%,*}"
done

# ---- warm-up (not recorded)
log "warm-up"
for proxy in "${PROXIES[@]}"; do
  timeout 60 ab -q -n 2000 -c 50 "http://127.0.0.1:${HTTP_PORT[$proxy]}/small.html" >/dev/null 2>&1 || true
done

# ---- the rounds
log "$ROUNDS rounds: ${WORKLOADS[*]} x ${PROXIES[*]}"
printf 'round\tworkload\tproxy\tthroughput\tp99_ms\terrors\tunits\tcpu_ticks\thwm_kib\tthreads\n' >"$OUT/raw.tsv"
for round in $(seq "$ROUNDS"); do
  for wl in "${WORKLOADS[@]}"; do
    if [ "$wl" = bulk ] || [ "$wl" = iperf ]; then set -- "${BULK_PROXIES[@]}"; else set -- "${PROXIES[@]}"; fi
    for proxy in "$@"; do
      measure "$round" "$wl" "$proxy"
    done
  done
done

# ---- report
log "report"
mkdir -p "$DOCS"
{
  echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "nproc=$(nproc)"
  echo "cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
  echo "kernel=$(uname -r)"
  echo "clk_tck=$(getconf CLK_TCK)"
  echo "rodizio=$("$RODIZIO" --version)"
  echo "haproxy=$(haproxy -v | head -1 | awk '{print $3}')"
  echo "nginx=$(nginx -v 2>&1 | sed 's|.*nginx/||')"
  echo "redis_version=$(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/')"
  echo "iperf3=$(iperf3 --version | head -1 | awk '{print $2}')"
  echo "wrk=$(wrk -v 2>&1 | head -1 | awk '{print $2}')"
  echo "ab=$(ab -V | head -1 | awk '{print $4, $5}')"
  echo "rounds=$ROUNDS"
  echo "command=${RODIZIO_FLAGS:+RODIZIO_FLAGS='$RODIZIO_FLAGS' }scripts/bench.sh $([ "$QUICK" -eq 1 ] && echo --quick)"
  echo "short=ab -n $SHORT_N -c 100 (612-byte file, a new connection per request)"
  echo "keepalive=wrk -t2 -c100 -d${WRK_SECS}s --latency (612-byte file, keep-alive)"
  echo "bulk=ab -n $BULK_N -c 10 (1 MiB file)"
  echo "iperf=iperf3 -t $IPERF_SECS (one stream)"
  echo "redis=redis-benchmark -n $REDIS_N -c 50 -t set,get"
  echo "idle=$IDLE_N connections, one byte sent on each, held idle 2 s"
} >"$OUT/meta.txt"
python3 "$ROOT/scripts/bench/report.py" "$OUT" >"$OUT/benchmarks.md"
gnuplot "$OUT/chart.gp"
# The hand-written analysis below the generated tables survives a re-run.
if [ -f "$DOCS/benchmarks.md" ] && grep -q '^## Where the time goes' "$DOCS/benchmarks.md"; then
  sed -n '/^## Where the time goes/,$p' "$DOCS/benchmarks.md" >>"$OUT/benchmarks.md"
fi
cp "$OUT/benchmarks.md" "$DOCS/benchmarks.md"
cp "$OUT/benchmarks.png" "$DOCS/benchmarks.png"

log "summary"
sed -n '/^### Ratios/,/^### Short/p' "$OUT/benchmarks.md" | sed '$d'
sed -n '/^## Memory per idle/,/^## Where/p' "$OUT/benchmarks.md" | grep '^|'
info "full table: docs/benchmarks.md, chart: docs/benchmarks.png, raw data and logs: bench-out/"
info "took $(( $(date +%s) - T0 ))s"
