//! The built-in demo backend: a tiny HTTP server that says who it is.
//!
//! `rodizio demo` starts three of them so a reader can watch round robin
//! work with nothing else installed, and `rodizio backend --listen ADDR` runs
//! one alone: the "backend role" of seed 001, where the same program is
//! either the balancer or one of the servers behind it.
//!
//! Every request gets `200 OK` with the body `Handled by server NAME\n`;
//! `GET /health` gets `200 OK` with `OK\n` (for health checks). It speaks
//! enough HTTP/1.x for `curl`, `ab` (with and without `-k`) and `wrk`:
//! keep-alive by default on HTTP/1.1 and on request for HTTP/1.0, request
//! bodies with `Content-Length` read and discarded. Anything it cannot parse
//! gets `400` and a close. One thread per connection, as in the balancer.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the article uses `python3 -m http.server 8001` (and 8002,
//! 8003) as its backends. Those still work; this one only saves the setup.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::shutdown::Shutdown;

/// Longest header section accepted, in bytes.
const MAX_HEAD: usize = 16 * 1024;
/// A demo connection idle this long is closed.
const IDLE: Duration = Duration::from_secs(60);

/// A bound demo backend, ready to [`serve`](DemoBackend::serve).
#[derive(Debug)]
pub struct DemoBackend {
    listener: TcpListener,
    name: Arc<str>,
}

impl DemoBackend {
    /// Binds the demo backend; `name` defaults to the bound address.
    ///
    /// # Errors
    ///
    /// [`Error::Bind`] when the address cannot be bound.
    pub fn bind(addr: SocketAddr, name: Option<String>) -> Result<DemoBackend> {
        let listener = TcpListener::bind(addr).map_err(|source| Error::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::io("reading the demo backend's address", e))?;
        Ok(DemoBackend {
            listener,
            name: name.unwrap_or_else(|| local.to_string()).into(),
        })
    }

    /// The address it listens on.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the socket cannot say.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener
            .local_addr()
            .map_err(|e| Error::io("reading the demo backend's address", e))
    }

    /// Serves until `shutdown` is triggered.
    pub fn serve(self, shutdown: &Shutdown) {
        if let Ok(addr) = self.listener.local_addr() {
            shutdown.wake_on_trigger(addr);
        }
        for conn in self.listener.incoming() {
            if shutdown.is_triggered() {
                break;
            }
            let Ok(stream) = conn else { continue };
            let name = Arc::clone(&self.name);
            let spawned = thread::Builder::new()
                .name("rodizio-demo".into())
                .stack_size(64 * 1024)
                .spawn(move || {
                    if let Err(err) = serve_connection(stream, &name) {
                        log::debug!("demo backend {name}: {err}");
                    }
                });
            if let Err(err) = spawned {
                log::warn!("demo backend: cannot start a thread: {err}");
            }
        }
    }

    /// Serves on a thread of its own until `shutdown` is triggered.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the thread cannot be started.
    pub fn spawn(self, shutdown: Shutdown) -> Result<thread::JoinHandle<()>> {
        thread::Builder::new()
            .name("rodizio-demo-accept".into())
            .spawn(move || self.serve(&shutdown))
            .map_err(|e| Error::io("starting a demo backend", e))
    }
}

/// Answers requests on one connection until the client closes, asks to
/// close, or sends something unparsable.
fn serve_connection(stream: TcpStream, name: &str) -> io::Result<()> {
    stream.set_read_timeout(Some(IDLE))?;
    stream.set_write_timeout(Some(IDLE))?;
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        // Request line.
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let request_line = line.trim_end().to_string();
        let mut parts = request_line.split_whitespace();
        let (Some(_method), Some(path), Some(version)) = (parts.next(), parts.next(), parts.next())
        else {
            return respond(&mut writer, "400 Bad Request", "bad request\n", false);
        };
        let http10 = version == "HTTP/1.0";
        let mut keep_alive = !http10;
        let mut body_len = 0usize;
        let mut head = request_line.len();
        // Headers.
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            head += line.len();
            if head > MAX_HEAD {
                return respond(
                    &mut writer,
                    "431 Request Header Fields Too Large",
                    "\n",
                    false,
                );
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((key, value)) = header.split_once(':') {
                let value = value.trim();
                if key.eq_ignore_ascii_case("content-length") {
                    match value.parse() {
                        Ok(n) => body_len = n,
                        Err(_) => {
                            return respond(&mut writer, "400 Bad Request", "bad length\n", false)
                        }
                    }
                } else if key.eq_ignore_ascii_case("connection") {
                    if value.eq_ignore_ascii_case("close") {
                        keep_alive = false;
                    } else if value.eq_ignore_ascii_case("keep-alive") {
                        keep_alive = true;
                    }
                }
            }
        }
        // Discard the body.
        io::copy(&mut (&mut reader).take(body_len as u64), &mut io::sink())?;
        let body = if path == "/health" {
            "OK\n".to_string()
        } else {
            format!("Handled by server {name}\n")
        };
        respond(&mut writer, "200 OK", &body, keep_alive)?;
        if !keep_alive {
            return Ok(());
        }
    }
}

fn respond(out: &mut TcpStream, status: &str, body: &str, keep_alive: bool) -> io::Result<()> {
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         Connection: {connection}\r\n\r\n{body}",
        body.len()
    );
    out.write_all(response.as_bytes())?;
    if !keep_alive {
        let _ = out.shutdown(std::net::Shutdown::Write);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_with_its_name_keeps_alive_and_serves_health() {
        let shutdown = Shutdown::new();
        let demo = DemoBackend::bind("127.0.0.1:0".parse().unwrap(), Some("A".into())).unwrap();
        let addr = demo.local_addr().unwrap();
        let handle = demo.spawn(shutdown.clone()).unwrap();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut reader = BufReader::new(s.try_clone().unwrap());
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        assert_eq!(status, "HTTP/1.1 200 OK\r\n");
        let mut line = String::new();
        while line != "\r\n" {
            line.clear();
            reader.read_line(&mut line).unwrap();
        }
        let mut body = String::new();
        reader.read_line(&mut body).unwrap();
        assert_eq!(body, "Handled by server A\n");
        // Same connection, second request: health, then close.
        s.write_all(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut rest = String::new();
        reader.read_to_string(&mut rest).unwrap();
        assert!(rest.starts_with("HTTP/1.1 200 OK\r\n"), "{rest}");
        assert!(rest.ends_with("\r\n\r\nOK\n"), "{rest}");
        shutdown.trigger();
        handle.join().unwrap();
    }
}
