//! The settings table: every setting of the balancer on one line, read
//! by `config/settings.rs` (the layers, the file's keys, `check-config`,
//! reload) and by `cli.rs` (the flags). A new setting is a line here and
//! the code that uses it. Only a macro: nothing runs here.
//!
//! # Corresponds to the C article
//!
//! The `#define`s at the top of the C file, with the flags and keys that change them.

/// The table itself, handed to `$callback`: `settings!` here, and the
/// command line's `balancer_args!` in `cli.rs`, each taking the columns it
/// needs. A line: the flag's help (`///`), `key: type` (the value a layer
/// gives), the long flag, the scope, how it is laid in a [`Config`]
/// (`set`, `some` for a setting off unless given, `by_hand`), `live` or
/// `restart[field kept]`, `file TYPE => take|hand` (how the file reads
/// it), `flag TYPE [clap's arg attributes]`, and how `check-config` prints
/// it (`always`, or `when` it is listed only sometimes). Last come the
/// lines of `table_sni.rs`, then `table_ends.rs`'s, then `table_log.rs`'s,
/// before the file-only keys (in the second braces).
macro_rules! settings_table {
    ($callback:ident) => {
        $crate::config::table_sni::with_sni! { $callback {
        /// Address to accept clients on (IPv4 or IPv6, e.g. `[::]:8080`).
        listen: SocketAddr, "listen", Service, set(listen), live,
            file Listen => hand,
            flag Option<SocketAddr> [short, value_parser = parse_listen],
            always |c: &Config| {
                let all: Vec<String> = c.listen_addrs().iter().map(|a| a.to_string()).collect();
                all.join(" ")
            };
        /// A backend as HOST:PORT[,OPTION...]; repeat for more (none: rodizio asks for them).
        backends: Vec<BackendSpec>, "backend", Service, set(backends), live,
            file Backends => hand,
            flag Vec<BackendSpec> [short, value_name = "HOST:PORT", value_parser = parse_backend,
                long_help = crate::backend::backend_help()],
            always |c: &Config| {
                let names: Vec<String> = c.backends.iter().map(|b| b.to_string()).collect();
                names.join(" ")
            };
        /// How to choose the backend for each new client: round-robin,
        /// weighted-round-robin, least-connections, ip-hash, p2c, first.
        algorithm: Algorithm, "algorithm", Service, set(algorithm), live,
            file Parsed<Algorithm> => hand,
            flag Option<Algorithm> [value_name = "ALGORITHM", value_parser = parse_algorithm],
            always |c: &Config| c.algorithm.name().to_string();
        /// Stack size of each worker thread (e.g. 65536, 64k).
        thread_stack: usize, "thread-stack", Process, set(thread_stack), restart[thread_stack],
            file Size => take,
            flag Option<usize> [value_parser = parse_size],
            always |c: &Config| format_size(c.thread_stack);
        /// Most worker threads, hence most connections served at once.
        workers: usize, "workers", Process, set(workers), restart[workers],
            file Whole<usize, 1, { super::MAX_WORKERS as u64 }> => take,
            flag Option<usize> [value_parser = whole::<usize, 1, { MAX_WORKERS as u64 }>],
            always |c: &Config| c.workers.to_string();
        /// Most clients of the service held at once, queued or served (HAProxy's
        /// frontend maxconn): past it the service stops accepting, and new
        /// clients wait in the kernel's backlog. Off by default.
        max_connections: usize, "max-connections", Service, some(max_connections),
            restart[max_connections],
            file MaybeCount => take,
            flag Option<usize> [value_name = "N", value_parser = whole::<usize, 1, { usize::MAX as u64 }>],
            always |c: &Config| or_off(c.max_connections, |n| n.to_string());
        /// Most accepted connections waiting for a free worker.
        queue_capacity: usize, "queue-capacity", Process, set(queue_capacity),
            restart[queue_capacity],
            file Whole<usize, 1, { usize::MAX as u64 }> => take,
            flag Option<usize> [value_parser = whole::<usize, 1, { usize::MAX as u64 }>],
            always |c: &Config| c.queue_capacity.to_string();
        /// A worker thread that waited this long for a client exits, down to a
        /// floor of a few (e.g. 30s, 10m); `off` keeps every worker started.
        worker_idle_timeout: Option<Duration>, "worker-idle-timeout", Process,
            set(worker_idle_timeout), restart[worker_idle_timeout],
            file MaybeSecs => take,
            flag Option<DurationOrOff> [value_name = "DUR", value_parser = parse_duration_or_off],
            always |c: &Config| or_off(c.worker_idle_timeout, format_duration);
        /// The listen(2) backlog.
        backlog: i32, "backlog", Process, set(backlog), restart[backlog],
            file Whole<i32, 1, { i32::MAX as u64 }> => take,
            flag Option<i32> [value_parser = clap::value_parser!(i32).range(1..)],
            always |c: &Config| c.backlog.to_string();
        /// How the kernel schedules every thread: normal (as started) or
        /// batch (SCHED_BATCH: a woken thread does not preempt the running one).
        sched_policy: SchedPolicy, "sched-policy", Process, set(sched_policy),
            restart[sched_policy],
            file Parsed<SchedPolicy> => take,
            flag Option<SchedPolicy> [value_name = "POLICY", value_parser = parse_sched_policy],
            always |c: &Config| c.sched_policy.to_string();
        /// Bytes per read in each direction (e.g. 4096, 16k).
        buffer_size: usize, "buffer-size", Service, set(proxy.buffer_size), live,
            file Size => take,
            flag Option<usize> [value_parser = parse_size],
            always |c: &Config| format_size(c.proxy.buffer_size);
        /// Longest wait for a backend to accept a connection (e.g. 500ms, 3s).
        connect_timeout: Duration, "connect-timeout", Service, set(proxy.connect_timeout), live,
            file Secs => take,
            flag Option<Duration> [value_parser = parse_duration],
            always |c: &Config| format_duration(c.proxy.connect_timeout);
        /// How many other backends to try after the first connect failed: a
        /// whole number (0: none), or all (the default: every candidate).
        connect_retries: u32, "connect-retries", Service, some(proxy.connect_retries), live,
            file AllOr => take,
            flag Option<u32> [value_name = "N", value_parser = whole::<u32, 0, { u32::MAX as u64 }>],
            always |c: &Config| c
                .proxy
                .connect_retries
                .map_or_else(|| "all".into(), |n| n.to_string());
        /// The longest all of a client's connects may take together: each
        /// try's connect timeout is cut to what is left, and no try starts
        /// once it is spent. Off by default (each try gets --connect-timeout).
        connect_retry_budget: Duration, "connect-retry-budget", Service,
            some(proxy.connect_retry_budget), live,
            file MaybeSecs => take,
            flag Option<Duration> [value_name = "DUR", value_parser = parse_duration],
            always |c: &Config| or_off(c.proxy.connect_retry_budget, format_duration);
        /// Close a connection after this long with no byte moving.
        idle_timeout: Duration, "idle-timeout", Service, set(proxy.idle_timeout), live,
            file Secs => take,
            flag Option<Duration> [value_parser = parse_duration],
            always |c: &Config| format_duration(c.proxy.idle_timeout);
        /// On SIGINT/SIGTERM, wait this long for connections in flight.
        drain_timeout: Duration, "drain-timeout", Process, set(drain_timeout),
            restart[drain_timeout],
            file Secs => take,
            flag Option<Duration> [value_parser = parse_duration],
            always |c: &Config| format_duration(c.drain_timeout);
        /// Move bytes with splice(2) through a pipe per direction (Linux, zero
        /// copy, up to 64 KiB per call) instead of 4096-byte reads and writes;
        /// --buffer-size is then unused. Off by default: the article's pump
        /// copies through a buffer.
        splice: bool, "splice", Service, set(proxy.splice), live,
            file bool => take,
            flag bool,
            always |c: &Config| c.proxy.splice.to_string();
        /// Let the kernel move the bytes of a long-lived connection (an eBPF
        /// sockmap program) once it has made --kernel-relay-after exchanges on
        /// the copy pump: off, on (the bare flag), or auto (on where the
        /// program loads: root or CAP_BPF and CAP_NET_ADMIN, else off with an
        /// info line). Not with --splice, a rate or TLS termination. Off by
        /// default: the article's pump copies through a buffer.
        kernel_relay: Switch, "kernel-relay", Service, set(proxy.kernel_relay), live,
            file OnOffAuto => take,
            flag Option<Switch> [value_name = "WHEN", num_args = 0..=1,
                require_equals = true, default_missing_value = "on",
                value_parser = parse_switch],
            always |c: &Config| c.proxy.kernel_relay.to_string();
        /// Exchanges (bytes to the backend, then bytes back) a connection makes
        /// on the copy pump before --kernel-relay takes it over; 0: from the
        /// start.
        kernel_relay_after: u32, "kernel-relay-after", Service, set(proxy.kernel_relay_after), live,
            file Whole<u32, 0, { u32::MAX as u64 }> => take,
            flag Option<u32> [value_name = "N", value_parser = whole::<u32, 0, { u32::MAX as u64 }>],
            always |c: &Config| c.proxy.kernel_relay_after.to_string();
        /// Hand a client to a worker only once its first bytes have arrived
        /// (TCP_DEFER_ACCEPT): fewer wake-ups per short connection. Off by
        /// default: clients of protocols where the server speaks first (SMTP,
        /// FTP, MySQL) would wait about a second before being served.
        defer_accept: bool, "defer-accept", Service, set(defer_accept), restart[defer_accept],
            file bool => take,
            flag bool,
            always |c: &Config| c.defer_accept.to_string();
        /// After moving bytes, give the CPU away once (sched_yield) and check
        /// again without waiting before sleeping in poll(2): the peer often
        /// answers meanwhile, and the worker is spared a sleep and a wake-up.
        /// off (the default), on (the bare flag: after every round that moved
        /// bytes), or auto (on each connection while the answers come). It
        /// pays only where the peer shares the scheduler's group (docs).
        yield_before_poll: Switch, "yield-before-poll", Service, set(proxy.yield_before_poll), live,
            file OnOffAuto => take,
            flag Option<Switch> [value_name = "WHEN", num_args = 0..=1,
                require_equals = true, default_missing_value = "on",
                value_parser = parse_switch],
            always |c: &Config| c.proxy.yield_before_poll.to_string();
        /// Active health check: tcp (connect), http (GET --health-path), off, or
        /// one that speaks the backend's protocol so it logs nothing: redis,
        /// tls, smtp, mysql, pgsql, send-expect (see docs/health-checks.md).
        health_check: CheckKind, "health-check", Service, set(health.check), live,
            file Parsed<CheckKind> => take,
            flag Option<CheckKind> [value_name = "KIND", value_parser = parse_check],
            always |c: &Config| c.health.check.name().to_string();
        /// Time between two rounds of active checks.
        health_interval: Duration, "health-interval", Service, set(health.interval), live,
            file Secs => hand,
            flag Option<Duration> [value_parser = parse_duration],
            always |c: &Config| format_duration(c.health.interval);
        /// Longest wait for one check.
        health_timeout: Duration, "health-timeout", Service, set(health.timeout), live,
            file Secs => take,
            flag Option<Duration> [value_parser = parse_duration],
            always |c: &Config| format_duration(c.health.timeout);
        /// Path requested by the http check.
        health_path: String, "health-path", Service, set(health.path), live,
            file String => take,
            flag Option<String>,
            always |c: &Config| c.health.path.clone();
        /// Failed checks in a row that mark a backend down.
        fall: u32, "fall", Service, set(health.fall), live,
            file Whole<u32, 1, { u32::MAX as u64 }> => take,
            flag Option<u32> [value_parser = whole::<u32, 1, { u32::MAX as u64 }>],
            always |c: &Config| c.health.fall.to_string();
        /// Successful checks in a row that mark a down backend up.
        rise: u32, "rise", Service, set(health.rise), live,
            file Whole<u32, 1, { u32::MAX as u64 }> => take,
            flag Option<u32> [value_parser = whole::<u32, 1, { u32::MAX as u64 }>],
            always |c: &Config| c.health.rise.to_string();
        /// Failed connects in a row on real traffic that mark a backend down at
        /// once (0: never).
        passive_failures: u32, "passive-failures", Service, set(health.passive_failures), live,
            file Whole<u32, 0, { u32::MAX as u64 }> => take,
            flag Option<u32> [value_parser = whole::<u32, 0, { u32::MAX as u64 }>],
            always |c: &Config| c.health.passive_failures.to_string();
        /// With --health-check off, how long a backend marked down by real
        /// traffic rests before it is tried again.
        health_cooldown: Duration, "health-cooldown", Service, set(health.cooldown), live,
            file Secs => take,
            flag Option<Duration> [value_parser = parse_duration],
            always |c: &Config| format_duration(c.health.cooldown);
        /// Answer clients that no backend can serve with HTTP 503 (none
        /// available) or 502 (none reachable) instead of just closing.
        http_replies: bool, "http-replies", Service, set(health.http_replies), live,
            file bool => take,
            flag bool,
            always |c: &Config| c.health.http_replies.to_string();
        /// User of the mysql check (it then logs in and quits, so the server
        /// logs nothing) and of the pgsql check (default rodizio).
        health_user: String, "health-user", Service, some(health.user), live,
            file Text => take,
            flag Option<String> [value_name = "USER"],
            always |c: &Config| c.health.user.clone().unwrap_or_default();
        /// Bytes the send-expect check sends: text with \r \n \xHH escapes,
        /// or hex:0d0a.
        health_send: Vec<u8>, "health-send", Service, some(health.send), live,
            file Bytes => take,
            flag Option<Vec<u8>> [value_name = "BYTES", value_parser = parse_health_bytes],
            always |c: &Config| c.health.send.as_deref().map(show_bytes).unwrap_or_default();
        /// Bytes the send-expect check wants in the reply (same notation).
        health_expect: Vec<u8>, "health-expect", Service, some(health.expect), live,
            file Bytes => take,
            flag Option<Vec<u8>> [value_name = "BYTES", value_parser = parse_health_bytes],
            always |c: &Config| c.health.expect.as_deref().map(show_bytes).unwrap_or_default();
        /// Limit each client IP to N new connections per WINDOW (e.g. 100/1s,
        /// 20/10s). Off by default.
        rate_limit: Rate, "rate-limit", Service, by_hand(rate_limit), live,
            file RateSetting => hand,
            flag Option<Rate> [value_name = "N/WINDOW", value_parser = Rate::parse],
            always |c: &Config| or_off(c.rate_limit.as_ref(), |r| r.rate.to_string());
        /// How connections are counted: fixed-window, sliding-window,
        /// token-bucket.
        rate_limit_algorithm: RateLimitAlgorithm, "rate-limit-algorithm", Service, by_hand(rate_limit), live,
            file Parsed<RateLimitAlgorithm> => take,
            flag Option<RateLimitAlgorithm> [value_name = "ALGORITHM", value_parser = parse_rule],
            when |c: &Config| c.rate_limit.as_ref().map(|r| r.algorithm.to_string());
        /// Most client IPs tracked at once; the table is allocated at start-up,
        /// about 54 bytes per client.
        rate_limit_max_clients: usize, "rate-limit-max-clients", Service, by_hand(rate_limit),
            live,
            file Whole<usize, 1, { MAX_MAX_CLIENTS as u64 }> => take,
            flag Option<u32> [value_name = "N", value_parser = clap::value_parser!(u32).range(1..=MAX_MAX_CLIENTS as i64)],
            when |c: &Config| c.rate_limit.as_ref().map(|r| r.max_clients.to_string());
        /// IPv6 clients are limited per prefix of this many bits; 128 limits
        /// each address.
        rate_limit_ipv6_prefix: u8, "rate-limit-ipv6-prefix", Service, by_hand(rate_limit),
            live,
            file Whole<u8, 1, 128> => take,
            flag Option<u8> [value_name = "BITS", value_parser = clap::value_parser!(u8).range(1..=128)],
            when |c: &Config| c.rate_limit.as_ref().map(|r| r.ipv6_prefix.to_string());
        /// What a refused client gets: `close` (closed at once) or `http` (a
        /// minimal 429 reply, then closed).
        rate_limit_reply: RateLimitReply, "rate-limit-reply", Service, by_hand(rate_limit), live,
            file Parsed<RateLimitReply> => take,
            flag Option<RateLimitReply> [value_name = "REPLY", value_parser = parse_reply],
            when |c: &Config| c.rate_limit.as_ref().map(|r| r.reply.name().to_string());
        /// Narrate each step of every connection (accepted, the choice of
        /// backend, the queue, the worker, connect, bytes each way, the
        /// half-closes and the close), as info lines with the log target
        /// rodizio::trace.
        trace: bool, "trace", Process, set(trace), restart[trace],
            file bool => take,
            flag bool,
            always |c: &Config| c.trace.to_string();
        /// The language of --trace: en or pt (Brazilian Portuguese). When not
        /// given: pt if LANG starts with pt.
        trace_lang: Lang, "trace-lang", Process, set(trace_lang), restart[trace_lang],
            file Parsed<Lang> => take,
            flag Option<Lang> [value_name = "LANG", value_parser = parse_lang],
            always |c: &Config| c.trace_lang.to_string();
        /// Serve the admin API (JSON over HTTP: list, add, drain, remove
        /// backends; reload; settings) on this address; loopback only unless
        /// --admin-allow-remote. Off by default.
        admin_listen: SocketAddr, "admin", Process, some(admin_listen), restart[admin_listen],
            file MaybeAddr => take,
            flag Option<SocketAddr> [visible_alias = "admin-listen", value_name = "ADDR", value_parser = parse_listen],
            always |c: &Config| or_off(c.admin_listen, |a| a.to_string());
        /// Let --admin listen on an address that is not loopback.
        admin_allow_remote: bool, "admin-allow-remote", Process, set(admin_allow_remote),
            restart[admin_allow_remote],
            file bool => take,
            flag bool,
            always |c: &Config| c.admin_allow_remote.to_string();
        /// Ask admin API requests for `Authorization: Bearer TOKEN`, TOKEN
        /// being this file's content (trimmed).
        admin_token_file: PathBuf, "admin-token-file", Process, some(admin_token_file),
            restart[admin_token_file],
            file Text => take,
            flag Option<PathBuf> [value_name = "FILE"],
            always |c: &Config| path_or_none(&c.admin_token_file);
        /// Close a client that waited longer than this for a free worker (503
        /// with --http-replies) instead of serving it late (HAProxy's `timeout
        /// queue`).
        queue_timeout: Duration, "queue-timeout", Service, set(proxy.queue_timeout), live,
            file Secs => take,
            flag Option<Duration> [value_parser = parse_duration],
            always |c: &Config| format_duration(c.proxy.queue_timeout);
        /// Most clients that wait at once for a slot when every backend is at
        /// its max_connections (HAProxy's maxqueue); one more is refused (503
        /// with --http-replies). Each waiting client holds a worker. 0: none wait.
        max_queue: usize, "max-queue", Service, set(proxy.max_queue), live,
            file Whole<usize, 0, { super::MAX_WORKERS as u64 }> => take,
            flag Option<usize> [value_name = "N", value_parser = whole::<usize, 0, { MAX_WORKERS as u64 }>],
            always |c: &Config| c.proxy.max_queue.to_string();
        /// Close a client that sends nothing within this time of being accepted
        /// (silent clients holding workers). Off by default: in protocols where
        /// the server speaks first the client is silent until greeted.
        client_first_byte_timeout: Duration, "client-first-byte-timeout", Service,
            some(proxy.client_first_byte_timeout), live,
            file MaybeSecs => take,
            flag Option<Duration> [value_parser = parse_duration],
            always |c: &Config| or_off(c.proxy.client_first_byte_timeout, format_duration);
        /// Once one side of a connection has closed its write side, close the
        /// connection when the other stays silent this long.
        fin_timeout: Duration, "fin-timeout", Service, some(proxy.fin_timeout), live,
            file MaybeSecs => take,
            flag Option<Duration> [value_name = "DUR", value_parser = parse_duration],
            always |c: &Config| c
                .proxy
                .fin_timeout
                .map_or_else(|| "same as idle_timeout".into(), format_duration);
        /// Turn on TCP keep-alive on both sockets of each connection: first
        /// probe after IDLE without traffic, then every IDLE/3 (at least 1s),
        /// dropped after 3 unanswered (e.g. 60s).
        tcp_keepalive: Duration, "tcp-keepalive", Service, some(proxy.tcp_keepalive), live,
            file MaybeSecs => take,
            flag Option<Duration> [value_name = "IDLE", value_parser = parse_duration],
            always |c: &Config| or_off(c.proxy.tcp_keepalive, format_duration);
        /// Give up on a connection whose sent data stays unacknowledged
        /// this long (TCP_USER_TIMEOUT on both sockets of each
        /// connection), so a peer that vanished is noticed even while
        /// bytes wait to be sent (e.g. 30s). Off by default.
        tcp_user_timeout: Duration, "tcp-user-timeout", Service,
            some(proxy.tcp_user_timeout), live,
            file MaybeSecs => take,
            flag Option<Duration> [value_name = "DUR", value_parser = parse_duration],
            always |c: &Config| or_off(c.proxy.tcp_user_timeout, format_duration);
        /// Look the backends given by name up again this often (e.g. 30s; 1s..24h),
        /// on one thread, and send new connections to the addresses found
        /// (nginx's resolve, HAProxy's resolvers); a failed lookup keeps the
        /// last ones. A reload looks them up again anyway. Off by default.
        resolve_interval: Duration, "resolve-interval", Service,
            some(proxy.resolve_interval), live,
            file MaybeSecs => take,
            flag Option<Duration> [value_name = "DUR", value_parser = parse_duration],
            always |c: &Config| or_off(c.proxy.resolve_interval, format_duration);
        /// The nameservers srv: backends are asked of, as IP:PORT[,IP:PORT...] (at most 3, in turn). Default: the system's.
        resolvers: Nameservers, "resolvers", Service, some(proxy.resolvers), live, file MaybeParsed<Nameservers> => take,
            flag Option<Nameservers> [value_name = "IP:PORT,...", value_parser = parse_nameservers], always |c: &Config| or_off(c.proxy.resolvers.as_ref(), |n| n.to_string());
        /// Follow backends from etcd: etcd://HOST:PORT[,HOST:PORT...]/PREFIX, each key a backend; USER:PASSWORD@ before the hosts for etcd's authentication (the password shown as ***), etcds://...?ca=FILE for TLS. Off by default.
        backends_from: EtcdSource, "backends-from", Service, some(proxy.backends_from), restart[proxy.backends_from], file MaybeParsed<EtcdSource> => take,
            flag Option<EtcdSource> [value_name = "etcd://HOST:PORT/PREFIX", value_parser = <EtcdSource as std::str::FromStr>::from_str], always |c: &Config| or_off(c.proxy.backends_from.as_ref(), |n| n.to_string());
        /// Ramp the share of a backend that comes back into rotation (health
        /// up, end of maintenance or draining, added at run time) from about
        /// 5% of its weight to all of it over this long (HAProxy's slowstart),
        /// e.g. 30s; ip-hash and first are left alone. Off by default.
        slow_start: Duration, "slow-start", Service, some(slow_start), live,
            file MaybeSecs => take,
            flag Option<Duration> [value_name = "DUR", value_parser = parse_duration],
            always |c: &Config| or_off(c.slow_start, format_duration);
        /// Serve only clients from these networks, as CIDR[,CIDR...] (nginx's
        /// allow); with --accept-proxy, the header's address is the client's.
        /// Off by default: every client.
        allow: CidrList, "allow", Service, some(proxy.allow), live,
            file MaybeParsed<CidrList> => take,
            flag Option<CidrList> [value_name = "CIDR,...", value_parser = parse_cidrs],
            always |c: &Config| or_off(c.proxy.allow.as_ref(), |l| l.to_string());
        /// Refuse clients from these networks, as CIDR[,CIDR...] (nginx's deny),
        /// even those --allow lists. Off by default.
        deny: CidrList, "deny", Service, some(proxy.deny), live,
            file MaybeParsed<CidrList> => take,
            flag Option<CidrList> [value_name = "CIDR,...", value_parser = parse_cidrs],
            always |c: &Config| or_off(c.proxy.deny.as_ref(), |l| l.to_string());
        /// Most connections open at once from one client address (nginx's
        /// limit_conn); past it a client gets the rate limiter's reply. IPv6
        /// addresses count per --rate-limit-ipv6-prefix. Off by default.
        max_connections_per_client: usize, "max-connections-per-client", Service,
            some(proxy.max_connections_per_client), live,
            file MaybeCount => take,
            flag Option<usize> [value_name = "N", value_parser = whole::<usize, 1, { u32::MAX as u64 }>],
            always |c: &Config| or_off(c.proxy.max_connections_per_client, |n| n.to_string());
        /// Most bytes a second read from each client, per connection (nginx's
        /// proxy_upload_rate), as a size: 1MB, 100KB/s; 0 or off: no cap.
        upload_rate: ByteRate, "upload-rate", Service, some(proxy.upload_rate), live,
            file MaybeParsed<ByteRate> => take,
            flag Option<ByteRate> [value_name = "RATE", value_parser = ByteRate::parse],
            always |c: &Config| c.proxy.upload_rate.unwrap_or(ByteRate(0)).to_string();
        /// Most bytes a second read from the backend of each connection
        /// (nginx's proxy_download_rate), as a size: 1MB, 100KB/s; 0 or off:
        /// no cap.
        download_rate: ByteRate, "download-rate", Service, some(proxy.download_rate), live,
            file MaybeParsed<ByteRate> => take,
            flag Option<ByteRate> [value_name = "RATE", value_parser = ByteRate::parse],
            always |c: &Config| c.proxy.download_rate.unwrap_or(ByteRate(0)).to_string();
        /// Terminate TLS with this certificate chain and key (PEM files, as
        /// CERT,KEY); repeat for more, chosen by the client's server name
        /// (SNI), the first the default. Files read again on every reload.
        /// Off by default.
        tls_certs: CertList, "tls-cert", Service, set(tls.certs), live,
            file CertList => take,
            flag Vec<CertPair> [value_name = "CERT,KEY"],
            always |c: &Config| c.tls.certs.to_string();
        /// Longest time a TLS client may take to finish its handshake.
        tls_handshake_timeout: Duration, "tls-handshake-timeout", Service,
            set(tls.handshake_timeout), live,
            file Secs => take,
            flag Option<Duration> [value_name = "DUR", value_parser = parse_duration],
            always |c: &Config| format_duration(c.tls.handshake_timeout);
        /// The most TLS handshakes and SNI peeks in progress at once on the
        /// service; one more closes the one stalled longest to make room.
        /// Keep it under --workers.
        tls_max_pending: usize, "tls-max-pending", Service, set(tls.max_pending),
            restart[tls.max_pending],
            file Whole<usize, 1, 1_000_000> => take,
            flag Option<usize> [value_name = "N", value_parser = whole::<usize, 1, 1_000_000>],
            always |c: &Config| c.tls.max_pending.to_string();
        /// Ask every TLS client for a certificate signed by these CAs (a PEM
        /// file): mutual TLS. Off by default.
        tls_client_ca: PathBuf, "tls-client-ca", Service, some(tls.client_ca), live,
            file Text => take,
            flag Option<PathBuf> [value_name = "FILE"],
            always |c: &Config| path_or_none(&c.tls.client_ca);
        /// With --tls-client-ca: refuse clients whose certificate one of
        /// these CRLs revokes (PEM files, each issued by a CA of
        /// --tls-client-ca); repeat for more. Read again on every reload.
        /// None by default.
        tls_client_crl: CrlFiles, "tls-client-crl", Service, set(tls.client_crl), live,
            file CrlFiles => take,
            flag Vec<PathBuf> [value_name = "FILE"],
            always |c: &Config| c.tls.client_crl.to_string();
        /// Speak TLS to the backends (re-encryption), verifying their
        /// certificates against --backend-tls-ca. Off by default.
        backend_tls: bool, "backend-tls", Service, set(tls.backend), live,
            file bool => take,
            flag bool,
            always |c: &Config| c.tls.backend.to_string();
        /// The CAs (a PEM file) that sign the backends' certificates, with
        /// --backend-tls; none: the system's bundle
        /// (/etc/ssl/certs/ca-certificates.crt).
        backend_tls_ca: PathBuf, "backend-tls-ca", Service, some(tls.backend_ca), live,
            file Text => take,
            flag Option<PathBuf> [value_name = "FILE"],
            always |c: &Config| path_or_none(&c.tls.backend_ca);
        /// The name sent to (SNI) and verified in every backend's
        /// certificate, with --backend-tls; none: each backend's host.
        backend_tls_server_name: String, "backend-tls-server-name", Service,
            some(tls.backend_server_name), live,
            file Text => take,
            flag Option<String> [value_name = "NAME"],
            always |c: &Config| c
                .tls
                .backend_server_name
                .clone()
                .unwrap_or_else(|| "none".into());
        /// Most TLS 1.2 sessions kept for clients to resume by session id
        /// (HAProxy's tune.ssl.cachesize), up to 1000000; 0: none. Kept across
        /// reloads that change no TLS setting, as are the ticket keys.
        tls_session_cache: usize, "tls-session-cache", Service, set(tls.session_cache), live,
            file Whole<usize, 0, { crate::tls_term::MAX_SESSION_CACHE as u64 }> => take,
            flag Option<usize> [value_name = "N", value_parser = whole::<usize, 0, { crate::tls_term::MAX_SESSION_CACHE as u64 }>],
            always |c: &Config| c.tls.session_cache.to_string();
        /// Refuse a TLS client whose server name (SNI) no certificate covers,
        /// or that sends none (alert unrecognized_name), instead of serving it
        /// the first certificate. Off by default.
        tls_strict_sni: bool, "tls-strict-sni", Service, set(tls.strict_sni), live,
            file bool => take,
            flag bool,
            always |c: &Config| c.tls.strict_sni.to_string();
        /// Protocols offered to TLS clients by ALPN, the preferred first, as
        /// PROTO[,PROTO...] (h2,http/1.1); a client offering only others is
        /// refused (RFC 7301). Off by default: no ALPN.
        tls_alpn: crate::tls_term::AlpnList, "tls-alpn", Service, set(tls.alpn), live,
            file crate::tls_term::AlpnList => take,
            flag Option<crate::tls_term::AlpnList> [value_name = "PROTO,...", value_parser = crate::tls_term::AlpnList::parse_flag],
            always |c: &Config| c.tls.alpn.to_string();
        /// Send every backend a PROXY protocol header (v1 or v2) with the
        /// client's address before its bytes; one backend alone takes
        /// `-b HOST:PORT,send-proxy` or `,send-proxy-v2`.
        send_proxy: Version, "send-proxy", Service, some(send_proxy), restart[send_proxy],
            file MaybeParsed<Version> => take,
            flag Option<Version> [value_name = "VERSION", value_parser = parse_proxy_version],
            always |c: &Config| or_off(c.send_proxy, |v| v.to_string());
        /// Expect a PROXY protocol header (v1 or v2) from every client: for a
        /// balancer behind another proxy (HAProxy's send-proxy, nginx's
        /// proxy_protocol on). The header's address is then the client's.
        accept_proxy: bool, "accept-proxy", Service, set(accept_proxy), restart[accept_proxy],
            file bool => take,
            flag bool,
            always |c: &Config| c.accept_proxy.to_string();
        /// The peers allowed to send that header, as CIDR[,CIDR...]; a client
        /// connecting from elsewhere is closed.
        accept_proxy_from: CidrList, "accept-proxy-from", Service, set(accept_proxy_from),
            restart[accept_proxy_from],
            file Parsed<CidrList> => take,
            flag Option<CidrList> [value_name = "CIDR,...", value_parser = parse_cidrs],
            always |c: &Config| c.accept_proxy_from.to_string();
        /// Longest wait for a complete PROXY protocol header; a client that
        /// sends none in time is closed.
        accept_proxy_timeout: Duration, "accept-proxy-timeout", Service,
            set(accept_proxy_timeout), restart[accept_proxy_timeout],
            file Secs => take,
            flag Option<Duration> [value_name = "DURATION", value_parser = parse_duration],
            always |c: &Config| format_duration(c.accept_proxy_timeout);
        /// Keep the rate limit's counts in Redis (redis://HOST:PORT/DB), shared
        /// by every balancer pointed at it, instead of in this process.
        rate_limit_store: String, "rate-limit-store", Process, some(rate_limit_store.url),
            restart[rate_limit_store],
            file Store => take,
            flag Option<String> [value_name = "URL"],
            always |c: &Config| c
                .rate_limit_store
                .url
                .clone()
                .unwrap_or_else(|| "in-process".into());
        // Kept, with the URL, as one `rate_limit_store`.
        /// Longest wait for Redis on one check (connect, read, write).
        rate_limit_store_timeout: Duration, "rate-limit-store-timeout", Process,
            set(rate_limit_store.timeout), restart,
            file Secs => take,
            flag Option<Duration> [value_name = "DURATION", value_parser = parse_duration],
            always |c: &Config| format_duration(c.rate_limit_store.timeout);
        /// When Redis fails or is slow: `open` serves the client unchecked,
        /// `closed` refuses it.
        rate_limit_store_failure: FailurePolicy, "rate-limit-store-failure", Process,
            set(rate_limit_store.failure), restart,
            file Parsed<FailurePolicy> => take,
            flag Option<FailurePolicy> [value_name = "POLICY", value_parser = parse_failure],
            always |c: &Config| c.rate_limit_store.failure.name().to_string();
        /// Set SO_REUSEPORT on the listening socket, so several rodizio
        /// processes listen on the same port (a new version starts before the
        /// old one drains; see docs/scaling.md). Off by default.
        reuse_port: bool, "reuse-port", Service, set(reuse_port), restart[reuse_port],
            file bool => take,
            flag bool,
            always |c: &Config| c.reuse_port.to_string();
        /// Once every socket is bound and every file opened, run as this user
        /// (a name or a number; its group too, unless --group says another).
        /// Off by default: rodizio stays who started it.
        user: String, "user", Process, some(user), restart[user],
            file Text => take,
            flag Option<String> [value_name = "USER"],
            always |c: &Config| c.user.clone().unwrap_or_else(|| "none".into());
        /// With --user: the group to run as (a name or a number) instead of
        /// the user's own.
        group: String, "group", Process, some(group), restart[group],
            file Text => take,
            flag Option<String> [value_name = "GROUP"],
            always |c: &Config| c.group.clone().unwrap_or_else(|| "none".into());
        /// Started as root, go on as root: without it (or --user) rodizio
        /// refuses to serve as root.
        allow_root: bool, "allow-root", Process, set(allow_root), restart[allow_root],
            file bool => take,
            flag bool,
            always |c: &Config| c.allow_root.to_string();
        } {
            mode: Parsed<Mode>,
            listen_port: Whole<u16, 0, 65535>,
            backend_servers: Backends,
            scheduling_algorithm: Parsed<Algorithm>,
            health_check_interval_seconds: Secs,
            services: Vec<Raw>,
            name: String,
        } }
    };
}
pub(crate) use settings_table;
