//! The CPU time of the test's own balancer threads, read from
//! `/proc/self/task`: for the tests in a binary of their own that bound
//! what waiting connections cost (no other test's threads run there).

#![allow(dead_code)]

use std::thread;
use std::time::Duration;

/// The threads of this process named `rodizio-worker`: each one's id and
/// its folder in `/proc/self/task`.
fn workers() -> Vec<(i32, std::path::PathBuf)> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter_map(|task| {
            let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
            let tid = task.file_name().to_str()?.parse::<i32>().ok()?;
            (comm.trim() == "rodizio-worker").then(|| (tid, task.path()))
        })
        .collect()
}

/// CPU time used so far by the threads named `rodizio-worker`, read from
/// each thread's own CPU clock (nanoseconds: the clock ticks of
/// `/proc/*/stat` are rounded down per thread, and a thousand threads that
/// each ran a few milliseconds would count as none).
pub fn worker_cpu() -> Duration {
    let mut total = Duration::ZERO;
    for (tid, _) in workers() {
        // The thread's CPU clock (the kernel's MAKE_THREAD_CPUCLOCK:
        // CPUCLOCK_SCHED | CPUCLOCK_PERTHREAD_MASK).
        let clock = (!tid << 3) | 6;
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is valid for the call; a thread that exited in
        // the meantime makes it fail, and counts as nothing.
        if unsafe { libc::clock_gettime(clock, &mut ts) } == 0 {
            total += Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
        }
    }
    total
}

/// CPU time the workers use over `window` (a measuring window: nothing
/// waits on it for ordering).
pub fn worker_cpu_over(window: Duration) -> Duration {
    let before = worker_cpu();
    thread::sleep(window);
    worker_cpu().saturating_sub(before)
}

/// Times the threads named `rodizio-worker` have gone to sleep so far
/// (`voluntary_ctxt_switches` in each thread's `status`): each wait a
/// worker makes (a `poll(2)` with a timeout, a pause) ends in one, so
/// this counts their looks; unlike their CPU time, it does not grow when
/// the machine is busy with other work.
pub fn worker_sleeps() -> u64 {
    workers()
        .into_iter()
        .filter_map(|(_, task)| std::fs::read_to_string(task.join("status")).ok())
        .filter_map(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|n| n.trim().parse::<u64>().ok())
        })
        .sum()
}

/// [`worker_sleeps`] over `window`, and the CPU time the workers used in
/// it (a measuring window: nothing waits on it for ordering).
pub fn worker_sleeps_over(window: Duration) -> (u64, Duration) {
    let (sleeps, cpu) = (worker_sleeps(), worker_cpu());
    thread::sleep(window);
    (
        worker_sleeps().saturating_sub(sleeps),
        worker_cpu().saturating_sub(cpu),
    )
}
