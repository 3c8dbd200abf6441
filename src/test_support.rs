//! What the unit tests share: a connected pair of sockets on loopback.
//! Compiled for tests only; no threads of its own. No C counterpart.

use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// Read and write timeout of both ends: a bug fails a test instead of
/// hanging it.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(10);

/// A connected pair on `127.0.0.1` (a port the kernel picks): the
/// connecting end and the accepted end, each with [`TIMEOUT`] for reads
/// and writes and `TCP_NODELAY` (a test's small writes leave at once).
pub(crate) fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    for socket in [&client, &server] {
        socket.set_read_timeout(Some(TIMEOUT)).unwrap();
        socket.set_write_timeout(Some(TIMEOUT)).unwrap();
        socket.set_nodelay(true).unwrap();
    }
    (client, server)
}
