//! `rodizio probe`: every kind of active check once against one server,
//! each saying what the server answered, and the kind worth choosing, so
//! that picking `--health-check` is an experiment rather than a guess.
//!
//! The kinds run one after another, each connection closed before the
//! next opens: a server that serves one connection at a time (a small
//! embedded one, a single-threaded test server) answers each in turn,
//! where checks all at once would leave all but one waiting and time them
//! out, with the wrong advice. A server silent to the kinds it does not
//! speak costs one check timeout per such kind. `send-expect` is left out:
//! it needs bytes only the operator knows.
//!
//! # Threads
//!
//! [`survey`] runs on the caller's thread.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C never checks a backend.

use std::fmt;
use std::time::{Duration, Instant};

use super::check::{answer, CheckFailure};
use super::{CheckKind, HealthConfig};
use crate::backend::Backend;

/// The kinds tried, in the order printed: from the plainest to those that
/// speak a protocol.
pub const KINDS: [CheckKind; 7] = [
    CheckKind::Tcp,
    CheckKind::Http,
    CheckKind::Redis,
    CheckKind::Tls,
    CheckKind::Smtp,
    CheckKind::Mysql,
    CheckKind::Pgsql,
];

/// What one kind of check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The kind of check.
    pub kind: CheckKind,
    /// What the server answered when it passed; why not when it failed.
    pub result: Result<String, CheckFailure>,
    /// How long the check took.
    pub took: Duration,
}

impl Finding {
    /// Whether the check passed.
    pub fn passed(&self) -> bool {
        self.result.is_ok()
    }
}

/// `redis   pass  answered "+PONG" (3 ms)`; a failure's reason without
/// the kind's name it starts with, which the first column already says.
impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.kind.name();
        let (word, text) = match &self.result {
            Ok(answer) => ("pass", answer.as_str()),
            Err(failure) => {
                let reason = failure.reason.as_str();
                let own = reason.strip_prefix(name).and_then(|r| r.strip_prefix(": "));
                ("fail", own.unwrap_or(reason))
            }
        };
        write!(
            f,
            "{name:<6}  {word}  {text} ({} ms)",
            self.took.as_millis()
        )
    }
}

/// Runs every kind of [`KINDS`] once against `backend`, one after
/// another, each with `config`'s timeout, path and user; the findings in
/// [`KINDS`]' order.
pub fn survey(backend: &Backend, config: &HealthConfig) -> Vec<Finding> {
    KINDS
        .iter()
        .map(|&kind| {
            let config = HealthConfig {
                check: kind,
                ..config.clone()
            };
            let started = Instant::now();
            let result = answer(backend, &config);
            Finding {
                kind,
                result,
                took: started.elapsed(),
            }
        })
        .collect()
}

/// The kinds to choose among, most telling first: those that speak a
/// protocol and passed (they see the server answer, not only accept);
/// else `http` if it passed; else `tcp` if it did. Empty when none passed.
pub fn suggested(findings: &[Finding]) -> Vec<CheckKind> {
    let passed = |wanted: &dyn Fn(CheckKind) -> bool| -> Vec<CheckKind> {
        findings
            .iter()
            .filter(|f| f.passed() && wanted(f.kind))
            .map(|f| f.kind)
            .collect()
    };
    let speaking = passed(&|k| !matches!(k, CheckKind::Tcp | CheckKind::Http));
    if !speaking.is_empty() {
        return speaking;
    }
    let http = passed(&|k| k == CheckKind::Http);
    if !http.is_empty() {
        return http;
    }
    passed(&|k| k == CheckKind::Tcp)
}

/// The last line: the kind to use, and every kind that passed:
/// `suggested: --health-check redis (passed: tcp, redis)`, or `no check
/// passed`.
pub fn suggestion(findings: &[Finding]) -> String {
    let chosen = suggested(findings);
    let Some(first) = chosen.first() else {
        return "no check passed".into();
    };
    let passed: Vec<&str> = findings
        .iter()
        .filter(|f| f.passed())
        .map(|f| f.kind.name())
        .collect();
    let others: Vec<&str> = chosen[1..].iter().map(|k| k.name()).collect();
    let or = if others.is_empty() {
        String::new()
    } else {
        format!(" (or {})", others.join(", "))
    };
    format!(
        "suggested: --health-check {}{or}; passed: {}",
        first.name(),
        passed.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::net::{SocketAddr, TcpListener};
    use std::thread;

    /// A fake Redis on loopback: `+PONG` to `PING`, `+OK` to `QUIT`, and
    /// nothing to anything else, until the client closes; one connection
    /// at a time, as a single-threaded server serves them (the next waits
    /// in the backlog, and a check that came first holds it until that
    /// check gives up).
    fn fake_redis() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                stream
                    .set_read_timeout(Some(Duration::from_secs(5)))
                    .unwrap();
                let mut out = stream.try_clone().unwrap();
                for line in BufReader::new(stream).lines() {
                    let reply: &[u8] = match line.as_deref() {
                        Ok("PING") => b"+PONG\r\n",
                        Ok("QUIT") => b"+OK\r\n",
                        Ok(_) => continue,
                        Err(_) => break,
                    };
                    if out.write_all(reply).is_err() {
                        break;
                    }
                }
            }
        });
        addr
    }

    fn config() -> HealthConfig {
        HealthConfig {
            timeout: Duration::from_millis(300),
            ..HealthConfig::default()
        }
    }

    /// Redis passes and tcp too, though the server serves one connection
    /// at a time; the others fail, the silent ones at the timeout, one
    /// after another.
    #[test]
    fn a_one_connection_redis_passes_redis_and_tcp() {
        let addr = fake_redis();
        let backend = Backend::new(addr.to_string(), vec![addr], 1);
        let started = Instant::now();
        let findings = survey(&backend, &config());
        let most = config().timeout * KINDS.len() as u32 + Duration::from_secs(2);
        assert!(started.elapsed() < most, "one timeout per kind at most");
        let kinds: Vec<CheckKind> = findings.iter().map(|f| f.kind).collect();
        assert_eq!(kinds, KINDS);
        let passed: Vec<&str> = findings
            .iter()
            .filter(|f| f.passed())
            .map(|f| f.kind.name())
            .collect();
        assert_eq!(passed, ["tcp", "redis"], "{findings:#?}");
        let redis = findings[2].to_string();
        assert!(
            redis.starts_with("redis   pass  answered \"+PONG\" ("),
            "{redis}"
        );
        let smtp = findings[4].to_string();
        assert!(
            smtp.starts_with("smtp    fail  timed out waiting for the greeting"),
            "{smtp}"
        );
        assert_eq!(suggested(&findings), [CheckKind::Redis]);
        assert_eq!(
            suggestion(&findings),
            "suggested: --health-check redis; passed: tcp, redis"
        );
    }

    #[test]
    fn a_closed_port_fails_every_kind() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let backend = Backend::new(addr.to_string(), vec![addr], 1);
        let findings = survey(&backend, &config());
        assert_eq!(findings.len(), KINDS.len());
        for f in &findings {
            let reason = &f.result.as_ref().unwrap_err().reason;
            assert!(reason.starts_with("connect: "), "{f}");
        }
        assert!(suggested(&findings).is_empty());
        assert_eq!(suggestion(&findings), "no check passed");
    }

    #[test]
    fn http_is_suggested_over_tcp() {
        let finding = |kind, ok: bool| Finding {
            kind,
            result: if ok {
                Ok("connected".into())
            } else {
                Err("no".to_string().into())
            },
            took: Duration::ZERO,
        };
        let web = [
            finding(CheckKind::Tcp, true),
            finding(CheckKind::Http, true),
        ];
        assert_eq!(suggested(&web), [CheckKind::Http]);
        let bare = [
            finding(CheckKind::Tcp, true),
            finding(CheckKind::Http, false),
        ];
        assert_eq!(
            suggestion(&bare),
            "suggested: --health-check tcp; passed: tcp"
        );
        let two = [
            finding(CheckKind::Tcp, true),
            finding(CheckKind::Mysql, true),
            finding(CheckKind::Pgsql, true),
        ];
        assert_eq!(
            suggestion(&two),
            "suggested: --health-check mysql (or pgsql); passed: tcp, mysql, pgsql"
        );
    }
}
