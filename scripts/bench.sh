#!/usr/bin/env bash
# rodizio beside HAProxy, nginx's stream module and the smallest
# thread-per-connection relay (scripts/bench/naive-relay.c), in one run on
# loopback.
#
#   scripts/bench.sh            full run (5 rounds, about 10 minutes)
#   scripts/bench.sh --quick    3 short rounds, about 2 minutes
#   scripts/bench.sh --rounds N
#   RODIZIO_FLAGS="--yield-before-poll --defer-accept" scripts/bench.sh --quick
#                               every rodizio instance gets these flags too
#
# It installs what is missing (apt-get), builds rodizio in release mode,
# starts the backends (nginx serving a 612-byte and a 1 MiB file on three
# ports, redis-server, iperf3) and the proxies in front of them (rodizio,
# the naive relay, HAProxy in mode tcp, nginx stream, and "direct": no proxy
# at all), runs each workload through each proxy in interleaved rounds
# (A B C D, A B C D, ...) so the machine's drift hits all alike, and stops
# everything it started, by PID, on exit or Ctrl-C.
#
# Every server and every load generator runs in a session of its own
# (setsid), as separate services do: with kernel.sched_autogroup_enabled=1
# each session is a scheduling group, and a saturated CPU is shared fairly
# between the groups, not between the threads (docs/benchmarks.md says why
# that matters). For each workload and proxy it records throughput, the
# 50th, 99th and 99.9th percentile latency, the proxy's CPU time and the
# time its threads waited in the run queue (/proc/PID/task/*/schedstat).
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
QUICK=0
ROUNDS=5
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; ROUNDS=3 ;;
    --rounds) ROUNDS=$2; shift ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
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
# The naive relay (the model at its smallest: a detached thread per
# connection, no pool) is the yardstick for small messages, where the
# model's price shows.
PROXIES=(rodizio naive haproxy nginx direct)
# rodizio --splice runs the bulk workloads too (the small-message ones see
# no difference from zero copy, and the run stays short).
BULK_PROXIES=(rodizio rodizio-splice haproxy nginx direct)
# rodizio with the kernel relay as the shipped unit and example config set
# it (kernel_relay auto, promotion after 4 exchanges) runs the keep-alive
# and redis workloads, whose connections make enough exchanges to be
# promoted, and the 1 MiB files, whose connections (one request each) are
# not: that row shows the copy pump under the setting.
RELAY_PROXIES=(rodizio rodizio-relay naive haproxy nginx direct)
WORKLOADS=(short keepalive bulk iperf redis)

proxies_for() {  # workload: the proxies it runs through, in turn
  case $1 in
    keepalive|redis) echo "${RELAY_PROXIES[*]}" ;;
    bulk) echo "rodizio rodizio-splice rodizio-relay haproxy nginx direct" ;;
    iperf) echo "${BULK_PROXIES[*]}" ;;
    *) echo "${PROXIES[*]}" ;;
  esac
}

# Ports (loopback only). Backends, then one front port per proxy and kind.
B1=18081; B2=18082; B3=18083; REDIS=18379; IPERF=18520
declare -A HTTP_PORT=([rodizio]=18101 [haproxy]=18102 [nginx]=18103 [rodizio-splice]=18104
                      [naive]=18105 [rodizio-relay]=18106 [direct]=$B1)
declare -A REDIS_PORT=([rodizio]=18201 [haproxy]=18202 [nginx]=18203 [naive]=18204
                       [rodizio-relay]=18205 [direct]=$REDIS)
# The admin API of the kernel relay's instances, for their promotion counts.
declare -A RELAY_ADMIN=([http]=18107 [redis]=18206)
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
  command -v gcc >/dev/null || need+=(gcc)
  [ -f /usr/include/pthread.h ] || need+=(libc6-dev)
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
declare -A PIDS     # proxy/kind (kind: http, redis, iperf) -> comma-separated PIDs to measure
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

# stat_field PID N: field N of /proc/PID/stat counted after the command
# name (4 is the session, 12 and 13 utime and stime); empty once PID is
# gone. Builtins only: it runs around every workload.
stat_field() {
  local line f
  { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 0
  read -ra f <<<"${line##*) }"
  echo "${f[$2 - 1]}"
}

# start NAME CMD...: runs CMD in the background in a session of its own,
# logging to $OUT/NAME.log. setsid without --fork keeps the PID ($! is the
# command itself, which is what stop and the exit trap kill): it forks only
# when its caller leads a process group, which a background job of a script
# without job control never does, and the check below says so if it ever did.
start() {
  local name=$1 sid; shift
  setsid "$@" >"$OUT/$name.log" 2>&1 &
  LAST_PID=$!
  STARTED+=("$LAST_PID")
  for _ in $(seq 100); do
    sid=$(stat_field "$LAST_PID" 4)
    [ "$sid" = "$LAST_PID" ] && break
    [ -n "$sid" ] || { echo "$name exited at start; see $OUT/$name.log" >&2; exit 1; }
    sleep 0.01
  done
  [ "$sid" = "$LAST_PID" ] || { echo "$name (pid $LAST_PID) did not get a session of its own" >&2; exit 1; }
  printf '%s\t%s\t%s\n' "$name" "$LAST_PID" "$(cat "/proc/$LAST_PID/autogroup" 2>/dev/null || echo -)" \
    >>"$OUT/sessions.tsv"
}

forget() {  # PID: no longer stopped by the exit trap
  local keep=() p
  for p in "${STARTED[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  STARTED=("${keep[@]}")
}

# stop PID: TERM, wait up to 5s, then KILL; forgotten by the exit trap.
stop() {
  local pid=$1
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  forget "$pid"
}

# load FILE SECS CMD...: runs a load generator in a session of its own,
# output to FILE, and waits for it. timeout (whose PID the exit trap stops;
# it passes the signal on) bounds it; setsid, a child of timeout, which
# leads its own process group, does not fork.
load() {
  local f=$1 secs=$2 pid; shift 2
  timeout "$secs" setsid "$@" >"$f" 2>&1 &
  pid=$!
  STARTED+=("$pid")
  wait "$pid" || true
  forget "$pid"
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

# Sum of user+system CPU ticks of the given PIDs (all their threads, the
# ended ones included).
cpu_ticks() {
  local pid total=0 line f
  for pid in ${1//,/ }; do
    { read -r line <"/proc/$pid/stat"; } 2>/dev/null || continue
    read -ra f <<<"${line##*) }"
    total=$((total + f[11] + f[12]))
  done
  echo "$total"
}

# Busy CPU ticks of the whole machine (every core: user, nice, system,
# irq, softirq, steal; not idle nor iowait), from /proc/stat's first line.
# On loopback the kernel's share of a relay (softirq, kworkers) runs on
# whichever thread sent the packet and is charged to no proxy's
# /proc/PID/stat: this counts it wherever it ran.
machine_ticks() {
  local _ user nice system idle iowait irq softirq steal
  read -r _ user nice system idle iowait irq softirq steal _ </proc/stat
  echo $((user + nice + system + irq + softirq + steal))
}

# sched_snap PIDS: one line per live thread of the PIDs, "tid run_ns
# wait_ns" from /proc/PID/task/TID/schedstat (time on the CPU, time waiting
# in the run queue), then a line "-". A thread may end while it is read: it
# is left out.
sched_snap() {
  local pid t r w _
  for pid in ${1//,/ }; do
    for t in /proc/"$pid"/task/*; do
      { read -r r w _ <"$t/schedstat"; } 2>/dev/null && echo "${t##*/} $r $w"
    done
  done
  echo -
}

# sched_watch PIDS FILE: a sched_snap every quarter second, appended to
# FILE, until killed. A thread that ends during a workload (the naive
# relay's, at the end of each connection) leaves its last sample behind.
sched_watch() {
  while :; do sched_snap "$1"; sleep 0.25; done >>"$2"
}

# sched_delta BEFORE SAMPLES: "run_ns wait_ns peak_threads": what each
# thread gained from BEFORE to its last sample (a thread born meanwhile
# counts from zero), summed, and the most threads in one sample. Threads
# that lived between two samples are missing; the report compares run_ns
# with the CPU ticks, which do count them, and marks the wait as a lower
# bound when too much is missing.
sched_delta() {
  awk 'FILENAME == ARGV[1] {if ($1 != "-") {r[$1] = $2; w[$1] = $3}; next}
       $1 == "-" {if (n > peak) peak = n; n = 0; next}
       {n++; lr[$1] = $2; lw[$1] = $3}
       END {
         for (t in lr) {
           dr = lr[t] - r[t]; dw = lw[t] - w[t]
           if (dr < 0 || dw < 0) {dr = lr[t]; dw = lw[t]}  # a reused thread id
           R += dr; W += dw
         }
         printf "%.0f %.0f %d\n", R, W, peak
       }' "$1" "$2"
}

# Sum of a /proc/PID/status field (kB or count) over the given PIDs.
status_sum() {
  local pid total=0 k v _
  for pid in ${1//,/ }; do
    while read -r k v _; do
      [ "$k" = "$2:" ] && total=$((total + v))
    done <"/proc/$pid/status"
  done
  echo "$total"
}

# ---------------------------------------------------------------- workloads
# Each load_* runs its load generator against PORT, its output to FILE
# (ab also writes every request's times to FILE.times); parse.py reads them.

load_short() {  # FILE PORT
  load "$1" 120 ab -q -n "$SHORT_N" -c 100 -r -g "$1.times" "http://127.0.0.1:$2/small.html"
}

load_keepalive() {
  load "$1" $((WRK_SECS + 30)) wrk -t2 -c100 -d"${WRK_SECS}s" --latency \
    -s "$ROOT/scripts/bench/latency.lua" "http://127.0.0.1:$2/small.html"
}

load_bulk() {
  load "$1" 120 ab -q -n "$BULK_N" -c 10 -r -g "$1.times" "http://127.0.0.1:$2/1m.bin"
}

load_iperf() {
  load "$1" $((IPERF_SECS + 20)) iperf3 -c 127.0.0.1 -p "$2" -t "$IPERF_SECS" -J
}

load_redis() {
  # The full output, not --csv: only it has the 99.9th percentile.
  load "$1" 120 redis-benchmark -h 127.0.0.1 -p "$2" -n "$REDIS_N" -c 50 -t set,get
}

expected() {  # workload: requests asked of the load generator (ab, redis)
  case $1 in
    short) echo "$SHORT_N" ;;
    bulk) echo "$BULK_N" ;;
    redis) echo "$REDIS_N" ;;
    *) echo 0 ;;
  esac
}

kind_of() {  # workload: which backends it reaches
  case $1 in
    redis|iperf) echo "$1" ;;
    *) echo http ;;
  esac
}

port_for() {  # workload proxy
  case $(kind_of "$1") in
    redis) echo "${REDIS_PORT[$2]}" ;;
    iperf) echo "${IPERF_PORT[$2]}" ;;
    *) echo "${HTTP_PORT[$2]}" ;;
  esac
}

# PIDs measured for a workload (empty for direct). rodizio and the naive
# relay run one instance per kind of backend, HAProxy and nginx one for all.
pids_for() {  # workload proxy
  echo "${PIDS[$2/$(kind_of "$1")]:-${PIDS[$2]:-}}"
}

# measure ROUND WORKLOAD PROXY: runs the workload through the proxy and
# appends what the proxy's processes show to $OUT/pending.tsv; flush reads
# the load generators' outputs.
measure() {
  local round=$1 wl=$2 proxy=$3 port pids f before=0 after=0 hwm=0 sched="0 0 0" watch
  local machine_before machine_after
  port=$(port_for "$wl" "$proxy")
  pids=$(pids_for "$wl" "$proxy")
  f=$OUT/logs/$wl-$proxy-r$round
  if [ -n "$pids" ]; then
    before=$(cpu_ticks "$pids")
    sched_snap "$pids" >"$f.sched0"
    : >"$f.sched"
    sched_watch "$pids" "$f.sched" &
    watch=$!
    STARTED+=("$watch")
  fi
  machine_before=$(machine_ticks)
  "load_$wl" "$f.txt" "$port"
  machine_after=$(machine_ticks)
  if [ -n "$pids" ]; then
    kill "$watch" 2>/dev/null || true
    wait "$watch" 2>/dev/null || true
    forget "$watch"
    sched_snap "$pids" >>"$f.sched"
    after=$(cpu_ticks "$pids")
    sched=$(sched_delta "$f.sched0" "$f.sched")
    hwm=$(status_sum "$pids" VmHWM)
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$wl" "$proxy" "$f.txt" "$(expected "$wl")" \
    "$((after - before))" "$(echo "$sched" | tr ' ' '\t')" "$hwm" \
    "$((machine_after - machine_before))" >>"$OUT/pending.tsv"
}

# flush: reads the load generators' outputs of the measures pending (one
# python3 start for several of them), appends the rows to raw.tsv and
# prints them.
flush() {
  python3 "$ROOT/scripts/bench/parse.py" --rows "$OUT/pending.tsv" | tee -a "$OUT/raw.tsv" |
    awk -F'\t' '{printf "   r%-2s %-9s %-14s %10s  p50/p99/p99.9 ms %s / %s / %s  errors %s\n",
                 $1, $2, $3, $4, $5, $6, $7, $8}'
  : >"$OUT/pending.tsv"
}

# ---------------------------------------------------------------- main
T0=$(date +%s)
install_missing
STREAM_MODULE=$(stream_module) || { echo "nginx stream module not found" >&2; exit 1; }

# RODIZIO_BIN measures another build (an older commit's, for a before and
# after) with this same harness.
if [ -n "${RODIZIO_BIN:-}" ]; then
  RODIZIO=$RODIZIO_BIN
else
  log "building rodizio (release)"
  cargo build --release --quiet
  RODIZIO=$ROOT/target/release/rodizio
fi
# Started as root, rodizio serves as root only when told to (a build that
# predates the flag has no such check).
if [ "$(id -u)" -eq 0 ] && "$RODIZIO" --help 2>/dev/null | grep -q -- --allow-root; then
  RODIZIO_EXTRA+=(--allow-root)
fi

rm -rf "$OUT"
mkdir -p "$OUT/logs" "$OUT/backend/www" "$OUT/backend/tmp" "$OUT/stream"
log "building the naive relay"
NAIVE=$OUT/naive-relay
gcc -O2 -pthread -o "$NAIVE" "$ROOT/scripts/bench/naive-relay.c"
chmod 755 "$OUT" "$OUT/backend" "$OUT/backend/www"
# Up to 1000 idle connections through each proxy, two sockets each.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

for p in $B1 $B2 $B3 $REDIS $IPERF 181{01..07} 182{01..06} 183{01..04} 184{01..03} 184{12,13,22,23}; do
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

log "starting backends (each in a session of its own)"
printf 'name\tpid\tautogroup\n' >"$OUT/sessions.tsv"
subst nginx-backend.conf.in "$OUT/backend/nginx.conf" "$OUT/backend" 0 0 0
start nginx-backend nginx -p "$OUT/backend" -c "$OUT/backend/nginx.conf" -e "$OUT/backend/error.log"
start redis redis-server --bind 127.0.0.1 --port "$REDIS" --save '' --appendonly no \
  --protected-mode no --dir "$OUT" --daemonize no
start iperf3 iperf3 -s -B 127.0.0.1 -p "$IPERF"
for p in $B1 $B2 $B3 $REDIS $IPERF; do wait_listen "$p"; done
info "nginx on $B1 $B2 $B3, redis on $REDIS, iperf3 on $IPERF"

log "starting proxies (each in a session of its own)"
export RUST_LOG=warn
start rodizio-http "$RODIZIO" "${RODIZIO_EXTRA[@]}" -l "127.0.0.1:${HTTP_PORT[rodizio]}" \
  -b "127.0.0.1:$B1" -b "127.0.0.1:$B2" -b "127.0.0.1:$B3" --idle-timeout 120s
PIDS[rodizio/http]=$LAST_PID
start rodizio-redis "$RODIZIO" "${RODIZIO_EXTRA[@]}" -l "127.0.0.1:${REDIS_PORT[rodizio]}" -b "127.0.0.1:$REDIS" --idle-timeout 120s
PIDS[rodizio/redis]=$LAST_PID
start rodizio-iperf "$RODIZIO" "${RODIZIO_EXTRA[@]}" -l "127.0.0.1:${IPERF_PORT[rodizio]}" -b "127.0.0.1:$IPERF" --idle-timeout 120s
PIDS[rodizio/iperf]=$LAST_PID
start rodizio-splice-http "$RODIZIO" "${RODIZIO_EXTRA[@]}" --splice -l "127.0.0.1:${HTTP_PORT[rodizio-splice]}" \
  -b "127.0.0.1:$B1" -b "127.0.0.1:$B2" -b "127.0.0.1:$B3" --idle-timeout 120s
PIDS[rodizio-splice/http]=$LAST_PID
start rodizio-splice-iperf "$RODIZIO" "${RODIZIO_EXTRA[@]}" --splice -l "127.0.0.1:${IPERF_PORT[rodizio-splice]}" \
  -b "127.0.0.1:$IPERF" --idle-timeout 120s
PIDS[rodizio-splice/iperf]=$LAST_PID
# Their one line at start (the program loaded or not) is an info line.
RELAY_LOG=warn,rodizio::proxy::kernel_relay::bpf=info
start rodizio-relay-http env RUST_LOG=$RELAY_LOG "$RODIZIO" "${RODIZIO_EXTRA[@]}" --kernel-relay=auto \
  --admin "127.0.0.1:${RELAY_ADMIN[http]}" -l "127.0.0.1:${HTTP_PORT[rodizio-relay]}" \
  -b "127.0.0.1:$B1" -b "127.0.0.1:$B2" -b "127.0.0.1:$B3" --idle-timeout 120s
PIDS[rodizio-relay/http]=$LAST_PID
start rodizio-relay-redis env RUST_LOG=$RELAY_LOG "$RODIZIO" "${RODIZIO_EXTRA[@]}" --kernel-relay=auto \
  --admin "127.0.0.1:${RELAY_ADMIN[redis]}" -l "127.0.0.1:${REDIS_PORT[rodizio-relay]}" \
  -b "127.0.0.1:$REDIS" --idle-timeout 120s
PIDS[rodizio-relay/redis]=$LAST_PID
start naive-http "$NAIVE" "${HTTP_PORT[naive]}" "$B1" "$B2" "$B3"
PIDS[naive/http]=$LAST_PID
start naive-redis "$NAIVE" "${REDIS_PORT[naive]}" "$REDIS"
PIDS[naive/redis]=$LAST_PID

subst haproxy.cfg.in "$OUT/haproxy.cfg" "$OUT" "${HTTP_PORT[haproxy]}" "${REDIS_PORT[haproxy]}" "${IPERF_PORT[haproxy]}"
start haproxy haproxy -f "$OUT/haproxy.cfg" -db
PIDS[haproxy]=$LAST_PID

subst nginx-stream.conf.in "$OUT/stream/nginx.conf" "$OUT/stream" "${HTTP_PORT[nginx]}" "${REDIS_PORT[nginx]}" "${IPERF_PORT[nginx]}"
start nginx-stream nginx -p "$OUT/stream" -c "$OUT/stream/nginx.conf" -e "$OUT/stream/error.log"
PIDS[nginx]=$(nginx_pids "$LAST_PID")
for p in 181{01..07} 182{01..06} 183{01..04}; do wait_listen "$p"; done
info "rodizio pids ${PIDS[rodizio/http]} (http) ${PIDS[rodizio/redis]} (redis) ${PIDS[rodizio/iperf]} (iperf3), --splice ${PIDS[rodizio-splice/http]} ${PIDS[rodizio-splice/iperf]}"
info "--kernel-relay=auto ${PIDS[rodizio-relay/http]} (http) ${PIDS[rodizio-relay/redis]} (redis)"
info "naive relay pids ${PIDS[naive/http]} (http) ${PIDS[naive/redis]} (redis)"
info "haproxy pid ${PIDS[haproxy]}, nginx pids ${PIDS[nginx]}"
info "scheduling groups: $(awk -F'\t' 'NR > 1 {print $3}' "$OUT/sessions.tsv" | sort -u | wc -l) for $(($(wc -l <"$OUT/sessions.tsv") - 1)) processes (kernel.sched_autogroup_enabled=$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo -))"

# Sanity: each proxy serves the small file.
for proxy in rodizio rodizio-splice rodizio-relay naive haproxy nginx direct; do
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
  load "$OUT/logs/idle-$proxy.txt" 120 python3 "$ROOT/scripts/bench/idle_conns.py" \
    --port "${IDLE_PORT[$proxy]}" --count "$IDLE_N" --pids "${IDLE_PIDS[$proxy]}" \
    --backend-ports "$B1,$B2,$B3"
  res=$(tail -n 1 "$OUT/logs/idle-$proxy.txt")
  [[ $res =~ ^[0-9]+\ [0-9]+\ [-0-9.]+\ [0-9]+$ ]] || res="0 0 nan 0"
  printf '%s\t%s\n' "$proxy" "$(echo "$res" | tr ' ' '\t')" >>"$OUT/idle.tsv"
  read -r before after per thr <<<"$res"
  info "$(printf '%-8s RSS %s KiB -> %s KiB: %s KiB per connection (%s threads)' "$proxy" "$before" "$after" "$per" "$thr")"
  stop "${IDLE_PIDS[$proxy]%%,*}"
done

# ---- warm-up (not recorded)
log "warm-up"
for proxy in "${RELAY_PROXIES[@]}"; do
  load "$OUT/logs/warmup-$proxy.txt" 60 ab -q -n 2000 -c 50 "http://127.0.0.1:${HTTP_PORT[$proxy]}/small.html"
done

# ---- the rounds
log "$ROUNDS rounds: ${WORKLOADS[*]} x ${RELAY_PROXIES[*]} rodizio-splice"
printf 'round\tworkload\tproxy\tthroughput\tp50_ms\tp99_ms\tp999_ms\terrors\tunits\tcpu_ticks\trun_ns\twait_ns\tthreads\thwm_kib\tmachine_ticks\n' >"$OUT/raw.tsv"
: >"$OUT/pending.tsv"
for round in $(seq "$ROUNDS"); do
  for wl in "${WORKLOADS[@]}"; do
    for proxy in $(proxies_for "$wl"); do
      measure "$round" "$wl" "$proxy"
    done
    flush
  done
done

# ---- report
log "report"
# What the kernel relay did: whether its program loaded (its one line at
# start) and how many connections it took, from each instance's counters.
relay_said() {  # kind
  local metrics promoted fell
  metrics=$(timeout 10 curl -s "http://127.0.0.1:${RELAY_ADMIN[$1]}/metrics" || true)
  promoted=$(awk '/^rodizio_kernel_relayed_total[ {]/ {n += $NF} END {print n + 0}' <<<"$metrics")
  fell=$(awk '/^rodizio_kernel_relay_fallbacks_total[ {]/ {n += $NF} END {print n + 0}' <<<"$metrics")
  echo "$promoted promoted, $fell fell back"
}
RELAY_LINE=$(grep -ho 'kernel relay (auto): [^;]*' "$OUT/rodizio-relay-http.log" 2>/dev/null | head -1 || true)
mkdir -p "$DOCS"
{
  echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "nproc=$(nproc)"
  echo "cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
  echo "kernel=$(uname -r)"
  echo "clk_tck=$(getconf CLK_TCK)"
  echo "autogroup=$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo -)"
  echo "gcc=$(gcc -dumpfullversion 2>/dev/null || gcc -dumpversion)"
  echo "rodizio=$("$RODIZIO" --version)"
  echo "haproxy=$(haproxy -v | head -1 | awk '{print $3}')"
  echo "nginx=$(nginx -v 2>&1 | sed 's|.*nginx/||')"
  echo "redis_version=$(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/')"
  echo "iperf3=$(iperf3 --version | head -1 | awk '{print $2}')"
  echo "wrk=$(wrk -v 2>&1 | head -1 | awk '{print $2}')"
  echo "ab=$(ab -V | head -1 | awk '{print $4, $5}')"
  echo "rounds=$ROUNDS"
  echo "relay=${RELAY_LINE:-kernel relay (auto): said nothing}; HTTP $(relay_said http), redis $(relay_said redis)"
  echo "command=${RODIZIO_FLAGS:+RODIZIO_FLAGS='$RODIZIO_FLAGS' }scripts/bench.sh $([ "$QUICK" -eq 1 ] && echo --quick)"
  echo "short=ab -n $SHORT_N -c 100 (612-byte file, a new connection per request)"
  echo "keepalive=wrk -t2 -c100 -d${WRK_SECS}s --latency -s latency.lua (612-byte file, keep-alive)"
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
