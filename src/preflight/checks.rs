//! The checks: each takes the settings' [`Demand`] and the [`Host`] as
//! plain numbers and gives one [`Line`]; none reads the system.
//!
//! How each decides:
//!
//! - **Open files**: the hard limit against every descriptor needed (the
//!   balancer raises its soft limit to the hard one at start-up).
//! - **Threads**: `RLIMIT_NPROC` (all this user's threads; root is exempt),
//!   then what `kernel.threads-max`, `kernel.pid_max` and the cgroup's
//!   `pids.max` leave beside the threads already running.
//! - **Backlog**: `net.core.somaxconn` caps it without a word; a warning.
//! - **Local ports**: each connection to one backend address takes a local
//!   port of `ip_local_port_range`, and the side that closes first keeps it
//!   in TIME_WAIT for 60 s: the range over 60 is the most new connections
//!   per second to one backend, shown (under [`MIN_RATE`], with the range
//!   that raises it). A warning only when the settings can reach the
//!   limit: more workers than ports, each able to hold a connection to
//!   one backend. The rate is the traffic's to reach, not the settings':
//!   every start on a stock range would warn of it otherwise.
//! - **Port sharing**: with `--reuse-port`, `net.ipv4.tcp_migrate_req` 0
//!   resets the clients queued on a balancer that closes; a warning.
//! - **Memory**: the workers' stacks, buffers and kernel stacks against the
//!   cgroup's limit (fail) and the memory available (warn).
//!
//! # Threads
//!
//! Pure functions, called on the main thread. No C counterpart.

use super::{Demand, Host, Limit, Line, Verdict};

/// How long a closed connection's local port stays in TIME_WAIT on Linux
/// (`TCP_TIMEWAIT_LEN`, not a setting).
pub const TIME_WAIT_SECS: u64 = 60;

/// New connections per second to one backend below which the local port
/// range's line says how to widen it.
pub const MIN_RATE: u64 = 1000;

/// The widest usual port range, `1024 65535`: 64,512 ports, 1,075 new
/// connections per second per backend.
const WIDE_RANGE: &str = "1024 65535";

/// The most `kernel.pid_max` can be on a 64-bit system (`PID_MAX_LIMIT`).
const PID_MAX_LIMIT: u64 = 4 * 1024 * 1024;

/// Open files: the hard `RLIMIT_NOFILE` against [`Demand::descriptors`].
pub fn descriptors(d: &Demand, h: &Host) -> Line {
    const WHAT: &str = "open files (RLIMIT_NOFILE)";
    let need = d.descriptors();
    let pipes = if d.splice { " + 4 for its pipes" } else { "" };
    let detail = format!(
        "{need} needed ({} workers × 2{pipes}, {} waiting clients, {} kept aside, {} others)",
        d.workers,
        d.waiting,
        d.kept_descriptors(),
        d.other_descriptors()
    );
    let Some(limit) = h.nofile else {
        return Line::ok(WHAT, format!("not readable here; {detail}"));
    };
    let numbers = format!("soft {}, hard {}; {detail}", limit.soft, limit.hard);
    if !limit.hard.allows(need) {
        let fix = match h.nr_open {
            Some(max) if max < need => {
                format!("sysctl -w fs.nr_open={need} && ulimit -n {need}")
            }
            _ => format!("ulimit -n {need} (LimitNOFILE={need} in a systemd unit)"),
        };
        return Line::bad(Verdict::Fail, WHAT, numbers, fix);
    }
    if !limit.soft.allows(need) {
        return Line::ok(WHAT, format!("{numbers}; rodizio raises the soft limit"));
    }
    Line::ok(WHAT, numbers)
}

/// `RLIMIT_NPROC` against [`Demand::threads`]: the threads of every
/// process of this user count, and root is not held to it.
pub fn user_threads(d: &Demand, h: &Host) -> Line {
    const WHAT: &str = "threads of this user (RLIMIT_NPROC)";
    let need = d.threads();
    let Some(limit) = h.nproc else {
        return Line::ok(WHAT, format!("not readable here; {need} needed"));
    };
    let numbers = format!("soft {}, hard {}; {need} needed", limit.soft, limit.hard);
    if h.root {
        return Line::ok(WHAT, format!("{numbers}; not enforced for root"));
    }
    if limit.soft.allows(need) {
        return Line::ok(WHAT, format!("{numbers}, beside this user's other threads"));
    }
    Line::bad(
        Verdict::Fail,
        WHAT,
        numbers,
        format!("ulimit -u {need} (LimitNPROC={need} in a systemd unit)"),
    )
}

/// `kernel.threads-max` beside the threads running.
pub fn threads_max(d: &Demand, h: &Host) -> Line {
    system_threads(d, h, "threads (kernel.threads-max)", h.threads_max, |n| {
        format!("sysctl -w kernel.threads-max={n}")
    })
}

/// `kernel.pid_max` beside the threads running: each thread takes a PID.
pub fn pid_max(d: &Demand, h: &Host) -> Line {
    system_threads(d, h, "PIDs (kernel.pid_max)", h.pid_max, |n| {
        format!("sysctl -w kernel.pid_max={}", n.min(PID_MAX_LIMIT))
    })
}

/// A system-wide thread limit: what it leaves beside the threads running
/// against [`Demand::threads`]; the fix suggests room for both, rounded up
/// to a multiple of 1024.
fn system_threads(
    d: &Demand,
    h: &Host,
    what: &str,
    limit: Option<u64>,
    fix: impl Fn(u64) -> String,
) -> Line {
    let need = d.threads();
    let Some(limit) = limit else {
        return Line::ok(what, format!("not readable here; {need} needed"));
    };
    let running = h.threads_now.unwrap_or(0);
    let left = limit.saturating_sub(running);
    let numbers = format!("{limit}, {running} in use, {left} left; {need} needed");
    if need <= left {
        return Line::ok(what, numbers);
    }
    let enough = (running + need).div_ceil(1024) * 1024;
    Line::bad(Verdict::Fail, what, numbers, fix(enough))
}

/// The cgroup's `pids.max`: its tasks (threads) in use and the workers'.
pub fn cgroup_tasks(d: &Demand, h: &Host) -> Line {
    const WHAT: &str = "tasks of the cgroup (pids.max)";
    let need = d.threads();
    let Some(cgroup) = h.tasks.as_ref().filter(|c| c.limit != Limit::Unlimited) else {
        return Line::ok(WHAT, format!("no limit; {need} needed"));
    };
    let in_use = cgroup.current.unwrap_or(0);
    let numbers = format!(
        "{} ({}), {in_use} in use; {need} needed",
        cgroup.limit,
        cgroup.file.display()
    );
    if cgroup.limit.allows(in_use + need) {
        return Line::ok(WHAT, numbers);
    }
    let enough = in_use + need;
    Line::bad(
        Verdict::Fail,
        WHAT,
        numbers,
        format!(
            "echo {enough} > {} (TasksMax={enough} in a systemd unit)",
            cgroup.file.display()
        ),
    )
}

/// `net.core.somaxconn` against the backlog: the kernel takes the smaller
/// without saying so.
pub fn backlog(d: &Demand, h: &Host) -> Line {
    const WHAT: &str = "listen backlog (net.core.somaxconn)";
    let Some(cap) = h.somaxconn else {
        return Line::ok(WHAT, format!("not readable here; backlog {}", d.backlog));
    };
    if d.backlog <= cap {
        return Line::ok(WHAT, format!("{cap}, backlog {}", d.backlog));
    }
    Line::bad(
        Verdict::Warn,
        WHAT,
        format!(
            "{cap} < backlog {}: the kernel queues at most {cap} clients",
            d.backlog
        ),
        format!("sysctl -w net.core.somaxconn={}", d.backlog),
    )
}

/// The local ports of `ip_local_port_range`: how many connections one
/// backend address can hold at once, and how many new ones per second
/// TIME_WAIT allows.
pub fn local_ports(d: &Demand, h: &Host) -> Line {
    const WHAT: &str = "local ports (net.ipv4.ip_local_port_range)";
    let Some((low, high)) = h.port_range else {
        return Line::ok(WHAT, "not readable here");
    };
    let ports = high - low + 1;
    let rate = ports / TIME_WAIT_SECS;
    let mut numbers = format!(
        "{low}-{high}, {ports} ports per backend address: {rate} new connections/s to each \
         (TIME_WAIT {TIME_WAIT_SECS} s)"
    );
    if h.tw_reuse == Some(1) {
        numbers.push_str(", more with net.ipv4.tcp_tw_reuse=1");
    } else if h.tw_reuse == Some(2) && d.loopback_backends {
        // The kernel's default: TIME_WAIT ports are reused for loopback
        // connections, which is all this configuration makes.
        numbers.push_str(", more to loopback backends with net.ipv4.tcp_tw_reuse=2");
    } else if rate < MIN_RATE {
        numbers.push_str(&format!(
            "; for more, net.ipv4.ip_local_port_range=\"{WIDE_RANGE}\""
        ));
    }
    // Reuse frees ports in TIME_WAIT, not those held by connections.
    if ports >= d.workers {
        return Line::ok(WHAT, numbers);
    }
    Line::bad(
        Verdict::Warn,
        WHAT,
        format!(
            "{numbers}; fewer than the {} workers could hold to one backend",
            d.workers
        ),
        format!("sysctl -w net.ipv4.ip_local_port_range=\"{WIDE_RANGE}\""),
    )
}

/// `net.ipv4.tcp_migrate_req` when the port is shared: at 0, the clients
/// queued on a balancer that closes its listener are reset instead of
/// handed to another of the group (docs/scaling.md).
pub fn port_sharing(d: &Demand, h: &Host) -> Line {
    const WHAT: &str = "port sharing (net.ipv4.tcp_migrate_req)";
    let shown = h
        .migrate_req
        .map_or("absent".to_string(), |v| v.to_string());
    if !d.shares_port {
        return Line::ok(WHAT, format!("{shown}; not needed, the port is not shared"));
    }
    match h.migrate_req {
        Some(0) => Line::bad(
            Verdict::Warn,
            WHAT,
            "0: a balancer that closes resets the clients queued on it",
            "sysctl -w net.ipv4.tcp_migrate_req=1",
        ),
        Some(v) => Line::ok(WHAT, v.to_string()),
        None => Line {
            fix: None,
            ..Line::ok(
                WHAT,
                "absent (Linux before 5.14): a balancer that closes resets the clients queued on it",
            )
            .verdict(Verdict::Warn)
        },
    }
}

/// The workers' memory at the fullest ([`Demand::memory`]) beside what the
/// cgroup uses, against its limit.
pub fn cgroup_memory(d: &Demand, h: &Host) -> Line {
    const WHAT: &str = "memory of the cgroup";
    let need = d.memory();
    let detail = memory_detail(d);
    let Some(cgroup) = h.memory.as_ref().filter(|c| c.limit != Limit::Unlimited) else {
        return Line::ok(WHAT, format!("no limit; {detail}"));
    };
    let in_use = cgroup.current.unwrap_or(0);
    let numbers = format!(
        "{} ({}), {} in use; {detail}",
        mib(limit_bytes(cgroup.limit)),
        cgroup.file.display(),
        mib(in_use)
    );
    if cgroup.limit.allows(in_use + need) {
        return Line::ok(WHAT, numbers);
    }
    let enough = (in_use + need).div_ceil(1 << 20) << 20;
    let name = if cgroup.file.ends_with("memory.max") {
        "MemoryMax"
    } else {
        "MemoryLimit"
    };
    Line::bad(
        Verdict::Fail,
        WHAT,
        numbers,
        format!(
            "echo {enough} > {} ({name}={enough} in a systemd unit; or --workers {})",
            cgroup.file.display(),
            workers_within(d, limit_bytes(cgroup.limit).saturating_sub(in_use))
        ),
    )
}

/// The workers' memory at the fullest against `MemAvailable`.
pub fn available_memory(d: &Demand, h: &Host) -> Line {
    const WHAT: &str = "memory available (MemAvailable)";
    let need = d.memory();
    let detail = memory_detail(d);
    let Some(available) = h.mem_available else {
        return Line::ok(WHAT, format!("not readable here; {detail}"));
    };
    let numbers = format!("{}; {detail}", mib(available));
    if need <= available {
        return Line::ok(WHAT, numbers);
    }
    Line::bad(
        Verdict::Warn,
        WHAT,
        numbers,
        format!("--workers {}", workers_within(d, available)),
    )
}

/// `352 MiB needed at most (4096 workers × 88 KiB: stack 64 KiB, buffers 8
/// KiB, kernel stack 16 KiB)`.
fn memory_detail(d: &Demand) -> String {
    let conduit = if d.splice { "pipes" } else { "buffers" };
    format!(
        "{} needed at most ({} workers × {} KiB: stack {} KiB, {conduit} {} KiB, kernel stack {} \
         KiB)",
        mib(d.memory()),
        d.workers,
        d.memory_per_worker() / 1024,
        d.stack / 1024,
        d.conduit_bytes() / 1024,
        super::KERNEL_STACK / 1024
    )
}

/// The most workers whose memory fits in `bytes` (at least 1).
fn workers_within(d: &Demand, bytes: u64) -> u64 {
    (bytes / d.memory_per_worker().max(1)).max(1)
}

/// A byte limit's number (`u64::MAX` for none, for arithmetic only).
fn limit_bytes(limit: Limit) -> u64 {
    match limit {
        Limit::At(n) => n,
        Limit::Unlimited => u64::MAX,
    }
}

/// Bytes in MiB, rounded up: `352 MiB`.
fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes.div_ceil(1 << 20))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::host::{Cgroup, Rlimit};
    use super::*;

    /// 100 workers, 50 waiting, 64 KiB stacks, 4 KiB buffers, two
    /// backends checked, nothing else: 250 + 40 descriptors, 107 threads.
    fn demand() -> Demand {
        Demand {
            workers: 100,
            stack: 64 * 1024,
            waiting: 50,
            buffer: 4096,
            splice: false,
            backlog: 4096,
            shares_port: false,
            admin: false,
            access_log: false,
            backends: 2,
            loopback_backends: false,
            checks: true,
        }
    }

    fn rlimit(soft: u64, hard: u64) -> Option<Rlimit> {
        Some(Rlimit {
            soft: Limit::At(soft),
            hard: Limit::At(hard),
        })
    }

    #[test]
    fn the_fixture_asks_for() {
        let d = demand();
        assert_eq!(d.descriptors(), 100 * 2 + 50 + 64 + 3 + 1 + 2 + 32);
        assert_eq!(d.threads(), 100 + 4 + 1 + 2);
    }

    #[test]
    fn descriptors_fail_under_the_hard_limit_only() {
        let d = demand();
        let need = d.descriptors();
        let host = |soft, hard| Host {
            nofile: rlimit(soft, hard),
            ..Host::default()
        };
        let line = descriptors(&d, &host(need, need));
        assert_eq!(line.verdict, Verdict::Ok, "{line}");
        let line = descriptors(&d, &host(64, need));
        assert_eq!(line.verdict, Verdict::Ok, "raised at start-up: {line}");
        assert!(line.numbers.contains("raises the soft limit"), "{line}");
        let line = descriptors(&d, &host(need - 1, need - 1));
        assert_eq!(line.verdict, Verdict::Fail);
        assert_eq!(
            line.fix.as_deref(),
            Some("ulimit -n 352 (LimitNOFILE=352 in a systemd unit)")
        );
        assert!(line.numbers.contains(
            "352 needed (100 workers × 2, 50 waiting clients, 64 kept aside, 38 others)"
        ));
        let low_nr_open = Host {
            nr_open: Some(100),
            ..host(10, 10)
        };
        let line = descriptors(&d, &low_nr_open);
        assert!(line.fix.unwrap().starts_with("sysctl -w fs.nr_open=352"));
        let unlimited = Host {
            nofile: Some(Rlimit {
                soft: Limit::Unlimited,
                hard: Limit::Unlimited,
            }),
            ..Host::default()
        };
        assert_eq!(descriptors(&d, &unlimited).verdict, Verdict::Ok);
    }

    #[test]
    fn splice_counts_the_pipes() {
        let d = Demand {
            splice: true,
            ..demand()
        };
        let host = Host {
            nofile: rlimit(300, 300),
            ..Host::default()
        };
        let line = descriptors(&d, &host);
        assert_eq!(line.verdict, Verdict::Fail, "100 × 6 + 64 + 88 > 300");
        assert!(line
            .numbers
            .contains("752 needed (100 workers × 2 + 4 for its pipes"));
    }

    #[test]
    fn rlimit_nproc_binds_all_but_root() {
        let d = demand();
        let low = Host {
            nproc: rlimit(50, 1000),
            ..Host::default()
        };
        let line = user_threads(&d, &low);
        assert_eq!(line.verdict, Verdict::Fail);
        assert_eq!(
            line.fix.as_deref(),
            Some("ulimit -u 107 (LimitNPROC=107 in a systemd unit)")
        );
        let root = Host { root: true, ..low };
        assert_eq!(user_threads(&d, &root).verdict, Verdict::Ok);
        let enough = Host {
            nproc: rlimit(107, 107),
            ..Host::default()
        };
        assert_eq!(user_threads(&d, &enough).verdict, Verdict::Ok);
    }

    #[test]
    fn system_thread_limits_count_the_threads_running() {
        let d = demand();
        let host = Host {
            threads_max: Some(1000),
            pid_max: Some(1000),
            threads_now: Some(893),
            ..Host::default()
        };
        assert_eq!(threads_max(&d, &host).verdict, Verdict::Ok, "107 left");
        let busier = Host {
            threads_now: Some(894),
            ..host
        };
        let line = threads_max(&d, &busier);
        assert_eq!(line.verdict, Verdict::Fail);
        assert_eq!(line.numbers, "1000, 894 in use, 106 left; 107 needed");
        assert_eq!(
            line.fix.as_deref(),
            Some("sysctl -w kernel.threads-max=1024")
        );
        let line = pid_max(&d, &busier);
        assert_eq!(line.verdict, Verdict::Fail);
        assert_eq!(line.fix.as_deref(), Some("sysctl -w kernel.pid_max=1024"));
        let line = pid_max(&d, &Host::default());
        assert_eq!(line.verdict, Verdict::Ok);
        assert!(line.numbers.starts_with("not readable here"));
    }

    #[test]
    fn the_cgroup_task_limit_counts_its_tasks() {
        let d = demand();
        let file = PathBuf::from("/sys/fs/cgroup/system.slice/rodizio.service/pids.max");
        let host = |max, current| Host {
            tasks: Some(Cgroup {
                file: file.clone(),
                limit: max,
                current,
            }),
            ..Host::default()
        };
        assert_eq!(
            cgroup_tasks(&d, &host(Limit::At(117), Some(10))).verdict,
            Verdict::Ok
        );
        let line = cgroup_tasks(&d, &host(Limit::At(116), Some(10)));
        assert_eq!(line.verdict, Verdict::Fail);
        assert_eq!(
            line.fix.unwrap(),
            format!(
                "echo 117 > {} (TasksMax=117 in a systemd unit)",
                file.display()
            )
        );
        assert_eq!(
            cgroup_tasks(&d, &host(Limit::Unlimited, None)).verdict,
            Verdict::Ok
        );
        assert_eq!(
            cgroup_tasks(&d, &Host::default()).numbers,
            "no limit; 107 needed"
        );
    }

    #[test]
    fn a_backlog_over_somaxconn_is_a_warning() {
        let d = demand();
        let capped = Host {
            somaxconn: Some(128),
            ..Host::default()
        };
        let line = backlog(&d, &capped);
        assert_eq!(line.verdict, Verdict::Warn);
        assert_eq!(
            line.numbers,
            "128 < backlog 4096: the kernel queues at most 128 clients"
        );
        assert_eq!(
            line.fix.as_deref(),
            Some("sysctl -w net.core.somaxconn=4096")
        );
        let equal = Host {
            somaxconn: Some(4096),
            ..Host::default()
        };
        assert_eq!(backlog(&d, &equal).verdict, Verdict::Ok);
    }

    #[test]
    fn the_port_range_gives_a_rate_per_backend() {
        let d = demand();
        let debian = Host {
            port_range: Some((32768, 60999)),
            ..Host::default()
        };
        // A stock range: the rate is told, not warned of (traffic, not
        // a setting, reaches it), nor is every start's log.
        let line = local_ports(&d, &debian);
        assert_eq!(line.verdict, Verdict::Ok, "{line}");
        assert!(
            line.numbers.starts_with(
                "32768-60999, 28232 ports per backend address: 470 new connections/s to each"
            ),
            "{line}"
        );
        assert!(
            line.numbers
                .ends_with("; for more, net.ipv4.ip_local_port_range=\"1024 65535\""),
            "{line}"
        );
        let wide = Host {
            port_range: Some((1024, 65535)),
            ..Host::default()
        };
        let line = local_ports(&d, &wide);
        assert_eq!(line.verdict, Verdict::Ok, "{line}");
        assert!(line.numbers.contains("1075 new connections/s"));
        // More workers than ports: one backend cannot take them all.
        let many = Demand {
            workers: 65536,
            ..demand()
        };
        let line = local_ports(&many, &wide);
        assert_eq!(line.verdict, Verdict::Warn);
        assert!(
            line.numbers.contains("fewer than the 65536 workers"),
            "{line}"
        );
        assert_eq!(
            line.fix.as_deref(),
            Some("sysctl -w net.ipv4.ip_local_port_range=\"1024 65535\"")
        );
        let reuse = Host {
            tw_reuse: Some(1),
            ..debian
        };
        assert_eq!(local_ports(&d, &reuse).verdict, Verdict::Ok);
        // The kernel's default reuse (2) covers loopback backends only.
        let loopback_only = Host {
            tw_reuse: Some(2),
            port_range: Some((32768, 60999)),
            ..Host::default()
        };
        let crowded = Demand {
            workers: 30_000,
            ..demand()
        };
        assert_eq!(local_ports(&crowded, &loopback_only).verdict, Verdict::Warn);
        let on_loopback = Demand {
            loopback_backends: true,
            ..demand()
        };
        let line = local_ports(&on_loopback, &loopback_only);
        assert_eq!(line.verdict, Verdict::Ok, "{line}");
        assert!(line.numbers.ends_with("tcp_tw_reuse=2"), "{line}");
    }

    #[test]
    fn migrate_req_matters_only_for_a_shared_port() {
        let off = Host {
            migrate_req: Some(0),
            ..Host::default()
        };
        assert_eq!(port_sharing(&demand(), &off).verdict, Verdict::Ok);
        let shared = Demand {
            shares_port: true,
            ..demand()
        };
        let line = port_sharing(&shared, &off);
        assert_eq!(line.verdict, Verdict::Warn);
        assert_eq!(
            line.fix.as_deref(),
            Some("sysctl -w net.ipv4.tcp_migrate_req=1")
        );
        let on = Host {
            migrate_req: Some(1),
            ..Host::default()
        };
        assert_eq!(port_sharing(&shared, &on).verdict, Verdict::Ok);
        let old_kernel = port_sharing(&shared, &Host::default());
        assert_eq!(old_kernel.verdict, Verdict::Warn);
        assert_eq!(old_kernel.fix, None);
    }

    /// 100 workers × 88 KiB = 8.6 MiB: a 16 MiB cgroup with 8 MiB in use
    /// is too small; 40 MiB available is enough, 8 MiB is not.
    #[test]
    fn memory_against_the_cgroup_and_what_is_available() {
        let d = demand();
        assert_eq!(d.memory(), 100 * 88 * 1024);
        let file = PathBuf::from("/sys/fs/cgroup/rodizio/memory.max");
        let host = |limit, current| Host {
            memory: Some(Cgroup {
                file: file.clone(),
                limit,
                current,
            }),
            ..Host::default()
        };
        let line = cgroup_memory(&d, &host(Limit::At(16 << 20), Some(8 << 20)));
        assert_eq!(line.verdict, Verdict::Fail, "{line}");
        assert!(
            line.numbers.ends_with(
                "9 MiB needed at most (100 workers × 88 KiB: stack 64 KiB, buffers 8 KiB, \
                 kernel stack 16 KiB)"
            ),
            "{line}"
        );
        let fix = line.fix.unwrap();
        assert!(
            fix.starts_with(&format!("echo 17825792 > {}", file.display())),
            "{fix}"
        );
        assert!(fix.contains("MemoryMax=17825792"), "{fix}");
        assert!(fix.ends_with("or --workers 93)"), "8 MiB / 88 KiB: {fix}");
        let roomy = host(Limit::At(64 << 20), Some(8 << 20));
        assert_eq!(cgroup_memory(&d, &roomy).verdict, Verdict::Ok);
        assert_eq!(
            cgroup_memory(&d, &host(Limit::Unlimited, None)).verdict,
            Verdict::Ok
        );

        let available = |bytes| Host {
            mem_available: Some(bytes),
            ..Host::default()
        };
        assert_eq!(
            available_memory(&d, &available(40 << 20)).verdict,
            Verdict::Ok
        );
        let line = available_memory(&d, &available(8 << 20));
        assert_eq!(line.verdict, Verdict::Warn);
        assert_eq!(line.fix.as_deref(), Some("--workers 93"));
    }

    #[test]
    fn splice_memory_counts_two_full_pipes() {
        let d = Demand {
            splice: true,
            ..demand()
        };
        assert_eq!(d.memory_per_worker(), (64 + 128 + 16) * 1024);
        let line = available_memory(&d, &Host::default());
        assert!(line.numbers.contains("pipes 128 KiB"), "{line}");
    }
}
