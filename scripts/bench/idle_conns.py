#!/usr/bin/env python3
"""Memory per idle connection: open COUNT client connections through a
proxy, send one byte on each, hold them, and report how much the proxy's
resident set grew, per connection.

The proxy's processes are given by PID (nginx: the master and its workers;
their VmRSS is summed). "Held" means the proxy has connected each one on to
a backend: the script waits until the kernel lists COUNT more established
connections towards the backend ports, then until the RSS stops moving, and
only then reads it. Every wait has a deadline.

Prints one line: `before_kib after_kib kib_per_conn threads_after`.
"""

import argparse
import socket
import sys
import time


def proc_status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def rss_kib(pids):
    return sum(proc_status(p, "VmRSS") for p in pids)


def threads(pids):
    return sum(proc_status(p, "Threads") for p in pids)


def established_to(ports):
    """Established TCP sockets (IPv4) whose remote port is one of `ports`."""
    n = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            rem_port = int(parts[2].split(":")[1], 16)
            if parts[3] == "01" and rem_port in ports:
                n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--pids", required=True, help="comma-separated PIDs")
    ap.add_argument("--backend-ports", required=True, help="comma-separated")
    ap.add_argument("--deadline", type=float, default=30.0)
    ap.add_argument(
        "--hold",
        type=float,
        default=2.0,
        help="seconds to hold the connections idle before reading the RSS",
    )
    a = ap.parse_args()
    pids = [int(p) for p in a.pids.split(",") if p]
    ports = {int(p) for p in a.backend_ports.split(",") if p}

    base_conns = established_to(ports)
    before = rss_kib(pids)
    socks = []
    try:
        for _ in range(a.count):
            s = socket.create_connection(("127.0.0.1", a.port), timeout=5)
            s.settimeout(5)
            s.sendall(b"G")
            socks.append(s)
        deadline = time.monotonic() + a.deadline
        # Wait until the proxy has reached a backend for every client.
        while established_to(ports) < base_conns + a.count:
            if time.monotonic() > deadline:
                print(
                    f"only {established_to(ports) - base_conns} of {a.count} "
                    "reached a backend",
                    file=sys.stderr,
                )
                break
            time.sleep(0.1)
        # Hold them idle a while (a proxy may free buffers of connections
        # that went quiet), then wait until the resident set stops moving
        # (five equal readings).
        time.sleep(a.hold)
        last, same = -1, 0
        while same < 5 and time.monotonic() < deadline:
            now = rss_kib(pids)
            same = same + 1 if now == last else 0
            last = now
            time.sleep(0.1)
        after = rss_kib(pids)
        print(f"{before} {after} {(after - before) / a.count:.2f} {threads(pids)}")
    finally:
        for s in socks:
            s.close()


if __name__ == "__main__":
    main()
