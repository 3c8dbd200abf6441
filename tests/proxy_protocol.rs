//! The PROXY protocol end to end: rodizio tells nginx who the client is
//! (`send-proxy`, `--send-proxy`), and learns it from HAProxy in front
//! (`--accept-proxy`), so its rate limit counts the real clients. nginx and
//! HAProxy are real, started here on loopback and free ports, and stopped
//! by PID ([`peers::Peer`]); the other tests use in-process peers.

mod common;
mod peers;

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{connect, until, wait_for, TestBackend, TestBalancer, IO_TIMEOUT};
use peers::{connect_from, free_port, loopback, need, read, temp_dir, Peer};
use rodizio::backend::BackendSpec;
use rodizio::health::CheckKind;
use rodizio::limiter::{Rate, RateLimitConfig, RateLimitReply};
use rodizio::proxy_protocol::{self, Header, Version};

/// nginx serving `200 ok` on a `proxy_protocol` listener, logging
/// `$proxy_protocol_addr $remote_addr "$request"` per request.
struct Nginx {
    peer: Peer,
    port: u16,
}

impl Nginx {
    fn start() -> Nginx {
        let bin = need("nginx", "nginx");
        let dir = temp_dir("pp-nginx");
        let port = free_port();
        let d = dir.display();
        let conf = format!(
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  log_format pp '$proxy_protocol_addr $remote_addr \"$request\"';\n\
               access_log {d}/access.log pp;\n\
               client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
               server {{ listen 127.0.0.1:{port} proxy_protocol; return 200 \"ok\\n\"; }}\n}}\n"
        );
        let conf_path = dir.join("nginx.conf");
        fs::write(&conf_path, conf).unwrap();
        let mut cmd = Command::new(bin);
        cmd.arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(dir.join("error.log"));
        let mut peer = Peer::spawn("nginx", cmd, libc::SIGTERM, &dir);
        // The readiness probe sends no header: nginx may log that one.
        peer.wait_listening(loopback(port));
        Nginx { peer, port }
    }

    fn access_log(&self) -> String {
        read(&self.peer.dir.join("access.log"))
    }

    fn error_log(&self) -> String {
        read(&self.peer.dir.join("error.log"))
    }
}

/// `GET path` with `Connection: close` from the loopback address `from`;
/// the whole reply.
fn get_from(from: [u8; 4], to: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut s = connect_from(from, to, IO_TIMEOUT)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    Ok(reply)
}

/// nginx behind rodizio logs, as `$proxy_protocol_addr`, the address the
/// client connected from (127.0.0.7), with a version 1 header asked for by
/// the backend's spec and a version 2 one asked for by `--send-proxy`; and
/// rodizio's http health checks, which open with a LOCAL header, are served
/// without nginx calling any header broken.
#[test]
fn nginx_logs_the_client_address_that_rodizio_sends() {
    let nginx = Nginx::start();
    let backend = loopback(nginx.port);
    let errors_before = nginx.error_log().len();
    for (name, spec, global) in [
        ("v1", format!("{backend},send-proxy"), None),
        ("v2", backend.to_string(), Some(Version::V2)),
    ] {
        let balancer = TestBalancer::with(&[], |c| {
            c.backends = vec![BackendSpec::parse(&spec).unwrap()];
            c.send_proxy = global;
            c.health.check = CheckKind::Http;
            c.health.interval = Duration::from_millis(100);
            c.health.timeout = Duration::from_secs(2);
        });
        let path = format!("/hello-{name}");
        let reply = get_from([127, 0, 0, 7], balancer.addr, &path).unwrap();
        assert!(reply.starts_with("HTTP/1.1 200"), "{name}: {reply:?}");
        let line = format!("127.0.0.7 127.0.0.1 \"GET {path} HTTP/1.1\"");
        until(&format!("nginx logs {line}"), || {
            nginx.access_log().contains(&line)
        });
        // The checks reach nginx as requests with no client address (LOCAL).
        let checks = |log: String| log.matches("- 127.0.0.1 \"GET /health HTTP/1.1\"").count();
        let before = checks(nginx.access_log());
        until(&format!("{name}: nginx serves a health check"), || {
            checks(nginx.access_log()) > before
        });
        assert!(balancer.backend(backend).is_healthy(), "{name}");
        balancer.stop();
    }
    let errors = nginx.error_log();
    let new_errors = &errors[errors_before.min(errors.len())..];
    assert!(
        !new_errors.contains("broken header"),
        "nginx refused a header:\n{new_errors}"
    );
}

/// HAProxy in front of rodizio with `send-proxy-v2`: rodizio's limiter
/// (`--rate-limit 3/30s`) sees the clients behind HAProxy, not HAProxy.
/// 127.0.0.8 is served three times, then refused with a 429, while
/// 127.0.0.9, through the same HAProxy, is still served.
#[test]
fn haproxy_in_front_lets_the_limiter_count_the_real_clients() {
    let web = TestBackend::http(1);
    let balancer = TestBalancer::with(&[web.addr()], |c| {
        c.accept_proxy = true;
        c.rate_limit = Some(RateLimitConfig {
            reply: RateLimitReply::Http,
            ..RateLimitConfig::new(Rate::parse("3/30s").unwrap())
        });
    });
    let bin = need("haproxy", "haproxy");
    let dir = temp_dir("pp-haproxy");
    let port = free_port();
    let conf = format!(
        "global\n  maxconn 64\n\
         defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 10s\n  timeout server 10s\n\
         frontend fe\n  bind 127.0.0.1:{port}\n  default_backend be\n\
         backend be\n  server s1 {} send-proxy-v2\n",
        balancer.addr
    );
    let conf_path = dir.join("haproxy.cfg");
    fs::write(&conf_path, conf).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("-f").arg(&conf_path).arg("-db");
    let mut haproxy = Peer::spawn("haproxy", cmd, libc::SIGTERM, &dir);
    let front = loopback(port);
    // The probe reaches rodizio as 127.0.0.1, a client of its own.
    haproxy.wait_listening(front);
    for n in 1..=3 {
        let reply = get_from([127, 0, 0, 8], front, "/").unwrap();
        assert!(
            reply.starts_with("HTTP/1.1 200") && reply.ends_with("backend 1\n"),
            "request {n} of 127.0.0.8: {reply:?}"
        );
    }
    let refused = get_from([127, 0, 0, 8], front, "/").unwrap_or_default();
    assert!(
        refused.starts_with("HTTP/1.1 429"),
        "the 4th request of 127.0.0.8: {refused:?}"
    );
    let other = get_from([127, 0, 0, 9], front, "/").unwrap();
    assert!(other.starts_with("HTTP/1.1 200"), "127.0.0.9: {other:?}");
    let s = balancer.stats.snapshot();
    assert_eq!(s.rate_limited, 1, "{s:?}");
    assert_eq!(s.proxy_header_refused, 0, "{s:?}");
    drop(haproxy);
    balancer.stop();
}

/// A backend that reads a PROXY protocol header and answers with the
/// client address it carries, then echoes the client's bytes.
fn header_echo() -> TestBackend {
    TestBackend::start(Arc::new(|mut s: TcpStream| {
        let header = proxy_protocol::read_header(&s, IO_TIMEOUT)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        let source = match header {
            Header::Proxy { source, .. } => source.to_string(),
            Header::Local => "local".to_string(),
        };
        writeln!(s, "{source}")?;
        common::echo(s)
    }))
}

/// With `--accept-proxy`, the address of the client's header is the one
/// passed on to a `send-proxy` backend, and the client's own bytes follow
/// the header untouched.
#[test]
fn the_accepted_address_is_passed_on_to_the_backend() {
    let backend = header_echo();
    let balancer = TestBalancer::with(&[], |c| {
        c.backends =
            vec![BackendSpec::parse(&format!("{},send-proxy-v2", backend.addr())).unwrap()];
        c.accept_proxy = true;
    });
    let mut s = connect(balancer.addr).unwrap();
    s.write_all(b"PROXY TCP4 192.0.2.44 127.0.0.1 5555 80\r\nhello")
        .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert_eq!(reply, "192.0.2.44:5555\nhello");
}

/// A client that sends no header is closed after `--accept-proxy-timeout`,
/// counted, and never reaches a backend; meanwhile the accept loop goes on:
/// a client with a header, arriving after it, is served at once.
#[test]
fn a_silent_client_costs_its_timeout_and_blocks_nobody() {
    let backend = header_echo();
    let balancer = TestBalancer::with(&[], |c| {
        c.backends = vec![BackendSpec::parse(&format!("{},send-proxy", backend.addr())).unwrap()];
        c.accept_proxy = true;
        c.accept_proxy_timeout = Duration::from_millis(1500);
    });
    let started = Instant::now();
    let mut silent = connect(balancer.addr).unwrap();
    until("the silent client is accepted", || {
        balancer.stats.snapshot().accepted == 1
    });
    let mut s = connect(balancer.addr).unwrap();
    s.write_all(b"PROXY TCP4 192.0.2.45 127.0.0.1 5556 80\r\nx")
        .unwrap();
    let mut line = [0u8; 16];
    s.read_exact(&mut line).unwrap();
    assert_eq!(&line, b"192.0.2.45:5556\n");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "the second client waited for the first: {:?}",
        started.elapsed()
    );
    let mut buf = [0u8; 8];
    let n = silent.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the silent client is closed");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1500), "{took:?}");
    assert!(took < Duration::from_secs(6), "{took:?}");
    assert!(wait_for(IO_TIMEOUT, || {
        balancer.stats.snapshot().proxy_header_refused == 1
    }));
    assert_eq!(backend.accepted(), 1, "only the second client got through");
}

/// A header from a peer outside `--accept-proxy-from`, and a malformed
/// header from a trusted one, each close that client only, and are counted.
#[test]
fn untrusted_and_malformed_headers_close_that_client_only() {
    let backend = header_echo();
    let spec = format!("{},send-proxy", backend.addr());
    let strict = TestBalancer::with(&[], |c| {
        c.backends = vec![BackendSpec::parse(&spec).unwrap()];
        c.accept_proxy = true;
        c.accept_proxy_from = "10.0.0.0/8".parse().unwrap();
    });
    let mut s = connect(strict.addr).unwrap();
    s.write_all(b"PROXY TCP4 192.0.2.46 127.0.0.1 5557 80\r\nx")
        .unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(
        s.read(&mut buf).unwrap_or(0),
        0,
        "an untrusted peer is closed"
    );
    until("the untrusted header is counted", || {
        strict.stats.snapshot().proxy_header_refused == 1
    });
    let open = TestBalancer::with(&[], |c| {
        c.backends = vec![BackendSpec::parse(&spec).unwrap()];
        c.accept_proxy = true;
    });
    let mut bad = connect(open.addr).unwrap();
    bad.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(bad.read(&mut buf).unwrap_or(0), 0, "no header: closed");
    let mut good = connect(open.addr).unwrap();
    good.write_all(b"PROXY TCP6 2001:db8::5 ::1 5558 80\r\ny")
        .unwrap();
    let mut line = [0u8; 20];
    good.read_exact(&mut line).unwrap();
    assert_eq!(&line, b"[2001:db8::5]:5558\ny");
    until("the malformed header is counted", || {
        open.stats.snapshot().proxy_header_refused == 1
    });
    assert_eq!(backend.accepted(), 1);
}

/// With `--accept-proxy` the pick waits for the header, so `ip-hash`
/// hashes the address it carries: clients that all come through one peer
/// (127.0.0.1) are spread over both backends by their own addresses, and
/// each address keeps its backend.
#[test]
fn ip_hash_hashes_the_address_of_the_header() {
    let one = TestBackend::http(1);
    let two = TestBackend::http(2);
    let balancer = TestBalancer::with(&[one.addr(), two.addr()], |c| {
        c.accept_proxy = true;
        c.algorithm = "ip-hash".parse().unwrap();
    });
    let ask = |client: &str| {
        let mut s = connect(balancer.addr).unwrap();
        write!(
            s,
            "PROXY TCP4 {client} 127.0.0.1 40000 80\r\n\
             GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 200"), "{client}: {reply:?}");
        reply.trim_end().rsplit(' ').next().unwrap().to_string()
    };
    let clients: Vec<String> = (1..=32).map(|n| format!("198.51.100.{n}")).collect();
    let first: Vec<String> = clients.iter().map(|c| ask(c)).collect();
    assert!(
        first.contains(&"1".to_string()) && first.contains(&"2".to_string()),
        "{first:?}"
    );
    let again: Vec<String> = clients.iter().map(|c| ask(c)).collect();
    assert_eq!(first, again, "each address keeps its backend");
}
