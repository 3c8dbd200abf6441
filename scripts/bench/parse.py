#!/usr/bin/env python3
"""Reads load generators' outputs.

    parse.py WORKLOAD FILE [EXPECTED]
        prints `throughput p50_ms p99_ms p999_ms errors units` for one:
        short, bulk: ab's text, and FILE.times (ab -g); keepalive: wrk's
        text with latency.lua's line; iperf: iperf3 -J; redis:
        redis-benchmark's full text. EXPECTED: requests asked (ab, redis).
    parse.py --rows PENDING
        for each line `round workload proxy file expected rest...` of
        PENDING (tab-separated), prints `round workload proxy throughput
        p50_ms p99_ms p999_ms errors units rest...`: bench.sh's raw.tsv rows.

throughput is requests/s (short, keepalive, redis) or MB/s (bulk, iperf);
units are the requests or bytes served, the denominator of the CPU and
run-queue figures. A latency the tool does not give is `nan` (iperf3 has
none). Errors count failed, missing and non-2xx requests; output that cannot
be read counts as one error with no throughput.

Percentiles:
- ab: nearest rank over every request's total time in `-g`'s file (whole
  milliseconds, ab's own resolution).
- wrk: its HdrHistogram, through latency.lua (microseconds).
- redis-benchmark: its "Latency by percentile distribution", the first
  line at or above the percentile, for SET and GET; the worse of the two.
"""

import json
import math
import re
import sys

FAILED = "0 nan nan nan 1 0"


def rank(sorted_ms, pct):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_ms:
        return float("nan")
    k = max(1, math.ceil(pct / 100 * len(sorted_ms)))
    return sorted_ms[k - 1]


def fields(text, pattern, cast=float, default=None):
    m = re.search(pattern, text, re.M)
    return cast(m.group(1)) if m else default


def ab(path, expected, bulk):
    text = open(path, errors="replace").read()
    done = fields(text, r"^Complete requests:\s+(\d+)", int, 0)
    failed = fields(text, r"^Failed requests:\s+(\d+)", int, 0)
    non2xx = fields(text, r"^Non-2xx responses:\s+(\d+)", int, 0)
    rps = fields(text, r"^Requests per second:\s+([\d.]+)")
    secs = fields(text, r"^Time taken for tests:\s+([\d.]+)")
    total = fields(text, r"^Total transferred:\s+(\d+)", int, 0)
    if rps is None or not secs:
        return FAILED
    times = []
    try:
        with open(path + ".times") as f:
            next(f)
            for line in f:
                parts = line.rstrip("\n").split("\t")
                times.append(float(parts[4]))
    except (OSError, StopIteration, IndexError, ValueError):
        pass
    times.sort()
    p50, p99, p999 = (rank(times, p) for p in (50, 99, 99.9))
    errors = (expected - done) + failed + non2xx
    if bulk:
        return f"{total / 1e6 / secs:.1f} {p50} {p99} {p999} {errors} {total}"
    return f"{rps} {p50} {p99} {p999} {errors} {done}"


def wrk(path):
    text = open(path, errors="replace").read()
    rps = fields(text, r"^Requests/sec:\s+([\d.]+)")
    n = fields(text, r"^\s*(\d+) requests in ", int, 0)
    lat = re.search(r"^latency_us p50 (\d+) p99 (\d+) p999 (\d+)", text, re.M)
    if rps is None or not lat:
        return FAILED
    p50, p99, p999 = (int(x) / 1000 for x in lat.groups())
    errors = 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if m:
        errors += sum(int(x) for x in m.groups())
    errors += fields(text, r"Non-2xx or 3xx responses:\s+(\d+)", int, 0)
    return f"{rps} {p50} {p99} {p999} {errors} {n}"


def iperf(path):
    try:
        r = json.load(open(path))["end"]["sum_received"]
        return f'{r["bits_per_second"] / 8e6:.1f} nan nan nan 0 {int(r["bytes"])}'
    except (OSError, ValueError, KeyError, TypeError):
        return FAILED


def redis(path, expected):
    # Progress lines end in \r, so split on both.
    lines = re.split(r"[\r\n]", open(path, errors="replace").read())
    tests = {}  # name -> {"dist": [(pct, ms)], "rps": float, "n": int}
    cur = None
    in_dist = False
    for line in lines:
        m = re.match(r"^====== (\w+) ======", line.strip())
        if m:
            cur = tests.setdefault(m.group(1), {"dist": [], "rps": None, "n": 0})
            in_dist = False
            continue
        if cur is None:
            continue
        m = re.match(r"^\s*(\d+) requests completed in", line)
        if m:
            cur["n"] = int(m.group(1))
        if line.startswith("Latency by percentile distribution"):
            in_dist = True
            continue
        if line.startswith("Cumulative distribution") or not line.strip():
            in_dist = False
        m = re.match(r"^([\d.]+)% <= ([\d.]+) milliseconds", line)
        if in_dist and m:
            cur["dist"].append((float(m.group(1)), float(m.group(2))))
        m = re.search(r"throughput summary: ([\d.]+) requests per second", line)
        if m:
            cur["rps"] = float(m.group(1))
    if set(tests) != {"SET", "GET"} or any(t["rps"] is None for t in tests.values()):
        return FAILED

    def pct(dist, p):
        for q, ms in dist:
            if q >= p:
                return ms
        return float("nan")

    p50, p99, p999 = (max(pct(t["dist"], p) for t in tests.values()) for p in (50, 99, 99.9))
    done = sum(t["n"] for t in tests.values())
    # Throughput over both tests together: requests over the time they took.
    secs = sum(t["n"] / t["rps"] for t in tests.values() if t["rps"])
    errors = 2 * expected - done
    return f"{done / secs:.0f} {p50} {p99} {p999} {errors} {done}"


def parse(wl, path, expected):
    try:
        if wl in ("short", "bulk"):
            return ab(path, expected, wl == "bulk")
        if wl == "keepalive":
            return wrk(path)
        if wl == "iperf":
            return iperf(path)
        if wl == "redis":
            return redis(path, expected)
    except OSError:
        return FAILED
    sys.exit(f"unknown workload: {wl}")


def main():
    if sys.argv[1] == "--rows":
        with open(sys.argv[2]) as f:
            for line in f:
                r, wl, proxy, path, expected, *rest = line.rstrip("\n").split("\t")
                res = parse(wl, path, int(expected)).split()
                print("\t".join([r, wl, proxy] + res + rest))
        return
    wl, path = sys.argv[1], sys.argv[2]
    print(parse(wl, path, int(sys.argv[3]) if len(sys.argv) > 3 else 0))


if __name__ == "__main__":
    main()
