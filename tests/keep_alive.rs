//! HTTP keep-alive: many requests on one client connection.

mod common;

use std::io::{BufReader, Write};

use common::{connect, read_response, TestBalancer};
use rodizio::demo::DemoBackend;
use rodizio::Shutdown;

/// 200 requests on one connection through the balancer to a demo backend:
/// every one is answered, all by the same backend over one backend
/// connection (the C served one request per connection, then closed).
#[test]
fn many_requests_on_one_connection() {
    let shutdown = Shutdown::new();
    let mut demos = Vec::new();
    let mut addrs = Vec::new();
    for name in ["A", "B"] {
        let demo = DemoBackend::bind("127.0.0.1:0".parse().unwrap(), Some(name.into())).unwrap();
        addrs.push(demo.local_addr().unwrap());
        demos.push(demo.spawn(shutdown.clone()).unwrap());
    }
    let lb = TestBalancer::over(&addrs);
    for expected in ["A", "B"] {
        let stream = connect(lb.addr).unwrap();
        let mut writer = stream.try_clone().unwrap();
        let mut reader = BufReader::new(stream);
        for i in 0..200 {
            // One write per request: a request split over several small
            // writes would wait on Nagle's algorithm and delayed ACKs.
            let request = format!("GET /{i} HTTP/1.1\r\nHost: test\r\n\r\n");
            writer.write_all(request.as_bytes()).unwrap();
            let response = read_response(&mut reader).expect("response on the same connection");
            assert_eq!(response.status, "HTTP/1.1 200 OK");
            assert_eq!(response.body, format!("Handled by server {expected}\n"));
        }
        // Pipelined: three requests in one write, three responses in order.
        writer
            .write_all(
                b"GET /1 HTTP/1.1\r\n\r\nGET /health HTTP/1.1\r\n\r\nGET /3 HTTP/1.1\r\n\r\n",
            )
            .unwrap();
        for body in [
            format!("Handled by server {expected}\n"),
            "OK\n".to_string(),
            format!("Handled by server {expected}\n"),
        ] {
            assert_eq!(read_response(&mut reader).unwrap().body, body);
        }
    }
    let stats = lb.stats.snapshot();
    assert_eq!(stats.accepted, 2);
    lb.stop();
    shutdown.trigger();
    for d in demos {
        d.join().unwrap();
    }
}
