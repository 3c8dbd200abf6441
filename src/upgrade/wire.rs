//! The hand-over's messages over a `SOCK_SEQPACKET` Unix socket: one line
//! of text per message (so no message runs into the next), with at most
//! two descriptors attached by `SCM_RIGHTS`; and messages of data (the
//! bytes a carried connection's buffers held), where a line announced
//! them.
//!
//! # Threads
//!
//! Called by the thread doing its side of the hand-over; nothing shared.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::io::{self, ErrorKind};
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;

use socket2::Socket;

/// The longest message, its newline included.
pub const MAX_LINE: usize = 512;

/// The longest message of data (a piece of a carried connection's
/// buffer).
pub const MAX_DATA: usize = 64 * 1024;

/// Descriptors a message may carry before it is refused: room for a few,
/// so that a peer sending more is seen (and its descriptors closed)
/// instead of the kernel dropping them silently.
const FD_ROOM: usize = 4;

/// Sends `line` and a newline as one message, with `fd` attached when
/// given.
pub fn send(socket: &Socket, line: &str, fd: Option<RawFd>) -> io::Result<()> {
    send_fds(socket, line, fd.as_slice())
}

/// Sends `line` and a newline as one message with `fds` attached (at
/// most two: a connection's client and backend sockets).
pub fn send_fds(socket: &Socket, line: &str, fds: &[RawFd]) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    if bytes.len() > MAX_LINE {
        return Err(io::Error::new(ErrorKind::InvalidInput, "message too long"));
    }
    send_raw(socket, &bytes, fds)
}

/// Sends `bytes` as one message of data, no descriptor: what a carried
/// connection's buffer holds, in pieces of at most [`MAX_DATA`].
pub fn send_data(socket: &Socket, bytes: &[u8]) -> io::Result<()> {
    if bytes.is_empty() || bytes.len() > MAX_DATA {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            "a data message of 1 to 64 KiB",
        ));
    }
    send_raw(socket, bytes, &[])
}

/// One `sendmsg(2)` of `bytes` with `fds` (at most two).
fn send_raw(socket: &Socket, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > 2 {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            "more than two descriptors",
        ));
    }
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // u64s: the control buffer must be aligned for `cmsghdr`.
    let mut control = [0u64; 8];
    // SAFETY: a zeroed msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let size = mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_* compute sizes and walk `control`, which is large
        // enough for two descriptors (32 bytes of 64); the header and its
        // data are written inside it.
        unsafe {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(size) as usize;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size) as usize;
            let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                ptr::write_unaligned(data.add(i), *fd);
            }
        }
    }
    // SAFETY: msg points at live buffers for the call (the kernel only
    // reads `bytes`).
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives one message: its line without the newline, and the
/// descriptor it carried. A closed peer, a message that is not one line
/// of printable text within [`MAX_LINE`], or one with more than one
/// descriptor is an error (its descriptors closed).
pub fn recv(socket: &Socket) -> io::Result<(String, Option<OwnedFd>)> {
    let (line, fds) = recv_fds(socket)?;
    if fds.len() > 1 {
        return Err(invalid("a message with more than one descriptor"));
    }
    Ok((line, fds.into_iter().next()))
}

/// [`recv`], with up to two descriptors.
pub fn recv_fds(socket: &Socket) -> io::Result<(String, Vec<OwnedFd>)> {
    let mut buf = [0u8; MAX_LINE];
    let (n, fds) = recv_raw(socket, &mut buf)?;
    if fds.len() > 2 {
        return Err(invalid("a message with more than two descriptors"));
    }
    let line = std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|text| text.strip_suffix('\n'))
        .filter(|line| line.chars().all(|c| !c.is_control()))
        .ok_or_else(|| invalid("a message that is not one line of text"))?;
    Ok((line.to_string(), fds))
}

/// Receives one message of data (see [`send_data`]): at most `max` bytes,
/// no descriptor.
pub fn recv_data(socket: &Socket, max: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; max.min(MAX_DATA)];
    let (n, fds) = recv_raw(socket, &mut buf)?;
    if !fds.is_empty() {
        return Err(invalid("a data message with a descriptor"));
    }
    buf.truncate(n);
    Ok(buf)
}

/// One `recvmsg(2)` into `buf`: the bytes received and the descriptors
/// (owned, so closed on any error). A closed peer, or a message longer
/// than `buf` or with more than [`FD_ROOM`] descriptors, is an error.
fn recv_raw(socket: &Socket, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: a zeroed msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: a size computation.
    msg.msg_controllen =
        unsafe { libc::CMSG_SPACE((FD_ROOM * mem::size_of::<RawFd>()) as u32) } as usize;
    // SAFETY: msg points at live buffers for the call.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let fds = take_fds(&msg);
    if n == 0 {
        return Err(io::Error::new(
            ErrorKind::UnexpectedEof,
            "the other process closed the socket",
        ));
    }
    if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        return Err(invalid(
            "a message longer than expected or with too many descriptors",
        ));
    }
    Ok((n as usize, fds))
}

/// The descriptors a received message carried, each owned (so closed when
/// dropped).
fn take_fds(msg: &libc::msghdr) -> Vec<OwnedFd> {
    let mut fds = Vec::new();
    // SAFETY: CMSG_FIRSTHDR/NXTHDR walk the control buffer the kernel
    // filled (bounded by msg_controllen); each SCM_RIGHTS entry holds
    // descriptors that are now this process's, owned once each.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let len = (*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize;
                for i in 0..len / mem::size_of::<RawFd>() {
                    let fd = ptr::read_unaligned(data.add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    fds
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use socket2::{Domain, Type};

    fn pair() -> (Socket, Socket) {
        Socket::pair(Domain::UNIX, Type::SEQPACKET, None).unwrap()
    }

    #[test]
    fn a_line_and_a_descriptor_arrive_together_and_apart_from_the_next() {
        let (a, b) = pair();
        let file = std::fs::File::open("/dev/null").unwrap();
        send(&a, "L 127.0.0.1:80", Some(file.as_raw_fd())).unwrap();
        send(&a, "END", None).unwrap();
        let (line, fd) = recv(&b).unwrap();
        assert_eq!(line, "L 127.0.0.1:80");
        assert!(fd.is_some());
        assert_eq!(recv(&b).unwrap().0, "END");
        drop(a);
        assert_eq!(recv(&b).unwrap_err().kind(), ErrorKind::UnexpectedEof);
    }

    #[test]
    fn garbage_long_lines_and_many_descriptors_are_refused() {
        let (a, b) = pair();
        for bytes in [
            &b"no newline"[..],
            b"two\nlines\n",
            b"\x1b[2Jescape\n",
            &[0xff, b'\n'],
        ] {
            // SAFETY: a send of a live buffer.
            unsafe { libc::send(a.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
            assert_eq!(
                recv(&b).unwrap_err().kind(),
                ErrorKind::InvalidData,
                "{bytes:?}"
            );
        }
        let long = vec![b'x'; 4096];
        // SAFETY: as above.
        unsafe { libc::send(a.as_raw_fd(), long.as_ptr().cast(), long.len(), 0) };
        assert_eq!(recv(&b).unwrap_err().kind(), ErrorKind::InvalidData);
        assert!(send(&a, &"y".repeat(MAX_LINE), None).is_err());
        // Two descriptors in one message: refused (both closed as the
        // error drops them; the binary's count is checked by
        // tests/hostile/upgrade.rs).
        let file = std::fs::File::open("/dev/null").unwrap();
        two_fds(&a, file.as_raw_fd());
        assert_eq!(recv(&b).unwrap_err().kind(), ErrorKind::InvalidData);
    }

    proptest::proptest! {
        /// Any bytes as a message: one printable line of at most 512
        /// bytes comes back as it was sent, anything else is refused;
        /// never a panic.
        #[test]
        fn any_message_is_a_line_or_refused(bytes in proptest::collection::vec(proptest::num::u8::ANY, 1..700)) {
            let (a, b) = pair();
            // SAFETY: a send of a live buffer.
            unsafe { libc::send(a.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
            let text = std::str::from_utf8(&bytes).ok();
            let line = text
                .and_then(|t| t.strip_suffix('\n'))
                .filter(|l| bytes.len() <= MAX_LINE && l.chars().all(|c| !c.is_control()));
            match (recv(&b), line) {
                (Ok((got, fd)), Some(line)) => {
                    proptest::prop_assert_eq!(got, line);
                    proptest::prop_assert!(fd.is_none());
                }
                (Err(e), None) => proptest::prop_assert_eq!(e.kind(), ErrorKind::InvalidData),
                (got, want) => proptest::prop_assert!(false, "{:?} for {:?}", got, want),
            }
        }
    }

    /// One message carrying `fd` twice.
    fn two_fds(socket: &Socket, fd: RawFd) {
        let mut byte = *b"\n";
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut control = [0u64; 8];
        // SAFETY: as in `send`, with room for two descriptors.
        unsafe {
            let mut msg: libc::msghdr = mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(8) as usize;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(8) as usize;
            let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
            ptr::write_unaligned(data, fd);
            ptr::write_unaligned(data.add(1), fd);
            assert!(libc::sendmsg(socket.as_raw_fd(), &msg, 0) > 0);
        }
    }
}
