//! `sched_policy`: how the kernel schedules rodizio's threads.
//!
//! `normal` (the default) leaves the process as it was started: every
//! thread `SCHED_OTHER`, and nothing here runs. `batch` puts every thread
//! of the process under `SCHED_BATCH` once, at start-up, from the thread
//! that builds the balancer: the threads alive then are switched one by
//! one (`/proc/self/task`), and every thread made later inherits the
//! policy from its parent. `SCHED_BATCH` threads get the same share of
//! the CPU as before; what changes is that a thread woken by a packet does
//! not preempt the thread running on that CPU, it waits for the running
//! one's slice to end or for it to sleep. With a thread per connection on
//! a saturated CPU, that trades a preemption per message for fewer
//! context switches: docs/moving-bytes.md, "What costs the tail", has the
//! numbers. It needs no privilege.
//!
//! # Corresponds to the C article
//!
//! No C counterpart; the C runs as it is started (`chrt -b 0 ./lb` would
//! give it the same).

use std::fmt;
use std::io;
use std::str::FromStr;

/// The scheduling policy of every thread (`sched_policy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SchedPolicy {
    /// As started (`SCHED_OTHER` unless the caller chose otherwise).
    #[default]
    Normal,
    /// `SCHED_BATCH`: no wake-up preemption.
    Batch,
}

impl SchedPolicy {
    /// The name on the command line and in the config file.
    pub fn name(self) -> &'static str {
        match self {
            SchedPolicy::Normal => "normal",
            SchedPolicy::Batch => "batch",
        }
    }
}

impl fmt::Display for SchedPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for SchedPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<SchedPolicy, String> {
        match text {
            "normal" => Ok(SchedPolicy::Normal),
            "batch" => Ok(SchedPolicy::Batch),
            other => Err(format!(
                "unknown scheduling policy `{other}` (normal or batch)"
            )),
        }
    }
}

/// Puts every thread of the process under `policy`; `Normal` changes
/// nothing. A thread that ended while the list was walked is skipped.
///
/// # Errors
///
/// The first error of `sched_setscheduler(2)` other than "no such thread".
pub fn apply(policy: SchedPolicy) -> io::Result<()> {
    if policy == SchedPolicy::Normal {
        return Ok(());
    }
    for entry in std::fs::read_dir("/proc/self/task")? {
        let Some(tid) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        match set(tid, libc::SCHED_BATCH) {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            other => other?,
        }
    }
    Ok(())
}

/// The policy of thread `tid` (0: the calling thread).
pub fn current(tid: libc::pid_t) -> io::Result<libc::c_int> {
    // SAFETY: sched_getscheduler only reads its argument.
    let policy = unsafe { libc::sched_getscheduler(tid) };
    if policy < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(policy)
    }
}

fn set(tid: libc::pid_t, policy: libc::c_int) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param that outlives the call.
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back() {
        for p in [SchedPolicy::Normal, SchedPolicy::Batch] {
            assert_eq!(p.name().parse::<SchedPolicy>(), Ok(p));
        }
        let err = "fifo".parse::<SchedPolicy>().unwrap_err();
        assert!(err.contains("normal or batch"), "{err}");
    }

    #[test]
    fn batch_reaches_threads_alive_and_made_later() {
        // In a child process of its own, so the test binary's other
        // threads keep their policy.
        let me = std::env::current_exe().unwrap();
        if std::env::var_os("RODIZIO_SCHED_CHILD").is_some() {
            return;
        }
        let out = std::process::Command::new(me)
            .args(["--exact", "kernel_sched::tests::child_body", "--nocapture"])
            .env("RODIZIO_SCHED_CHILD", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("batch before=3 after=3"), "{text}");
    }

    #[test]
    fn child_body() {
        if std::env::var_os("RODIZIO_SCHED_CHILD").is_none() {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (told, hear) = std::sync::mpsc::channel();
        let before = std::thread::spawn(move || {
            // SAFETY: gettid has no arguments.
            told.send(unsafe { libc::gettid() }).unwrap();
            rx.recv().ok();
        });
        let tid = hear.recv().unwrap();
        assert_eq!(current(tid).unwrap(), libc::SCHED_OTHER);
        apply(SchedPolicy::Batch).unwrap();
        let early = current(tid).unwrap();
        let later = std::thread::spawn(|| current(0).unwrap()).join().unwrap();
        drop(tx);
        before.join().unwrap();
        println!("batch before={early} after={later}");
    }
}
