//! The SNI routing lines of the settings table (`table.rs`):
//! `server_names`, `server_alpn`, `sni_default` and `sni_timeout`, laid
//! after the table's other lines and before `table_ends.rs`'s. Kept apart
//! so each file stays readable; the lines are the same columns.
//!
//! Only a macro: nothing runs here.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C serves one port with one list of backends.

/// Hands the table's lines, then these, on to `table_ends`' `with_ends`,
/// which adds its own and goes on to `$callback`.
macro_rules! with_sni {
    ($callback:ident { $($entries:tt)* } { $($file_only:tt)* }) => {
        $crate::config::table_ends::with_ends! { $callback {
        $($entries)*
        /// Route TLS clients to this service by the name their ClientHello
        /// asks for (SNI), without decrypting: NAME[,NAME...], exact or
        /// *.example.com; services sharing a listening address must all
        /// give names. Off by default.
        server_names: ServerNames, "server-names", Service, some(sni.server_names),
            restart[sni.server_names],
            file MaybeServerNames => take,
            flag Option<ServerNames> [value_name = "NAME,...", value_parser = ServerNames::parse_flag],
            always |c: &Config| or_off(c.sni.server_names.as_ref(), |n| n.to_string());
        /// With --server-names: take only the clients that offer one of these
        /// protocols by ALPN, as PROTO[,PROTO...] (h2,http/1.1), and take them
        /// before a service of the same name without it. Off by default.
        server_alpn: crate::tls_term::AlpnList, "server-alpn", Service, set(sni.alpn), restart[sni.alpn],
            file crate::tls_term::AlpnList => take,
            flag Option<crate::tls_term::AlpnList> [value_name = "PROTO,...", value_parser = crate::tls_term::AlpnList::parse_flag],
            always |c: &Config| c.sni.alpn.to_string();
        /// With --server-names: this service takes the clients of its
        /// addresses that no name matches, that send none or nothing, or that
        /// are not TLS (at most one per address). Off by default: they are
        /// closed.
        sni_default: bool, "sni-default", Service, set(sni.default), restart[sni.default],
            file bool => take,
            flag bool,
            always |c: &Config| c.sni.default.to_string();
        /// With --server-names: the longest wait for a complete ClientHello;
        /// then a client that sent nothing goes to the default service (or
        /// is closed), one that began a hello is closed.
        sni_timeout: Duration, "sni-timeout", Service, set(sni.timeout), restart[sni.timeout],
            file Secs => take,
            flag Option<Duration> [value_name = "DURATION", value_parser = parse_duration],
            always |c: &Config| format_duration(c.sni.timeout);
        } { $($file_only)* } }
    };
}
pub(crate) use with_sni;
