//! Bandwidth per connection: `download_rate` and `upload_rate`, a token
//! bucket per direction in the pump. A 10 MB download through curl at
//! 1MB/s takes 10 s; a 200 KB upload at 100KB/s about 2 s; the splice
//! pump honours the cap too; the other direction is not held back.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{TestBackend, TestBalancer, IO_TIMEOUT};
use rodizio::proxy::ProxyConfig;
use rodizio::units::ByteRate;

const MB: usize = 1024 * 1024;

/// An HTTP backend answering any request with `len` bytes of body.
fn big_body(len: usize) -> TestBackend {
    TestBackend::start(Arc::new(move |stream: TcpStream| {
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut line = String::new();
        while reader.read_line(&mut line)? > 2 {
            line.clear();
        }
        let mut stream = stream;
        write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
        )?;
        let chunk = vec![b'r'; 64 * 1024];
        let mut left = len;
        while left > 0 {
            let n = left.min(chunk.len());
            stream.write_all(&chunk[..n])?;
            left -= n;
        }
        Ok(())
    }))
}

/// A backend that reads to the client's end of stream and answers with
/// the number of bytes it got.
fn counter() -> TestBackend {
    TestBackend::start(Arc::new(|mut stream: TcpStream| {
        let mut got = Vec::new();
        stream.read_to_end(&mut got)?;
        write!(stream, "{}", got.len())
    }))
}

fn rated(download: Option<&str>, upload: Option<&str>, splice: bool) -> ProxyConfig {
    ProxyConfig {
        download_rate: download.map(|r| ByteRate::parse(r).unwrap()),
        upload_rate: upload.map(|r| ByteRate::parse(r).unwrap()),
        splice,
        ..ProxyConfig::default()
    }
}

/// curl's download of `url`: the bytes it got and the seconds it took.
fn curl(url: &str) -> (usize, f64) {
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "--max-time", "60"])
        .args(["-w", "%{size_download} %{time_total}", url])
        .output()
        .expect("curl (Debian package curl; scripts/install-test-tools.sh)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut parts = text.split_whitespace();
    let size = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let secs = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0.0);
    (size, secs)
}

/// The measure: 10 MB at `download_rate 1MB` takes 10 ± 1 s.
#[test]
fn a_10mb_download_at_1mb_a_second_takes_10_seconds() {
    let backend = big_body(10 * MB);
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.proxy = rated(Some("1MB"), None, false);
    });
    let (size, secs) = curl(&format!("http://{}/", lb.addr));
    assert_eq!(size, 10 * MB);
    eprintln!("10 MB at 1MB/s through curl: {secs:.2} s");
    assert!((9.0..=11.0).contains(&secs), "took {secs:.2} s");
    // Counted when the connection ends, just after curl has its bytes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while lb.stats.snapshot().completed == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let s = lb.stats.snapshot();
    assert!(s.bytes_to_clients >= (10 * MB) as u64, "{s:?}");
}

/// 200 KB up at `upload_rate 100KB/s`: about 2 s (the first tenth of a
/// second's worth goes at once).
#[test]
fn a_200kb_upload_at_100kb_a_second_takes_2_seconds() {
    let backend = counter();
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.proxy = rated(None, Some("100KB/s"), false);
    });
    let started = Instant::now();
    let mut s = TcpStream::connect(lb.addr).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s.write_all(&vec![b'u'; 200 * 1024]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let took = started.elapsed();
    assert_eq!(reply, (200 * 1024).to_string());
    eprintln!("200 KB up at 100KB/s: {took:?}");
    assert!(
        (Duration::from_millis(1500)..=Duration::from_millis(2500)).contains(&took),
        "took {took:?}"
    );
}

/// The splice pump reads through its pipes no faster than the cap.
#[test]
fn splice_honours_the_download_rate() {
    let backend = big_body(MB);
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.proxy = rated(Some("512k"), None, true);
    });
    let (size, secs) = curl(&format!("http://{}/", lb.addr));
    assert_eq!(size, MB);
    // 1 MB at 512 KB/s, less the first 51 KB: 1.9 s.
    assert!((1.4..=2.6).contains(&secs), "took {secs:.2} s");
}

/// With the download capped hard, the upload of the same connection still
/// flows at full speed: an echo through a cap on the way back only.
#[test]
fn a_capped_direction_does_not_hold_the_other_back() {
    let backend = counter();
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.proxy = rated(Some("1k"), None, false);
    });
    let started = Instant::now();
    let mut s = TcpStream::connect(lb.addr).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s.write_all(&vec![b'u'; 4 * MB]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert_eq!(reply, (4 * MB).to_string());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// Rates are live: a connection started after the change has the new cap.
#[test]
fn the_rates_are_live() {
    let backend = big_body(256 * 1024);
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.proxy = rated(Some("128k"), None, false);
    });
    let url = format!("http://{}/", lb.addr);
    let (_, capped) = curl(&url);
    assert!(capped >= 1.5, "took {capped:.2} s");
    lb.live
        .proxy
        .store(Arc::new(rated(Some("off"), None, false)));
    let (size, free) = curl(&url);
    assert_eq!(size, 256 * 1024);
    assert!(free < 1.0, "took {free:.2} s");
}
