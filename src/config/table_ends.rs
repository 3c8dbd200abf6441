//! The end of the settings table (`table.rs`): the settings that end
//! connections on purpose (`on_backend_down`, `on_backend_removed`,
//! `removed_drain_timeout`, `max_connection_lifetime` and its jitter,
//! `drain_spread` and its order) and the one that hands the listening
//! sockets to a new process (`upgrade_socket`),
//! laid after the table's other lines before it is handed on. Kept apart
//! so each file stays readable; the lines are the same columns.
//!
//! Only a macro: nothing runs here.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

/// Hands the table's lines, then these, on to the access log's
/// (`table_log`), which adds its own and calls `$callback`.
macro_rules! with_ends {
    ($callback:ident { $($entries:tt)* } { $($file_only:tt)* }) => {
        $crate::config::table_log::with_log_settings! { $callback {
        $($entries)*
        /// A backend marked DOWN: keep its connections, or close them.
        on_backend_down: OnDown, "on-backend-down", Service, set(proxy.ends.on_backend_down), live,
            file Parsed<OnDown> => take, flag Option<OnDown> [value_parser = parse_on_down],
            always |c: &Config| c.proxy.ends.on_backend_down.to_string();
        /// A removed backend: drain its connections, or close them.
        on_backend_removed: Removal, "on-backend-removed", Service, set(proxy.ends.on_backend_removed), live,
            file Parsed<Removal> => take, flag Option<Removal> [value_parser = parse_removal],
            always |c: &Config| c.proxy.ends.on_backend_removed.to_string();
        /// Draining a removed backend, close what is left after this long.
        removed_drain_timeout: Duration, "removed-drain-timeout", Service, some(proxy.ends.removed_drain_timeout), live,
            file MaybeSecs => take, flag Option<Duration> [value_parser = parse_duration],
            always |c: &Config| or_off(c.proxy.ends.removed_drain_timeout, format_duration);
        /// Close each connection this long after it started (FIN first).
        max_connection_lifetime: Duration, "max-connection-lifetime", Service, some(proxy.ends.max_connection_lifetime), live,
            file MaybeSecs => take, flag Option<Duration> [value_parser = parse_duration],
            always |c: &Config| or_off(c.proxy.ends.max_connection_lifetime, format_duration);
        /// Each lifetime longer by up to this much, spread by connection.
        max_connection_lifetime_jitter: Duration, "max-connection-lifetime-jitter", Service, some(proxy.ends.max_connection_lifetime_jitter), live,
            file MaybeSecs => take, flag Option<Duration> [value_parser = parse_duration],
            always |c: &Config| or_off(c.proxy.ends.max_connection_lifetime_jitter, format_duration);
        /// At the drain timeout, close what is left over this long, one by one.
        drain_spread: Duration, "drain-spread", Process, some(drain_spread), restart[drain_spread],
            file MaybeSecs => take, flag Option<Duration> [value_parser = parse_duration],
            always |c: &Config| or_off(c.drain_spread, format_duration);
        /// Which --drain-spread closes first: oldest or idlest.
        drain_spread_order: SpreadOrder, "drain-spread-order", Process, set(drain_spread_order),
            restart[drain_spread_order],
            file Parsed<SpreadOrder> => take, flag Option<SpreadOrder> [value_parser = parse_spread_order],
            always |c: &Config| c.drain_spread_order.to_string();
        /// A Unix socket: a new rodizio started with the same one takes
        /// this one's listening sockets, then this one drains and exits.
        upgrade_socket: PathBuf, "upgrade-socket", Process, some(upgrade_socket),
            restart[upgrade_socket],
            file Text => take,
            flag Option<PathBuf> [value_name = "PATH"],
            always |c: &Config| path_or_none(&c.upgrade_socket);
        } { $($file_only)* } }
    };
}
pub(crate) use with_ends;
