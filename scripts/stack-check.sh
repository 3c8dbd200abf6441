#!/usr/bin/env bash
# Memory per idle connection, the part rodizio controls: each worker
# thread's stack. Through the release binary (the only build whose frames
# mean anything here), CONNECTIONS clients each send one byte and stay
# open; once the backend has every byte (so every worker has connected and
# pumped), each worker's stack mapping in /proc/PID/smaps must have at most
# 8 KiB resident: two pages, the first of which glibc's thread descriptor
# and static TLS mostly fill. A third page costs 4 KiB more per connection
# (docs/internals.md, "The pool", tells how to find what went deeper).
#
# Ports are free ones picked at run time; everything it starts is stopped
# by its PID on exit; every wait is bounded.
#
# Environment: RODIZIO_BIN to test a given binary (default: `cargo build
# --release` then the release binary); CONNECTIONS (default 50); SNI=1 to
# route by SNI (`--server-names a.test`), each client sending a TLS
# ClientHello for a.test instead of its one byte; those are allowed 12 KiB
# (one page more: the peek and the choice run on the worker before the
# pump, docs/tls.md).
set -euo pipefail
cd "$(dirname "$0")/.."

CONNECTIONS=${CONNECTIONS:-50}
SNI=${SNI:-0}
sni_flags=()
[ "$SNI" = 1 ] && sni_flags=(--server-names a.test)

PROG=stack-check
. scripts/lib.sh
need_tools python3 timeout

if [ -n "${RODIZIO_BIN:-}" ]; then
  bin=$RODIZIO_BIN
else
  echo "== cargo build --release"
  timeout 1200 cargo build --release --quiet
  bin="${CARGO_TARGET_DIR:-target}/release/rodizio"
fi
[ -x "$bin" ] || fail "no binary at $bin"

read -r backend_port lb_port < <(free_ports 2)

# The backend: accepts every connection, keeps it open, and writes the
# count of bytes received so far to a file. It exits after two minutes.
echo "== a backend on port $backend_port that holds its connections"
python3 - "$backend_port" "$work/received" <<'EOF' &
import os, selectors, socket, sys, time
port, path = int(sys.argv[1]), sys.argv[2]
server = socket.create_server(("127.0.0.1", port))
server.setblocking(False)
sel = selectors.DefaultSelector()
sel.register(server, selectors.EVENT_READ)
held, received = [], 0
end = time.monotonic() + 120
while time.monotonic() < end:
    for key, _ in sel.select(timeout=1):
        if key.fileobj is server:
            conn, _ = server.accept()
            conn.setblocking(False)
            sel.register(conn, selectors.EVENT_READ)
            held.append(conn)
            continue
        try:
            data = key.fileobj.recv(4096)
        except BlockingIOError:
            continue
        if not data:
            sel.unregister(key.fileobj)
            continue
        received += len(data)
        with open(path + ".tmp", "w") as f:
            f.write(str(received))
        os.replace(path + ".tmp", path)
EOF
pids+=("$!")
backend_pid=$!
# The backend listens before rodizio starts: a client refused by a backend
# not yet up would count against it, and three would mark it down.
for _ in $(seq 1 100); do
  python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=1).close()" \
    "$backend_port" 2>/dev/null && break
  kill -0 "$backend_pid" 2>/dev/null || fail "the backend exited"
  sleep 0.1
done

echo "== rodizio ($bin) on port $lb_port, default settings (64 KiB worker stacks)"
RUST_LOG=${RUST_LOG:-warn} "$bin" "${root_flag[@]}" -l "127.0.0.1:$lb_port" -b "127.0.0.1:$backend_port" --thread-stack 64k "${sni_flags[@]}" \
  >"$work/rodizio.out" 2>&1 &
pids+=("$!")
rodizio_pid=$!
wait_line "$work/rodizio.out" "Load balancer listening on port $lb_port" "$rodizio_pid"

echo "== $CONNECTIONS idle connections, one byte (SNI=1: a ClientHello) sent on each"
python3 - "$lb_port" "$CONNECTIONS" "$work/received" "$rodizio_pid" "$SNI" <<'EOF' || fail "see above"
import os, socket, sys, time
port, count, received, pid = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])

def client_hello(name):
    """A minimal TLS ClientHello asking for `name` (src/sni/client_hello.rs's build)."""
    n2 = lambda n: n.to_bytes(2, "big")
    entry = b"\x00" + n2(len(name)) + name
    body = n2(len(entry)) + entry
    exts = b"\x00\x00" + n2(len(body)) + body
    hello = b"\x03\x03" + b"\x5a" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00" + n2(len(exts)) + exts
    handshake = b"\x01" + len(hello).to_bytes(3, "big") + hello
    return b"\x16\x03\x01" + n2(len(handshake)) + handshake

first = client_hello(b"a.test") if sys.argv[5] == "1" else b"G"

def stop(message):
    print(f"stack-check: FAIL: {message}", file=sys.stderr)
    sys.exit(1)

clients = []
for _ in range(count):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.settimeout(5)
    s.sendall(first)
    clients.append(s)

# Every byte at the backend: every worker has connected and pumped.
deadline = time.monotonic() + 30
got = 0
while time.monotonic() < deadline:
    try:
        got = int(open(received).read() or 0)
    except FileNotFoundError:
        got = 0
    if got >= count * len(first):
        break
    time.sleep(0.1)
else:
    stop(f"the backend received {got} of {count * len(first)} bytes within 30s")

# The balancer's worker threads, by their name.
worker_tasks = [
    task
    for task in os.listdir(f"/proc/{pid}/task")
    if open(f"/proc/{pid}/task/{task}/comm").read().strip() == "rodizio-worker"
]
workers = len(worker_tasks)

# A worker's stack: a read-write anonymous mapping of the thread stack size
# (64 KiB by default) right above its guard page (no access).
def worker_stacks():
    """The 64 KiB anonymous mappings just above a guard page, with their Rss."""
    stacks, previous, current = [], None, None
    for line in open(f"/proc/{pid}/smaps"):
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            current = {"start": start, "end": end, "perms": fields[1], "anon": len(fields) < 6}
            if (
                previous is not None
                and previous["perms"] == "---p"
                and previous["end"] == start
                and current["perms"] == "rw-p"
                and current["anon"]
                and end - start == 64 * 1024
            ):
                stacks.append(current)
            previous = current
        elif fields[0] == "Rss:" and current is not None:
            current["rss_kib"] = int(fields[1])
    return stacks

# An idle connection: the pump hands its buffers and the stack pages
# below it back after RELEASE_AFTER (0.5 s) of silence; wait for that, at
# most 5 s, then judge.
limit = 12 if sys.argv[5] == "1" else 8
settle = time.monotonic() + 5
while True:
    stacks = worker_stacks()
    if len(stacks) >= count and max(s.get("rss_kib", 0) for s in stacks) <= limit:
        break
    if time.monotonic() > settle:
        break
    time.sleep(0.1)
if len(stacks) < count or workers < count:
    stop(f"found {len(stacks)} worker stacks and {workers} workers for {count} connections")
resident = sorted(s["rss_kib"] for s in stacks)
print(f"worker stacks: {len(stacks)}, resident KiB from {resident[0]} to {resident[-1]}")

# Where each idle worker waits: its stack pointer (the second last field
# of /proc/PID/task/TID/syscall) in bytes below the top of its stack.
depths = []
for task in worker_tasks:
    try:
        sp = int(open(f"/proc/{pid}/task/{task}/syscall").read().split()[-2], 16)
    except (OSError, ValueError, IndexError):
        continue
    depths += [s["end"] - sp for s in stacks if s["start"] <= sp < s["end"]]
if depths:
    print(f"idle workers wait {min(depths)} to {max(depths)} bytes below the top of their stacks")
over = [r for r in resident if r > limit]
if over:
    stop(
        f"{len(over)} worker stacks have more than {limit} KiB resident (up to {resident[-1]} KiB): "
        "something on the path to the pump runs deeper than before "
        "(docs/internals.md, \"The pool\")"
    )
for s in clients:
    s.close()
EOF

echo "stack-check: OK ($CONNECTIONS idle connections, every worker stack at most $([ "$SNI" = 1 ] && echo 12 || echo 8) KiB resident)"
