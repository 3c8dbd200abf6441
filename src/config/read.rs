//! Reading the config file from disk, bounded: at most [`MAX_FILE_SIZE`]
//! bytes, and only from a regular file.
//!
//! Called by [`super::file::load`] on the main thread at start-up and on
//! the thread that asks for a reload; nothing here is shared.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C reads no file.

use std::path::Path;

/// Largest config file read: 1 MiB. A real one is a few kilobytes; the
/// cap keeps `/dev/zero`, a log given by mistake or a huge file from
/// growing the process without bound.
pub const MAX_FILE_SIZE: u64 = 1 << 20;

/// The file's text, read up to [`MAX_FILE_SIZE`], or why not. Only
/// regular files are read: a FIFO that nobody writes to would block the
/// start-up (or a reload) forever, and a device such as `/dev/urandom`
/// never ends.
pub(crate) fn read_capped(path: &Path) -> std::result::Result<String, String> {
    use crate::system::FileError;
    let bytes = crate::files::read(path, MAX_FILE_SIZE).map_err(|e| match e {
        FileError::Io(e) => format!("cannot be read: {e}"),
        FileError::Directory => "cannot be read: Is a directory, not a file".into(),
        FileError::NotRegular => "cannot be read: not a regular file (a pipe or a device?)".into(),
        FileError::TooLarge => format!(
            "is larger than {} KiB, the most a config file may be",
            MAX_FILE_SIZE / 1024
        ),
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        format!("is not UTF-8 text (byte {} is not valid UTF-8)", at + 1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_read() {
        let dir = std::env::temp_dir();
        assert!(read_capped(&dir).unwrap_err().contains("Is a directory"));
        let zero = read_capped(Path::new("/dev/zero")).unwrap_err();
        assert!(zero.contains("not a regular file"), "{zero}");
    }
}
