//! Many clients at once: the article's `ab -n 1000 -c 100`, in-process.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{backends, http_get, TestBackend, TestBalancer};

/// 1000 requests from 100 concurrent threads: zero failures, and round
/// robin still splits the connections exactly (334, 333, 333).
#[test]
fn thousand_requests_at_a_hundred_concurrent() {
    let backends = backends(3, TestBackend::http);
    let addrs: Vec<_> = backends.iter().map(|b| b.addr()).collect();
    let lb = TestBalancer::over(&addrs);
    let failures = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let threads: Vec<_> = (0..100)
        .map(|_| {
            let (failures, ok, addr) = (failures.clone(), ok.clone(), lb.addr);
            thread::spawn(move || {
                for _ in 0..10 {
                    match http_get(addr, "/") {
                        Ok(r)
                            if r.status == "HTTP/1.1 200 OK" && r.body.starts_with("backend ") =>
                        {
                            ok.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(r) => {
                            eprintln!("bad response: {r:?}");
                            failures.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => {
                            eprintln!("request failed: {e}");
                            failures.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let elapsed = started.elapsed();
    assert_eq!(failures.load(Ordering::SeqCst), 0);
    assert_eq!(ok.load(Ordering::SeqCst), 1000);
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
    let (held, counts) = lb.proxied(&backends.iter().collect::<Vec<_>>(), |c| {
        let mut c = c.to_vec();
        c.sort_unstable();
        c == [333, 333, 334]
    });
    assert!(held, "split {counts:?}");
    lb.stop();
}
