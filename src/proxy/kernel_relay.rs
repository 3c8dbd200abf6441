//! `--kernel-relay`: the worker still accepts, picks, connects, owns the
//! connection and closes it, but the kernel moves the bytes between the
//! two sockets (an eBPF sockmap program), and the thread only waits for the
//! end.
//!
//! # Why
//!
//! On small messages (keep-alive HTTP, redis) the copy pump's cost is not
//! the copy but the wake-ups: each message wakes the connection's thread
//! to read it, and the thread's write then wakes the peer. Here each socket
//! gets a tiny `sk_skb/stream_verdict` program: when a segment arrives on
//! one socket, the program looks up the other socket in a `SOCKHASH` (keyed
//! by the receiving socket's cookie, `SO_COOKIE`) and hands the segment to
//! its send path (`bpf_sk_redirect_hash`). No user thread runs per message;
//! the kernel does the sending from a work queue (`sk_psock_backlog`).
//!
//! # How it is loaded, and why this way
//!
//! With raw `bpf(2)` calls through `libc::syscall`, and the program's 27
//! instructions written out below with small encoding helpers. A C compiler
//! with a BPF target at build time, or a loader library, would be far more
//! than a program this size needs, and would make every build depend on
//! tools that a plain `cargo build` does not have. Loading needs root (or
//! `CAP_BPF` + `CAP_NET_ADMIN`) and a kernel with sockmap (≥ 5.x; the
//! pitfalls handled below were read against 6.x). When anything fails, the
//! balancer logs it once and every connection uses the copy pump.
//!
//! Three maps, made once per process:
//!
//! - `peers` (`SOCKHASH`): cookie of a socket → the socket its bytes go to.
//!   The program redirects through it. It has no program attached.
//! - `verdicts` (`SOCKHASH`): each relayed socket, keyed by its own cookie;
//!   the program is attached to this map, so a socket in it gets the
//!   program. Keeping it apart from `peers` (as the kernel's selftest
//!   `sockmap_redir.c` does) lets a socket be in `peers` before it runs the
//!   program: both peers are inserted there first, then into `verdicts`, so
//!   the program never runs for a socket whose peer is missing (the redirect
//!   would drop the bytes). When no peer is found anyway, it passes the
//!   bytes to the socket's own queue (`SK_PASS`) rather than drop them.
//! - `moved` (`HASH`): cookie → bytes the program redirected from that
//!   socket. Needed only to leave the kernel path mid-connection (below).
//!
//! # The pitfalls, and what is done about each
//!
//! - Only `ESTABLISHED` sockets can be inserted: a client that already
//!   half-closed (or a backend that did) is copied in user space.
//! - Bytes already queued when a socket is inserted wait for the next
//!   segment; a `recv(MSG_PEEK | MSG_DONTWAIT)` after insertion pushes them
//!   through the program (a server that speaks first).
//! - A bare FIN arrives as a zero-length segment: the program drops it (the
//!   end of stream is still seen, as `POLLRDHUP`, by the thread).
//! - Deleting a socket from the maps, or closing it, throws away what the
//!   kernel still queues for it. So before the thread passes an end of
//!   stream on (`shutdown(SHUT_WR)` on the other socket), it waits until
//!   every byte received on one side reached the other's TCP send path:
//!   `tcpi_bytes_received` of the source (less one for its FIN) against
//!   `tcpi_bytes_acked` + `SIOCOUTQ` of the destination, from `TCP_INFO`,
//!   each measured from where it stood at the start.
//! - Behind a slow reader the kernel's queue toward it has no bound: the
//!   program takes segments off the fast side as fast as they come. The
//!   thread samples that queue (received on one side minus sent on the
//!   other) and, above [`BACKLOG_BOUND`], leaves the kernel path: it takes
//!   both sockets out of `verdicts`, waits for a grace period (so no run of
//!   the program is still in flight), waits until the `moved` count of each
//!   side has reached the other's send path, takes them out of `peers` (the
//!   kernel state goes, with nothing in it), and hands the connection to
//!   the copy pump, whose 4096-byte buffer bounds memory again. The
//!   sampling interval shrinks with the observed rate (1 ms at the fastest),
//!   so the queue overshoots the bound by about a millisecond's worth of
//!   traffic; a burst that starts after a quiet spell can overshoot by what
//!   arrives in up to [`MAX_CHECK`].
//! - Idle timeout: the thread sees no bytes, so it reads the same `TCP_INFO`
//!   counters: when none of them moved for `idle_timeout`, the connection
//!   ends as the copy pump's would.
//!
//! Only the worker thread that owns the connection runs this code; the maps
//! are shared by all (the kernel locks them), and loaded once, on first use,
//! behind a `OnceLock`.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the article copies through a buffer, like the default
//! pump. The connection's life around it (connect, fail-over, the final
//! `shutdown(SHUT_RDWR)` and `close()`) is the same code as always.

use std::io::{self, ErrorKind};
use std::mem;
use std::net::{Shutdown as Direction, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::pump::{pump, splice_pump, Transfer};
use super::ProxyConfig;
use crate::stats::Stats;

/// Most bytes the kernel may hold for one socket (received on the other,
/// not yet in this one's send path) before the connection leaves the kernel
/// path for the copy pump. The sockets' own buffers come on top, as with
/// any pump.
pub const BACKLOG_BOUND: u64 = 4 << 20;

/// Longest pause between two looks at the counters while bytes move or
/// not: it bounds how late an idle timeout or a growing backlog is seen.
pub const MAX_CHECK: Duration = Duration::from_millis(100);

/// Shortest pause between two looks while bytes stream.
const MIN_CHECK: Duration = Duration::from_millis(1);

/// Longest pause between two looks while an end of stream waits for the
/// last bytes to reach the other side.
const MAX_DELIVERY_CHECK: Duration = Duration::from_millis(20);

/// Entries of each map: two per relayed connection.
const MAP_ENTRIES: u32 = 65536;

// ----------------------------------------------------------------- bpf(2)

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
/// `getsockopt(SOL_SOCKET, SO_COOKIE)`: the socket's unique 64-bit id.
const SO_COOKIE: libc::c_int = 57;
/// `membarrier(MEMBARRIER_CMD_GLOBAL)`: returns after an RCU grace period.
const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1;

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
const MOV: u8 = 0xb0;
const JEQ: u8 = 0x10;
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
/// `dst = *(u32 *)(src + off)`
const fn load_u32(dst: u8, src: u8, off: i16) -> Insn {
    insn(LDX | MEM | W, dst, src, off, 0)
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
/// if (bpf_sk_redirect_hash(skb, &peers, &key, 0) != SK_PASS)
///     return SK_PASS;                           // no peer: keep the bytes
/// if (n = bpf_map_lookup_elem(&moved, &key)) __sync_fetch_and_add(n, len);
/// return SK_PASS;                               // redirected
/// ```
fn program(peers: RawFd, moved: RawFd) -> Vec<Insn> {
    let [peers_lo, peers_hi] = load_map(R2, peers);
    let [moved_lo, moved_hi] = load_map(R1, moved);
    vec![
        /* 0 */ mov_reg(R6, R1),
        /* 1 */ load_u32(R7, R6, 0), // __sk_buff.len is at offset 0
        /* 2 */ jump_eq(R7, 0, 22), // -> 25 drop
        /* 3 */ mov_reg(R1, R6),
        /* 4 */ call(BPF_FUNC_GET_SOCKET_COOKIE),
        /* 5 */ store_u64(R10, -8, R0),
        /* 6 */ mov_reg(R1, R6),
        /* 7 */ peers_lo,
        /* 8 */ peers_hi,
        /* 9 */ mov_reg(R3, R10),
        /* 10 */ add_imm(R3, -8),
        /* 11 */ mov_imm(R4, 0),
        /* 12 */ call(BPF_FUNC_SK_REDIRECT_HASH),
        /* 13 */ jump_ne(R0, SK_PASS, 9), // -> 23 pass
        /* 14 */ moved_lo,
        /* 15 */ moved_hi,
        /* 16 */ mov_reg(R2, R10),
        /* 17 */ add_imm(R2, -8),
        /* 18 */ call(BPF_FUNC_MAP_LOOKUP_ELEM),
        /* 19 */ jump_eq(R0, 0, 3), // -> 23 pass
        /* 20 */ atomic_add_u64(R0, 0, R7),
        /* 21 */ mov_imm(R0, SK_PASS),
        /* 22 */ exit(),
        /* 23 */ mov_imm(R0, SK_PASS),
        /* 24 */ exit(),
        /* 25 */ mov_imm(R0, SK_DROP),
        /* 26 */ exit(),
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

fn map_update(map: &OwnedFd, key: u64, value: u64) -> io::Result<()> {
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u64 as u64,
        value: &value as *const u64 as u64,
        flags: 0, // BPF_ANY
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(|_| ())
}

fn map_delete(map: &OwnedFd, key: u64) -> io::Result<()> {
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u64 as u64,
        value: 0,
        flags: 0,
    };
    bpf(BPF_MAP_DELETE_ELEM, &mut attr).map(|_| ())
}

fn map_lookup(map: &OwnedFd, key: u64) -> io::Result<u64> {
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
struct Kernel {
    peers: OwnedFd,
    verdicts: OwnedFd,
    moved: OwnedFd,
    /// Kept open for the process's life (the attachment holds it too).
    _program: OwnedFd,
}

impl Kernel {
    fn load() -> io::Result<Kernel> {
        let peers = map_create(BPF_MAP_TYPE_SOCKHASH)?;
        let verdicts = map_create(BPF_MAP_TYPE_SOCKHASH)?;
        let moved = map_create(BPF_MAP_TYPE_HASH)?;
        let insns = program(peers.as_raw_fd(), moved.as_raw_fd());
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
            _program: program,
        })
    }
}

static KERNEL: OnceLock<Option<Kernel>> = OnceLock::new();

/// Loads the program on first call and logs, once, which path relayed
/// connections take. Returns whether the kernel path is available.
pub fn prepare() -> bool {
    kernel().is_some()
}

fn kernel() -> Option<&'static Kernel> {
    KERNEL
        .get_or_init(|| match Kernel::load() {
            Ok(k) => {
                log::info!("kernel relay: on (sockmap program loaded)");
                Some(k)
            }
            Err(e) => {
                log::warn!(
                    "kernel relay: unavailable ({e}); connections use the copy pump \
                     (needs root or CAP_BPF + CAP_NET_ADMIN, and sockmap in the kernel)"
                );
                None
            }
        })
        .as_ref()
}

// ------------------------------------------------------- one connection

/// Relays one connection through the kernel, or through the copy pump
/// (the splice pump with `--splice`) when the kernel path cannot take it:
/// the program did not load, a socket cannot be inserted, or the backlog
/// bound was hit. Byte counts go into `transfer` as for [`pump`].
///
/// # Errors
///
/// As [`pump`]: the first error of either socket, or `TimedOut` at the idle
/// timeout.
pub fn relay(
    client: &TcpStream,
    backend: &TcpStream,
    settings: &ProxyConfig,
    stats: &Stats,
    transfer: &mut Transfer,
) -> io::Result<()> {
    let copy = |transfer: &mut Transfer| {
        if settings.splice {
            splice_pump(
                client,
                backend,
                settings.idle_timeout,
                settings.yield_before_poll,
                transfer,
            )
        } else {
            pump(
                client,
                backend,
                settings.buffer_size,
                settings.idle_timeout,
                settings.yield_before_poll,
                transfer,
            )
        }
    };
    let Some(kernel) = kernel() else {
        return copy(transfer);
    };
    let mut link = Link::new(kernel, client, backend);
    if let Err(e) = link.insert() {
        log::debug!("kernel relay: not taken ({e}), copying in user space");
        Stats::incr(&stats.kernel_relay_fallbacks);
        link.unwind(settings.idle_timeout, transfer)?;
        return copy(transfer);
    }
    Stats::incr(&stats.kernel_relayed);
    match link.run(settings.idle_timeout, transfer)? {
        End::Finished => Ok(()),
        End::Backlog => {
            log::debug!("kernel relay: backlog bound hit, copying in user space");
            Stats::incr(&stats.kernel_relay_fallbacks);
            link.unwind(settings.idle_timeout, transfer)?;
            copy(transfer)
        }
    }
}

/// How [`Link::run`] ended without an error.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// Both directions passed their end of stream on.
    Finished,
    /// A backlog passed [`BACKLOG_BOUND`]: the copy pump goes on.
    Backlog,
}

/// What `TCP_INFO` and `SIOCOUTQ` say of one socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    /// `tcpi_bytes_received`: bytes received in order (a FIN counts one).
    received: u64,
    /// `tcpi_bytes_acked`: bytes sent and acknowledged (our SYN and FIN
    /// count one each).
    acked: u64,
    /// `SIOCOUTQ`: bytes in the send queue, sent or not, not yet acked.
    outq: u64,
    /// `tcpi_state`.
    state: u8,
}

// `tcpi_state` values (the kernel's `TCP_*` states).
const TCP_ESTABLISHED: u8 = 1;
const TCP_TIME_WAIT: u8 = 6;
const TCP_CLOSE: u8 = 7;
const TCP_CLOSE_WAIT: u8 = 8;
const TCP_LAST_ACK: u8 = 9;
const TCP_CLOSING: u8 = 11;

impl Counts {
    fn of(socket: &TcpStream) -> io::Result<Counts> {
        let fd = socket.as_raw_fd();
        // SAFETY: zero is a valid `tcp_info`; the kernel fills at most `len`.
        let mut info: libc::tcp_info = unsafe { mem::zeroed() };
        let mut len = mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: `info` and `len` are valid for the call.
        let ret = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                &mut info as *mut libc::tcp_info as *mut libc::c_void,
                &mut len,
            )
        };
        if ret != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut outq: libc::c_int = 0;
        // SAFETY: SIOCOUTQ (TIOCOUTQ's number) writes one int.
        if unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut outq) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Counts {
            received: info.tcpi_bytes_received,
            acked: info.tcpi_bytes_acked,
            outq: outq.max(0) as u64,
            state: info.tcpi_state,
        })
    }

    /// The peer's FIN has arrived (it counts one in `received`).
    fn fin_in(&self) -> bool {
        matches!(
            self.state,
            TCP_CLOSE_WAIT | TCP_LAST_ACK | TCP_CLOSING | TCP_TIME_WAIT | TCP_CLOSE
        )
    }

    /// Data bytes received since the start (FIN left out).
    fn data_in(&self) -> u64 {
        self.received - u64::from(self.fin_in() && self.received > 0)
    }

    /// Bytes handed to this socket's send path since the start.
    fn handed(&self) -> u64 {
        self.acked + self.outq
    }
}

/// One direction: bytes from `src` to `dst`.
#[derive(Debug, Default)]
struct Way {
    /// `src`'s [`Counts::data_in`] when the relay started.
    in_base: u64,
    /// `dst`'s [`Counts::handed`] when the relay started (an active
    /// socket's SYN counts one there).
    out_base: u64,
    /// The source's end of stream was seen.
    eof: bool,
    /// It was passed on: `shutdown(SHUT_WR)` on the destination.
    done: bool,
}

impl Way {
    fn taken(&self, src: &Counts) -> u64 {
        src.data_in().saturating_sub(self.in_base)
    }

    fn sent(&self, dst: &Counts) -> u64 {
        dst.handed().saturating_sub(self.out_base)
    }

    /// Bytes the kernel holds between the two.
    fn backlog(&self, src: &Counts, dst: &Counts) -> u64 {
        self.taken(src).saturating_sub(self.sent(dst))
    }
}

/// One connection's place in the maps.
struct Link<'a> {
    kernel: &'static Kernel,
    /// Client then backend.
    sockets: [&'a TcpStream; 2],
    cookies: [u64; 2],
    /// Which entries were made: `moved`, `peers` (keyed by the socket whose
    /// bytes go to the other), `verdicts`.
    in_moved: [bool; 2],
    in_peers: [bool; 2],
    in_verdicts: [bool; 2],
    /// Client → backend, backend → client.
    ways: [Way; 2],
}

impl<'a> Link<'a> {
    fn new(kernel: &'static Kernel, client: &'a TcpStream, backend: &'a TcpStream) -> Link<'a> {
        Link {
            kernel,
            sockets: [client, backend],
            cookies: [0; 2],
            in_moved: [false; 2],
            in_peers: [false; 2],
            in_verdicts: [false; 2],
            ways: [Way::default(), Way::default()],
        }
    }

    /// Puts both sockets into the maps: `moved` and `peers` first, then
    /// `verdicts` (backend first, client last), then pushes bytes that were
    /// already queued through the program.
    fn insert(&mut self) -> io::Result<()> {
        let counts = [Counts::of(self.sockets[0])?, Counts::of(self.sockets[1])?];
        for c in &counts {
            if c.state != TCP_ESTABLISHED {
                return Err(io::Error::other("a socket is no longer ESTABLISHED"));
            }
        }
        for i in 0..2 {
            self.cookies[i] = cookie(self.sockets[i])?;
            // Way i goes from socket i to socket 1 - i.
            self.ways[i].in_base = counts[i].data_in();
            self.ways[i].out_base = counts[1 - i].handed();
        }
        for i in 0..2 {
            map_update(&self.kernel.moved, self.cookies[i], 0)?;
            self.in_moved[i] = true;
        }
        for i in 0..2 {
            let peer = self.sockets[1 - i].as_raw_fd() as u64;
            map_update(&self.kernel.peers, self.cookies[i], peer)?;
            self.in_peers[i] = true;
        }
        for i in [1, 0] {
            let fd = self.sockets[i].as_raw_fd() as u64;
            map_update(&self.kernel.verdicts, self.cookies[i], fd)?;
            self.in_verdicts[i] = true;
        }
        for socket in self.sockets {
            push_queued(socket);
        }
        Ok(())
    }

    /// Waits while the kernel moves the bytes, passes each end of stream
    /// on once its direction has delivered everything, and watches the
    /// backlog and the idle timeout.
    fn run(&mut self, idle_timeout: Duration, transfer: &mut Transfer) -> io::Result<End> {
        let mut last = [Counts::default(); 2];
        let mut last_at = Instant::now();
        let mut last_move = last_at;
        let mut check = MIN_CHECK;
        let mut delivery_check = Duration::ZERO;
        loop {
            let now_counts = [Counts::of(self.sockets[0])?, Counts::of(self.sockets[1])?];
            let now = Instant::now();
            for (i, c) in now_counts.iter().enumerate() {
                if c.state == TCP_CLOSE {
                    if let Some(e) = self.sockets[i].take_error()? {
                        return Err(e);
                    }
                }
                if c.fin_in() {
                    self.ways[i].eof = true;
                }
            }
            // Bytes seen moving, in this much time.
            let moved: u64 = (0..2)
                .map(|i| {
                    let (a, b) = (&now_counts[i], &last[i]);
                    (a.received + a.acked).saturating_sub(b.received + b.acked)
                })
                .sum();
            let elapsed = now - last_at;
            let changed = now_counts
                .iter()
                .zip(&last)
                .any(|(a, b)| (a.received, a.acked) != (b.received, b.acked));
            if changed {
                last_move = now;
            }
            let mut worst_backlog = 0;
            for i in 0..2 {
                let (src, dst) = (&now_counts[i], &now_counts[1 - i]);
                let way = &mut self.ways[i];
                let sent = way.sent(dst);
                if !way.done {
                    let count = if i == 0 {
                        &mut transfer.to_backend
                    } else {
                        &mut transfer.to_client
                    };
                    *count = sent;
                }
                let backlog = way.backlog(src, dst);
                worst_backlog = worst_backlog.max(backlog);
                if way.eof && !way.done && backlog == 0 {
                    // Every byte of this direction is in the destination's
                    // send path: the FIN can follow it.
                    way.done = true;
                    if let Err(e) = self.sockets[1 - i].shutdown(Direction::Write) {
                        if e.kind() != ErrorKind::NotConnected {
                            return Err(e);
                        }
                    }
                }
            }
            if self.ways[0].done && self.ways[1].done {
                return Ok(End::Finished);
            }
            if worst_backlog > BACKLOG_BOUND {
                return Ok(End::Backlog);
            }
            let quiet = now - last_move;
            if quiet >= idle_timeout {
                return Err(io::Error::new(ErrorKind::TimedOut, "idle timeout"));
            }
            last = now_counts;
            last_at = now;
            // How long until the next look.
            let waiting_delivery = self.ways.iter().any(|w| w.eof && !w.done);
            let wait = if waiting_delivery {
                // The last bytes are on their way through the kernel's
                // work queue: look again soon, then less and less often.
                let wait = delivery_check;
                delivery_check = (delivery_check * 2)
                    .max(Duration::from_micros(250))
                    .min(MAX_DELIVERY_CHECK);
                wait
            } else if moved > 0 {
                // Streaming: look again before the backlog could reach the
                // bound at the rate just seen.
                let rate = moved as f64 / elapsed.as_secs_f64().max(1e-6);
                let room = BACKLOG_BOUND.saturating_sub(worst_backlog) as f64;
                check = Duration::from_secs_f64(room / rate / 4.0).clamp(MIN_CHECK, MAX_CHECK);
                check
            } else {
                check = (check * 2).min(MAX_CHECK);
                check
            };
            let wait = wait.min(idle_timeout - quiet);
            let mut fds = [self.watch(0), self.watch(1)];
            if wait.is_zero() {
                // SAFETY: no arguments; on Linux it always succeeds.
                unsafe { libc::sched_yield() };
            } else {
                poll(&mut fds, wait)?;
            }
            // What poll saw counts too, so that a hang-up or an error that
            // the next sample would not show cannot make the loop spin.
            for (i, fd) in fds.iter().enumerate() {
                if fd.revents & libc::POLLERR != 0 {
                    if let Some(e) = self.sockets[i].take_error()? {
                        return Err(e);
                    }
                }
                if fd.revents & (libc::POLLRDHUP | libc::POLLHUP) != 0 {
                    self.ways[i].eof = true;
                }
            }
        }
    }

    /// A `pollfd` that wakes on the end of stream (or an error) of socket
    /// `i`, or nothing (fd -1) once its end was seen: a half-closed socket
    /// would report `POLLRDHUP` on every call.
    fn watch(&self, i: usize) -> libc::pollfd {
        libc::pollfd {
            fd: if self.ways[i].eof {
                -1
            } else {
                self.sockets[i].as_raw_fd()
            },
            events: libc::POLLRDHUP,
            revents: 0,
        }
    }

    /// Takes the connection out of the kernel path with nothing lost: stops
    /// the program on both sockets, waits for runs still in flight, waits
    /// until what the program took from each side is in the other's send
    /// path, then drops the sockets' kernel state. The copy pump can go on
    /// from there.
    /// The byte counts in `transfer` then say what was delivered.
    fn unwind(&mut self, idle_timeout: Duration, transfer: &mut Transfer) -> io::Result<()> {
        for i in 0..2 {
            if self.in_verdicts[i] {
                map_delete(&self.kernel.verdicts, self.cookies[i])?;
                self.in_verdicts[i] = false;
            }
        }
        // The program runs under RCU: after a grace period no run that
        // started before the deletes can still be adding to `moved` or
        // queueing bytes.
        // SAFETY: MEMBARRIER_CMD_GLOBAL takes no pointer.
        if unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut taken = [0u64; 2];
        for (i, taken) in taken.iter_mut().enumerate() {
            if self.in_moved[i] {
                *taken = map_lookup(&self.kernel.moved, self.cookies[i])?;
            }
        }
        let mut last = None;
        let mut last_move = Instant::now();
        let mut wait = Duration::from_micros(250);
        loop {
            let counts = [Counts::of(self.sockets[0])?, Counts::of(self.sockets[1])?];
            for (i, c) in counts.iter().enumerate() {
                if c.state == TCP_CLOSE {
                    if let Some(e) = self.sockets[i].take_error()? {
                        return Err(e);
                    }
                }
            }
            let delivered = (0..2).all(|i| {
                let way = &self.ways[i];
                way.done || way.sent(&counts[1 - i]) >= taken[i]
            });
            if delivered {
                // Exactly what the program took has reached the other side.
                if !self.ways[0].done {
                    transfer.to_backend = taken[0];
                }
                if !self.ways[1].done {
                    transfer.to_client = taken[1];
                }
                break;
            }
            let now_key = counts.map(|c| (c.acked, c.outq));
            if last != Some(now_key) {
                last = Some(now_key);
                last_move = Instant::now();
            } else if last_move.elapsed() >= idle_timeout {
                return Err(io::Error::new(ErrorKind::TimedOut, "idle timeout"));
            }
            let mut none = [libc::pollfd {
                fd: -1,
                events: 0,
                revents: 0,
            }; 2];
            poll(&mut none, wait)?;
            wait = (wait * 2).min(MAX_DELIVERY_CHECK);
        }
        self.forget();
        Ok(())
    }

    /// Deletes what is left of the connection in the maps. Once both
    /// sockets are out of `peers` and `verdicts`, the kernel drops their
    /// sockmap state and they are plain TCP sockets again.
    fn forget(&mut self) {
        for i in 0..2 {
            if self.in_verdicts[i] {
                let _ = map_delete(&self.kernel.verdicts, self.cookies[i]);
                self.in_verdicts[i] = false;
            }
        }
        for i in 0..2 {
            if self.in_peers[i] {
                let _ = map_delete(&self.kernel.peers, self.cookies[i]);
                self.in_peers[i] = false;
            }
        }
        for i in 0..2 {
            if self.in_moved[i] {
                let _ = map_delete(&self.kernel.moved, self.cookies[i]);
                self.in_moved[i] = false;
            }
        }
    }
}

impl Drop for Link<'_> {
    /// `moved` entries go with the connection; `peers` and `verdicts`
    /// entries go by themselves when the sockets close, and deleting them
    /// here would throw away bytes the kernel still holds for a socket
    /// after an error (the copy pump loses its buffer the same way).
    fn drop(&mut self) {
        for i in 0..2 {
            if self.in_moved[i] {
                let _ = map_delete(&self.kernel.moved, self.cookies[i]);
            }
        }
    }
}

/// The socket's cookie (`SO_COOKIE`), its key in the maps.
fn cookie(socket: &TcpStream) -> io::Result<u64> {
    let mut value = 0u64;
    let mut len = mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for the call.
    let ret = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_COOKIE,
            &mut value as *mut u64 as *mut libc::c_void,
            &mut len,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

/// Bytes that were queued before the socket got the program wait for the
/// next segment; a non-blocking peek makes the kernel pass them through
/// the program now (it says `EAGAIN`, having found nothing left to peek).
fn push_queued(socket: &TcpStream) {
    let mut byte = 0u8;
    // SAFETY: one byte of valid memory; the result is not needed.
    unsafe {
        libc::recv(
            socket.as_raw_fd(),
            &mut byte as *mut u8 as *mut libc::c_void,
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
}

/// `poll(2)` for at most `wait`; a signal just ends the wait early.
fn poll(fds: &mut [libc::pollfd; 2], wait: Duration) -> io::Result<()> {
    let ms = i32::try_from(wait.as_millis().max(1)).unwrap_or(i32::MAX);
    // SAFETY: `fds` is a valid array of two pollfd for the whole call.
    let ret = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if ret < 0 {
        let err = io::Error::last_os_error();
        if err.kind() != ErrorKind::Interrupted {
            return Err(err);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

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
        assert_eq!(load_map(R2, 5)[0].regs, 0x12);
        assert_eq!(mem::size_of::<Insn>(), 8);
    }

    #[test]
    fn every_jump_lands_on_an_exit_path() {
        let p = program(3, 4);
        assert_eq!(p.len(), 27);
        for (pc, i) in p.iter().enumerate() {
            if i.code & 0x07 == JMP && i.code & 0xf0 != CALL && i.code & 0xf0 != EXIT {
                let target = pc as i64 + 1 + i.off as i64;
                // Each jump goes to `r0 = ...; exit`.
                let t = target as usize;
                assert_eq!(p[t].code, ALU64 | MOV | K, "jump at {pc}");
                assert_eq!(p[t + 1], exit(), "jump at {pc}");
            }
        }
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        for s in [&a, &b] {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        }
        (a, b)
    }

    #[test]
    fn the_counters_leave_out_syn_and_fin() {
        let (mut a, mut b) = pair();
        let fresh = Counts::of(&a).unwrap();
        // The connecting side's SYN counts as one acked byte.
        assert_eq!(fresh.handed(), 1);
        a.write_all(b"12345").unwrap();
        a.shutdown(Direction::Write).unwrap();
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        let c = Counts::of(&b).unwrap();
        assert!(c.fin_in());
        assert_eq!(c.received, 6);
        assert_eq!(c.data_in(), 5);
    }

    #[test]
    fn the_program_loads_and_relays_both_ways() {
        // The tests run as root here; elsewhere this is the check that
        // says the kernel path cannot work.
        let kernel = kernel().expect("the sockmap program should load (root, sockmap)");
        let (mut client, client_end) = pair();
        let (backend_end, mut backend) = pair();
        // Bytes queued before insertion must come through too.
        client.write_all(b"early ").unwrap();
        let mut link = Link::new(kernel, &client_end, &backend_end);
        let mut deadline = Instant::now() + Duration::from_secs(5);
        while Counts::of(&client_end).unwrap().received < 6 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        link.insert().unwrap();
        client.write_all(b"then more").unwrap();
        let mut got = [0u8; 15];
        backend.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"early then more");
        backend.write_all(b"reply").unwrap();
        let mut reply = [0u8; 5];
        client.read_exact(&mut reply).unwrap();
        assert_eq!(&reply, b"reply");
        // The program counted what it redirected from each side.
        deadline = Instant::now() + Duration::from_secs(5);
        let moved = |i: usize| map_lookup(&kernel.moved, link.cookies[i]).unwrap();
        while (moved(0), moved(1)) != (15, 5) && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!((moved(0), moved(1)), (15, 5));
        // Unwound, the sockets are plain again and bytes still flow.
        let mut transfer = Transfer::default();
        link.unwind(Duration::from_secs(5), &mut transfer).unwrap();
        assert_eq!((transfer.to_backend, transfer.to_client), (15, 5));
        client.write_all(b"plain").unwrap();
        let mut buf = [0u8; 5];
        let mut from = &client_end;
        from.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"plain");
    }
}
