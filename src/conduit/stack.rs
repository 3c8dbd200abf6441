//! The stack pages a worker touched below its pump are handed back.
//!
//! A TLS handshake (key exchange, certificate signing or verification)
//! runs 20 KiB and more below the pump's frame; those pages stay resident
//! for as long as the thread lives, so every idle TLS connection would keep
//! them. [`trim`] gives the pages below the caller's frame (less a margin
//! for what the pump calls) back to the kernel with `madvise(2)`
//! `MADV_DONTNEED`: they read as zeros when touched again, as unused stack
//! may. One call per TLS connection, on the worker thread that owns the
//! stack. The plain pump calls [`trim_idle`] when a connection has been
//! idle long enough to hand its buffers back (`RELEASE_AFTER`): what the
//! backend connect touched below the pump (a page, at most) goes back then
//! too, so an idle plain connection keeps two pages of stack, and a busy
//! one pays nothing.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::cell::Cell;

/// Kept resident below the caller's frame: what the TLS pump's own calls
/// (rustls reading and writing a record, `poll`) reach without a
/// handshake.
const MARGIN: usize = 4 * 1024;

thread_local! {
    /// The lowest address of this thread's stack, read once (0: unknown).
    static LOWEST: Cell<usize> = const { Cell::new(0) };
}

/// What the plain pump's wait keeps below the frame of [`trim_idle`]:
/// the rest of the page its own calls stand in. The `poll(2)` it calls
/// next runs above this frame's depth, in a page that stays.
const IDLE_MARGIN: usize = 0;

/// Hands back the pages of this thread's stack lying more than [`MARGIN`]
/// below the caller's frame. Errors only leave the pages resident.
#[inline(never)]
pub(crate) fn trim() {
    trim_below(MARGIN);
}

/// [`trim`] for the plain pump's idle wait: every page below the one
/// this frame's calls stand in ([`IDLE_MARGIN`]).
#[inline(never)]
pub(crate) fn trim_idle() {
    trim_below(IDLE_MARGIN);
}

/// Slack below [`callee_depth`]'s mark for the `madvise(2)` wrapper,
/// which pushes its return address and nothing else.
const CALL_SLACK: usize = 16;

/// An address in the frame of a function called from the caller's frame,
/// at the depth the caller's next call (`madvise`) stands at: its return
/// address lies above the mark. A local of the caller's own would not do:
/// the caller's frame and its call's return address may reach below it,
/// into a page the call would then hand back under its own feet.
#[inline(never)]
fn callee_depth() -> usize {
    let here = 0u8;
    std::hint::black_box(std::ptr::addr_of!(here)) as usize
}

/// Hands back the pages lying more than `margin` below the frame of a
/// call from here.
#[inline(always)]
fn trim_below(margin: usize) {
    let sp = callee_depth().saturating_sub(CALL_SLACK);
    let Some(lowest) = lowest() else {
        return;
    };
    let page = 4096;
    let start = lowest.next_multiple_of(page);
    let end = sp.saturating_sub(margin) & !(page - 1);
    if end > start {
        // SAFETY: [start, end) lies in this thread's own stack, below every
        // live frame (this one's and its `madvise` call's return address
        // are above `end`, see `callee_depth`), so no live data is there; a
        // signal handler would run below `sp`, after this call, on fresh
        // zero pages.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
}

/// The lowest address of the calling thread's stack, from
/// `pthread_getattr_np` the first time and from memory after.
fn lowest() -> Option<usize> {
    let known = LOWEST.with(Cell::get);
    if known != 0 {
        return Some(known);
    }
    // SAFETY: the attributes are initialised by pthread_getattr_np before
    // they are read, and destroyed once.
    let lowest = unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr = std::ptr::null_mut();
        let mut size = 0;
        let got = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if got != 0 {
            return None;
        }
        addr as usize
    };
    LOWEST.with(|c| c.set(lowest));
    Some(lowest)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident pages of the mapping holding `addr`, from /proc/self/smaps.
    fn resident_kib(addr: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = (a..b).contains(&addr);
                        continue;
                    }
                }
            }
            if inside && line.starts_with("Rss:") {
                return line.split_whitespace().nth(1).unwrap().parse().unwrap();
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[inline(never)]
    fn deep(n: usize) -> u8 {
        let mut page = [0u8; 4096];
        page[n % 4096] = n as u8;
        let below = if n > 0 { deep(n - 1) } else { 0 };
        std::hint::black_box(&mut page)[0].wrapping_add(below)
    }

    /// Recurses `n` frames of a few dozen bytes each, then trims as the
    /// idle pump does, and returns through every frame.
    #[inline(never)]
    fn trim_at(n: usize) -> u8 {
        let mut pad = [0u8; 40];
        pad[n % 40] = n as u8;
        let below = if n > 0 {
            trim_at(n - 1)
        } else {
            trim_idle_then(7)
        };
        std::hint::black_box(&mut pad)[n % 40].wrapping_add(below)
    }

    #[inline(never)]
    fn trim_idle_then(value: u8) -> u8 {
        trim_idle();
        std::hint::black_box(value)
    }

    /// The idle trim, called at every depth of a page in steps of a few
    /// dozen bytes: wherever the frame stands against a page boundary,
    /// every frame above it returns (none of its pages went back).
    #[test]
    fn the_idle_trim_leaves_every_live_frame_at_any_depth() {
        let sums = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(|| (0..200).map(|n| u64::from(trim_at(n))).sum::<u64>())
            .unwrap()
            .join()
            .unwrap();
        let expected: u64 = (0..200u64)
            .map(|n| (0..=n).fold(7u8, |acc, k| acc.wrapping_add(k as u8)) as u64)
            .sum();
        assert_eq!(sums, expected);
    }

    /// 64 pages touched deep in a 512 KiB stack: resident until trimmed,
    /// then back to about the margin; the thread goes on using its stack.
    #[test]
    fn pages_below_the_frame_go_back_and_the_stack_stays_usable() {
        let (before, after, again) = std::thread::Builder::new()
            .stack_size(512 * 1024)
            .spawn(|| {
                let here = 0u8;
                let sp = std::ptr::addr_of!(here) as usize;
                deep(64);
                let before = resident_kib(sp);
                trim();
                let after = resident_kib(sp);
                deep(64);
                (before, after, resident_kib(sp))
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(before >= 256, "{before} KiB before");
        assert!(after <= 48, "{after} KiB after");
        assert!(again >= 256, "{again} KiB when used again");
    }
}
