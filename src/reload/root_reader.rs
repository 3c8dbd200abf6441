//! The root reader kept for reloads: started as root with `user` set,
//! rodizio forks it before anything else runs (before the first thread,
//! before any socket is bound), so that a reload, once root is given up,
//! still reads the config file and the root-only files it names (a key
//! certbot wrote mode 600). [`keep_root_reader`] decides whether one is
//! needed and what it may read: the files the settings name now, read
//! again from the config file at each request (with the start-up flags
//! over it), or the flags' own when started without a file.
//!
//! # Threads
//!
//! [`keep_root_reader`] runs on the main thread, before any other thread
//! starts; what it hands the reader runs in that process.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C runs as whoever starts it.

use std::path::{Path, PathBuf};

use crate::config::file;
use crate::config::{Config, Overrides};
use crate::error::{Error, Result};
use crate::files;

/// Every file `config` names that rodizio reads: each service's TLS
/// files and etcd CA, and the admin token file.
pub fn named_files(config: &Config) -> Vec<PathBuf> {
    let mut named: Vec<PathBuf> = config
        .service_list()
        .iter()
        .flat_map(|service| service.tls.files().into_iter().chain(service.etcd_ca()))
        .collect();
    named.extend(config.admin_token_file.iter().cloned());
    named
}

/// Forks the root reader when the process will give root up
/// ([`crate::privileges::gives_root_up`]) and installs it, so that every
/// later read of an operator's file ([`files::read`]) goes through it.
/// To be called before any thread starts. `path` is the config file
/// given at start, `flags` the start-up flags, `config` what they settle
/// to now.
///
/// # Errors
///
/// [`Error::Io`] when the reader cannot be started.
pub fn keep_root_reader(path: Option<&Path>, flags: &Overrides, config: &Config) -> Result<()> {
    if !crate::privileges::gives_root_up(config.user.as_deref(), config.group.as_deref()) {
        return Ok(());
    }
    let at_start = named_files(config);
    let allowed: files::reader::Allowed = match path {
        Some(path) => {
            let (path, flags) = (path.to_path_buf(), flags.clone());
            Box::new(move |asked: &Path| {
                let now = file::load(&path).and_then(|f| f.settle(&flags));
                now.is_ok_and(|config| named_files(&config).iter().any(|n| n == asked))
            })
        }
        None => Box::new(move |asked: &Path| at_start.iter().any(|n| n == asked)),
    };
    let client = files::reader::spawn(path.map(Path::to_path_buf), allowed)
        .map_err(|e| Error::io("starting the root reader for reloads", e))?;
    files::install(client);
    Ok(())
}
