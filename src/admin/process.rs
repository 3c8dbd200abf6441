//! The standard `process_*` series every Prometheus client library exports
//! (start time, open descriptors and their limit, resident and virtual
//! memory, threads, CPU seconds), read from `/proc/self` at each scrape, so
//! dashboards made for any exporter work here unchanged.
//!
//! Runs on the admin thread that answers `/metrics`; reads a few small
//! files and lists `/proc/self/fd`, and touches nothing the workers use.
//! Off Linux (no `/proc`), the series are left out rather than made up.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::system;

/// What `/proc/self` says about this process now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessNow {
    /// When it started, in seconds since the Unix epoch.
    pub start_time: f64,
    /// CPU time used, user and system, in seconds.
    pub cpu_seconds: f64,
    /// Descriptors open now.
    pub open_fds: u64,
    /// Its open-files limit (the soft one, which the kernel enforces).
    pub max_fds: u64,
    /// Resident memory, in bytes.
    pub resident_bytes: u64,
    /// Virtual memory, in bytes.
    pub virtual_bytes: u64,
    /// Threads now.
    pub threads: u64,
}

/// Reads [`ProcessNow`]; `None` when `/proc` cannot be read.
pub fn read() -> Option<ProcessNow> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The name, in parentheses, may hold spaces: the fields after it are
    // counted from the last `)`; the first of them is field 3 (`state`).
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    // SAFETY: sysconf only reads a system constant.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    let boot = boot_time()?;
    Some(ProcessNow {
        start_time: boot as f64 + field(22)? as f64 / ticks,
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        open_fds: system::open_descriptors()?,
        max_fds: system::nofile_limit()?,
        resident_bytes: field(24)? * page.max(1) as u64,
        virtual_bytes: field(23)?,
        threads: field(20)?,
    })
}

/// The system's boot time, seconds since the Unix epoch (`btime`).
fn boot_time() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The collector of the `process_*` series (registered without the
/// `rodizio_` prefix: these names are the same in every exporter).
#[derive(Debug)]
pub(super) struct Process;

impl Collector for Process {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(p) = read() else {
            return Ok(());
        };
        let gauges: [(&str, &str, f64); 6] = [
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                p.start_time,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                p.open_fds as f64,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                p.max_fds as f64,
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                p.resident_bytes as f64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                p.virtual_bytes as f64,
            ),
            (
                "process_threads",
                "Number of OS threads in the process.",
                p.threads as f64,
            ),
        ];
        let cpu = ConstCounter::new(p.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        for (name, help, value) in gauges {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_self_reads_sensible_values() {
        let p = read().expect("/proc/self");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // Started in the last day, not in the future (a second of slack
        // for the clock ticks' rounding).
        assert!(
            p.start_time <= now + 1.0 && p.start_time > now - 86_400.0,
            "{p:?}"
        );
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let with_one_more = read().unwrap().open_fds;
        drop(file);
        assert!(with_one_more >= 4 && with_one_more <= p.max_fds, "{p:?}");
        assert!(p.threads >= 1 && p.resident_bytes > 1 << 20, "{p:?}");
        assert!(p.virtual_bytes >= p.resident_bytes, "{p:?}");
    }
}
