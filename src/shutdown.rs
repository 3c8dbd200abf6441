//! Stopping the balancer: a trigger that any thread can pull.
//!
//! [`Shutdown`] is a cloneable handle. [`Shutdown::trigger`] sets a flag,
//! disconnects a `crossbeam-channel` (so every thread blocked in
//! `select!`/`recv` on [`Shutdown::receiver`] wakes at once) and runs the
//! hooks registered by the threads that sleep where no channel reaches: the
//! accept loop, in a blocking `accept(2)`, is woken by a connection to its
//! own listening address, and, if it waits for room in a full queue, by the
//! queue being closed. The library never installs signal handlers itself:
//! the caller owns the trigger, so tests stop a balancer by calling
//! `trigger()`, with no signal involved.
//!
//! The binary pulls it from its signal thread ([`crate::signals`]) on
//! SIGINT or SIGTERM.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C loops until killed, cutting every connection.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

/// A cloneable stop button.
#[derive(Debug, Clone)]
pub struct Shutdown {
    inner: Arc<Inner>,
}

struct Inner {
    triggered: AtomicBool,
    /// Dropped on trigger; receivers then see "disconnected" at once.
    sender: Mutex<Option<Sender<()>>>,
    receiver: Receiver<()>,
    /// What to run on trigger, once: the wake-ups of threads that sleep
    /// where the channel cannot reach them.
    hooks: Mutex<Vec<Hook>>,
}

/// A wake-up run once on trigger.
type Hook = Box<dyn FnOnce() + Send>;

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shutdown")
            .field("triggered", &self.triggered)
            .field("hooks", &self.hooks.lock().len())
            .finish()
    }
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown::new()
    }
}

impl Shutdown {
    /// A fresh, untriggered handle.
    pub fn new() -> Shutdown {
        let (sender, receiver) = crossbeam_channel::bounded(0);
        Shutdown {
            inner: Arc::new(Inner {
                triggered: AtomicBool::new(false),
                sender: Mutex::new(Some(sender)),
                receiver,
                hooks: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Starts the shutdown. Calling it again does nothing more.
    pub fn trigger(&self) {
        if self.inner.triggered.swap(true, Ordering::SeqCst) {
            return;
        }
        self.inner.sender.lock().take();
        // Taken under the lock, run after it: a hook may take a while (a
        // connect) and must not hold up `on_trigger` callers.
        let hooks = std::mem::take(&mut *self.inner.hooks.lock());
        for hook in hooks {
            hook();
        }
    }

    /// Whether [`trigger`](Self::trigger) was called.
    pub fn is_triggered(&self) -> bool {
        self.inner.triggered.load(Ordering::SeqCst)
    }

    /// A receiver that never gets a message and disconnects on trigger: use
    /// it in `select!` or `recv_timeout` to sleep until shutdown.
    pub fn receiver(&self) -> Receiver<()> {
        self.inner.receiver.clone()
    }

    /// Runs `hook` once on trigger, or now if already triggered.
    ///
    /// The flag is read under the hooks' lock, and `trigger` sets it before
    /// taking that lock: so either `trigger` will find the hook, or this call
    /// sees the flag and runs it itself, never neither.
    pub(crate) fn on_trigger(&self, hook: impl FnOnce() + Send + 'static) {
        let mut hooks = self.inner.hooks.lock();
        if !self.is_triggered() {
            hooks.push(Box::new(hook));
            return;
        }
        drop(hooks);
        hook();
    }

    /// A new handle triggered when this one is (and on its own too): a
    /// part that may be stopped alone, such as one service's accept loop.
    /// The parent holds it weakly, so a child dropped costs nothing more
    /// than its hook's few bytes.
    pub fn child(&self) -> Shutdown {
        let child = Shutdown::new();
        let weak = Arc::downgrade(&child.inner);
        self.on_trigger(move || {
            if let Some(inner) = weak.upgrade() {
                Shutdown { inner }.trigger();
            }
        });
        child
    }

    /// Wakes a blocking `accept(2)` on `addr` on trigger: a connection is
    /// enough to make it return; the accept loop sees the flag and drops it.
    pub(crate) fn wake_on_trigger(&self, addr: SocketAddr) {
        self.on_trigger(move || {
            let _ = TcpStream::connect_timeout(&reachable(addr), Duration::from_secs(1));
        });
    }
}

/// The address to connect to for a listener bound to `addr`: an unspecified
/// address (`0.0.0.0`, `::`) is reached through loopback.
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), addr.port())
        }
        _ => addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn trigger_disconnects_receivers() {
        let s = Shutdown::new();
        let rx = s.receiver();
        assert!(rx.recv_timeout(Duration::from_millis(10)).is_err());
        assert!(!s.is_triggered());
        s.clone().trigger();
        assert!(s.is_triggered());
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected)
        );
    }

    #[test]
    fn hooks_run_once_whether_registered_before_or_after_the_trigger() {
        use std::sync::atomic::AtomicUsize;
        let s = Shutdown::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = || {
            let runs = Arc::clone(&runs);
            move || {
                runs.fetch_add(1, Ordering::SeqCst);
            }
        };
        s.on_trigger(counter());
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        s.trigger();
        s.trigger();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        s.on_trigger(counter());
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn trigger_wakes_a_blocked_accept() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = Shutdown::new();
        s.wake_on_trigger(listener.local_addr().unwrap());
        let t = std::thread::spawn(move || listener.accept().is_ok());
        s.trigger();
        assert!(t.join().unwrap());
    }
}
