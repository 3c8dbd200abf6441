//! The kernel relay's side in the kernel: the `bpf(2)` calls, the verdict
//! program's 43 instructions written out, and the four maps, loaded once
//! per process on first use.
//!
//! # Threads
//!
//! Any worker thread may call [`kernel`]; the first loads the program
//! behind a `OnceLock`, and the maps are then shared by all (the kernel
//! locks them).
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

/// Entries of each map: two per relayed connection.
const MAP_ENTRIES: u32 = 65536;

// Commands, map and program types, attach types, helpers: the numbers of
// the kernel's uapi `linux/bpf.h`, which are stable ABI.
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_TYPE_SOCKHASH: u32 = 18;
const BPF_PROG_TYPE_SK_SKB: u32 = 14;
const BPF_SK_SKB_STREAM_VERDICT: u32 = 5;
const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_FUNC_GET_SOCKET_COOKIE: i32 = 46;
const BPF_FUNC_SK_REDIRECT_HASH: i32 = 72;
/// `src_reg` of a 64-bit immediate load that names a map by its fd.
const BPF_PSEUDO_MAP_FD: u8 = 1;
/// The program's verdicts.
const SK_DROP: i32 = 0;
const SK_PASS: i32 = 1;

/// Added once to a socket's `moved` count when the program stops
/// redirecting its bytes (the latch, see [`program`]); the bits below it
/// are the count.
pub(super) const LATCHED: u64 = 1 << 62;

/// One eBPF instruction, as the kernel reads it (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Insn {
    code: u8,
    /// Destination register in the low nibble, source in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

// Instruction classes, sizes, modes and operations (uapi `bpf_common.h`).
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const STX: u8 = 0x03;
const JMP: u8 = 0x05;
const ALU64: u8 = 0x07;
const W: u8 = 0x00;
const DW: u8 = 0x18;
const IMM: u8 = 0x00;
const MEM: u8 = 0x60;
const ATOMIC: u8 = 0xc0;
const K: u8 = 0x00;
const X: u8 = 0x08;
const ADD: u8 = 0x00;
const LSH: u8 = 0x60;
const MOV: u8 = 0xb0;
const JEQ: u8 = 0x10;
const JGT: u8 = 0x20;
const JGE: u8 = 0x30;
const JNE: u8 = 0x50;
const CALL: u8 = 0x80;
const EXIT: u8 = 0x90;

// Registers: R0 return value, R1-R5 arguments, R6-R9 kept across calls,
// R10 the frame pointer.
const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R6: u8 = 6;
const R7: u8 = 7;
const R8: u8 = 8;
const R10: u8 = 10;

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}
const fn mov_reg(dst: u8, src: u8) -> Insn {
    insn(ALU64 | MOV | X, dst, src, 0, 0)
}
const fn mov_imm(dst: u8, imm: i32) -> Insn {
    insn(ALU64 | MOV | K, dst, 0, 0, imm)
}
const fn add_imm(dst: u8, imm: i32) -> Insn {
    insn(ALU64 | ADD | K, dst, 0, 0, imm)
}
const fn add_reg(dst: u8, src: u8) -> Insn {
    insn(ALU64 | ADD | X, dst, src, 0, 0)
}
const fn shift_left(dst: u8, bits: i32) -> Insn {
    insn(ALU64 | LSH | K, dst, 0, 0, bits)
}
/// `dst = *(u32 *)(src + off)`
const fn load_u32(dst: u8, src: u8, off: i16) -> Insn {
    insn(LDX | MEM | W, dst, src, off, 0)
}
/// `dst = *(u64 *)(src + off)`
const fn load_u64(dst: u8, src: u8, off: i16) -> Insn {
    insn(LDX | MEM | DW, dst, src, off, 0)
}
/// `*(u64 *)(dst + off) = src`
const fn store_u64(dst: u8, off: i16, src: u8) -> Insn {
    insn(STX | MEM | DW, dst, src, off, 0)
}
/// `lock *(u64 *)(dst + off) += src`
const fn atomic_add_u64(dst: u8, off: i16, src: u8) -> Insn {
    insn(STX | ATOMIC | DW, dst, src, off, ADD as i32)
}
/// Jump `off` instructions past the next one when `dst == imm`.
const fn jump_eq(dst: u8, imm: i32, off: i16) -> Insn {
    insn(JMP | JEQ | K, dst, 0, off, imm)
}
/// Jump `off` instructions past the next one when `dst != imm`.
const fn jump_ne(dst: u8, imm: i32, off: i16) -> Insn {
    insn(JMP | JNE | K, dst, 0, off, imm)
}
/// Jump `off` instructions past the next one when `dst > src` (unsigned).
const fn jump_gt(dst: u8, src: u8, off: i16) -> Insn {
    insn(JMP | JGT | X, dst, src, off, 0)
}
/// Jump `off` instructions past the next one when `dst >= src` (unsigned).
const fn jump_ge(dst: u8, src: u8, off: i16) -> Insn {
    insn(JMP | JGE | X, dst, src, off, 0)
}
const fn call(helper: i32) -> Insn {
    insn(JMP | CALL, 0, 0, 0, helper)
}
const fn exit() -> Insn {
    insn(JMP | EXIT, 0, 0, 0, 0)
}
/// `dst = map` (the kernel swaps the fd for the map's address): a 64-bit
/// immediate, which takes two instruction slots.
const fn load_map(dst: u8, fd: RawFd) -> [Insn; 2] {
    [
        insn(LD | DW | IMM, dst, BPF_PSEUDO_MAP_FD, 0, fd),
        insn(0, 0, 0, 0, 0),
    ]
}

/// The verdict program, run by the kernel for each segment that arrives on
/// a relayed socket (`ctx` is its `struct __sk_buff`):
///
/// ```text
/// if (skb->len == 0) return SK_DROP;            // a bare FIN
/// key = bpf_get_socket_cookie(skb);             // the receiving socket
/// n = bpf_map_lookup_elem(&moved, &key);        // what it redirected
/// limit = bpf_map_lookup_elem(&limits, &key);   // set by its thread
/// if (!n || !limit) return SK_PASS;             // keep the bytes
/// if (*n + len > *limit) {                      // the bound: latch
///     if (*n < LATCHED) __sync_fetch_and_add(n, LATCHED);
///     return SK_PASS;                           // keep the bytes
/// }
/// if (bpf_sk_redirect_hash(skb, &peers, &key, 0) != SK_PASS)
///     return SK_PASS;                           // no peer: keep the bytes
/// __sync_fetch_and_add(n, len);
/// return SK_PASS;                               // redirected
/// ```
///
/// "Keep" (`SK_PASS` with no redirect) queues the bytes on the receiving
/// socket itself, where its own `read` finds them, charged to its receive
/// memory: TCP's window then holds the sender back. Once a socket's
/// bytes are kept, all that follow are (the latch only grows the count,
/// and a deleted peer does not come back), so they stay in order. The
/// thread raises `limits` as the other side's send path takes the bytes,
/// so the bytes the kernel holds between the two sockets never pass
/// `BACKLOG_BOUND`, whether or not the thread gets the CPU.
fn program(peers: RawFd, moved: RawFd, limits: RawFd) -> Vec<Insn> {
    let [peers_lo, peers_hi] = load_map(R2, peers);
    let [moved_lo, moved_hi] = load_map(R1, moved);
    let [limits_lo, limits_hi] = load_map(R1, limits);
    vec![
        /* 0 */ mov_reg(R6, R1),
        /* 1 */ load_u32(R7, R6, 0), // __sk_buff.len is at offset 0
        /* 2 */ jump_eq(R7, 0, 38), // -> 41 drop
        /* 3 */ mov_reg(R1, R6),
        /* 4 */ call(BPF_FUNC_GET_SOCKET_COOKIE),
        /* 5 */ store_u64(R10, -8, R0),
        /* 6 */ moved_lo,
        /* 7 */ moved_hi,
        /* 8 */ mov_reg(R2, R10),
        /* 9 */ add_imm(R2, -8),
        /* 10 */ call(BPF_FUNC_MAP_LOOKUP_ELEM),
        /* 11 */ jump_eq(R0, 0, 27), // -> 39 keep
        /* 12 */ mov_reg(R8, R0),
        /* 13 */ limits_lo,
        /* 14 */ limits_hi,
        /* 15 */ mov_reg(R2, R10),
        /* 16 */ add_imm(R2, -8),
        /* 17 */ call(BPF_FUNC_MAP_LOOKUP_ELEM),
        /* 18 */ jump_eq(R0, 0, 20), // -> 39 keep
        /* 19 */ load_u64(R1, R0, 0),
        /* 20 */ load_u64(R2, R8, 0),
        /* 21 */ add_reg(R2, R7),
        /* 22 */ jump_gt(R2, R1, 11), // -> 34 latch
        /* 23 */ mov_reg(R1, R6),
        /* 24 */ peers_lo,
        /* 25 */ peers_hi,
        /* 26 */ mov_reg(R3, R10),
        /* 27 */ add_imm(R3, -8),
        /* 28 */ mov_imm(R4, 0),
        /* 29 */ call(BPF_FUNC_SK_REDIRECT_HASH),
        /* 30 */ jump_ne(R0, SK_PASS, 8), // -> 39 keep
        /* 31 */ atomic_add_u64(R8, 0, R7),
        /* 32 */ mov_imm(R0, SK_PASS),
        /* 33 */ exit(),
        /* 34 */ mov_imm(R1, 1),
        /* 35 */ shift_left(R1, LATCHED.trailing_zeros() as i32),
        /* 36 */ load_u64(R2, R8, 0),
        /* 37 */ jump_ge(R2, R1, 1), // -> 39 keep
        /* 38 */ atomic_add_u64(R8, 0, R1),
        /* 39 */ mov_imm(R0, SK_PASS),
        /* 40 */ exit(),
        /* 41 */ mov_imm(R0, SK_DROP),
        /* 42 */ exit(),
    ]
}

// The parts of `union bpf_attr` each command reads. The kernel takes a
// shorter struct than its own and reads the rest as zero.
#[repr(C)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
}

#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
}

#[repr(C)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
struct ProgAttach {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
}

/// One `bpf(2)` call.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, initialized struct of the layout the
    // command reads, and the size passed is its own.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            mem::size_of::<T>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A `bpf(2)` call that returns a new descriptor.
fn bpf_fd<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    let fd = bpf(cmd, attr)?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn map_create(map_type: u32) -> io::Result<OwnedFd> {
    bpf_fd(
        BPF_MAP_CREATE,
        &mut MapCreate {
            map_type,
            key_size: 8,
            value_size: 8,
            max_entries: MAP_ENTRIES,
        },
    )
}

pub(super) fn map_update(map: &OwnedFd, key: u64, value: u64) -> io::Result<()> {
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u64 as u64,
        value: &value as *const u64 as u64,
        flags: 0, // BPF_ANY
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(|_| ())
}

pub(super) fn map_delete(map: &OwnedFd, key: u64) -> io::Result<()> {
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u64 as u64,
        value: 0,
        flags: 0,
    };
    bpf(BPF_MAP_DELETE_ELEM, &mut attr).map(|_| ())
}

pub(super) fn map_lookup(map: &OwnedFd, key: u64) -> io::Result<u64> {
    let mut value = 0u64;
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u64 as u64,
        value: &mut value as *mut u64 as u64,
        flags: 0,
    };
    bpf(BPF_MAP_LOOKUP_ELEM, &mut attr)?;
    Ok(value)
}

/// The maps and the attached program, shared by every relayed connection.
#[derive(Debug)]
pub(super) struct Kernel {
    pub(super) peers: OwnedFd,
    pub(super) verdicts: OwnedFd,
    pub(super) moved: OwnedFd,
    /// Per socket, the most its `moved` may reach: written by its thread
    /// only (an update replaces the element, so the program's own counts
    /// live in `moved`).
    pub(super) limits: OwnedFd,
    /// Kept open for the process's life (the attachment holds it too).
    _program: OwnedFd,
}

impl Kernel {
    fn load() -> io::Result<Kernel> {
        let peers = map_create(BPF_MAP_TYPE_SOCKHASH)?;
        let verdicts = map_create(BPF_MAP_TYPE_SOCKHASH)?;
        let moved = map_create(BPF_MAP_TYPE_HASH)?;
        let limits = map_create(BPF_MAP_TYPE_HASH)?;
        let insns = program(peers.as_raw_fd(), moved.as_raw_fd(), limits.as_raw_fd());
        let license = b"GPL\0"; // the sockmap helpers are GPL-only
        let mut log = vec![0u8; 16 * 1024];
        let mut attr = ProgLoad {
            prog_type: BPF_PROG_TYPE_SK_SKB,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 1,
            log_size: log.len() as u32,
            log_buf: log.as_mut_ptr() as u64,
        };
        let program = bpf_fd(BPF_PROG_LOAD, &mut attr).map_err(|e| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let said = String::from_utf8_lossy(&log[..end]);
            let said = said.trim();
            if said.is_empty() {
                e
            } else {
                io::Error::new(e.kind(), format!("{e}; the verifier said: {said}"))
            }
        })?;
        bpf(
            BPF_PROG_ATTACH,
            &mut ProgAttach {
                target_fd: verdicts.as_raw_fd() as u32,
                attach_bpf_fd: program.as_raw_fd() as u32,
                attach_type: BPF_SK_SKB_STREAM_VERDICT,
                attach_flags: 0,
            },
        )?;
        Ok(Kernel {
            peers,
            verdicts,
            moved,
            limits,
            _program: program,
        })
    }
}

static KERNEL: OnceLock<Option<Kernel>> = OnceLock::new();

/// The loaded maps and program, or `None` when they could not load.
pub(super) fn kernel() -> Option<&'static Kernel> {
    kernel_for(false)
}

/// [`kernel`], loading it on the first call; `auto`: the first call came
/// from `kernel_relay: auto`, whose failure is one info line, not a
/// warning (the operator did not ask for the relay on this machine).
pub(super) fn kernel_for(auto: bool) -> Option<&'static Kernel> {
    KERNEL
        .get_or_init(|| {
            let loaded = Kernel::load();
            log_loaded(&loaded, auto);
            loaded.ok()
        })
        .as_ref()
}

/// The one line at the first load: on, or off and why.
fn log_loaded(loaded: &io::Result<Kernel>, auto: bool) {
    let mode = if auto { "auto" } else { "on" };
    match loaded {
        Ok(_) => log::info!("kernel relay ({mode}): on, sockmap program loaded"),
        Err(e) => {
            let why = if e.kind() == io::ErrorKind::PermissionDenied {
                format!(
                    "the process may not load it ({e}): it needs root before the \
                     privilege drop, or CAP_BPF and CAP_NET_ADMIN"
                )
            } else {
                format!("the kernel refused the sockmap program ({e})")
            };
            if auto {
                log::info!("kernel relay (auto): off, {why}; connections use the copy pump");
            } else {
                log::warn!("kernel relay (on): unavailable, {why}; connections use the copy pump");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_are_encoded_as_the_kernel_reads_them() {
        // `r6 = r1` is 0xbf with dst 6 and src 1 in the register byte.
        assert_eq!(
            mov_reg(R6, R1),
            Insn {
                code: 0xbf,
                regs: 0x16,
                off: 0,
                imm: 0
            }
        );
        assert_eq!(call(72).code, 0x85);
        assert_eq!(exit().code, 0x95);
        assert_eq!(store_u64(R10, -8, R0).code, 0x7b);
        assert_eq!(atomic_add_u64(R0, 0, R7).code, 0xdb);
        assert_eq!(load_u64(R1, R0, 0).code, 0x79);
        assert_eq!(jump_gt(R2, R1, 0).code, 0x2d);
        assert_eq!(jump_ge(R2, R1, 0).code, 0x3d);
        assert_eq!(add_reg(R2, R7).code, 0x0f);
        assert_eq!(shift_left(R1, 62).code, 0x67);
        assert_eq!(load_map(R2, 5)[0].regs, 0x12);
        assert_eq!(mem::size_of::<Insn>(), 8);
    }

    #[test]
    fn every_jump_lands_where_its_comment_says() {
        let p = program(3, 4, 5);
        assert_eq!(p.len(), 43);
        // Each jump goes to `r0 = verdict; exit`, or to the latch.
        let keep = [mov_imm(R0, SK_PASS), exit()];
        let drop = [mov_imm(R0, SK_DROP), exit()];
        let mut jumps = Vec::new();
        for (pc, i) in p.iter().enumerate() {
            if i.code & 0x07 == JMP && i.code & 0xf0 != CALL && i.code & 0xf0 != EXIT {
                let t = (pc as i64 + 1 + i.off as i64) as usize;
                jumps.push((pc, t));
                let lands = &p[t..(t + 2).min(p.len())];
                assert!(
                    lands == keep || lands == drop || p[t] == mov_imm(R1, 1),
                    "jump at {pc} lands on {:?}",
                    p[t]
                );
            }
        }
        assert_eq!(
            jumps,
            [(2, 41), (11, 39), (18, 39), (22, 34), (30, 39), (37, 39)]
        );
        // The latch adds exactly LATCHED.
        assert_eq!(p[35], shift_left(R1, 62));
        assert_eq!(1u64 << p[35].imm, LATCHED);
    }
}
