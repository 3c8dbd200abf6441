#!/usr/bin/env python3
"""Backends and clients for scripts/compare-c.sh: the same six checks
against the article's C program and against rodizio.

  checks.py ports N            N distinct free ports on 127.0.0.1
  checks.py backends FILE      start the test backends, write "line PORT" and
                               "http PORT" to FILE, serve until killed
  checks.py wait-listen PORT SECONDS
                               wait until something listens on PORT (read
                               from /proc/net/tcp: no connection is made, so
                               the balancer's count of connections is untouched)
  checks.py check NAME PORT    run one check against the balancer on PORT;
                               prints "ok" or the first failure, exits 0 or 1

The backends:

- line: one command per line. `ONCE text` answers the line and closes;
  `SET k v` answers `+OK`, `GET k` answers `$v` (or `$-1`), `PING`
  answers `+PONG` (a Redis-like session); `BIG n` sends n bytes
  (byte i is i % 251) and closes. A connection quiet for 2 s gets back
  whatever partial line it sent, then a close: a cut request shows.
- http: HTTP/1.1 with keep-alive (python's http.server).

Every socket has a timeout and every loop a bound in count and in time.
"""

import http.server
import os
import socket
import struct
import sys
import threading
import time

QUIET = 2.0  # a backend gives up on a silent connection after this
REPLY = 4.0  # a client gives up waiting for one reply after this (> QUIET)
# Larger than what the kernel can hold in socket buffers between a backend
# and a client (a few MiB on loopback), so a transfer cut by a balancer that
# dies cannot arrive whole from those buffers.
BIG = 16 * 1024 * 1024
FIRST = 64 * 1024


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


CYCLE = bytes(range(251))


def pattern(start, n):
    """n bytes of the stream whose byte i is i % 251, from byte `start`."""
    first = start % 251
    return (CYCLE * (n // 251 + 2))[first : first + n]


# ---------------------------------------------------------------- backends


def serve_line(conn):
    conn.settimeout(QUIET)
    store = {}
    pending = b""
    try:
        while True:
            try:
                data = conn.recv(65536)
            except socket.timeout:
                if pending:
                    conn.sendall(pending)
                return
            if not data:
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                words = line.rstrip(b"\r").split()
                cmd = words[0] if words else b""
                if cmd == b"ONCE":
                    conn.sendall(line + b"\n")
                    return
                if cmd == b"BIG" and len(words) == 2:
                    total = int(words[1])
                    sent = 0
                    while sent < total:
                        n = min(65536, total - sent)
                        conn.sendall(pattern(sent, n))
                        sent += n
                    return
                if cmd == b"SET" and len(words) == 3:
                    store[words[1]] = words[2]
                    reply = b"+OK"
                elif cmd == b"GET" and len(words) == 2:
                    value = store.get(words[1])
                    reply = b"$-1" if value is None else b"$" + value
                elif cmd == b"PING":
                    reply = b"+PONG"
                else:
                    reply = b"-ERR unknown command"
                conn.sendall(reply + b"\r\n")
    except OSError:
        pass
    finally:
        conn.close()


def line_server(listener):
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve_line, args=(conn,), daemon=True).start()


class KeepAlive(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = QUIET

    def do_GET(self):
        body = b"hello\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def backends(path):
    line = socket.socket()
    line.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    line.bind(("127.0.0.1", 0))
    line.listen(4096)
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), KeepAlive)
    web.daemon_threads = True
    threading.Thread(target=line_server, args=(line,), daemon=True).start()
    threading.Thread(target=web.serve_forever, daemon=True).start()
    with open(path + ".tmp", "w") as f:
        f.write(f"line {line.getsockname()[1]}\nhttp {web.server_address[1]}\n")
    # Renamed when complete, so the reader never sees half of it.
    os.rename(path + ".tmp", path)
    while True:
        time.sleep(3600)


def wait_listen(port, seconds):
    want = f":{port:04X}"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table) as f:
                    next(f)
                    for row in f:
                        fields = row.split()
                        if fields[1].endswith(want) and fields[3] == "0A":
                            return 0
            except OSError:
                pass
        time.sleep(0.02)
    return 1


# ----------------------------------------------------------------- clients


class Fail(Exception):
    pass


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=REPLY)
    s.settimeout(REPLY)
    return s


def recv_all(s, limit=16 * 1024 * 1024):
    """Everything until the end of stream (or a reset, or REPLY seconds of
    silence, or `limit` bytes)."""
    out = b""
    while len(out) < limit:
        try:
            data = s.recv(65536)
        except socket.timeout:
            raise Fail(f"no end of stream after {len(out)} bytes within {REPLY:.0f} s")
        except ConnectionResetError:
            break
        if not data:
            break
        out += data
    return out


def once(port, text):
    s = connect(port)
    try:
        s.sendall(text)
        return recv_all(s)
    finally:
        s.close()


def check_binary(port):
    payload = bytes(b for b in range(256) if b != 10) * 4  # zeros, no newline
    msg = b"ONCE ab\x00" + payload + b"\n"
    back = once(port, msg)
    if back != msg:
        raise Fail(f"sent {len(msg)} bytes, {len(back)} came back")


def read_line(f, what):
    try:
        line = f.readline()
    except socket.timeout:
        raise Fail(f"{what}: no reply within {REPLY:.0f} s")
    except ConnectionResetError:
        raise Fail(f"{what}: connection reset")
    if not line:
        raise Fail(f"{what}: closed with no reply")
    return line


def check_keep_alive(port):
    s = connect(port)
    f = s.makefile("rb")
    try:
        for i in range(1, 21):
            what = f"request {i} on one connection"
            s.sendall(f"GET /{i} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
            status = read_line(f, what)
            if not status.startswith(b"HTTP/1.1 200"):
                raise Fail(f"{what}: {status!r}")
            length = None
            while True:
                header = read_line(f, what)
                if header == b"\r\n":
                    break
                name, _, value = header.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if length is None or f.read(length) != b"hello\n":
                raise Fail(f"{what}: wrong body")
    finally:
        f.close()
        s.close()


def check_redis(port):
    s = connect(port)
    f = s.makefile("rb")
    try:
        turn = 0
        for i in range(50):
            for cmd, want in (
                (f"SET key{i} value{i}", "+OK"),
                (f"GET key{i}", f"$value{i}"),
                ("PING", "+PONG"),
            ):
                turn += 1
                s.sendall(cmd.encode() + b"\r\n")
                got = read_line(f, f"round trip {turn}").rstrip(b"\r\n").decode()
                if got != want:
                    raise Fail(f"round trip {turn}: {got!r}, not {want!r}")
    finally:
        f.close()
        s.close()


def check_refused(port):
    for i in range(1, 7):
        msg = f"ONCE client {i}\n".encode()
        try:
            back = once(port, msg)
        except OSError as e:
            raise Fail(f"client {i}: {e}")
        if back != msg:
            raise Fail(f"client {i}: closed with {len(back)} of {len(msg)} bytes")


def check_4096(port):
    started = time.monotonic()
    for i in range(1, 4098):
        if time.monotonic() - started > 120:
            raise Fail(f"only {i - 1} connections in 120 s")
        msg = f"ONCE {i}\n".encode()
        try:
            back = once(port, msg)
        except (OSError, Fail) as e:
            raise Fail(f"connection {i}: {e}")
        if back != msg:
            raise Fail(f"connection {i}: closed with no reply")


def receive_pattern(s, start, total):
    """Reads the BIG stream from byte `start` up to `total` or its end,
    checking every byte; returns how many bytes came in all."""
    got = start
    while got < total:
        try:
            data = s.recv(65536)
        except socket.timeout:
            raise Fail(f"stalled at {got} of {total} bytes")
        except ConnectionResetError:
            break
        if not data:
            break
        if data != pattern(got, len(data)):
            raise Fail(f"corrupted after byte {got}")
        got += len(data)
    return got


def check_reset(port):
    good = socket.socket()
    # A small receive buffer, so the transfer really is in flight (not
    # already sitting in this socket) when the other client resets.
    good.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    good.settimeout(REPLY)
    good.connect(("127.0.0.1", port))
    try:
        good.sendall(f"BIG {BIG}\n".encode())
        got = receive_pattern(good, 0, FIRST)
        if got < FIRST:
            raise Fail("the first transfer ended before the reset")
        bad = connect(port)
        bad.sendall(f"BIG {BIG}\n".encode())
        some = b""
        while len(some) < FIRST:
            data = bad.recv(FIRST - len(some))
            if not data:
                break
            some += data
        # Reset: SO_LINGER on with a zero timeout, then close.
        bad.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        bad.close()
        try:
            got = receive_pattern(good, got, BIG)
        except Fail as e:
            raise Fail(f"transfer in flight: {e}")
        if got != BIG:
            raise Fail(f"transfer in flight cut at {got} of {BIG} bytes")
    finally:
        good.close()
    try:
        back = once(port, b"ONCE after\n")
    except OSError as e:
        raise Fail(f"next client: {e}")
    if back != b"ONCE after\n":
        raise Fail("next client not served")


CHECKS = {
    "binary": check_binary,
    "keep-alive": check_keep_alive,
    "redis": check_redis,
    "refused": check_refused,
    "conn-4096": check_4096,
    "reset": check_reset,
}


def main(argv):
    if len(argv) == 3 and argv[1] == "ports":
        print(*free_ports(int(argv[2])))
        return 0
    if len(argv) == 3 and argv[1] == "backends":
        backends(argv[2])
        return 0
    if len(argv) == 4 and argv[1] == "wait-listen":
        return wait_listen(int(argv[2]), float(argv[3]))
    if len(argv) == 4 and argv[1] == "check" and argv[2] in CHECKS:
        try:
            CHECKS[argv[2]](int(argv[3]))
        except (Fail, OSError) as e:
            print(f"FAIL: {e}")
            return 1
        print("ok")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
