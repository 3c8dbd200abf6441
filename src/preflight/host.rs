//! What this host gives, read once: resource limits (`getrlimit(2)`),
//! kernel settings (`/proc/sys`), the threads running (`/proc/loadavg`),
//! available memory (`/proc/meminfo`) and the cgroup's limits (v2, or the
//! v1 `pids` and `memory` controllers).
//!
//! A value that cannot be read (another system, a `/proc` hidden by a
//! sandbox) is `None`, and its check says so rather than guessing.
//!
//! # Threads
//!
//! Read on the main thread by [`Host::read`]; the result is plain data.
//! No C counterpart.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

/// A limit the host sets: a number, or none at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// At most this many (descriptors, threads, bytes).
    At(u64),
    /// No limit (`RLIM_INFINITY`, a cgroup's `max`).
    Unlimited,
}

impl Limit {
    /// Whether `n` fits under the limit.
    pub fn allows(self, n: u64) -> bool {
        match self {
            Limit::At(max) => n <= max,
            Limit::Unlimited => true,
        }
    }

    /// The tighter of two limits.
    pub fn min(self, other: Limit) -> Limit {
        match (self, other) {
            (Limit::At(a), Limit::At(b)) => Limit::At(a.min(b)),
            (Limit::At(a), Limit::Unlimited) | (Limit::Unlimited, Limit::At(a)) => Limit::At(a),
            (Limit::Unlimited, Limit::Unlimited) => Limit::Unlimited,
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::At(n) => write!(f, "{n}"),
            Limit::Unlimited => f.write_str("unlimited"),
        }
    }
}

/// A resource limit's soft value (what is enforced) and hard value (how
/// far an unprivileged process may raise the soft one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimit {
    /// The enforced limit.
    pub soft: Limit,
    /// The ceiling of the soft limit.
    pub hard: Limit,
}

/// One cgroup limit: the tightest among this process's cgroup and its
/// ancestors, with the file that sets it (for the fix) and what is in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    /// The file holding the tightest limit (`.../pids.max`).
    pub file: PathBuf,
    /// Its value.
    pub limit: Limit,
    /// What the cgroup uses now (tasks, bytes), if readable.
    pub current: Option<u64>,
}

/// What this host gives, as plain numbers; `None` where unreadable.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Host {
    /// `RLIMIT_NOFILE`: open files of this process.
    pub nofile: Option<Rlimit>,
    /// `fs.nr_open`: the highest hard `RLIMIT_NOFILE` the kernel allows.
    pub nr_open: Option<u64>,
    /// `RLIMIT_NPROC`: threads of all this user's processes together.
    pub nproc: Option<Rlimit>,
    /// Running as root, whom the kernel exempts from `RLIMIT_NPROC`.
    pub root: bool,
    /// `kernel.threads-max`: threads on the whole system.
    pub threads_max: Option<u64>,
    /// `kernel.pid_max`: one more than the highest PID (a thread takes one).
    pub pid_max: Option<u64>,
    /// Threads running on the system now (`/proc/loadavg`).
    pub threads_now: Option<u64>,
    /// The cgroup's `pids.max`: its tasks (threads) together.
    pub tasks: Option<Cgroup>,
    /// `net.core.somaxconn`: the cap on any `listen(2)` backlog.
    pub somaxconn: Option<u64>,
    /// `net.ipv4.ip_local_port_range`: the ports `connect(2)` picks from.
    pub port_range: Option<(u64, u64)>,
    /// `net.ipv4.tcp_tw_reuse`: 1 lets a connect reuse a port in TIME_WAIT.
    pub tw_reuse: Option<u64>,
    /// `net.ipv4.tcp_migrate_req`: 1 hands the clients queued on a closing
    /// `SO_REUSEPORT` listener to another of its group.
    pub migrate_req: Option<u64>,
    /// The cgroup's memory limit (`memory.max`, or v1's
    /// `memory.limit_in_bytes`).
    pub memory: Option<Cgroup>,
    /// `MemAvailable` of `/proc/meminfo`, in bytes.
    pub mem_available: Option<u64>,
}

impl Host {
    /// Reads this host now.
    pub fn read() -> Host {
        let cgroups = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let root = Path::new(CGROUP_ROOT);
        Host {
            nofile: rlimit(libc::RLIMIT_NOFILE),
            nr_open: sysctl("fs/nr_open"),
            nproc: rlimit(libc::RLIMIT_NPROC),
            // SAFETY: getuid has no preconditions and cannot fail.
            root: unsafe { libc::getuid() } == 0,
            threads_max: sysctl("kernel/threads-max"),
            pid_max: sysctl("kernel/pid_max"),
            threads_now: fs::read_to_string("/proc/loadavg")
                .ok()
                .and_then(|t| loadavg_threads(&t)),
            tasks: cgroup_limit(root, &cgroups, "pids", ("pids.max", "pids.current")),
            somaxconn: sysctl("net/core/somaxconn"),
            port_range: fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
                .ok()
                .and_then(|t| port_range(&t)),
            tw_reuse: sysctl("net/ipv4/tcp_tw_reuse"),
            migrate_req: sysctl("net/ipv4/tcp_migrate_req"),
            memory: cgroup_limit(root, &cgroups, "memory", ("memory.max", "memory.current"))
                .or_else(|| {
                    let v1 = ("memory.limit_in_bytes", "memory.usage_in_bytes");
                    cgroup_limit(root, &cgroups, "memory", v1)
                }),
            mem_available: fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|t| mem_available(&t)),
        }
    }
}

/// Where the cgroup file systems are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// A cgroup v1 value at or above this means "no limit" (the kernel shows
/// `PAGE_COUNTER_MAX` pages in bytes, about 2^63).
const V1_UNLIMITED: u64 = 1 << 62;

/// `resource`'s soft and hard limits.
fn rlimit(resource: libc::__rlimit_resource_t) -> Option<Rlimit> {
    // SAFETY: rlimit is plain data, filled by getrlimit.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid resource and a pointer to a live rlimit.
    if unsafe { libc::getrlimit(resource, &mut limit) } != 0 {
        return None;
    }
    let value = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY {
            Limit::Unlimited
        } else {
            Limit::At(v)
        }
    };
    Some(Rlimit {
        soft: value(limit.rlim_cur),
        hard: value(limit.rlim_max),
    })
}

/// A number from `/proc/sys/NAME`.
fn sysctl(name: &str) -> Option<u64> {
    fs::read_to_string(Path::new("/proc/sys").join(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The threads running on the system: the fourth field of `/proc/loadavg`,
/// `running/total`.
pub fn loadavg_threads(text: &str) -> Option<u64> {
    text.split_whitespace()
        .nth(3)?
        .split('/')
        .nth(1)?
        .parse()
        .ok()
}

/// `ip_local_port_range`: two numbers, low and high.
pub fn port_range(text: &str) -> Option<(u64, u64)> {
    let mut words = text.split_whitespace().map(str::parse::<u64>);
    match (words.next()?, words.next()?) {
        (Ok(low), Ok(high)) if low <= high => Some((low, high)),
        _ => None,
    }
}

/// `MemAvailable:  23894144 kB` in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The directory of this process's cgroup for `controller`, from
/// `/proc/self/cgroup`'s text: the v2 line (`0::/PATH`, under `root`)
/// when `root` is a v2 mount, else the v1 line naming the controller
/// (`4:memory:/PATH`, under `root/controller`).
pub fn cgroup_dir(root: &Path, proc_cgroup: &str, controller: &str) -> Option<PathBuf> {
    let under = |base: PathBuf, path: &str| base.join(path.trim_start_matches('/'));
    let v2 = root.join("cgroup.controllers").exists();
    for line in proc_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(names), Some(path)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if v2 && names.is_empty() {
            return Some(under(root.to_path_buf(), path));
        }
        if !v2 && names.split(',').any(|n| n == controller) {
            return Some(under(root.join(controller), path));
        }
    }
    None
}

/// The tightest `files.0` of the cgroup directory for `controller` and its
/// ancestors up to the mount, with `files.1` (what is in use) read beside
/// the cgroup's own. `None` when no such file is there.
fn cgroup_limit(
    root: &Path,
    proc_cgroup: &str,
    controller: &str,
    (limit_file, current_file): (&str, &str),
) -> Option<Cgroup> {
    let dir = cgroup_dir(root, proc_cgroup, controller)?;
    let mount = if root.join("cgroup.controllers").exists() {
        root.to_path_buf()
    } else {
        root.join(controller)
    };
    let mut best: Option<Cgroup> = None;
    let mut at = Some(dir.as_path());
    while let Some(d) = at.filter(|d| d.starts_with(&mount)) {
        let file = d.join(limit_file);
        if let Some(limit) = fs::read_to_string(&file)
            .ok()
            .and_then(|t| cgroup_value(&t))
        {
            let current = fs::read_to_string(d.join(current_file))
                .ok()
                .and_then(|t| t.trim().parse().ok());
            let tighter = match &best {
                None => true,
                Some(b) => limit.min(b.limit) != b.limit,
            };
            if tighter {
                best = Some(Cgroup {
                    file,
                    limit,
                    current,
                });
            }
        }
        at = d.parent();
    }
    best
}

/// A cgroup limit file's value: `max`, a number, or v1's near-2^63 for
/// none.
pub fn cgroup_value(text: &str) -> Option<Limit> {
    match text.trim() {
        "max" => Some(Limit::Unlimited),
        number => number.parse::<u64>().ok().map(|n| {
            if n >= V1_UNLIMITED {
                Limit::Unlimited
            } else {
                Limit::At(n)
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_parsed() {
        assert_eq!(loadavg_threads("0.52 0.58 0.59 3/412 12345\n"), Some(412));
        assert_eq!(loadavg_threads("garbage"), None);
        assert_eq!(port_range("32768\t60999\n"), Some((32768, 60999)));
        assert_eq!(port_range("60999 32768"), None);
        let meminfo = "MemTotal:  32000000 kB\nMemAvailable:   23894144 kB\n";
        assert_eq!(mem_available(meminfo), Some(23894144 * 1024));
        assert_eq!(cgroup_value("max\n"), Some(Limit::Unlimited));
        assert_eq!(cgroup_value("4915\n"), Some(Limit::At(4915)));
        assert_eq!(
            cgroup_value("9223372036854771712"),
            Some(Limit::Unlimited),
            "v1's no limit"
        );
        assert_eq!(cgroup_value(""), None);
    }

    #[test]
    fn limits_compare() {
        assert!(Limit::At(10).allows(10) && !Limit::At(10).allows(11));
        assert!(Limit::Unlimited.allows(u64::MAX));
        assert_eq!(Limit::At(3).min(Limit::Unlimited), Limit::At(3));
        assert_eq!(Limit::At(3).min(Limit::At(2)), Limit::At(2));
        assert_eq!(Limit::Unlimited.to_string(), "unlimited");
    }

    /// A v2 tree and a v1 tree, made in a temporary directory: the
    /// tightest limit among the cgroup and its ancestors is the one found.
    #[test]
    fn the_tightest_cgroup_limit_is_found() {
        let base = std::env::temp_dir().join(format!("rodizio-cgroup-{}", std::process::id()));
        let v2 = base.join("v2");
        let leaf = v2.join("system.slice/rodizio.service");
        fs::create_dir_all(&leaf).unwrap();
        fs::write(v2.join("cgroup.controllers"), "pids memory\n").unwrap();
        fs::write(v2.join("system.slice/pids.max"), "5000\n").unwrap();
        fs::write(leaf.join("pids.max"), "max\n").unwrap();
        fs::write(leaf.join("pids.current"), "7\n").unwrap();
        let proc_cgroup = "0::/system.slice/rodizio.service\n";
        assert_eq!(cgroup_dir(&v2, proc_cgroup, "pids"), Some(leaf.clone()));
        let tasks = cgroup_limit(&v2, proc_cgroup, "pids", ("pids.max", "pids.current")).unwrap();
        assert_eq!(tasks.limit, Limit::At(5000));
        assert_eq!(tasks.file, v2.join("system.slice/pids.max"));
        assert_eq!(tasks.current, None, "read beside the limit's file");
        assert!(cgroup_limit(&v2, proc_cgroup, "memory", ("memory.max", "x")).is_none());

        let v1 = base.join("v1");
        let memory = v1.join("memory/box");
        fs::create_dir_all(&memory).unwrap();
        fs::write(memory.join("memory.limit_in_bytes"), "268435456\n").unwrap();
        fs::write(memory.join("memory.usage_in_bytes"), "1000\n").unwrap();
        fs::write(
            v1.join("memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        let proc_cgroup = "5:cpu,cpuacct:/\n4:memory:/box\n0::/\n";
        let files = ("memory.limit_in_bytes", "memory.usage_in_bytes");
        let mem = cgroup_limit(&v1, proc_cgroup, "memory", files).unwrap();
        assert_eq!(mem.limit, Limit::At(256 << 20));
        assert_eq!(mem.current, Some(1000));
        fs::remove_dir_all(&base).unwrap();
    }

    /// On this machine: the open-files limit is always readable on Linux.
    #[test]
    fn this_host_reads() {
        let host = Host::read();
        assert!(host.nofile.is_some());
        assert!(host.nproc.is_some());
    }
}
