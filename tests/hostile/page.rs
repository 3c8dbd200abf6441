//! The stats page: hostile names in its tables and its charts, a thousand
//! backends, and fifty clients that ask for it and read slowly.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use rodizio::backend::Backend;
use rodizio::Config;

/// `GET path`, read whole: the status line and the body.
fn fetch(addr: SocketAddr, path: &str) -> (String, String) {
    let r = http_get(addr, path).expect("GET");
    (r.status, r.body)
}

/// A balancer with its admin API over `backends` (health checks off).
fn with_admin(backends: &[SocketAddr]) -> TestBalancer {
    TestBalancer::start(Config {
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..config(backends)
    })
}

/// A backend whose name is HTML and SVG markup, quotes and an ampersand
/// (a name no address parser would take, put in the list directly): the
/// page and its chart show it escaped, never as markup.
#[test]
fn a_backend_name_of_markup_is_escaped_in_the_page_and_the_chart() {
    let echo = TestBackend::echo();
    let lb = with_admin(&[echo.addr()]);
    let evil = "<script>alert('x')</script>\"&<svg onload=x>:80";
    lb.scheduler
        .add(Arc::new(Backend::new(evil.into(), vec![echo.addr()], 1)));
    let (status, page) = fetch(lb.admin.unwrap(), "/");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(!page.contains("<script"), "{page}");
    assert!(!page.contains("<svg onload"), "{page}");
    assert!(
        page.contains(
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&amp;&lt;svg onload=x&gt;:80"
        ),
        "{page}"
    );
    // The chart is labelled with the service's name, escaped the same way.
    assert_eq!(page.matches("<svg class=\"chart\"").count(), 1);
    assert_eq!(page.matches("<svg").count(), 1, "{page}");
}

/// A thousand backends: the page shows at most `MAX_ROWS` rows per
/// service (the totals row counts all of them), stays under 200 KB and is
/// served within seconds even on a loaded machine.
#[test]
fn a_thousand_backends_keep_the_page_bounded() {
    let addrs: Vec<SocketAddr> = (0..1000u16)
        .map(|i| SocketAddr::from(([127, 0, 0, 1], 20000 + i)))
        .collect();
    let lb = with_admin(&addrs);
    let started = Instant::now();
    let (status, page) = fetch(lb.admin.unwrap(), "/");
    let took = started.elapsed();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let rows = page.matches("data-backend=").count();
    assert_eq!(rows, rodizio::admin::page::MAX_ROWS);
    assert!(page.contains("800 more backends, not shown"));
    assert!(page.contains("<th>1000/1000 up</th>"));
    assert!(page.len() < 200_000, "{} bytes", page.len());
    assert!(took < Duration::from_secs(5), "{took:?}");
    eprintln!(
        "1000 backends: the page is {} bytes, served in {took:?}",
        page.len()
    );
}

/// Fifty clients ask for the page (of a thousand backends) and read
/// nothing: the rest of the API answers at once meanwhile, and each of
/// them still gets its answer when it reads.
#[test]
fn fifty_slow_readers_of_the_page_do_not_hold_up_the_api() {
    let addrs: Vec<SocketAddr> = (0..1000u16)
        .map(|i| SocketAddr::from(([127, 0, 0, 1], 21000 + i)))
        .collect();
    let lb = with_admin(&addrs);
    let admin = lb.admin.unwrap();
    let mut readers: Vec<TcpStream> = (0..50)
        .map(|_| {
            let s = TcpStream::connect_timeout(&admin, Duration::from_secs(5)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
            // A small receive buffer, so the page does not fit in it.
            socket2::SockRef::from(&s)
                .set_recv_buffer_size(4096)
                .unwrap();
            let mut w = &s;
            w.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
            s
        })
        .collect();
    let t = time_until(Duration::from_secs(3), || {
        http_get(admin, "/backends").is_ok_and(|r| r.status.starts_with("HTTP/1.1 200"))
    });
    assert!(
        t.is_some(),
        "the API did not answer while 50 readers lagged"
    );
    for s in &mut readers {
        let mut head = [0u8; 64];
        let mut got = 0;
        while got < 12 {
            let n = s.read(&mut head[got..]).expect("the page's answer");
            assert!(n > 0, "closed without an answer");
            got += n;
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{:?}", &head[..got]);
    }
}
