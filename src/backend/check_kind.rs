//! The kinds of active check (`tcp`, `http`, `redis`, ...) and their
//! names in flags and files.
//!
//! A leaf: it imports nothing of the crate. It sits in `backend/`, beside
//! the backend's own check settings (`own_check`) that name a kind, so
//! that `backend` needs nothing of `health/` above it; `health` re-exports
//! it as [`crate::health::CheckKind`].
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C never checks a backend.

/// The kind of active check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CheckKind {
    /// Open a TCP connection, then close it.
    #[default]
    Tcp,
    /// `GET` the health path; a 2xx or 3xx status is healthy.
    Http,
    /// No active check (passive checks and the cool-down still apply).
    Off,
    /// Redis `PING`, `+PONG` (or `-NOAUTH`) is healthy.
    Redis,
    /// A TLS ClientHello; a handshake record back is healthy.
    Tls,
    /// Read the SMTP `220` greeting, say `QUIT`.
    Smtp,
    /// Read the MySQL/MariaDB greeting; with `health_user`, log in and quit.
    Mysql,
    /// A PostgreSQL startup message for `health_user`; an authentication
    /// request or an error answer means alive.
    Pgsql,
    /// Send `health_send` (if any), expect `health_expect` in the reply.
    SendExpect,
}

impl CheckKind {
    /// Every kind, in the order the help lists them.
    pub const ALL: [CheckKind; 9] = [
        CheckKind::Tcp,
        CheckKind::Http,
        CheckKind::Off,
        CheckKind::Redis,
        CheckKind::Tls,
        CheckKind::Smtp,
        CheckKind::Mysql,
        CheckKind::Pgsql,
        CheckKind::SendExpect,
    ];

    /// The name used in flags and the config file (`tcp`, `http`, ...).
    pub fn name(self) -> &'static str {
        match self {
            CheckKind::Tcp => "tcp",
            CheckKind::Http => "http",
            CheckKind::Off => "off",
            CheckKind::Redis => "redis",
            CheckKind::Tls => "tls",
            CheckKind::Smtp => "smtp",
            CheckKind::Mysql => "mysql",
            CheckKind::Pgsql => "pgsql",
            CheckKind::SendExpect => "send-expect",
        }
    }
}

impl std::str::FromStr for CheckKind {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let wanted = text.trim().replace('_', "-");
        CheckKind::ALL
            .into_iter()
            .find(|k| k.name() == wanted)
            .ok_or_else(|| {
                let names: Vec<&str> = CheckKind::ALL.iter().map(|k| k.name()).collect();
                format!("'{text}' is not a health check (use {})", names.join(", "))
            })
    }
}
