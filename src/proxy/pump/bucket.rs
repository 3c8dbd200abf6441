//! The token bucket of one direction of the pump, for a bandwidth cap per
//! connection (the service's upload and download rates, as nginx caps
//! them).
//!
//! A token is a byte that may be read from the direction's source. Tokens
//! come at the rate, up to a tenth of a second's worth (so a connection
//! quiet for a while cannot burst far above its rate); a read takes at
//! most the tokens there are. With fewer tokens than a chunk (the buffer
//! or the pipe, or the whole bucket if smaller), the direction stops
//! reading until a chunk's worth has come: the pump's `poll` then waits no
//! longer than that ([`Bucket::wait_ms`]), and the other direction flows
//! meanwhile. Only a capped direction has a bucket, so an uncapped one
//! never reads the clock.
//!
//! # Threads
//!
//! The worker serving the connection; nothing shared.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::time::{Duration, Instant};

const NANOS: u128 = 1_000_000_000;

/// One direction's tokens.
#[derive(Debug)]
pub(super) struct Bucket {
    /// Bytes per second (at least 1).
    rate: u64,
    /// Most tokens held: a tenth of a second's worth, at least one byte.
    burst: u64,
    tokens: u64,
    /// When `tokens` was last brought up to date.
    at: Instant,
    /// The buffer's or pipe's size, as the last read gave it.
    capacity: usize,
}

impl Bucket {
    /// A full bucket for `rate` bytes per second.
    pub(super) fn new(rate: u64, now: Instant) -> Bucket {
        let rate = rate.max(1);
        let burst = (rate / 10).max(1);
        Bucket {
            rate,
            burst,
            tokens: burst,
            at: now,
            capacity: usize::MAX,
        }
    }

    /// Adds the tokens come since the last time. The time of a partial
    /// token is kept, so that many short intervals add up exactly.
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_nanos();
        let add = elapsed * u128::from(self.rate) / NANOS;
        if add == 0 {
            return;
        }
        let room = u128::from(self.burst - self.tokens);
        if add >= room {
            self.tokens = self.burst;
            self.at = now;
        } else {
            self.tokens += add as u64;
            let spent = add * NANOS / u128::from(self.rate);
            self.at += Duration::from_nanos(spent as u64);
        }
    }

    /// The smallest read worth waking up for: a buffer or pipe full, or
    /// the whole bucket when it is smaller.
    fn chunk(&self) -> u64 {
        (self.capacity as u64).min(self.burst)
    }

    /// How many bytes may be read at `now`, at most `capacity`; 0 when
    /// fewer than a chunk's worth have come (then the direction waits).
    pub(super) fn allowance(&mut self, now: Instant, capacity: usize) -> usize {
        self.refill(now);
        self.capacity = capacity;
        if self.tokens < self.chunk() {
            return 0;
        }
        self.tokens.min(capacity as u64) as usize
    }

    /// Whether a chunk's worth of tokens is there at `now`.
    pub(super) fn ready(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.chunk()
    }

    /// `n` bytes were read.
    pub(super) fn spend(&mut self, n: usize) {
        self.tokens = self.tokens.saturating_sub(n as u64);
    }

    /// Milliseconds from `now` until a chunk's worth of tokens is there,
    /// rounded up, at least 1.
    pub(super) fn wait_ms(&mut self, now: Instant) -> i32 {
        self.refill(now);
        let missing = self.chunk().saturating_sub(self.tokens);
        let nanos = (u128::from(missing) * NANOS).div_ceil(u128::from(self.rate));
        let since = now.saturating_duration_since(self.at).as_nanos();
        let ms = nanos.saturating_sub(since).div_ceil(1_000_000);
        i32::try_from(ms).unwrap_or(i32::MAX).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Over ten simulated seconds at 1000 bytes a second, reading in chunks
    /// of 64 as soon as the bucket allows, 10 000 bytes pass (plus the
    /// first burst), whatever the step of the clock.
    #[test]
    fn the_rate_holds_over_time() {
        for step_us in [100, 1_000, 7_000, 33_000] {
            let start = Instant::now();
            let mut b = Bucket::new(1000, start);
            let mut read = 0u64;
            let mut t = Duration::ZERO;
            while t <= Duration::from_secs(10) {
                let n = b.allowance(start + t, 64);
                b.spend(n);
                read += n as u64;
                t += Duration::from_micros(step_us);
            }
            assert!(
                (10_000..=10_100).contains(&read),
                "step {step_us}us: {read}"
            );
        }
    }

    #[test]
    fn an_empty_bucket_waits_for_a_chunk() {
        let start = Instant::now();
        let mut b = Bucket::new(1_000_000, start);
        // The burst is 100 000 bytes: read it all in 4096-byte chunks.
        let mut got = 0;
        loop {
            let n = b.allowance(start, 4096);
            if n == 0 {
                break;
            }
            b.spend(n);
            got += n;
        }
        assert_eq!(got, 24 * 4096);
        // 4096 - (100 000 % 4096 = 1696 left) = 2400 bytes, 2.4 ms: 3 ms.
        assert_eq!(b.wait_ms(start), 3);
        assert_eq!(b.allowance(start + Duration::from_millis(3), 4096), 4096);
        // A bucket smaller than a chunk waits for the whole bucket.
        let mut slow = Bucket::new(100, start);
        assert_eq!(slow.allowance(start, 4096), 10);
        slow.spend(10);
        assert_eq!(slow.wait_ms(start), 100);
        assert_eq!(slow.allowance(start + Duration::from_millis(99), 4096), 0);
        assert_eq!(slow.allowance(start + Duration::from_millis(100), 4096), 10);
    }
}
