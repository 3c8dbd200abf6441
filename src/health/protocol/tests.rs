//! Unit tests of the protocol checks, each against a one-connection fake
//! server on loopback.

use super::mysql::{client, Greeting};
use super::pgsql::pg_error;
use super::tls::client_hello;
use super::*;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::thread;
use std::time::Duration;

/// A one-connection fake server: runs `serve` on the accepted stream in
/// a thread, and returns the client side, connected.
fn fake(serve: impl FnOnce(TcpStream) + Send + 'static) -> (TcpStream, thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let handle = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        serve(s);
    });
    (client, handle)
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

#[test]
fn parse_bytes_text_escapes_and_hex() {
    assert_eq!(parse_bytes("SSH-").unwrap(), b"SSH-");
    assert_eq!(
        parse_bytes(r"a\r\n\t\0\\\x41\xff").unwrap(),
        b"a\r\n\t\0\\A\xff"
    );
    assert_eq!(parse_bytes("é").unwrap(), "é".as_bytes());
    assert_eq!(parse_bytes("hex:0D0a00").unwrap(), b"\r\n\0");
    assert_eq!(parse_bytes("hex:").unwrap(), b"");
    assert_eq!(parse_bytes("").unwrap(), b"");
    assert!(parse_bytes(r"\q")
        .unwrap_err()
        .contains("unknown escape \\q"));
    assert!(parse_bytes("end\\").unwrap_err().contains("trailing"));
    assert!(parse_bytes(r"\x4").unwrap_err().contains("two hex digits"));
    assert!(parse_bytes(r"\xg0").unwrap_err().contains("two hex digits"));
    assert!(parse_bytes("hex:abc").unwrap_err().contains("even number"));
    assert!(parse_bytes("hex:zz").unwrap_err().contains("'z'"));
}

#[test]
fn client_hello_lengths_add_up() {
    for sni in [None, Some("backend.example")] {
        let hello = client_hello(sni);
        assert_eq!(&hello[..3], &[0x16, 0x03, 0x01]);
        let record_len = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
        assert_eq!(record_len, hello.len() - 5);
        assert_eq!(hello[5], 1, "ClientHello");
        let hs_len =
            usize::from(hello[6]) << 16 | usize::from(hello[7]) << 8 | usize::from(hello[8]);
        assert_eq!(hs_len, hello.len() - 9);
        // version, random, session id, suites, compression.
        let mut at = 9 + 2 + 32;
        assert_eq!(hello[at], 0);
        at += 1;
        let suites = usize::from(u16::from_be_bytes([hello[at], hello[at + 1]]));
        at += 2 + suites + 2;
        let ext_len = usize::from(u16::from_be_bytes([hello[at], hello[at + 1]]));
        assert_eq!(ext_len, hello.len() - at - 2);
        // Walk the extensions: each length must land exactly at the end.
        at += 2;
        let mut kinds = Vec::new();
        while at < hello.len() {
            kinds.push(u16::from_be_bytes([hello[at], hello[at + 1]]));
            at += 4 + usize::from(u16::from_be_bytes([hello[at + 2], hello[at + 3]]));
        }
        assert_eq!(at, hello.len());
        assert!(kinds.contains(&0x002b), "supported_versions");
        assert_eq!(kinds.contains(&0x0000), sni.is_some(), "SNI");
    }
    assert_ne!(
        client_hello(None)[11..43],
        client_hello(None)[11..43],
        "random"
    );
}

#[test]
fn redis_pong_and_noauth_are_healthy_anything_else_is_not() {
    for (answer, ok) in [
        (&b"+PONG\r\n"[..], true),
        (b"-NOAUTH Authentication required.\r\n", true),
        (b"-ERR unknown command 'PING'\r\n", false),
        (b"-LOADING Redis is loading\r\n", false),
    ] {
        let (mut c, h) = fake(move |mut s| {
            let mut got = [0u8; 6];
            s.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"PING\r\n");
            s.write_all(answer).unwrap();
            if ok {
                s.read_exact(&mut got).unwrap();
                assert_eq!(&got, b"QUIT\r\n");
            }
        });
        let r = run(&ProtocolCheck::Redis, &mut c, soon());
        assert_eq!(r.is_ok(), ok, "{answer:?}: {r:?}");
        if let Err(e) = r {
            assert!(e.starts_with("redis: answered \"-"), "{e}");
        }
        h.join().unwrap();
    }
}

#[test]
fn a_reply_split_in_bytes_parses_the_same() {
    let (mut c, h) = fake(|mut s| {
        let mut got = [0u8; 6];
        s.read_exact(&mut got).unwrap();
        for b in b"+PONG\r\n" {
            s.write_all(&[*b]).unwrap();
            s.flush().unwrap();
        }
    });
    assert_eq!(
        answer(&ProtocolCheck::Redis, &mut c, soon()),
        Ok("answered \"+PONG\"".to_string())
    );
    h.join().unwrap();
}

#[test]
fn smtp_multiline_greeting_then_quit() {
    let (mut c, h) = fake(|mut s| {
        s.write_all(b"220-mail.example ESMTP\r\n220 ready\r\n")
            .unwrap();
        let mut got = [0u8; 6];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"QUIT\r\n");
        s.write_all(b"221 bye\r\n").unwrap();
    });
    assert_eq!(
        answer(&ProtocolCheck::Smtp, &mut c, soon()),
        Ok("greeting \"220 ready\"".to_string())
    );
    h.join().unwrap();
    let (mut c, h) = fake(|mut s| s.write_all(b"554 no service here\r\n").unwrap());
    let e = run(&ProtocolCheck::Smtp, &mut c, soon()).unwrap_err();
    assert_eq!(e, "smtp: greeting \"554 no service here\"");
    h.join().unwrap();
}

#[test]
fn mysql_error_greeting_is_unhealthy_with_its_message() {
    let (mut c, h) = fake(|mut s| {
        let mut p = vec![0xff, 0x10, 0x04];
        p.extend_from_slice(b"Too many connections");
        let mut packet = vec![p.len() as u8, 0, 0, 0];
        packet.extend_from_slice(&p);
        s.write_all(&packet).unwrap();
    });
    let check = ProtocolCheck::Mysql {
        user: Some("u".into()),
    };
    let e = run(&check, &mut c, soon()).unwrap_err();
    assert_eq!(e, "mysql: server error 1040: Too many connections");
    h.join().unwrap();
}

/// The greeting of MariaDB 10.11, as sent on the wire.
const MARIADB_GREETING: &[u8] =
    b"d\x00\x00\x00\n5.5.5-10.11.19-MariaDB-0+deb12u1\x00\x19\x00\x00\x00\
    ic8,qw#E\x00\xfe\xf7\x08\x02\x00\xff\x81\x15\x00\x00\x00\x00\x00\x00\x1d\x00\x00\x00\
    q-(!kzE(4oR-\x00mysql_native_password\x00";

fn read_packet(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut header = [0u8; 4];
    s.read_exact(&mut header).unwrap();
    let len = usize::from(header[0]) | usize::from(header[1]) << 8;
    let mut payload = vec![0; len];
    s.read_exact(&mut payload).unwrap();
    (header[3], payload)
}

#[test]
fn mysql_greeting_parses_and_a_plugin_switch_is_answered() {
    let g = Greeting::parse(&MARIADB_GREETING[4..]).unwrap();
    assert_eq!(g.plugin, "mysql_native_password");
    assert_eq!(g.capabilities & client::LONG_PASSWORD, 0, "MariaDB");
    assert_ne!(g.capabilities & client::PLUGIN_AUTH, 0);

    let (mut c, h) = fake(|mut s| {
        s.write_all(MARIADB_GREETING).unwrap();
        let (seq, login) = read_packet(&mut s);
        assert_eq!(seq, 1);
        let caps = u32::from_le_bytes(login[..4].try_into().unwrap());
        assert_ne!(caps & client::PROTOCOL_41, 0);
        assert_eq!(caps & client::LONG_PASSWORD, 0, "masked with the server's");
        let user_and_rest = &login[32..];
        assert!(user_and_rest.starts_with(b"check\0\0mysql_native_password\0"));
        // Ask for another plugin; the empty answer comes with seq 3.
        s.write_all(b"\x18\x00\x00\x02\xfeclient_ed25519\x00ABCDEFG\x00")
            .unwrap();
        assert_eq!(read_packet(&mut s), (3, vec![]));
        s.write_all(b"\x07\x00\x00\x04\x00\x00\x00\x02\x00\x00\x00")
            .unwrap();
        assert_eq!(read_packet(&mut s), (0, vec![0x01]), "COM_QUIT");
    });
    let check = ProtocolCheck::Mysql {
        user: Some("check".into()),
    };
    assert_eq!(
        answer(&check, &mut c, soon()),
        Ok("greeting from \"5.5.5-10.11.19-MariaDB-0+deb12u1\", logged in as 'check'".into())
    );
    h.join().unwrap();
}

#[test]
fn tls_alert_is_unhealthy_and_named() {
    let (mut c, h) = fake(|mut s| {
        let mut hello = [0u8; 5];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(hello[0], 0x16);
        s.write_all(&[0x15, 3, 3, 0, 2, 2, 40]).unwrap();
    });
    let e = run(&ProtocolCheck::Tls, &mut c, soon()).unwrap_err();
    assert_eq!(
        e,
        "tls: the server answered with an alert (level 2, description 40: handshake_failure)"
    );
    h.join().unwrap();
}

#[test]
fn pgsql_errors_that_mean_no_connections_are_unhealthy() {
    let error = |state: &str| {
        let mut m = b"SFATAL\0C".to_vec();
        m.extend_from_slice(state.as_bytes());
        m.extend_from_slice(b"\0Mthe database system is starting up\0\0");
        m
    };
    assert!(pg_error(&error("28000"))
        .unwrap()
        .starts_with("answered error 28000"));
    assert!(pg_error(&error("3D000")).is_ok());
    let e = pg_error(&error("57P03")).unwrap_err();
    assert_eq!(e, "server error 57P03: the database system is starting up");
    assert!(pg_error(&error("53300")).is_err());
}

#[test]
fn send_expect_finds_bytes_across_reads_and_respects_the_bound() {
    let (mut c, h) = fake(|mut s| {
        let mut got = [0u8; 3];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi\n");
        s.write_all(b"hello, ").unwrap();
        s.flush().unwrap();
        s.write_all(b"OK\n").unwrap();
    });
    let check = ProtocolCheck::SendExpect {
        send: b"hi\n".to_vec(),
        expect: b"OK".to_vec(),
    };
    assert_eq!(run(&check, &mut c, soon()), Ok(()));
    h.join().unwrap();

    let (mut c, h) = fake(|mut s| {
        let _ = s.write_all(&[b'x'; 10_000]);
    });
    let check = ProtocolCheck::SendExpect {
        send: vec![],
        expect: b"OK".to_vec(),
    };
    let e = run(&check, &mut c, soon()).unwrap_err();
    assert!(e.contains("in the first 4096 bytes"), "{e}");
    drop(c);
    h.join().unwrap();
}

#[test]
fn a_past_deadline_fails_at_once() {
    let (mut c, h) = fake(|_| {});
    let e = run(&ProtocolCheck::Smtp, &mut c, Instant::now()).unwrap_err();
    assert_eq!(e, "smtp: timed out waiting for the greeting");
    h.join().unwrap();
}
