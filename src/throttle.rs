//! A log line at most once per interval for an event that can repeat
//! thousands of times a second (a failed `accept(2)` when file descriptors
//! run out, a client dropped after waiting too long in the queue): the
//! first occurrence is logged at once, the following ones are only counted
//! until the interval has passed, and the next line says how many there
//! were.
//!
//! A leaf. [`LogThrottle`] is `Sync` and lock-free (two atomics), so any
//! thread may report to it: the accept loop, every worker.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C `exit()`s on the first such error.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a throttled event may be logged; see the module docs.
#[derive(Debug)]
pub struct LogThrottle {
    /// Nanoseconds between two lines.
    interval: u64,
    /// Ticks are nanoseconds since this instant.
    epoch: Instant,
    /// The tick from which the next line may be logged (0: at once).
    next_at: AtomicU64,
    /// Events since the last line that were not logged.
    suppressed: AtomicU64,
}

impl LogThrottle {
    /// A throttle letting one line through per `interval`.
    pub fn new(interval: Duration) -> LogThrottle {
        LogThrottle {
            interval: u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX),
            epoch: Instant::now(),
            next_at: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Reports one event at `now`. `Some(n)` when the caller should log a
    /// line now, `n` being the events left unlogged since the previous
    /// line; `None` when this one is only counted.
    ///
    /// Of several threads reporting at the same moment, exactly one wins
    /// the compare-and-swap and logs; the others count.
    pub fn event(&self, now: Instant) -> Option<u64> {
        let t =
            u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        let next = self.next_at.load(Ordering::Relaxed);
        if t >= next
            && self
                .next_at
                .compare_exchange(
                    next,
                    t.saturating_add(self.interval),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::AcqRel));
        }
        self.suppressed.fetch_add(1, Ordering::AcqRel);
        None
    }

    /// Time from `now` until [`event`](Self::event) would say log: what a
    /// thread with nothing else to do may sleep before its next line.
    pub fn wait(&self, now: Instant) -> Duration {
        let t =
            u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(self.next_at.load(Ordering::Relaxed).saturating_sub(t))
    }

    /// A throttle like [`LogThrottle::new`] whose clock starts at `epoch`
    /// instead of now, for a caller that passes its own `now` to
    /// [`event`](LogThrottle::event): an event at `epoch` is logged, and the
    /// next line may go exactly `interval` after it. An event before `epoch`
    /// counts as at `epoch`.
    pub fn since(interval: Duration, epoch: Instant) -> LogThrottle {
        LogThrottle {
            interval: u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX),
            epoch,
            next_at: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether an event at `now` would be logged: the interval since the
    /// last line has passed (or none was logged yet). A throttle that is
    /// due holds nothing but its count, so a keyed set of throttles may
    /// forget it.
    pub fn is_due(&self, now: Instant) -> bool {
        let t =
            u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        t >= self.next_at.load(Ordering::Relaxed)
    }
}

/// `" (N more since the last such line)"` when `n` events went unlogged,
/// empty otherwise: the tail of a throttled log line.
pub fn more(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} more since the last such line)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_the_count_of_the_rest() {
        let throttle = LogThrottle::new(Duration::from_secs(1));
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        assert_eq!(throttle.event(ms(0)), Some(0));
        let logged = (1..1000)
            .filter(|&n| throttle.event(ms(n)).is_some())
            .count();
        assert_eq!(logged, 0);
        assert_eq!(throttle.event(ms(1000)), Some(999));
        assert_eq!(throttle.event(ms(1001)), None);
        assert_eq!(throttle.event(ms(5000)), Some(1));
        assert_eq!(more(0), "");
        assert_eq!(more(3), " (3 more since the last such line)");
    }

    #[test]
    fn since_starts_the_clock_at_its_epoch_and_is_due_says_when_a_line_may_go() {
        let t0 = Instant::now();
        let throttle = LogThrottle::since(Duration::from_secs(10), t0);
        let s = |n| t0 + Duration::from_secs(n);
        assert!(throttle.is_due(t0));
        assert_eq!(throttle.event(t0), Some(0));
        assert!(!throttle.is_due(s(9)));
        assert_eq!(throttle.event(s(9)), None);
        assert!(
            throttle.is_due(s(10)),
            "exactly one interval after the line"
        );
        assert_eq!(throttle.event(s(10)), Some(1));
        assert!(!throttle.is_due(s(19)));
    }

    #[test]
    fn threads_racing_log_once() {
        let throttle = std::sync::Arc::new(LogThrottle::new(Duration::from_secs(3600)));
        let now = Instant::now();
        let lines: usize = (0..4)
            .map(|_| {
                let throttle = std::sync::Arc::clone(&throttle);
                std::thread::spawn(move || {
                    (0..1000).filter(|_| throttle.event(now).is_some()).count()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(lines, 1);
        assert_eq!(throttle.suppressed.load(Ordering::Relaxed), 3999);
    }
}
