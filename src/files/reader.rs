//! The privileged reader: a process forked before root is given up that
//! keeps root and does nothing but answer the serving process's requests
//! (`protocol.rs`): the config file given at start, or a file its
//! settings name, read bounded ([`crate::system::read_bounded`]: regular
//! files only, never past the size asked). Anything else is refused; a
//! request it cannot parse ends it. It ends when the serving process does:
//! it reads the end of the stream, and `PR_SET_PDEATHSIG` kills it should
//! the serving process die at once.
//!
//! # Threads
//!
//! [`spawn`] forks on the main thread before any other thread is started,
//! so the reader is a whole single-threaded process; [`serve`] is its only
//! loop (a test runs it on a thread of its own).
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C runs as whoever starts it.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use super::protocol::{self, Client, Request, MAX_REPLY};
use crate::system::read_bounded;

/// Whether a path is one the settings name now: the reader asks it for
/// each request (it reads the config file again, as root).
pub type Allowed = Box<dyn Fn(&Path) -> bool>;

/// Answers requests on `stream` until it ends or carries garbage: the
/// config file `config` (the one given at start), or a file `allowed`
/// accepts.
pub fn serve(stream: UnixStream, config: Option<&Path>, allowed: &dyn Fn(&Path) -> bool) {
    let (mut from, mut to) = (&stream, &stream);
    while let Ok(Some(request)) = protocol::read_request(&mut from) {
        let written = match request {
            Request::Config { max } => match config {
                Some(path) => {
                    protocol::write_reply(&mut to, &read_bounded(path, max.min(MAX_REPLY)))
                }
                None => {
                    protocol::write_refusal(&mut to, "rodizio was started without a config file")
                }
            },
            Request::File { path, max } if allowed(&path) => {
                protocol::write_reply(&mut to, &read_bounded(&path, max.min(MAX_REPLY)))
            }
            Request::File { path, .. } => protocol::write_refusal(
                &mut to,
                &format!("{} is not a file the settings name", path.display()),
            ),
        };
        if written.is_err() {
            return;
        }
    }
}

/// Forks the reader (to be called as root, before any thread starts) and
/// returns the serving side's end of the link to it.
///
/// # Errors
///
/// The error of `socketpair` or `fork`.
pub fn spawn(config: Option<PathBuf>, allowed: Allowed) -> io::Result<Client> {
    let (ours, theirs) = UnixStream::pair()?;
    // SAFETY: reads our own process id.
    let parent = unsafe { libc::getpid() };
    // SAFETY: no other thread runs yet (see the module doc), so the child
    // is a whole copy of this one; it leaves by `_exit` alone.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            drop(ours);
            become_reader(parent);
            serve(theirs, config.as_deref(), &*allowed);
            // SAFETY: ends the reader without running the serving side's
            // exit handlers.
            unsafe { libc::_exit(0) }
        }
        pid => {
            drop(theirs);
            log::debug!("root reader started (pid {pid})");
            Ok(Client::new(ours, config, protocol::DEFAULT_TIMEOUT).for_process(pid))
        }
    }
}

/// What the reader is made of, just after the fork: killed with its
/// parent, named `rodizio-reader` in `ps`, deaf to the signals a terminal
/// or an operator sends the balancer (Ctrl-C, SIGHUP, SIGUSR1: the
/// balancer's to handle; it ends when the balancer does), with no input,
/// no output and no log.
fn become_reader(parent: libc::pid_t) {
    // What it reads to know the settings (the config file, each time)
    // would log its warnings again: the balancer has logged them.
    log::set_max_level(log::LevelFilter::Off);
    // SAFETY: process-wide settings of this new process; the name is a
    // NUL-terminated string that lives for the call.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != parent {
            libc::_exit(0);
        }
        libc::prctl(libc::PR_SET_NAME, c"rodizio-reader".as_ptr());
        for signal in [
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGUSR1,
            libc::SIGUSR2,
            libc::SIGPIPE,
        ] {
            libc::signal(signal, libc::SIG_IGN);
        }
        // Neither the terminal's input nor the balancer's output (a pipe
        // whose reader waits for its end) is held.
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::close(null);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::system::FileError;
    use std::time::Duration;

    /// A reader on a thread, answering for a config file and one named
    /// file; anything else refused.
    #[test]
    fn the_config_and_named_files_are_read_and_others_refused() {
        let dir = std::env::temp_dir().join(format!("rodizio-reader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("rodizio.json");
        let named = dir.join("site.pem");
        let other = dir.join("other");
        std::fs::write(&config, b"{}").unwrap();
        std::fs::write(&named, b"PEM").unwrap();
        std::fs::write(&other, b"secret").unwrap();
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (config2, named2) = (config.clone(), named.clone());
        let reader = std::thread::spawn(move || {
            serve(theirs, Some(&config2), &move |p: &Path| p == named2);
        });
        let client = Client::new(ours, Some(config.clone()), Duration::from_secs(5));
        assert_eq!(client.read(&config, 100).unwrap(), b"{}");
        assert_eq!(client.read(&named, 100).unwrap(), b"PEM");
        assert!(matches!(client.read(&named, 2), Err(FileError::TooLarge)));
        let Err(FileError::Io(e)) = client.read(&other, 100) else {
            panic!("read a file the settings do not name")
        };
        assert!(
            e.to_string().contains("not a file the settings name"),
            "{e}"
        );
        // Still up after a refusal.
        assert_eq!(client.read(&named, 100).unwrap(), b"PEM");
        drop(client);
        reader.join().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
