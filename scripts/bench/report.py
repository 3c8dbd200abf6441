#!/usr/bin/env python3
"""Turns bench-out/raw.tsv, idle.tsv and meta.txt into the markdown report
(printed) and the gnuplot chart script and data (written into the same
directory). Medians are taken over the rounds; errors are summed; peak RSS
and threads are the largest seen."""

import statistics
import sys
from collections import defaultdict
from pathlib import Path

PROXIES = ["rodizio", "rodizio-splice", "rodizio-relay", "naive", "haproxy", "nginx", "direct"]
NAMES = {
    "rodizio": "rodizio",
    "rodizio-splice": "rodizio --splice",
    "rodizio-relay": "rodizio --kernel-relay=auto",
    "naive": "naive relay",
    "haproxy": "HAProxy",
    "nginx": "nginx stream",
    "direct": "direct",
}
COLOURS = {
    "rodizio": "#d9534f",
    "rodizio-splice": "#f0ad4e",
    "rodizio-relay": "#8c564b",
    "naive": "#9467bd",
    "haproxy": "#5b9bd5",
    "nginx": "#70ad47",
    "direct": "#a5a5a5",
}
WORKLOADS = {
    # key: (title, throughput unit, per-unit suffix, units per denominator)
    "short": ("Short connections", "req/s", "µs/req", 1e-6),
    "keepalive": ("Keep-alive", "req/s", "µs/req", 1e-6),
    "bulk": ("Bulk: 1 MiB files", "MB/s", "s/GB", 1e9),
    "iperf": ("iperf3, one stream", "MB/s", "s/GB", 1e9),
    "redis": ("Redis SET+GET", "req/s", "µs/req", 1e-6),
}
# A p99 above this many times the best peer's is flagged.
TAIL_FLAG = 3.0
# Below this share of the CPU time seen by the live threads' schedstat, the
# run-queue wait misses ended threads and is shown as a lower bound.
COVERAGE = 0.8


def num(s):
    try:
        return float(s)
    except ValueError:
        return float("nan")


def med(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def worst(xs):
    xs = [x for x in xs if x == x]
    return max(xs) if xs else float("nan")


def fmt(x, digits=0):
    if x != x:
        return "–"
    return f"{x:,.{digits}f}"


def ms(x):
    """A latency in ms, with the digits its size deserves."""
    if x != x:
        return "–"
    return fmt(x, 2 if x < 10 else 1 if x < 100 else 0)


def times(r):
    """A ratio such as 3.6×, with a second digit where one would read 3.0×."""
    return f"{r:.1f}×" if round(r, 1) > TAIL_FLAG else f"{r:.2f}×"


def per_unit(secs, units, scale):
    """Seconds of CPU (or waiting) per unit: µs per request, or s per GB."""
    if units <= 0:
        return float("nan")
    return secs / units / scale if scale < 1 else secs / (units / scale)


def main():
    out = Path(sys.argv[1])
    meta = dict(
        line.split("=", 1) for line in (out / "meta.txt").read_text().splitlines() if "=" in line
    )
    tck = float(meta["clk_tck"])

    rows = defaultdict(list)
    lines = (out / "raw.tsv").read_text().splitlines()[1:]
    for line in lines:
        (r, wl, proxy, thr, p50, p99, p999, errs, units, ticks, run_ns, wait_ns, threads,
         hwm, *machine) = line.split("\t")
        rows[(wl, proxy)].append(
            dict(thr=num(thr), p50=num(p50), p99=num(p99), p999=num(p999), errs=int(errs),
                 units=num(units), ticks=num(ticks), run=num(run_ns) / 1e9,
                 wait=num(wait_ns) / 1e9, hwm=num(hwm), threads=num(threads),
                 # Older raw.tsv files have no machine column.
                 machine=num(machine[0]) if machine else float("nan"))
        )

    summary = {}
    for (wl, proxy), rs in rows.items():
        scale = WORKLOADS[wl][3]
        cpu, wait, cover, machine = [], [], [], []
        for x in rs:
            if x["units"] > 0:
                machine.append(per_unit(x["machine"] / tck, x["units"], scale))
            if proxy == "direct" or x["units"] <= 0:
                continue
            secs = x["ticks"] / tck
            cpu.append(per_unit(secs, x["units"], scale))
            wait.append(per_unit(x["wait"], x["units"], scale))
            # Ticks come in 1/CLK_TCK s: too few to compare, take it as whole.
            cover.append(x["run"] / secs if x["ticks"] >= 10 else 1.0)
        summary[(wl, proxy)] = dict(
            thr=med([x["thr"] for x in rs]),
            p50=med([x["p50"] for x in rs]),
            p99=med([x["p99"] for x in rs]),
            p999=med([x["p999"] for x in rs]),
            p99_worst=worst([x["p99"] for x in rs]),
            errs=sum(x["errs"] for x in rs),
            cpu=med(cpu),
            machine=med(machine),
            wait=med(wait),
            wait_partial=bool(cover) and med(cover) < COVERAGE,
            hwm=max(x["hwm"] for x in rs),
            threads=max(x["threads"] for x in rs),
            n=len(rs),
        )

    def best_peer(wl, proxy):
        """The lowest median p99 among the other proxies (not direct)."""
        peers = [
            s["p99"] for (w, x), s in summary.items()
            if w == wl and x not in (proxy, "direct") and s["p99"] == s["p99"]
        ]
        return min(peers) if peers else float("nan")

    def flagged(wl, proxy):
        s = summary.get((wl, proxy))
        best = best_peer(wl, proxy)
        return bool(s) and proxy != "direct" and s["p99"] > TAIL_FLAG * best

    def ratio(wl, a, b):
        sa, sb = summary.get((wl, a)), summary.get((wl, b))
        if not sa or not sb or not sb["thr"]:
            return float("nan")
        return sa["thr"] / sb["thr"]

    def marginal(wl, proxy):
        """Whole-machine CPU per unit through `proxy` less the same through no proxy."""
        s, d = summary.get((wl, proxy)), summary.get((wl, "direct"))
        if not s or not d:
            return float("nan")
        return s["machine"] - d["machine"]

    p = print
    p("# Benchmarks")
    p()
    p("rodizio beside HAProxy (`mode tcp`, `balance roundrobin`, `nbthread 2`), nginx's")
    p("stream module (`worker_processes 2`, round robin) and, on small messages, the naive")
    p("relay: the thread-per-connection model at its smallest (`scripts/bench/naive-relay.c`,")
    p("60 lines of C: a detached thread with a 64 KiB stack per client, `poll(2)` and")
    p("4096-byte reads and writes, no pool, no limits). All on the same machine in the same")
    p("run, with \"direct\" (no proxy) as the ceiling. Everything runs on loopback:")
    p("the load generator, the proxy and the backends share the same cores, so absolute")
    p("numbers are low and the **ratios** are what carry over to other machines.")
    p("Produced by `scripts/bench.sh` (`make bench`; `make bench-quick` for a short run).")
    p()
    p("![Throughput relative to HAProxy, and p99 latency](benchmarks.png)")
    p()
    p("## How the processes run")
    p()
    p("Every server (each backend, each proxy) and every load generator runs in a session")
    p("of its own (`setsid`), as separate services on one machine do. This decides the")
    p("tail. With `kernel.sched_autogroup_enabled=1`, the default of most distributions'")
    p("kernels, each session is a scheduling group, and a saturated CPU is shared fairly")
    p("between the groups, not between the threads; separate systemd services get the same")
    p("from their cgroups (`CPUWeight=`). HAProxy's and nginx's two busy threads take their")
    p("group's share with nothing queued inside it. A thread per connection puts a hundred")
    p("runnable threads in one group, and each waits in the run queue behind the others.")
    p("Started from one shell, in one session, the proxy's threads would compete one by one")
    p("with the load generator's and the backends', and the tail would look better than it")
    p("is where the proxy is deployed. The processes are still stopped by their PIDs.")
    p(f"In this run `kernel.sched_autogroup_enabled` was {meta.get('autogroup', '–')}.")
    p()
    p("## Machine and tools")
    p()
    p(f"- Date: {meta['date']}")
    p(f"- Machine: {meta['nproc']} CPUs, {meta['cpu']}, Linux {meta['kernel']}")
    p(f"- {meta['rodizio']} (release build, default flags: 4096-byte chunks, 64 KiB stacks, "
      "round robin; `--idle-timeout 120s`)")
    p(f"- HAProxy {meta['haproxy']}, nginx {meta['nginx']}, redis {meta['redis_version']}, "
      f"iperf3 {meta['iperf3']}, wrk {meta['wrk']}, ab {meta['ab']}; the naive relay built "
      f"with gcc {meta.get('gcc', '–')} `-O2`")
    p(f"- Command: `{meta['command'].strip()}`, rounds: {meta['rounds']}; in each round every "
      "workload runs through each proxy and direct in turn (A B C D, A B C D, ...).")
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
    p("Throughput, latency, CPU and run-queue wait are medians over the rounds; errors are")
    p("summed over the rounds.")
    p()
    p("- **Latency** is per request, as the load generator sees it: the 50th, 99th and")
    p("  99.9th percentiles from ab's per-request times (`-g`, whole milliseconds), wrk's")
    p("  histogram (`scripts/bench/latency.lua`: `--latency` stops at the 99th) and")
    p("  redis-benchmark's percentile distribution (the worse of SET and GET); iperf3 has")
    p("  none. \"worst p99\" is the largest p99 of any round.")
    p(f"  A p99 above {TAIL_FLAG:g}× the lowest p99 of the other proxies in the same workload")
    p("  is flagged ⚠.")
    p("- **CPU** is the proxy's user+system time (all its threads and processes, from")
    p("  `/proc/PID/stat`) divided by the requests or bytes served.")
    p("- **Machine CPU** is the busy time of every core (user, nice, system, irq, softirq,")
    p("  steal from `/proc/stat`) while the workload ran, divided by the requests or bytes")
    p("  served: the proxy, the load generator, the backends and the kernel's work for all")
    p("  of them. On loopback a relay's kernel work (softirq, the kernel relay's sockmap")
    p("  program) runs on whichever thread sent the packet and is charged to no proxy's")
    p("  `/proc/PID/stat`, so the proxy's own CPU flatters a proxy that moves bytes in the")
    p("  kernel; this figure does not. **Over direct** is the machine CPU per unit through")
    p("  the proxy less the same with no proxy at all: what putting the proxy in the path")
    p("  costs the machine, whoever pays it.")
    p("- **Run-queue wait** is the time the proxy's threads were ready to run but waiting for")
    p("  a CPU, summed over its threads (the second field of `/proc/PID/task/*/schedstat`,")
    p("  read before each workload, every quarter of a second during it and after it), per")
    p("  request or per GB. A thread that started and ended between two samples is not in")
    p("  it (the naive relay starts and ends a thread per connection): where the threads")
    p(f"  sampled account for less than {COVERAGE:.0%} of the CPU time, the figure is a lower")
    p("  bound, written ≥.")
    p("- **Peak RSS** is `VmHWM` from `/proc/PID/status`; **threads** is the most threads")
    p("  seen at once in those samples.")
    p("  rodizio and the naive relay run one process per kind of backend (HTTP, redis,")
    p("  iperf3), so their figures are those of the process serving the workload;")
    p("  HAProxy's and nginx's come from their single instance (nginx: master and two")
    p("  workers summed), so their peak RSS is the peak over the whole run so far.")
    p()
    p("## Results")
    p()
    p("### Ratios of throughput")
    p()
    p("| workload | rodizio ÷ HAProxy | nginx ÷ HAProxy | rodizio ÷ best of HAProxy, nginx | "
      "rodizio --splice ÷ best of HAProxy, nginx | "
      "rodizio --kernel-relay=auto ÷ best of HAProxy, nginx | rodizio ÷ naive relay | "
      "rodizio ÷ direct |")
    p("|---|---:|---:|---:|---:|---:|---:|---:|")
    for wl in WORKLOADS:
        best = max(
            (summary.get((wl, x), {}).get("thr", 0) for x in ("haproxy", "nginx")), default=0
        )

        def to_best(proxy):
            s = summary.get((wl, proxy))
            return s["thr"] / best if s and best else float("nan")

        p(f"| {WORKLOADS[wl][0]} | {fmt(ratio(wl, 'rodizio', 'haproxy'), 2)} | "
          f"{fmt(ratio(wl, 'nginx', 'haproxy'), 2)} | {fmt(to_best('rodizio'), 2)} | "
          f"{fmt(to_best('rodizio-splice'), 2)} | {fmt(to_best('rodizio-relay'), 2)} | "
          f"{fmt(ratio(wl, 'rodizio', 'naive'), 2)} | {fmt(ratio(wl, 'rodizio', 'direct'), 2)} |")
    p()
    if "relay" in meta:
        p(f"The kernel relay's instances: {meta['relay'].strip()}. Their connections start on")
        p("the copy pump and are handed to the kernel after 4 exchanges (`kernel_relay_after`),")
        p("so the 1 MiB files (one request per connection) stay on the copy pump; the CPU of")
        p("the promoted ones is mostly the kernel's, in the machine CPU, not in the proxy's.")
        p()
    p("### What each proxy costs the whole machine")
    p()
    p("Machine CPU per request (per GB for bulk and iperf3) through the proxy, less the same")
    p("with no proxy: every core's busy time, the kernel's work on loopback included (see")
    p("\"Machine CPU\" above). The proxy's own CPU is in each workload's table below.")
    p()
    costed = [x for x in PROXIES if x != "direct" and any((wl, x) in summary for wl in WORKLOADS)]
    p("| workload | " + " | ".join(NAMES[x] for x in costed) + " |")
    p("|---|" + "---:|" * len(costed))
    for wl, (title, unit, per, _) in WORKLOADS.items():
        pdig = 1 if unit == "req/s" else 2
        p(f"| {title} ({per}) | " + " | ".join(fmt(marginal(wl, x), pdig) for x in costed) + " |")
    p()
    p("### Tail latency: p99")
    p()
    p("p99 in ms, median over the rounds (worst round in brackets); "
      f"⚠ above {TAIL_FLAG:g}× the best peer's.")
    p()
    shown = [x for x in PROXIES if any((wl, x) in summary for wl in WORKLOADS)]
    lat_wls = [wl for wl in WORKLOADS if any(
        s["p99"] == s["p99"] for (w, _), s in summary.items() if w == wl)]
    p("| workload | " + " | ".join(NAMES[x] for x in shown) + " |")
    p("|---|" + "---:|" * len(shown))
    for wl in lat_wls:
        cells = []
        for x in shown:
            s = summary.get((wl, x))
            if not s or s["p99"] != s["p99"]:
                cells.append("–")
                continue
            flag = " ⚠" if flagged(wl, x) else ""
            cells.append(f"{ms(s['p99'])} ({ms(s['p99_worst'])}){flag}")
        p(f"| {WORKLOADS[wl][0]} | " + " | ".join(cells) + " |")
    flags = [(wl, x) for wl in lat_wls for x in shown if flagged(wl, x)]
    p()
    if flags:
        p("Flagged: " + "; ".join(
            f"{NAMES[x]} on {WORKLOADS[wl][0]} ({ms(summary[(wl, x)]['p99'])} ms, "
            f"{times(summary[(wl, x)]['p99'] / best_peer(wl, x))} the best peer's "
            f"{ms(best_peer(wl, x))} ms)" for wl, x in flags) + ".")
    else:
        p(f"No p99 above {TAIL_FLAG:g}× the best peer's.")
    p()
    for wl, (title, unit, per, _) in WORKLOADS.items():
        p(f"### {title}")
        p()
        p(f"`{meta[wl]}`")
        p()
        p(f"| proxy | {unit} | p50 ms | p99 ms | p99.9 ms | worst p99 ms | errors | CPU {per} | "
          f"machine CPU {per} | over direct {per} | "
          f"run-queue wait {per} | peak RSS MiB | threads | × HAProxy | × direct |")
        p("|---|" + "---:|" * 14)
        for proxy in PROXIES:
            s = summary.get((wl, proxy))
            if not s:
                continue
            proc = proxy != "direct"
            digits = 1 if unit == "MB/s" else 0
            pdig = 1 if unit == "req/s" else 2
            flag = " ⚠" if flagged(wl, proxy) else ""
            wait = fmt(s["wait"], pdig) if proc else "–"
            if proc and s["wait_partial"] and s["wait"] == s["wait"]:
                wait = "≥ " + wait
            p(f"| {NAMES[proxy]} | {fmt(s['thr'], digits)} | {ms(s['p50'])} | "
              f"{ms(s['p99'])}{flag} | {ms(s['p999'])} | {ms(s['p99_worst'])} | {s['errs']} | "
              f"{fmt(s['cpu'], pdig) if proc else '–'} | {fmt(s['machine'], pdig)} | "
              f"{fmt(marginal(wl, proxy), pdig) if proc else '–'} | {wait} | "
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

    chart(out, meta, summary, ratio, shown, lat_wls)


def short_title(wl):
    return WORKLOADS[wl][0].split(":")[0].split(",")[0]


def chart(out, meta, summary, ratio, shown, lat_wls):
    """Two panels: throughput relative to HAProxy, and p99 on a log scale."""
    with open(out / "chart.dat", "w") as f:
        f.write("# workload " + " ".join(shown) + "\n")
        for wl in WORKLOADS:
            vals = [ratio(wl, x, "haproxy") for x in shown]
            f.write('"{}" {}\n'.format(
                short_title(wl), " ".join("?" if v != v else f"{v:.3f}" for v in vals)))
    with open(out / "latency.dat", "w") as f:
        f.write("# workload " + " ".join(shown) + " (p99 ms)\n")
        for wl in lat_wls:
            vals = [summary.get((wl, x), {}).get("p99", float("nan")) for x in shown]
            f.write('"{}" {}\n'.format(
                short_title(wl), " ".join("?" if v != v or v <= 0 else f"{v:.3f}" for v in vals)))

    def plot(data):
        cols = []
        for i, x in enumerate(shown):
            title = "direct (no proxy)" if x == "direct" else NAMES[x]
            src = f'"{out}/{data}" using {i + 2}' + (":xtic(1)" if i == 0 else "")
            if i:
                src = f'"" using {i + 2}'
            cols.append(f'{src} title "{title}" lc rgb "{COLOURS[x]}"')
        return "plot " + ", \\\n     ".join(cols) + "\n"

    (out / "chart.gp").write_text(f"""\
set terminal pngcairo size 1000,900 font "sans,10"
set output "{out}/benchmarks.png"
set multiplot layout 2,1
# The same plot width in both panels; the key sits right of the upper one.
set lmargin at screen 0.07
set rmargin at screen 0.80
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set grid ytics
set key outside right top
set datafile missing "?"
set title "Throughput relative to HAProxy (1.0), median over rounds ({meta['rounds']}); {meta['nproc']} CPUs, loopback"
set ylabel "× HAProxy"
set yrange [0:*]
set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb "#444444"
{plot("chart.dat")}unset arrow 1
set title "p99 latency, ms (log scale; lower is better), median over rounds; each process in its own session"
set ylabel "p99 ms"
set logscale y
set yrange [*:*]
set grid mytics
unset key
{plot("latency.dat")}unset multiplot
""")


if __name__ == "__main__":
    main()
