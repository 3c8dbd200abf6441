#!/usr/bin/env python3
"""Turns bench-out/raw.tsv, idle.tsv and meta.txt into the markdown report
(printed) and the gnuplot chart script and data (written into the same
directory). Medians are taken over the rounds; errors are summed; peak RSS
and threads are the largest seen."""

import statistics
import sys
from collections import defaultdict
from pathlib import Path

PROXIES = ["rodizio", "rodizio-splice", "haproxy", "nginx", "direct"]
NAMES = {
    "rodizio": "rodizio",
    "rodizio-splice": "rodizio --splice",
    "haproxy": "HAProxy",
    "nginx": "nginx stream",
    "direct": "direct",
}
WORKLOADS = {
    # key: (title, throughput unit, CPU unit, units per CPU denominator)
    "short": ("Short connections", "req/s", "CPU µs/req", 1e-6),
    "keepalive": ("Keep-alive", "req/s", "CPU µs/req", 1e-6),
    "bulk": ("Bulk: 1 MiB files", "MB/s", "CPU s/GB", 1e9),
    "iperf": ("iperf3, one stream", "MB/s", "CPU s/GB", 1e9),
    "redis": ("Redis SET+GET", "req/s", "CPU µs/req", 1e-6),
}


def num(s):
    try:
        return float(s)
    except ValueError:
        return float("nan")


def med(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def fmt(x, digits=0):
    if x != x:
        return "–"
    return f"{x:,.{digits}f}"


def main():
    out = Path(sys.argv[1])
    meta = dict(
        line.split("=", 1) for line in (out / "meta.txt").read_text().splitlines() if "=" in line
    )
    tck = float(meta["clk_tck"])

    rows = defaultdict(list)
    lines = (out / "raw.tsv").read_text().splitlines()[1:]
    for line in lines:
        r, wl, proxy, thr, p99, errs, units, ticks, hwm, threads = line.split("\t")
        rows[(wl, proxy)].append(
            dict(thr=num(thr), p99=num(p99), errs=int(errs), units=num(units),
                 ticks=num(ticks), hwm=num(hwm), threads=num(threads))
        )

    summary = {}
    for (wl, proxy), rs in rows.items():
        scale = WORKLOADS[wl][3]
        cpu = []
        for x in rs:
            if proxy == "direct" or x["units"] <= 0:
                continue
            secs = x["ticks"] / tck
            cpu.append(secs / x["units"] / scale if scale < 1 else secs / (x["units"] / scale))
        summary[(wl, proxy)] = dict(
            thr=med([x["thr"] for x in rs]),
            p99=med([x["p99"] for x in rs]),
            errs=sum(x["errs"] for x in rs),
            cpu=med(cpu),
            hwm=max(x["hwm"] for x in rs),
            threads=max(x["threads"] for x in rs),
            n=len(rs),
        )

    def ratio(wl, a, b):
        sa, sb = summary.get((wl, a)), summary.get((wl, b))
        if not sa or not sb or not sb["thr"]:
            return float("nan")
        return sa["thr"] / sb["thr"]

    p = print
    p("# Benchmarks")
    p()
    p("rodizio beside HAProxy (`mode tcp`, `balance roundrobin`, `nbthread 2`) and nginx's")
    p("stream module (`worker_processes 2`, round robin), on the same machine in the same")
    p("run, with \"direct\" (no proxy) as the ceiling. Everything runs on loopback:")
    p("the load generator, the proxy and the backends share the same cores, so absolute")
    p("numbers are low and the **ratios** are what carry over to other machines.")
    p("Produced by `scripts/bench.sh` (`make bench`; `make bench-quick` for a short run).")
    p()
    p("![Throughput relative to HAProxy](benchmarks.png)")
    p()
    p("## Machine and tools")
    p()
    p(f"- Date: {meta['date']}")
    p(f"- Machine: {meta['nproc']} CPUs, {meta['cpu']}, Linux {meta['kernel']}")
    p(f"- {meta['rodizio']} (release build, default flags: 4096-byte chunks, 64 KiB stacks, "
      "round robin; `--idle-timeout 120s`)")
    p(f"- HAProxy {meta['haproxy']}, nginx {meta['nginx']}, redis {meta['redis_version']}, "
      f"iperf3 {meta['iperf3']}, wrk {meta['wrk']}, ab {meta['ab']}")
    p(f"- Command: `{meta['command'].strip()}`, rounds: {meta['rounds']}; in each round every "
      "workload runs through rodizio, HAProxy, nginx and direct in turn (A B C D, A B C D, ...).")
    p("- Backends: one nginx serving a 612-byte and a 1 MiB file on three ports (the HTTP "
      "proxies balance over the three; \"direct\" uses the first), one redis-server, one "
      "iperf3 server.")
    p()
    p("| workload | load |")
    p("|---|---|")
    for wl in WORKLOADS:
        p(f"| {WORKLOADS[wl][0]} | `{meta[wl]}` |")
    p(f"| Memory per idle connection | {meta['idle']} |")
    p()
    p("Throughput, p99 and CPU are medians over the rounds; errors are summed over the rounds;")
    p("CPU is the proxy's user+system time (all its threads and processes, from")
    p("`/proc/PID/stat`) divided by the requests or bytes served; peak RSS is `VmHWM` and")
    p("threads is `Threads` from `/proc/PID/status`. rodizio runs one process per")
    p("kind of backend (HTTP, redis, iperf3), so its figures are those of the process")
    p("serving the workload; HAProxy's and nginx's come from their single instance (nginx:")
    p("master and two workers summed), so their peak RSS is the peak over the whole run so far.")
    p()
    p("## Results")
    p()
    p("### Ratios of throughput")
    p()
    p("| workload | rodizio ÷ HAProxy | nginx ÷ HAProxy | rodizio ÷ best of HAProxy, nginx | "
      "rodizio --splice ÷ best of HAProxy, nginx | rodizio ÷ direct |")
    p("|---|---:|---:|---:|---:|---:|")
    for wl in WORKLOADS:
        best = max(
            (summary.get((wl, x), {}).get("thr", 0) for x in ("haproxy", "nginx")), default=0
        )
        rb = summary[(wl, "rodizio")]["thr"] / best if best else float("nan")
        sp = summary.get((wl, "rodizio-splice"))
        sb = sp["thr"] / best if sp and best else float("nan")
        p(f"| {WORKLOADS[wl][0]} | {fmt(ratio(wl, 'rodizio', 'haproxy'), 2)} | "
          f"{fmt(ratio(wl, 'nginx', 'haproxy'), 2)} | {fmt(rb, 2)} | {fmt(sb, 2)} | "
          f"{fmt(ratio(wl, 'rodizio', 'direct'), 2)} |")
    p()
    for wl, (title, unit, cpu_unit, _) in WORKLOADS.items():
        p(f"### {title}")
        p()
        p(f"`{meta[wl]}`")
        p()
        p(f"| proxy | {unit} | p99 ms | errors | {cpu_unit} | peak RSS MiB | threads | × HAProxy | × direct |")
        p("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for proxy in PROXIES:
            s = summary.get((wl, proxy))
            if not s:
                continue
            proc = proxy != "direct"
            digits = 1 if unit == "MB/s" else 0
            p(f"| {NAMES[proxy]} | {fmt(s['thr'], digits)} | {fmt(s['p99'], 2)} | {s['errs']} | "
              f"{fmt(s['cpu'], 1 if unit == 'req/s' else 2) if proc else '–'} | "
              f"{fmt(s['hwm'] / 1024, 1) if proc else '–'} | "
              f"{fmt(s['threads']) if proc else '–'} | "
              f"{fmt(ratio(wl, proxy, 'haproxy'), 2)} | {fmt(ratio(wl, proxy, 'direct'), 2)} |")
        p()

    p("## Memory per idle connection")
    p()
    p(f"{meta['idle']} through each proxy (to the HTTP backends, which hold a partial request")
    p("open), on fresh processes before any other load; `VmRSS` read before and after, once every")
    p("connection has reached a backend and the RSS has settled.")
    p()
    p("| proxy | RSS before KiB | RSS after KiB | KiB per connection | threads after |")
    p("|---|---:|---:|---:|---:|")
    for line in (out / "idle.tsv").read_text().splitlines():
        proxy, before, after, per, threads = line.split("\t")
        p(f"| {NAMES[proxy]} | {fmt(num(before))} | {fmt(num(after))} | {fmt(num(per), 1)} | {threads} |")
    p()

    # The chart: throughput relative to HAProxy, grouped by workload.
    with open(out / "chart.dat", "w") as f:
        f.write("# workload rodizio rodizio-splice haproxy nginx direct\n")
        for wl in WORKLOADS:
            vals = [ratio(wl, x, "haproxy") for x in PROXIES]
            f.write('"{}" {}\n'.format(
                WORKLOADS[wl][0].split(":")[0].split(",")[0],
                " ".join("?" if v != v else f"{v:.3f}" for v in vals)))
    (out / "chart.gp").write_text(f"""\
set terminal pngcairo size 900,480 font "sans,10"
set output "{out}/benchmarks.png"
set title "Throughput relative to HAProxy (1.0), median over rounds ({meta['rounds']}); {meta['nproc']} CPUs, loopback"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set ylabel "× HAProxy"
set yrange [0:*]
set grid ytics
set key top left
set datafile missing "?"
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb "#444444"
plot "{out}/chart.dat" using 2:xtic(1) title "rodizio" lc rgb "#d9534f", \\
     "" using 3 title "rodizio --splice" lc rgb "#f0ad4e", \\
     "" using 4 title "HAProxy" lc rgb "#5b9bd5", \\
     "" using 5 title "nginx stream" lc rgb "#70ad47", \\
     "" using 6 title "direct (no proxy)" lc rgb "#a5a5a5"
""")


if __name__ == "__main__":
    main()
