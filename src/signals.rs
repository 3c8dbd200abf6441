//! The signal thread: SIGINT and SIGTERM stop the balancer, SIGHUP asks for
//! a reload, SIGUSR1 for the logs to be reopened; none of them kills the
//! process by surprise.
//!
//! [`spawn`] blocks these signals in the calling thread, and so in every
//! thread it starts afterwards, then starts one thread that waits for them
//! with `sigwait(2)`: the reaction is then ordinary code (log, take a lock,
//! call a hook), so `main` calls it before any other thread exists. The first
//! SIGINT or SIGTERM triggers the [`Shutdown`], a second exits at once with
//! 128 + its number ([`exit`]); SIGHUP runs [`Signals::on_reload`]'s hook,
//! SIGUSR1 [`Signals::on_reopen`]'s; SIGUSR2 is logged and ignored. The exit
//! codes in detail: docs/internals.md, "Signals".
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C handles no signal, so all of them kill it.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::shutdown::Shutdown;

/// A hook the signal thread runs.
type Hook = Box<dyn Fn() + Send + Sync>;

/// The second SIGINT/SIGTERM, once one came (0 before).
static SECOND_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Held by whoever ends the process: [`exit`] or the signal thread on a
/// second signal, so the two never decide the exit code differently.
static EXIT_LOCK: Mutex<()> = parking_lot::const_mutex(());

/// Ends the process with `code`, or with 128 + N if a second SIGINT or
/// SIGTERM (number N) has arrived by now, while `stopping` (a first one
/// was handled): received by the signal thread, or still pending. So a
/// second signal that arrives before this call gives 128 + N, whether the
/// drain had finished or not; one that arrives during it is too late.
pub fn exit(code: u8, stopping: bool) -> ! {
    use std::io::Write;
    let _exiting = EXIT_LOCK.lock();
    let _ = std::io::stdout().flush();
    let second = match SECOND_SIGNAL.load(Ordering::SeqCst) {
        0 if stopping => pending_stop_signal(),
        0 => None,
        signo => Some(signo),
    };
    match second {
        Some(signo) => {
            log::warn!("second stop signal ({signo}): exiting with {}", 128 + signo);
            std::process::exit(128 + signo)
        }
        None => std::process::exit(i32::from(code)),
    }
}

/// A SIGINT or SIGTERM delivered to the process and not yet taken by the
/// signal thread.
fn pending_stop_signal() -> Option<libc::c_int> {
    // SAFETY: sigpending fills a sigset_t we own; sigismember reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        if libc::sigpending(&mut set) != 0 {
            return None;
        }
        [libc::SIGTERM, libc::SIGINT]
            .into_iter()
            .find(|&s| libc::sigismember(&set, s) == 1)
    }
}

/// The signals the thread waits for, with their names.
const SIGNALS: [(libc::c_int, &str); 5] = [
    (libc::SIGINT, "SIGINT"),
    (libc::SIGTERM, "SIGTERM"),
    (libc::SIGHUP, "SIGHUP"),
    (libc::SIGUSR1, "SIGUSR1"),
    (libc::SIGUSR2, "SIGUSR2"),
];

/// A handle on the signal thread, to set what SIGHUP and SIGUSR1 do once
/// the parts they act on exist.
#[derive(Clone, Default)]
pub struct Signals {
    hooks: Arc<Hooks>,
}

#[derive(Default)]
struct Hooks {
    reload: Mutex<Option<Hook>>,
    reopen: Mutex<Option<Hook>>,
}

impl std::fmt::Debug for Signals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signals").finish_non_exhaustive()
    }
}

impl Signals {
    /// What SIGHUP does from now on.
    pub fn on_reload(&self, hook: impl Fn() + Send + Sync + 'static) {
        *self.hooks.reload.lock() = Some(Box::new(hook));
    }

    /// What SIGUSR1 does from now on.
    pub fn on_reopen(&self, hook: impl Fn() + Send + Sync + 'static) {
        *self.hooks.reopen.lock() = Some(Box::new(hook));
    }

    /// Reacts to one signal as the thread does (the thread's body; tests
    /// call it directly).
    fn handle(&self, signo: libc::c_int, shutdown: &Shutdown) {
        let name = SIGNALS
            .iter()
            .find(|(n, _)| *n == signo)
            .map_or("signal", |(_, name)| name);
        match signo {
            libc::SIGINT | libc::SIGTERM => {
                if shutdown.is_triggered() {
                    SECOND_SIGNAL.store(signo, Ordering::SeqCst);
                    // Under the exit lock: if `main` is already exiting
                    // with its own code, this waits and `main` sees the
                    // flag set just above.
                    let _exiting = EXIT_LOCK.lock();
                    log::warn!("{name} again: exiting now");
                    std::process::exit(128 + signo);
                }
                log::info!("{name} received: stopping (send it again to exit now)");
                shutdown.trigger();
            }
            libc::SIGHUP => match &*self.hooks.reload.lock() {
                Some(hook) => {
                    log::info!("{name} received: reloading");
                    hook();
                }
                None => log::warn!(
                    "{name} received: reload is not supported here (no config file); going on"
                ),
            },
            libc::SIGUSR1 => match &*self.hooks.reopen.lock() {
                Some(hook) => {
                    log::info!("{name} received: reopening the log file");
                    hook();
                }
                None => log::info!("{name} received: ignored (no log file to reopen)"),
            },
            _ => log::info!("{name} received: ignored"),
        }
    }
}

/// Blocks SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 in the calling
/// thread (and so in every thread it spawns afterwards) and starts the
/// thread that waits for them. Call it from `main` before starting any
/// other thread.
///
/// # Errors
///
/// [`Error::Io`] when the signal mask cannot be set or the thread not spawned.
pub fn spawn(shutdown: Shutdown) -> Result<Signals> {
    // SAFETY: sigset_t is plain data; the libc calls only read and write it.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for (signo, _) in SIGNALS {
            libc::sigaddset(&mut set, signo);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(Error::io(
                "blocking signals",
                std::io::Error::from_raw_os_error(rc),
            ));
        }
        set
    };
    let signals = Signals::default();
    let handle = signals.clone();
    std::thread::Builder::new()
        .name("rodizio-signal".into())
        .spawn(move || loop {
            let mut signo: libc::c_int = 0;
            // SAFETY: `set` is a valid, initialised signal set.
            if unsafe { libc::sigwait(&set, &mut signo) } != 0 {
                continue;
            }
            handle.handle(signo, &shutdown);
        })
        .map_err(|e| Error::io("starting the signal thread", e))?;
    Ok(signals)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn hangup_runs_the_reload_hook_and_never_stops() {
        let signals = Signals::default();
        let shutdown = Shutdown::new();
        // No hook yet: logged, nothing else.
        signals.handle(libc::SIGHUP, &shutdown);
        assert!(!shutdown.is_triggered());
        let reloads = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&reloads);
        signals.on_reload(move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        signals.handle(libc::SIGHUP, &shutdown);
        signals.handle(libc::SIGHUP, &shutdown);
        assert_eq!(reloads.load(Ordering::SeqCst), 2);
        signals.handle(libc::SIGUSR1, &shutdown);
        signals.handle(libc::SIGUSR2, &shutdown);
        assert!(!shutdown.is_triggered());
        signals.handle(libc::SIGTERM, &shutdown);
        assert!(shutdown.is_triggered());
    }
}
