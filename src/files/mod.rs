//! Reading a file an operator names (the config file, certificates and
//! keys, CAs, CRLs, the admin token): the one place that decides how.
//!
//! Started as root with `user` set, rodizio gives root up before it
//! serves, yet a reload must read again what only root may read (certbot
//! writes `privkey.pem` mode 600 in a root-only directory). So, before
//! giving root up, `main` forks a small reader that keeps root
//! (`reader.rs`, as OpenSSH's monitor and nginx's master do) and installs
//! the serving side's end ([`install`]). From then on [`read`] asks it over
//! a Unix stream pair (`protocol.rs`: length-prefixed, bounded, with a
//! deadline); without one, [`read`] reads the file itself
//! ([`crate::system::read_bounded`]). The serving process never regains
//! root: the reader answers only for the config file given at start and
//! the files that file (and the flags) name, read bounded, regular files
//! only.
//!
//! A reader that dies, lies, stalls or sends garbage fails the read that
//! met it with one line, and every later one says the reader is gone: the
//! reload that asked is refused and the running settings stay.
//!
//! # Threads
//!
//! [`read`] runs on whatever thread reads (the reloading thread, the main
//! thread at start-up); a mutex makes two requests take turns. The reader
//! is another process, single-threaded.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C reads no file.

pub mod protocol;
pub mod reader;

use std::path::Path;
use std::sync::OnceLock;

pub use protocol::Client;

use crate::system::FileError;

/// The reader's end, once [`install`]ed: for the life of the process.
static READER: OnceLock<Client> = OnceLock::new();

/// The bytes of the regular file `path`, at most `max`: asked of the
/// privileged reader when there is one, else read here.
///
/// # Errors
///
/// The [`FileError`] that says why; a reader that failed is a
/// [`FileError::Io`] saying so.
pub fn read(path: &Path, max: u64) -> Result<Vec<u8>, FileError> {
    match READER.get() {
        Some(client) => client.read(path, max),
        None => crate::system::read_bounded(path, max),
    }
}

/// From now on [`read`] asks `client`. Only the first call counts: a
/// process has one reader.
pub fn install(client: Client) {
    let _ = READER.set(client);
}

/// Whether [`read`] asks a privileged reader.
pub fn through_reader() -> bool {
    READER.get().is_some()
}
