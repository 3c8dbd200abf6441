#!/usr/bin/env bash
# TLS termination: rodizio (--tls-cert) beside HAProxy (mode tcp, `bind ...
# ssl crt`) and nginx's stream module (`listen ... ssl`, ssl_certificate),
# the same certificate for all three (ECDSA P-256, or RSA-2048 with
# KEY=rsa), in one run on loopback,
# each proxy in front of one nginx serving a 1 MiB file:
#
#   handshakes/s     openssl s_time -new for SECS seconds (a full handshake
#                    per connection, TLS 1.3)
#   CPU/handshake    the proxy's user+system time over that run, divided
#                    by the handshakes
#   bulk MB/s        curl fetching the 1 MiB file BULK_N times over one
#                    connection
#   RSS/connection   IDLE_N idle TLS connections held open (python3's ssl):
#                    the proxy's resident memory growth, divided by IDLE_N
#
#   scripts/bench-tls.sh            SECS=10 BULK_N=200 IDLE_N=500 KEY=ec
#   KEY=rsa scripts/bench-tls.sh    the site's key RSA-2048 (the CA stays P-256)
#   scripts/bench-tls.sh --quick    a smoke run (tiny counts)
#   RODIZIO_BIN=path scripts/bench-tls.sh   another build
#
# Results go to bench-out/tls.txt. Never part of `make test`: a shared
# machine gives noisy numbers.
set -euo pipefail
[ -n "${BENCH_DEBUG:-}" ] && set -x
cd "$(dirname "$0")/.."
PROG=bench-tls
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
need_tools openssl curl python3 haproxy nginx

SECS=${SECS:-10}
BULK_N=${BULK_N:-200}
IDLE_N=${IDLE_N:-500}
KEY=${KEY:-ec}
if [ "${1:-}" = "--quick" ]; then
  SECS=1 BULK_N=5 IDLE_N=20
fi
if [ -n "${RODIZIO_BIN:-}" ]; then
  bin=$RODIZIO_BIN
else
  echo "== cargo build --release"
  cargo build --release --quiet
  bin=target/release/rodizio
fi
stream_module=""
for f in /usr/lib/nginx/modules/ngx_stream_module.so /usr/share/nginx/modules/ngx_stream_module.so; do
  [ -f "$f" ] && stream_module=$f
done
[ -n "$stream_module" ] || fail "nginx's stream module is missing (libnginx-mod-stream)"

# ------------------------------------------------------------ certificate
ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$work/ca.key" -out "$work/ca.pem" -days 2 \
  -subj "/CN=bench CA" 2>/dev/null
case $KEY in
  ec) site=("${ec[@]}") ;;
  rsa) site=(-newkey rsa:2048 -nodes) ;;
  *) fail "KEY is ec or rsa, not '$KEY'" ;;
esac
openssl req "${site[@]}" -keyout "$work/site.key" -out "$work/site.csr" -subj "/CN=localhost" 2>/dev/null
echo "subjectAltName=DNS:localhost" >"$work/site.ext"
openssl x509 -req -in "$work/site.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
  -set_serial 1 -days 2 -extfile "$work/site.ext" -out "$work/site.pem" 2>/dev/null
cat "$work/site.pem" "$work/site.key" >"$work/site.haproxy.pem"

# ------------------------------------------------------------ processes
read -r back p_rodizio p_haproxy p_nginx <<<"$(free_ports 4)"
user=$(id -un)
mkdir -p "$work/back/www" "$work/back/tmp" "$work/stream/tmp"
head -c 1048576 /dev/urandom >"$work/back/www/big.bin"
cat >"$work/back/nginx.conf" <<EOF
user $user;
worker_processes 1;
daemon off;
pid $work/back/nginx.pid;
error_log $work/back/error.log warn;
events { worker_connections 4096; }
http {
    access_log off; sendfile on; keepalive_requests 1000000;
    client_body_temp_path $work/back/tmp; proxy_temp_path $work/back/tmp;
    fastcgi_temp_path $work/back/tmp; uwsgi_temp_path $work/back/tmp; scgi_temp_path $work/back/tmp;
    server { listen 127.0.0.1:$back; root $work/back/www; }
}
EOF
cat >"$work/stream/nginx.conf" <<EOF
load_module $stream_module;
user $user;
worker_processes 2;
daemon off;
pid $work/stream/nginx.pid;
error_log $work/stream/error.log warn;
events { worker_connections 8192; }
stream {
    server {
        listen 127.0.0.1:$p_nginx ssl;
        ssl_certificate $work/site.pem;
        ssl_certificate_key $work/site.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        proxy_pass 127.0.0.1:$back;
    }
}
EOF
cat >"$work/haproxy.cfg" <<EOF
global
    nbthread 2
    maxconn 8192
defaults
    mode tcp
    timeout connect 3s
    timeout client 120s
    timeout server 120s
frontend tls_in
    bind 127.0.0.1:$p_haproxy ssl crt $work/site.haproxy.pem
    default_backend back
backend back
    server b1 127.0.0.1:$back
EOF

declare -A pid
start() { # NAME PORT COMMAND...: started, its PID kept, listening
  local name=$1 port=$2
  shift 2
  setsid "$@" >"$work/$name.log" 2>&1 &
  pid[$name]=$!
  pids+=("$!")
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    kill -0 "${pid[$name]}" 2>/dev/null || break
    sleep 0.1
  done
  cat "$work/$name.log" >&2
  fail "$name is not listening on $port"
}
start backend "$back" nginx -p "$work/back" -c "$work/back/nginx.conf" -e "$work/back/error.log"
start rodizio "$p_rodizio" "$bin" "${root_flag[@]}" -l "127.0.0.1:$p_rodizio" \
  -b "127.0.0.1:$back" --health-check off --tls-cert "$work/site.pem,$work/site.key"
start haproxy "$p_haproxy" haproxy -f "$work/haproxy.cfg" -db
start nginx "$p_nginx" nginx -p "$work/stream" -c "$work/stream/nginx.conf" -e "$work/stream/error.log"

# ------------------------------------------------------------ measures
cpu_ticks() { # PID...: user+system ticks of these processes and their children's threads
  local p total=0
  for p in "$@"; do
    for t in /proc/"$p"/task/*/stat; do
      total=$((total + $(awk '{print $14 + $15}' "$t" 2>/dev/null || echo 0)))
    done
  done
  echo "$total"
}
procs_of() { # NAME: the proxy's PID and its children's (nginx's workers)
  echo "${pid[$1]}" $(pgrep -P "${pid[$1]}" || true)
}
rss_kib() { # PID...: their resident memory in KiB
  local p total=0
  for p in "$@"; do
    total=$((total + $(awk '/^VmRSS/ {print $2}' /proc/"$p"/status)))
  done
  echo "$total"
}
hz=$(getconf CLK_TCK)
out=bench-out/tls.txt
mkdir -p bench-out
{
  echo "# TLS termination, $(date -u +%Y-%m-%dT%H:%MZ), KEY=$KEY SECS=$SECS BULK_N=$BULK_N IDLE_N=$IDLE_N"
  printf '%-8s %12s %14s %10s %12s\n' proxy handshakes/s cpu_us/hs bulk_MB/s rss_KiB/conn
} | tee "$out"
for name in rodizio haproxy nginx; do
  port_var=p_$name
  port=${!port_var}
  read -ra procs <<<"$(procs_of "$name")"
  before=$(cpu_ticks "${procs[@]}")
  hs_out=$(openssl s_time -connect "127.0.0.1:$port" -new -time "$SECS" -CAfile "$work/ca.pem" 2>&1 || true)
  after=$(cpu_ticks "${procs[@]}")
  conns=$(echo "$hs_out" | awk '/connections in .* real seconds/ {print $1; exit}')
  conns=${conns:-0}
  hs_per_s=$(awk -v c="$conns" -v s="$SECS" 'BEGIN {printf "%.0f", c / s}')
  cpu_us=$(awk -v t=$((after - before)) -v hz="$hz" -v c="$conns" \
    'BEGIN {if (c > 0) printf "%.0f", t / hz * 1e6 / c; else print "-"}')
  urls=()
  for _ in $(seq 1 "$BULK_N"); do urls+=(-o /dev/null "https://localhost:$port/big.bin"); done
  bulk=$(curl -s --cacert "$work/ca.pem" -w '%{size_download} %{time_total}\n' "${urls[@]}" |
    awk '{b += $1; t += $2} END {if (t > 0) printf "%.0f", b / t / 1e6; else print "-"}')
  read -ra procs <<<"$(procs_of "$name")"
  rss_before=$(rss_kib "${procs[@]}")
  python3 - "$port" "$IDLE_N" "$work/ca.pem" "$work/idle.ready" <<'PY' &
import socket, ssl, sys, time
port, n, ca, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
ctx = ssl.create_default_context(cafile=ca)
held = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    held.append(ctx.wrap_socket(s, server_hostname="localhost"))
open(ready, "w").close()
time.sleep(30)
PY
  idle=$!
  pids+=("$idle")
  for _ in $(seq 1 300); do [ -e "$work/idle.ready" ] && break; sleep 0.1; done
  sleep 1 # the proxies' threads settle after the last handshake
  read -ra procs <<<"$(procs_of "$name")"
  rss_after=$(rss_kib "${procs[@]}")
  kill "$idle" 2>/dev/null || true
  wait "$idle" 2>/dev/null || true
  rm -f "$work/idle.ready"
  rss_conn=$(awk -v d=$((rss_after - rss_before)) -v n="$IDLE_N" 'BEGIN {printf "%.1f", d / n}')
  printf '%-8s %12s %14s %10s %12s\n' "$name" "$hs_per_s" "$cpu_us" "$bulk" "$rss_conn" | tee -a "$out"
done
