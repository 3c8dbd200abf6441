//! Giving up root once it is no longer needed: the `user` and `group`
//! settings (HAProxy's `user` and `group`), and the refusal to serve as
//! root without them.
//!
//! Root is needed to bind a port below 1024 (without
//! `CAP_NET_BIND_SERVICE`) and to open files only root may open. `main`
//! does all of that first (both listening sockets bound, the access log
//! opened, the admin token read), then calls [`drop_root`], before any
//! client is accepted:
//! `setgroups` (only the new group), `setgid`, then `setuid`, in that
//! order, since after `setuid` the other two are no longer allowed; then
//! it checks that the ids are the new ones and that root cannot be taken
//! back. Started as root with no `user`, it refuses to go on unless
//! `allow_root` is set, and says so first, before anything is bound or
//! asked ([`refuse_root`]). Started as another user, nothing changes unless
//! `user` names someone else (and then the switch fails: only root may).
//!
//! What is read after the switch is read by a root reader kept for it
//! ([`crate::files`]: the config file and the files it names, on each
//! reload); the access log's path, when SIGUSR1 reopens it, is opened as
//! the new user (docs/operations.md, "Dropping root").
//!
//! # Threads
//!
//! [`drop_root`] runs on the main thread; threads already started (the
//! signal thread, the access log's writer) change with it, as glibc's
//! `setuid` and `setgid` apply to every thread of the process.
//! [`Identity::of`] looks the names up in the user database on whatever
//! thread validates the settings.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C runs as whoever starts it.

use std::ffi::CString;
use std::io;

use crate::error::{Error, Result};

/// The ids `user` and `group` name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user id to take, when `user` is given.
    pub uid: Option<libc::uid_t>,
    /// The group id to take: `group`'s, else the user's own group.
    pub gid: Option<libc::gid_t>,
    /// The names as given, for the log.
    words: String,
}

impl Identity {
    /// The ids the `user` and `group` settings name (a name or a number
    /// each), looked up; `None` when neither is given.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] (`user` or `group`) for a name this host
    /// does not know, or a user number with no entry and no `group`.
    pub fn of(user: Option<&str>, group: Option<&str>) -> Result<Option<Identity>> {
        if user.is_none() && group.is_none() {
            return Ok(None);
        }
        let (user_name, group_name) = (user, group);
        let lookup = |key: &str, e: io::Error| {
            Error::setting(key, format!("cannot read the user database: {e}"))
        };
        let user = match user_name {
            None => None,
            Some(name) => match user_entry(name).map_err(|e| lookup("user", e))? {
                Some(entry) => Some(entry),
                None => match name.parse::<libc::uid_t>() {
                    Ok(uid) => Some((uid, None)),
                    Err(_) => {
                        return Err(Error::setting(
                            "user",
                            format!("{name}: no such user on this host"),
                        ))
                    }
                },
            },
        };
        let gid = match group_name {
            Some(name) => match group_id(name).map_err(|e| lookup("group", e))? {
                Some(gid) => Some(gid),
                None => name.parse::<libc::gid_t>().map(Some).map_err(|_| {
                    Error::setting("group", format!("{name}: no such group on this host"))
                })?,
            },
            None => match user {
                Some((_, Some(gid))) => Some(gid),
                Some((uid, None)) => {
                    return Err(Error::setting(
                        "user",
                        format!(
                            "{uid} has no entry in the user database, so no group of its \
                             own: give `group` too"
                        ),
                    ))
                }
                None => None,
            },
        };
        let uid = user.map(|(uid, _)| uid);
        let mut words = Vec::new();
        if let (Some(name), Some(uid)) = (user_name, uid) {
            words.push(format!("user {name} ({uid})"));
        }
        match (group_name, gid) {
            (Some(name), Some(gid)) => words.push(format!("group {name} ({gid})")),
            (None, Some(gid)) => words.push(format!("its group ({gid})")),
            _ => {}
        }
        Ok(Some(Identity {
            uid,
            gid,
            words: words.join(" and "),
        }))
    }

    /// Takes these ids: `setgroups`, `setgid`, `setuid`, then checks.
    fn assume(&self) -> io::Result<()> {
        // SAFETY: plain system calls on ids; `setgroups` reads one gid_t
        // that lives for the call.
        unsafe {
            if let Some(gid) = self.gid {
                if libc::setgroups(1, &gid) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::setgid(gid) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(uid) = self.uid {
                if libc::setuid(uid) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        self.check()
    }

    /// Whether the process now has these ids, and, without root, cannot
    /// take root back.
    fn check(&self) -> io::Result<()> {
        let wrong = |what: &str| Err(io::Error::other(format!("the {what} did not change")));
        // SAFETY: these calls only read the process's ids (and setuid(0)
        // fails unless the process may be root again).
        unsafe {
            if let Some(gid) = self.gid {
                if libc::getgid() != gid || libc::getegid() != gid {
                    return wrong("group id");
                }
            }
            if let Some(uid) = self.uid {
                if libc::getuid() != uid || libc::geteuid() != uid {
                    return wrong("user id");
                }
                if uid != 0 && libc::setuid(0) == 0 {
                    return Err(io::Error::other("root could still be taken back"));
                }
            }
        }
        Ok(())
    }

    /// Whether the process runs with these ids already.
    fn is_current(&self) -> bool {
        let same = |id: Option<u32>, real: u32, effective: u32| {
            id.map_or(true, |id| id == real && id == effective)
        };
        // SAFETY: these calls only read the process's ids.
        unsafe {
            same(self.uid, libc::getuid(), libc::geteuid())
                && same(self.gid, libc::getgid(), libc::getegid())
        }
    }
}

/// Refuses at once, before anything is bound or asked, a start as root
/// that [`drop_root`] would refuse after binding (no `user`, no
/// `allow_root`): the prompt's questions are not asked for nothing.
///
/// # Errors
///
/// [`Error::InvalidConfig`] (exit 2) saying what to give.
pub fn refuse_root(user: Option<&str>, allow_root: bool) -> Result<()> {
    // SAFETY: reads the effective user id.
    let root = unsafe { libc::geteuid() } == 0;
    if root && user.is_none() && !allow_root {
        return Err(serving_as_root());
    }
    Ok(())
}

/// Whether [`drop_root`] will give root up for another user: started as
/// root, with `user` naming someone else. Such a process keeps a root
/// reader for the files a reload reads ([`crate::files`]).
pub fn gives_root_up(user: Option<&str>, group: Option<&str>) -> bool {
    // SAFETY: reads the effective user id.
    let root = unsafe { libc::geteuid() } == 0;
    let uid = Identity::of(user, group).ok().flatten().and_then(|i| i.uid);
    root && uid.is_some_and(|uid| uid != 0)
}

/// The refusal to serve as root, in one line.
fn serving_as_root() -> Error {
    Error::InvalidConfig(
        "started as root, rodizio gives root up once its ports are bound: name the \
         user to run as with `user` (--user, e.g. nobody; `group` for its group), or \
         set `allow_root` (--allow-root) to serve as root"
            .into(),
    )
}

/// Called once everything that needs root is done, before the first
/// client: takes the ids `user` and `group` name, or refuses to go on as
/// root without them (unless `allow_root`).
///
/// # Errors
///
/// [`Error::InvalidSetting`] or [`Error::InvalidConfig`] (a usage error,
/// exit 2) when the names are unknown, the switch is not allowed, or the
/// process would serve as root without being told to; [`Error::Io`] when a
/// switch allowed by the system still fails.
pub fn drop_root(user: Option<&str>, group: Option<&str>, allow_root: bool) -> Result<()> {
    // SAFETY: reads the effective user id.
    let started_as_root = unsafe { libc::geteuid() } == 0;
    if let Some(identity) = Identity::of(user, group)? {
        if !identity.is_current() {
            identity.assume().map_err(|e| match e.raw_os_error() {
                Some(libc::EPERM) => Error::setting(
                    if identity.uid.is_some() {
                        "user"
                    } else {
                        "group"
                    },
                    format!(
                        "{}: not allowed to switch to it ({e}): only a process started \
                         as root may",
                        identity.words
                    ),
                ),
                _ => Error::io(format!("switching to {}", identity.words), e),
            })?;
            log::info!("running as {}", identity.words);
        }
    }
    // SAFETY: reads the effective user id.
    if started_as_root && unsafe { libc::geteuid() } == 0 && !allow_root {
        return Err(serving_as_root());
    }
    Ok(())
}

/// The user `name`'s id and group id, from the user database; `None` when
/// it has no entry.
fn user_entry(name: &str) -> io::Result<Option<(libc::uid_t, Option<libc::gid_t>)>> {
    let Ok(cname) = CString::new(name) else {
        return Ok(None);
    };
    let mut buf = vec![0u8; 1024];
    loop {
        // SAFETY: passwd is plain data filled by getpwnam_r, whose strings
        // point into `buf`, which outlives every read of them here.
        let (rc, found) = unsafe {
            let mut entry: libc::passwd = std::mem::zeroed();
            let mut result: *mut libc::passwd = std::ptr::null_mut();
            let rc = libc::getpwnam_r(
                cname.as_ptr(),
                &mut entry,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            );
            (
                rc,
                (!result.is_null()).then_some((entry.pw_uid, Some(entry.pw_gid))),
            )
        };
        match rc {
            0 => return Ok(found),
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            // "Not found" in several spellings, as getpwnam(3) warns.
            libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => return Ok(None),
            rc => return Err(io::Error::from_raw_os_error(rc)),
        }
    }
}

/// The group `name`'s id, from the group database; `None` when it has no
/// entry.
fn group_id(name: &str) -> io::Result<Option<libc::gid_t>> {
    let Ok(cname) = CString::new(name) else {
        return Ok(None);
    };
    let mut buf = vec![0u8; 1024];
    loop {
        // SAFETY: as in user_entry, with group and getgrnam_r.
        let (rc, found) = unsafe {
            let mut entry: libc::group = std::mem::zeroed();
            let mut result: *mut libc::group = std::ptr::null_mut();
            let rc = libc::getgrnam_r(
                cname.as_ptr(),
                &mut entry,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            );
            (rc, (!result.is_null()).then_some(entry.gr_gid))
        };
        match rc {
            0 => return Ok(found),
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => return Ok(None),
            rc => return Err(io::Error::from_raw_os_error(rc)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_are_looked_up() {
        assert_eq!(Identity::of(None, None).unwrap(), None);
        let root = Identity::of(Some("root"), None).unwrap().unwrap();
        assert_eq!((root.uid, root.gid), (Some(0), Some(0)));
        let by_number = Identity::of(Some("0"), Some("0")).unwrap().unwrap();
        assert_eq!((by_number.uid, by_number.gid), (Some(0), Some(0)));
        let group_only = Identity::of(None, Some("root")).unwrap().unwrap();
        assert_eq!((group_only.uid, group_only.gid), (None, Some(0)));
    }

    #[test]
    fn unknown_names_are_refused_in_words() {
        let err = Identity::of(Some("no-such-user-here"), None).unwrap_err();
        assert_eq!(
            err.worded_as_flag().to_string(),
            "invalid configuration: --user no-such-user-here: no such user on this host"
        );
        let err = Identity::of(Some("root"), Some("no-such-group")).unwrap_err();
        assert!(
            err.to_string()
                .contains("group no-such-group: no such group"),
            "{err}"
        );
        // A number with no entry has no group of its own.
        let err = Identity::of(Some("4000000000"), None).unwrap_err();
        assert!(err.to_string().contains("give `group` too"), "{err}");
        assert!(Identity::of(Some("4000000000"), Some("0")).is_ok());
    }

    #[test]
    fn the_current_ids_need_no_switch() {
        // SAFETY: reads the ids.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let me = Identity::of(Some(&uid.to_string()), Some(&gid.to_string()))
            .unwrap()
            .unwrap();
        assert!(me.is_current());
        assert!(me.check().is_ok());
    }
}
