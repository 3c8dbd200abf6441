# Shared by the test scripts (source it after `cd` to the project root, with
# PROG set to the script's name): a failure line, a work directory whose
# processes are stopped by PID on exit, free loopback ports, a bounded wait
# for a line in a log, and the binary to test.

# fail MESSAGE: one line on standard error, exit 1.
fail() {
  echo "$PROG: FAIL: $*" >&2
  exit 1
}

# need_tools TOOL...: fails naming the first one missing.
need_tools() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 ||
      fail "'$tool' is missing (scripts/install-test-tools.sh installs it)"
  done
}

# $work: a temporary directory; append every PID started to $pids: both are
# cleaned up on exit (each process stopped by its PID, then waited for).
work=$(mktemp -d)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# free_ports N: N free TCP ports on 127.0.0.1, on one line.
free_ports() {
  python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
for s in socks:
    s.close()
' "$1"
}

# wait_line FILE LINE PID: waits (at most 10 s) for LINE in FILE while PID
# lives; fails with the file's content otherwise.
wait_line() {
  local file=$1 line=$2 pid=$3
  for _ in $(seq 1 100); do
    grep -q "$line" "$file" && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$file" >&2
  fail "no '$line' within 10s"
}

# root_flag: what a balancer started as root needs to go on serving as root
# (rodizio refuses it without --user or --allow-root); CI runs as root.
root_flag=()
if [ "$(id -u)" -eq 0 ]; then
  root_flag=(--allow-root)
fi

# debug_bin: sets $bin to RODIZIO_BIN, or builds and takes the debug binary.
debug_bin() {
  if [ -n "${RODIZIO_BIN:-}" ]; then
    bin=$RODIZIO_BIN
  else
    echo "== cargo build"
    timeout 600 cargo build --quiet
    bin="${CARGO_TARGET_DIR:-target}/debug/rodizio"
  fi
  [ -x "$bin" ] || fail "no binary at $bin"
}
