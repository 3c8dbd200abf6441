//! The access log's lines of the settings table (`table.rs`), kept here so
//! that each file of the table stays readable: `settings_table!` hands
//! its lines and its file-only keys to [`with_log_settings`], which adds
//! these before the file-only keys and calls the table's reader.
//!
//! Only a macro: nothing runs here.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C prints `### REQUEST FINISHED ###` and nothing
//! else.

/// Calls `$callback!` with the table's lines, these, then `@file_only`.
macro_rules! with_log_settings {
    ($callback:ident { $($lines:tt)* } { $($file_only:tt)* }) => {
        $callback! {
        $($lines)*
        /// Write one line per connection when it ends, as text or json (client,
        /// backend, queue and connect times, duration, bytes, how it ended);
        /// refused clients get a line too. Off by default.
        access_log: crate::access_log::Format, "access-log", Process, some(access_log),
            restart[access_log],
            file MaybeParsed<crate::access_log::Format> => take,
            flag Option<crate::access_log::Format> [value_name = "FORMAT", value_parser = parse_access_log],
            always |c: &Config| or_off(c.access_log, |f| f.to_string());
        /// Where --access-log writes (default: standard output); reopened on
        /// SIGUSR1, for logrotate.
        access_log_file: PathBuf, "access-log-file", Process, some(access_log_file),
            restart[access_log_file],
            file Stdout => take,
            flag Option<PathBuf> [value_name = "PATH"],
            always |c: &Config| c
                .access_log_file
                .as_ref()
                .map_or("stdout".into(), |p| p.display().to_string());
        /// The access log's line as a template over its fields, e.g.
        /// "{time} {client} {backend} {end} {to_client}" (docs/operations.md);
        /// default: the --access-log format's own line.
        access_log_format: crate::access_log::Template, "access-log-format", Process,
            some(access_log_format), restart[access_log_format],
            file MaybeParsed<crate::access_log::Template> => take,
            flag Option<crate::access_log::Template> [value_name = "TEMPLATE",
                value_parser = |t: &str| t.parse::<crate::access_log::Template>().map_err(|e| e.to_string().replace("invalid configuration: ", ""))],
            always |c: &Config| or_off(c.access_log_format.as_ref(), |t| t.to_string());
        /// Where the access log goes: stdout, file (--access-log-file),
        /// syslog:IP:PORT (UDP) or syslog:/PATH (a Unix datagram socket), in
        /// RFC 5424. Default: the file when one is given, else stdout.
        access_log_target: crate::access_log::Destination, "access-log-target", Process,
            some(access_log_target), restart[access_log_target],
            file DefaultOr<crate::access_log::Destination> => take,
            flag Option<crate::access_log::Destination> [value_name = "TARGET",
                value_parser = |t: &str| t.parse::<crate::access_log::Destination>().map_err(|e| e.to_string().replace("invalid configuration: ", ""))],
            always |c: &Config| c
                .access_log_target
                .as_ref()
                .map_or("default".into(), |t| t.to_string());
        /// Write an interim line (bytes since the last line) for each
        /// connection open longer than this, every this long. Off by default.
        access_log_interval: Duration, "access-log-interval", Process,
            some(access_log_interval), restart[access_log_interval],
            file MaybeSecs => take,
            flag Option<Duration> [value_name = "DUR", value_parser = parse_duration],
            always |c: &Config| or_off(c.access_log_interval, format_duration);
        /// Write a line when a connection's backend is connected, too.
        access_log_at_connect: bool, "access-log-at-connect", Process,
            set(access_log_at_connect), restart[access_log_at_connect],
            file bool => take,
            flag bool,
            always |c: &Config| c.access_log_at_connect.to_string();
        @file_only { $($file_only)* }
        }
    };
}
pub(crate) use with_log_settings;
