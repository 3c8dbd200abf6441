//! The server side's tuning: resumption (the session cache,
//! `tls_session_cache`, and TLS 1.2/1.3 tickets with rotating keys), kept
//! across reloads that change no TLS setting; the ALPN list offered
//! (`tls_alpn`, an [`AlpnList`], which SNI routing reads too and so lives
//! below both, in `sni::alpn`); the server's cipher order.
//!
//! # Threads
//!
//! Built by the thread that starts or reloads the balancer; the cache and
//! the ticket keys are then shared by rustls on every worker thread (the
//! cache behind rustls's own lock).
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::sync::Arc;

use super::TlsSettings;
pub use crate::sni::alpn::AlpnList;
use rustls::server::{NoServerSessionStorage, ProducesTickets, StoresServerSessions};

/// Default of `tls_session_cache`: HAProxy's `tune.ssl.cachesize`.
pub const DEFAULT_SESSION_CACHE: usize = 20_000;

/// The most sessions `tls_session_cache` may keep: rustls reserves room
/// for every entry when the cache is made (about 72 bytes each, touched
/// only as sessions come), and a full entry is a few hundred bytes, so a
/// million is some hundreds of MB at worst.
pub const MAX_SESSION_CACHE: usize = 1_000_000;

/// What resumption needs that outlives one terminator: the session cache
/// and the ticket keys, handed to the next terminator by a reload that
/// changes no TLS setting, so clients resume across it.
#[derive(Debug, Clone)]
pub(super) struct Resumption {
    /// The settings these were made for: another terminator takes them
    /// only when its settings are the same.
    settings: TlsSettings,
    cache: Arc<dyn StoresServerSessions>,
    tickets: Arc<dyn ProducesTickets>,
}

impl Resumption {
    /// The resumption of `previous` when it was made for settings that
    /// match `settings`, else a new one: an empty cache of
    /// `tls_session_cache` entries and new ticket keys.
    ///
    /// With `tls_client_ca`, never the previous one: a session carries
    /// the client's verified certificate, and a client the new files no
    /// longer trust must not resume past them.
    ///
    /// # Errors
    ///
    /// No randomness for the ticket keys, in words.
    pub(super) fn for_settings(
        settings: &TlsSettings,
        previous: Option<&Resumption>,
    ) -> Result<Resumption, String> {
        if let Some(previous) = previous {
            if settings.client_ca.is_none() && same_but_timeout(&previous.settings, settings) {
                return Ok(previous.clone());
            }
        }
        let cache: Arc<dyn StoresServerSessions> = match settings.session_cache {
            0 => Arc::new(NoServerSessionStorage {}),
            n => rustls::server::ServerSessionMemoryCache::new(n.min(MAX_SESSION_CACHE)),
        };
        // Keys rotated every 6 hours, a ticket good for 12.
        let tickets =
            super::crypto::ticketer().map_err(|e| format!("cannot make TLS ticket keys: {e}"))?;
        Ok(Resumption {
            settings: settings.clone(),
            cache,
            tickets,
        })
    }

    /// Puts the cache, the ticket keys, the ALPN list and the server's
    /// cipher order in `config`.
    pub(super) fn tune(&self, config: &mut rustls::ServerConfig) {
        config.session_storage = Arc::clone(&self.cache);
        config.ticketer = Arc::clone(&self.tickets);
        // The server's order of cipher suites, not the client's: the
        // provider lists the strongest first.
        config.ignore_client_order = true;
        config.alpn_protocols = self
            .settings
            .alpn
            .0
            .iter()
            .map(|p| p.clone().into_bytes())
            .collect();
    }
}

/// Whether `a` and `b` are the same settings but for the handshake's
/// timeout, which no session depends on.
fn same_but_timeout(a: &TlsSettings, b: &TlsSettings) -> bool {
    let b = TlsSettings {
        handshake_timeout: a.handshake_timeout,
        ..b.clone()
    };
    *a == b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache and the ticket keys pass to the next terminator when only
    /// the handshake's timeout changed; any other change, or mutual TLS,
    /// makes new ones.
    #[test]
    fn resumption_is_kept_only_for_the_same_settings() {
        let base = TlsSettings::default();
        let first = Resumption::for_settings(&base, None).unwrap();
        let kept = |s: &TlsSettings| {
            let next = Resumption::for_settings(s, Some(&first)).unwrap();
            Arc::ptr_eq(&next.cache, &first.cache) && Arc::ptr_eq(&next.tickets, &first.tickets)
        };
        assert!(kept(&base));
        assert!(kept(&TlsSettings {
            handshake_timeout: std::time::Duration::from_secs(3),
            ..base.clone()
        }));
        assert!(!kept(&TlsSettings {
            session_cache: 5,
            ..base.clone()
        }));
        assert!(!kept(&TlsSettings {
            strict_sni: true,
            ..base.clone()
        }));
        let mutual = TlsSettings {
            client_ca: Some("ca.pem".into()),
            ..base.clone()
        };
        let with_ca = Resumption::for_settings(&mutual, None).unwrap();
        let again = Resumption::for_settings(&mutual, Some(&with_ca)).unwrap();
        assert!(!Arc::ptr_eq(&again.tickets, &with_ca.tickets));
    }

    /// Size 0 stores nothing; a huge size is an entry count, capped, and
    /// costs nothing until sessions come.
    #[test]
    fn cache_sizes_zero_and_huge() {
        let off = Resumption::for_settings(
            &TlsSettings {
                session_cache: 0,
                ..TlsSettings::default()
            },
            None,
        )
        .unwrap();
        assert!(!off.cache.can_cache());
        assert!(!off.cache.put(vec![1], vec![2]));
        let huge = Resumption::for_settings(
            &TlsSettings {
                session_cache: usize::MAX,
                ..TlsSettings::default()
            },
            None,
        )
        .unwrap();
        assert!(huge.cache.put(vec![1], vec![2]));
        assert_eq!(huge.cache.get(&[1]), Some(vec![2]));
    }

    /// A small cache keeps the newest sessions and forgets the oldest.
    #[test]
    fn many_sessions_keep_the_newest() {
        let r = Resumption::for_settings(
            &TlsSettings {
                session_cache: 300,
                ..TlsSettings::default()
            },
            None,
        )
        .unwrap();
        for i in 0..10_000u32 {
            r.cache.put(i.to_be_bytes().to_vec(), vec![0; 100]);
        }
        assert!(r.cache.get(&9_999u32.to_be_bytes()).is_some());
        assert!(r.cache.get(&0u32.to_be_bytes()).is_none());
    }
}
