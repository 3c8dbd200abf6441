//! Several services in one balancer, with real peers: HTTP (ab against demo
//! backends) on one service and Redis (redis-benchmark against two
//! redis-servers) on another, at the same time; a reload under load that
//! stops one service, changes another and starts a third; a reload that
//! cannot bind keeps everything; a service renamed with its address kept;
//! and `max_connections` keeping one flooded service from taking every
//! worker.

mod common;
mod peers;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use common::{http_get, request, test_data, until, wait_for, Demo, TestBackend, IO_TIMEOUT};
use peers::{free_port, need, temp_dir, Peer};
use rodizio::config::file;
use rodizio::config::Overrides;
use rodizio::reload::Reloader;
use rodizio::running::Running;
use rodizio::{Balancer, Shutdown};

/// redis-server on `port`, with no persistence.
fn redis(port: u16) -> Peer {
    peers::redis_server(port, "services-redis")
}

/// A balancer built from a config file, running on its own thread.
struct Running1 {
    running: Arc<Running>,
    admin: SocketAddr,
    reloader: Reloader,
    shutdown: Shutdown,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl Running1 {
    fn start(name: &str, text: &str) -> Running1 {
        let path = temp_dir(name).join("rodizio.json");
        std::fs::write(&path, text).unwrap();
        let file = file::load(&path).unwrap();
        let config = file.settle(&Overrides::default()).unwrap();
        let balancer = Balancer::bind(config).expect("bind");
        let reloader = Reloader::new(&path, Overrides::default(), &balancer);
        let running = balancer.running();
        let admin = balancer.admin_addr().expect("admin on");
        let shutdown = Shutdown::new();
        let thread = {
            let shutdown = shutdown.clone();
            thread::spawn(move || balancer.run(&shutdown).unwrap())
        };
        Running1 {
            running,
            admin,
            reloader,
            shutdown,
            thread: Some(thread),
            path,
        }
    }

    /// The first address the service `name` listens on, once it does.
    fn addr(&self, name: &str) -> SocketAddr {
        until("the service listens", || {
            !self.running.addrs(name).is_empty()
        });
        self.running.addrs(name)[0]
    }

    fn write(&self, text: &str) {
        std::fs::write(&self.path, text).unwrap();
    }

    /// One sample of `/metrics`, by name with its labels as written.
    fn metric(&self, sample: &str) -> f64 {
        let body = http_get(self.admin, "/metrics").unwrap().body;
        body.lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {sample} in:\n{body}"))
    }

    /// The sum of a per-backend series over the backends of `service`.
    fn backends_sum(&self, family: &str, service: &str) -> f64 {
        let body = http_get(self.admin, "/metrics").unwrap().body;
        let prefix = format!("{family}{{service=\"{service}\",backend=");
        body.lines()
            .filter(|l| l.starts_with(&prefix))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
            .sum()
    }
}

impl Drop for Running1 {
    fn drop(&mut self) {
        self.shutdown.trigger();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(self.path.parent().unwrap());
    }
}

/// Runs `ab` (keep-alive off: one connection per request) against `addr`.
fn ab(addr: SocketAddr, n: usize, c: usize) -> Output {
    let bin = need("ab", "apache2-utils");
    Command::new("timeout")
        .arg("60")
        .arg(bin)
        .args(["-q", "-n", &n.to_string(), "-c", &c.to_string(), "-s", "10"])
        .arg(format!("http://{addr}/"))
        .output()
        .expect("run ab")
}

/// ab's "Failed requests" and "Complete requests".
fn ab_counts(out: &Output) -> (usize, usize) {
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in ab's output:\n{text}"))
    };
    (field("Complete requests:"), field("Failed requests:"))
}

/// HTTP on one service and Redis on another, at the same time, with other
/// algorithms and health checks: nothing fails, and each service counts
/// exactly its own connections.
#[test]
fn http_and_redis_services_run_side_by_side() {
    let demos = [
        Demo::start("127.0.0.1:0", "web-1"),
        Demo::start("127.0.0.1:0", "web-2"),
    ];
    let ports = [free_port(), free_port()];
    let _redis: Vec<Peer> = ports.iter().map(|p| redis(*p)).collect();
    let b = Running1::start(
        "services-side",
        &format!(
            r#"{{"admin_listen": "127.0.0.1:0", "workers": 256,
                "services": [
                  {{"name": "web", "listen": "127.0.0.1:0", "algorithm": "round-robin",
                    "health_check": "http", "health_path": "/", "health_interval": "200ms",
                    "backends": ["{}", "{}"]}},
                  {{"name": "cache", "listen": "127.0.0.1:0", "algorithm": "least-connections",
                    "health_check": "redis", "health_interval": "200ms",
                    "backends": ["127.0.0.1:{}", "127.0.0.1:{}"]}}
                ]}}"#,
            demos[0].addr, demos[1].addr, ports[0], ports[1]
        ),
    );
    let (web, cache) = (b.addr("web"), b.addr("cache"));
    let bench = need("redis-benchmark", "redis-tools");
    let redis_run = thread::spawn(move || {
        Command::new("timeout")
            .arg("60")
            .arg(bench)
            .args(["-h", "127.0.0.1", "-p", &cache.port().to_string()])
            .args(["-n", "4000", "-c", "20", "-t", "set,get", "-q"])
            .output()
            .expect("run redis-benchmark")
    });
    let web_run = ab(web, 2000, 20);
    let redis_out = redis_run.join().unwrap();
    let (complete, failed) = ab_counts(&web_run);
    assert_eq!(
        (complete, failed),
        (2000, 0),
        "ab: {}",
        String::from_utf8_lossy(&web_run.stdout)
    );
    let text = String::from_utf8_lossy(&redis_out.stdout).to_string()
        + &String::from_utf8_lossy(&redis_out.stderr);
    assert!(redis_out.status.success(), "redis-benchmark: {text}");
    assert!(
        text.contains("SET: ") && text.contains("GET: "),
        "redis-benchmark: {text}"
    );
    assert!(
        !text.to_lowercase().contains("error"),
        "redis-benchmark: {text}"
    );
    // Every connection ended: the counts are final.
    until("both services idle", || {
        b.metric("rodizio_active{service=\"web\"}") == 0.0
            && b.metric("rodizio_active{service=\"cache\"}") == 0.0
    });
    // Each service counts its own connections, each once: the accepted
    // ones all completed and all reached one of its backends. (ab may open
    // a few connections more than its requests, so its share is at least
    // 2000.)
    for service in ["web", "cache"] {
        let accepted = b.metric(&format!("rodizio_accepted_total{{service=\"{service}\"}}"));
        let completed = b.metric(&format!("rodizio_completed_total{{service=\"{service}\"}}"));
        let reached = b.backends_sum("rodizio_backend_connections_total", service);
        assert_eq!((completed, reached), (accepted, accepted), "{service}");
    }
    assert!(b.metric("rodizio_accepted_total{service=\"web\"}") >= 2000.0);
    assert!(b.metric("rodizio_accepted_total{service=\"cache\"}") >= 40.0);
    // Exactly: 50 more requests to the web service and 30 to the cache
    // move each one's counts by that much, and the other's not at all.
    let before = |s: &str| b.metric(&format!("rodizio_completed_total{{service=\"{s}\"}}"));
    let (web0, cache0) = (before("web"), before("cache"));
    for _ in 0..50 {
        assert!(request(web).unwrap().starts_with("web-"));
    }
    for _ in 0..30 {
        let mut s = TcpStream::connect(cache).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.write_all(b"PING\r\n").unwrap();
        let mut pong = [0u8; 7];
        s.read_exact(&mut pong).unwrap();
        assert_eq!(&pong, b"+PONG\r\n");
    }
    until("the last requests counted", || {
        before("web") == web0 + 50.0 && before("cache") >= cache0 + 30.0
    });
    assert_eq!(
        (before("web"), before("cache")),
        (web0 + 50.0, cache0 + 30.0)
    );
    // The process's totals are the two services' together.
    let services = http_get(b.admin, "/services").unwrap().body;
    assert!(
        services.contains("\"name\":\"web\"") && services.contains("\"name\":\"cache\""),
        "{services}"
    );
    assert!(services.contains("least-connections"), "{services}");
}

/// A reload under load stops the first service, changes the second's
/// algorithm and starts a third: the second fails nothing, the first's
/// connection in flight finishes byte for byte, the third answers. Then a
/// reload whose new address cannot be bound changes nothing.
#[test]
fn a_reload_under_load_adds_changes_and_stops_services() {
    let echo = TestBackend::echo();
    let demos = [
        Demo::start("127.0.0.1:0", "web-1"),
        Demo::start("127.0.0.1:0", "web-2"),
    ];
    let extra = Demo::start("127.0.0.1:0", "new-1");
    let old = format!(
        r#"{{"name": "old", "listen": "127.0.0.1:0", "health_check": "off",
            "backends": ["{}"]}}"#,
        echo.addr()
    );
    let web = |algorithm: &str| {
        format!(
            r#"{{"name": "web", "listen": "127.0.0.1:0", "algorithm": "{algorithm}",
                "backends": ["{}", "{}"]}}"#,
            demos[0].addr, demos[1].addr
        )
    };
    let new = format!(
        r#"{{"name": "new", "listen": "127.0.0.1:0", "backends": ["{}"]}}"#,
        extra.addr
    );
    let file = |services: &[&str]| {
        format!(
            r#"{{"admin_listen": "127.0.0.1:0", "services": [{}]}}"#,
            services.join(",")
        )
    };
    let b = Running1::start("services-reload", &file(&[&old, &web("round-robin")]));
    let (old_addr, web_addr) = (b.addr("old"), b.addr("web"));
    // A connection through the service that is going away, half-way.
    let data = test_data(256 * 1024, 7);
    let mut held = TcpStream::connect(old_addr).unwrap();
    held.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    held.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut back = vec![0u8; data.len()];
    held.write_all(&data[..data.len() / 2]).unwrap();
    held.read_exact(&mut back[..data.len() / 2]).unwrap();
    // Load on the service that stays, across the reload.
    let load = thread::spawn(move || ab(web_addr, 3000, 10));
    until("the load is under way", || {
        b.metric("rodizio_accepted_total{service=\"web\"}") >= 200.0
    });
    b.write(&file(&[&web("least-connections"), &new]));
    let report = b.reloader.reload().expect("reload");
    assert_eq!(
        (report.services_added, report.services_removed),
        (1, 1),
        "{report:?}"
    );
    assert!(
        report
            .summary
            .contains("service web: algorithm round-robin → least-connections"),
        "{}",
        report.summary
    );
    let out = load.join().unwrap();
    assert_eq!(
        ab_counts(&out),
        (3000, 0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The stopped service's client goes on to the end, byte for byte...
    held.write_all(&data[data.len() / 2..]).unwrap();
    held.read_exact(&mut back[data.len() / 2..]).unwrap();
    assert!(back == data, "the echo came back changed");
    drop(held);
    // ...while its address takes no new client.
    assert!(TcpStream::connect_timeout(&old_addr, IO_TIMEOUT).is_err());
    // The new service answers.
    assert_eq!(request(b.addr("new")).unwrap(), "new-1");
    let names = |b: &Running1| -> Vec<String> {
        b.running
            .list()
            .iter()
            .map(|s| s.name().to_string())
            .collect()
    };
    assert_eq!(names(&b), ["web", "new"]);
    // An address that cannot be bound: the reload is refused whole.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let blocked = format!(
        r#"{{"name": "blocked", "listen": "{}", "backends": ["{}"]}}"#,
        taken.local_addr().unwrap(),
        extra.addr
    );
    b.write(&file(&[&web("round-robin"), &new, &blocked]));
    let err = b.reloader.reload().expect_err("a taken address");
    assert!(
        err.to_string().contains("Address already in use") || err.to_string().contains("in use"),
        "{err}"
    );
    assert_eq!(names(&b), ["web", "new"]);
    let web_now = b.running.find("web").unwrap();
    assert_eq!(
        web_now.live.scheduler.algorithm().name(),
        "least-connections"
    );
    assert!(request(b.addr("web")).unwrap().starts_with("web-"));
}

/// A service at its `max_connections` stops accepting: flooded with
/// clients that send nothing, it holds at most its limit of the workers,
/// and the other service is still served.
#[test]
fn max_connections_keeps_a_flood_from_taking_every_worker() {
    let echo = TestBackend::echo();
    let demo = Demo::start("127.0.0.1:0", "web-1");
    let b = Running1::start(
        "services-max",
        &format!(
            r#"{{"admin_listen": "127.0.0.1:0", "workers": 8, "services": [
                {{"name": "slow", "listen": "127.0.0.1:0", "max_connections": 4,
                  "health_check": "off", "backends": ["{}"]}},
                {{"name": "web", "listen": "127.0.0.1:0", "backends": ["{}"]}}]}}"#,
            echo.addr(),
            demo.addr
        ),
    );
    let slow = b.addr("slow");
    // Twenty clients that connect and say nothing: without the limit they
    // would take all 8 workers and queue the rest.
    let mut flood: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(slow).unwrap()).collect();
    until("the slow service at its limit", || {
        b.metric("rodizio_service_connections_held{service=\"slow\"}") == 4.0
    });
    assert_eq!(b.metric("rodizio_accepted_total{service=\"slow\"}"), 4.0);
    for _ in 0..20 {
        assert!(request(b.addr("web")).unwrap().starts_with("web-"));
    }
    // One of the first four leaves: a fifth is taken in, served, and the
    // count stays at the limit.
    drop(flood.remove(0));
    until("a waiting client taken in", || {
        b.metric("rodizio_accepted_total{service=\"slow\"}") == 5.0
    });
    assert_eq!(
        b.metric("rodizio_service_connections_held{service=\"slow\"}"),
        4.0
    );
    drop(flood);
    let gone = wait_for(Duration::from_secs(10), || {
        b.metric("rodizio_service_connections_held{service=\"slow\"}") == 0.0
    });
    assert!(gone, "{}", http_get(b.admin, "/metrics").unwrap().body);
}

/// A service renamed with its address kept: the reload takes the old
/// service's listening socket over instead of binding the address again
/// (which failed, "Address already in use", on rodizio's own socket); the
/// address answers with the renamed service's backend, and a dry run
/// says the same.
#[test]
fn a_service_renamed_keeps_its_address() {
    let one = Demo::start("127.0.0.1:0", "one");
    let two = Demo::start("127.0.0.1:0", "two");
    let listen = peers::loopback(free_port());
    let service = |name: &str, backend: SocketAddr| {
        format!(
            r#"{{"admin_listen": "127.0.0.1:0", "services": [
                {{"name": "{name}", "listen": "{listen}", "health_check": "off",
                  "backends": ["{backend}"]}}]}}"#
        )
    };
    let b = Running1::start("services-rename", &service("old", one.addr));
    assert_eq!(b.addr("old"), listen);
    assert_eq!(request(listen).unwrap(), "one");
    b.write(&service("new", two.addr));
    b.reloader.dry_run().expect("a dry run of the rename");
    let report = b.reloader.reload().expect("the rename");
    assert_eq!(
        (report.services_added, report.services_removed),
        (1, 1),
        "{report:?}"
    );
    assert_eq!(b.addr("new"), listen);
    assert!(b.running.find("old").is_none());
    for _ in 0..5 {
        assert_eq!(request(listen).unwrap(), "two");
    }
    // And back, under the first name.
    b.write(&service("old", one.addr));
    b.reloader.reload().expect("the rename back");
    assert_eq!(request(listen).unwrap(), "one");
}
