//! `rodizio [FLAGS] upgrade`: starts the new process with the same flags,
//! in its own session, and waits until it says how its start went: it
//! serves (the running one handed it the listening sockets and the open
//! connections, or none was running), or it exited (the running one
//! serves on). The new process says so on a pipe whose descriptor it
//! finds in `RODIZIO_UPGRADE_REPORT` ([`report`]): one line,
//! `serving CARRIED STAYED`; a pipe closed without it is a failed start.
//!
//! # Threads
//!
//! The command's main thread; the new process's `Upgrade::serve` writes
//! the report.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// The variable naming the report's descriptor in the new process.
pub const REPORT: &str = "RODIZIO_UPGRADE_REPORT";

/// `rodizio [FLAGS] upgrade` with the settings `config` the flags give:
/// the new process started with the same arguments (the subcommand left
/// out), once `upgrade_socket` is set; the exit code.
///
/// # Errors
///
/// [`crate::Error::InvalidSetting`] (`upgrade_socket`) when it is not set;
/// [`crate::Error::Io`] when this program cannot be found.
pub fn command(config: &crate::Config) -> crate::error::Result<u8> {
    use crate::error::Error;
    if config.upgrade_socket.is_none() {
        return Err(Error::setting(
            "upgrade_socket",
            "`rodizio upgrade` needs it: the running rodizio's upgrade socket",
        ));
    }
    let exe = std::env::current_exe().map_err(|e| Error::io("finding this program", e))?;
    // The same arguments, without the subcommand (the last `upgrade`:
    // flags come before it).
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if let Some(at) = args.iter().rposition(|a| a == "upgrade") {
        args.remove(at);
    }
    Ok(run(&exe, &args))
}

/// Runs `exe` with `args` (the flags before `upgrade`) as the new process;
/// the exit code: 0 once it serves, 1 when it did not start (its own lines
/// say why; the running one serves on).
pub fn run(exe: &std::path::Path, args: &[OsString]) -> u8 {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for the call.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        eprintln!("rodizio upgrade: {}", std::io::Error::last_os_error());
        return 1;
    }
    // SAFETY: pipe2 succeeded: both are open descriptors owned by no one.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let write_fd = write.as_raw_fd();
    let mut command = Command::new(exe);
    command
        .args(args)
        .env(REPORT, write_fd.to_string())
        .stdin(Stdio::null());
    // SAFETY: between fork and exec only async-signal-safe calls: setsid
    // and fcntl (the report's end is kept open across the exec).
    unsafe {
        command.pre_exec(move || {
            libc::setsid();
            if libc::fcntl(write_fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => {
            eprintln!("rodizio upgrade: starting {}: {err}", exe.display());
            return 1;
        }
    };
    drop(write);
    let mut line = String::new();
    let _ = BufReader::new(File::from(read)).read_line(&mut line);
    let pid = child.id();
    match line.trim().strip_prefix("serving ") {
        Some(counts) => {
            let (carried, stayed) = counts.split_once(' ').unwrap_or((counts, "0"));
            println!(
                "rodizio upgrade: the new process (pid {pid}) serves; {carried} open connections \
                 carried over, {stayed} left to drain in the old one"
            );
            0
        }
        None => {
            let status = child
                .wait()
                .map_or_else(|e| e.to_string(), |s| s.to_string());
            eprintln!(
                "rodizio upgrade: the new process (pid {pid}) did not start ({status}); \
                 the running one serves on"
            );
            1
        }
    }
}

/// The new process's side, at start: the report's pipe when `rodizio
/// upgrade` started it (`RODIZIO_UPGRADE_REPORT`), kept from any process
/// it starts in turn.
pub fn take_report() -> Option<File> {
    let fd = std::env::var(REPORT).ok()?.parse::<i32>().ok()?;
    // Not a standard stream, and open: then it is the launcher's pipe.
    // SAFETY: F_SETFD on a descriptor number changes only its flag, and
    // fails when it is not open.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: the launcher left this descriptor open for this process to
    // write its report once and close; nothing else here uses it.
    Some(unsafe { File::from_raw_fd(fd) })
}

/// The new process's side, once it serves: tells `rodizio upgrade` so,
/// with the connections carried over and those that stayed.
pub fn report(pipe: Option<File>, carried: usize, stayed: usize) {
    if let Some(mut pipe) = pipe {
        let _ = writeln!(pipe, "serving {carried} {stayed}");
    }
}
