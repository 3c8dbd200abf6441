//! The interactive entry of backends, asked exactly as the article's C does.
//!
//! [`servers_entry`] is generic over its input and output, so the binary
//! passes standard input and output while tests pass a `Cursor` and a
//! `Vec<u8>` and check every byte that was printed.
//!
//! The questions and the `Invalid input.` answer are the C's, word for word.
//! Each answer is one line, read as bytes, at most 1 KiB of them.
//! Anything invalid (a line that is not UTF-8 or too long, not a number, out
//! of range, an address that does not resolve, a port outside 1..65535)
//! prints `Invalid input.` followed by the reason on the same line, and asks
//! the same question again; white space around an answer is ignored. End of input returns
//! [`Error::PromptEof`] instead of asking forever. It runs on the main
//! thread before the balancer starts, so nothing here is shared.
//!
//! # Corresponds to the C article
//!
//! `servers_entry()`. The C's `scanf` loops forever on a non-number or at
//! end of input, overflows its 20-byte address buffer on a long name and
//! never checks the port (docs/c-to-rust.md); here each answer is read as
//! a line of bytes and validated.

use std::io::{BufRead, Write};
use std::net::ToSocketAddrs;

use crate::backend::{parse_port, BackendSpec};
use crate::config::MAX_PROMPT_SERVERS;
use crate::error::{Error, Result};

/// Longest answer kept, in bytes: a host name is at most 253. A longer
/// line is refused and the rest of it skipped without being stored, so a
/// line with no end (`yes | rodizio`, a file given by mistake) cannot
/// grow the process.
const MAX_ANSWER: usize = 1024;

/// Asks for the number of servers, then the address and port of each.
///
/// # Errors
///
/// [`Error::PromptEof`] if the input ends first; [`Error::Io`] if it cannot
/// be read or the output cannot be written.
pub fn servers_entry<R: BufRead, W: Write>(
    input: &mut R,
    output: &mut W,
) -> Result<Vec<BackendSpec>> {
    let count = ask(
        input,
        output,
        &format!("Enter the number of servers (1 <= number_of_servers <= {MAX_PROMPT_SERVERS}): "),
        parse_count,
    )?;
    let mut servers = Vec::with_capacity(count);
    for idx in 1..=count {
        let host = ask(
            input,
            output,
            &format!("Enter the address of the {idx} server: "),
            valid_host,
        )?;
        let port = ask(
            input,
            output,
            &format!("Enter the port of the {idx} server: "),
            port_answer,
        )?;
        servers.push(BackendSpec {
            host,
            port,
            weight: 1,
            send_proxy: None,
            check: Default::default(),
            max_connections: None,
            backup: false,
            ends: Default::default(),
        });
    }
    Ok(servers)
}

/// Prints `question`, reads one line, and returns it converted by `parse`;
/// prints `Invalid input.` and the reason `parse` gives, and asks again,
/// while `parse` refuses it.
fn ask<R: BufRead, W: Write, T>(
    input: &mut R,
    output: &mut W,
    question: &str,
    parse: impl Fn(&str) -> std::result::Result<T, String>,
) -> Result<T> {
    let write_err = |e| Error::io("writing the prompt", e);
    let mut line = Vec::new();
    loop {
        output.write_all(question.as_bytes()).map_err(write_err)?;
        output.flush().map_err(write_err)?;
        let reason = match read_answer(input, &mut line)
            .map_err(|e| Error::io("reading the prompt's answer", e))?
        {
            Answer::End => {
                // Finish the prompt's line so the error starts on its own.
                let _ = output.write_all(b"\n");
                return Err(Error::PromptEof);
            }
            Answer::TooLong => format!("The answer is longer than {MAX_ANSWER} bytes."),
            // Bytes, not `read_line`: a line that is not UTF-8 is only
            // one more invalid answer.
            Answer::Line => match std::str::from_utf8(&line) {
                Ok(text) => match parse(text.trim()) {
                    Ok(value) => return Ok(value),
                    Err(reason) => reason,
                },
                Err(_) => "The answer is not UTF-8 text.".to_string(),
            },
        };
        writeln!(output, "Invalid input. {reason}").map_err(write_err)?;
    }
}

/// What [`read_answer`] found.
enum Answer {
    /// A line (without its end) is in the buffer.
    Line,
    /// A line longer than [`MAX_ANSWER`], skipped to its end.
    TooLong,
    /// The input ended.
    End,
}

/// Reads one line into `line`, keeping at most [`MAX_ANSWER`] bytes.
fn read_answer<R: BufRead>(input: &mut R, line: &mut Vec<u8>) -> std::io::Result<Answer> {
    line.clear();
    let limit = MAX_ANSWER as u64 + 1;
    if std::io::Read::take(&mut *input, limit).read_until(b'\n', line)? == 0 {
        return Ok(Answer::End);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
        return Ok(Answer::Line);
    }
    if line.len() <= MAX_ANSWER {
        // The input ended without a newline: still an answer.
        return Ok(Answer::Line);
    }
    // Too long: skip to the end of the line, storing none of it.
    loop {
        let buf = match input.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(Answer::TooLong);
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(at) => {
                input.consume(at + 1);
                return Ok(Answer::TooLong);
            }
            None => {
                let n = buf.len();
                input.consume(n);
            }
        }
    }
}

/// Up to 40 characters of what was typed, to echo it.
fn echo(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

/// A number of servers, 1 to [`MAX_PROMPT_SERVERS`].
fn parse_count(text: &str) -> std::result::Result<usize, String> {
    text.parse::<usize>()
        .ok()
        .filter(|n| (1..=MAX_PROMPT_SERVERS).contains(n))
        .ok_or_else(|| {
            format!(
                "'{}' is not a number from 1 to {MAX_PROMPT_SERVERS}.",
                echo(text)
            )
        })
}

/// A port, 1 to 65535.
fn port_answer(text: &str) -> std::result::Result<u16, String> {
    parse_port(text)
        .ok_or_else(|| format!("'{}' is not a port: a number from 1 to 65535.", echo(text)))
}

/// An address is valid when it is a plain host name or IP literal (brackets
/// allowed around IPv6) that resolves.
fn valid_host(text: &str) -> std::result::Result<String, String> {
    let with_port = text
        .rsplit_once(':')
        .filter(|(host, port)| {
            !host.is_empty()
                && port.parse::<u16>().is_ok()
                && (!host.contains(':') || host.starts_with('['))
        })
        .is_some();
    if with_port {
        // `127.0.0.1:8001`, `[::1]:8001`, `localhost:8001`.
        return Err(format!(
            "'{}' has a port: type the address alone, the port is asked next.",
            echo(text)
        ));
    }
    let host = plain_host(text)
        .ok_or_else(|| format!("'{}' is not a host name or an IP address.", echo(text)))?;
    if host.chars().all(|c| c.is_ascii_digit() || c == '.')
        && host.parse::<std::net::Ipv4Addr>().is_err()
    {
        // `3` would resolve to 0.0.0.3: a slip, not an address.
        return Err(format!(
            "'{}' is not an IPv4 address (four numbers, e.g. 127.0.0.1).",
            echo(host)
        ));
    }
    // Port 1 is a placeholder: only the host part is being resolved.
    let resolves = (host, 1).to_socket_addrs().map(|mut a| a.next().is_some());
    if resolves.unwrap_or(false) {
        Ok(host.to_string())
    } else {
        Err(format!("'{}' does not resolve to an address.", echo(host)))
    }
}

/// The host in `text` if it can be one before it is resolved: 1 to 253
/// bytes with no white space, `/` or bracket, once the brackets around an
/// IPv6 literal are taken off.
fn plain_host(text: &str) -> Option<&str> {
    let host = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    let plain = !host.is_empty()
        && host.len() <= 253
        && !host.contains(char::is_whitespace)
        && !host.contains(['/', '[', ']']);
    plain.then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Cursor;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn run(input: &str) -> (Result<Vec<BackendSpec>>, String) {
        let mut out = Vec::new();
        let result = servers_entry(&mut Cursor::new(input.as_bytes()), &mut out);
        (result, String::from_utf8(out).unwrap())
    }

    #[test]
    fn asks_the_articles_questions() {
        let (result, out) = run("2\n127.0.0.1\n8001\nlocalhost\n8002\n");
        let servers = result.unwrap();
        assert_eq!(servers[0].name(), "127.0.0.1:8001");
        assert_eq!(servers[1].name(), "localhost:8002");
        assert_eq!(
            out,
            "Enter the number of servers (1 <= number_of_servers <= 10): \
             Enter the address of the 1 server: \
             Enter the port of the 1 server: \
             Enter the address of the 2 server: \
             Enter the port of the 2 server: "
        );
    }

    #[test]
    fn re_asks_on_every_kind_of_invalid_input() {
        let input = "abc\n0\n11\n-1\n\n1\n\
                     no such host.invalid\n\
                     nosuchhost.invalid\n\
                     256.1.1.1\n\
                     [::1]\n\
                     0\n65536\nhttp\n8001\n";
        let (result, out) = run(input);
        let servers = result.unwrap();
        assert_eq!(servers.len(), 1);
        assert_eq!(servers[0].host, "::1");
        assert_eq!(servers[0].port, 8001);
        assert_eq!(out.matches("Invalid input.").count(), 5 + 3 + 3);
        assert_eq!(
            out.matches("Enter the number of servers").count(),
            6,
            "{out}"
        );
    }

    #[test]
    fn end_of_input_is_an_error_not_a_loop() {
        for input in ["", "abc\n", "1\n", "1\n127.0.0.1\n"] {
            let (result, _) = run(input);
            assert!(matches!(result, Err(Error::PromptEof)), "{input:?}");
        }
    }

    /// A line that is not UTF-8 is one more invalid answer: the question is
    /// asked again, and the prompt goes on.
    #[test]
    fn invalid_utf8_is_an_invalid_answer() {
        let input = b"\xff\xfe\n1\n\xc3(\n127.0.0.1\n8\x80\n8001\n";
        let mut out = Vec::new();
        let result = servers_entry(&mut Cursor::new(&input[..]), &mut out);
        let out = String::from_utf8(out).unwrap();
        let servers = result.unwrap();
        assert_eq!(servers.len(), 1);
        assert_eq!(servers[0].name(), "127.0.0.1:8001");
        assert_eq!(out.matches("Invalid input.").count(), 3, "{out}");
        assert_eq!(out.matches("Enter the number of servers").count(), 2);
        assert_eq!(out.matches("Enter the address of the 1 server").count(), 2);
        assert_eq!(out.matches("Enter the port of the 1 server").count(), 2);
    }

    /// `out` with the reason after each `Invalid input.` taken off, to
    /// compare with [`transcript`].
    fn without_reasons(out: &str) -> String {
        out.split_inclusive('\n')
            .map(|line| match line.find("Invalid input.") {
                Some(at) => format!("{}Invalid input.\n", &line[..at]),
                None => line.to_string(),
            })
            .collect()
    }

    /// Each refusal keeps the article's `Invalid input.` first, then says
    /// why: the range of a number, that the port is asked next.
    #[test]
    fn invalid_answers_say_why() {
        let input = "11\nabc\n1\n127.0.0.1:8001\n[::1]:8001\n3\n127.0.0.1\n0\n70000\n8001\n";
        let (result, out) = run(input);
        assert_eq!(result.unwrap()[0].name(), "127.0.0.1:8001");
        let reasons: Vec<&str> = out
            .split("Invalid input.")
            .skip(1)
            .map(|r| r.split('\n').next().unwrap_or_default())
            .collect();
        assert_eq!(reasons.len(), 7, "{out}");
        for r in &reasons {
            assert!(r.starts_with(' ') && r.len() > 10, "no reason: {out}");
        }
        assert!(reasons[0].contains("from 1 to 10"), "{out}");
        assert!(reasons[1].contains("from 1 to 10"), "{out}");
        assert!(reasons[2].contains("the port is asked next"), "{out}");
        assert!(reasons[3].contains("the port is asked next"), "{out}");
        assert!(reasons[4].contains("not an IPv4 address"), "{out}");
        assert!(reasons[5].contains("from 1 to 65535"), "{out}");
        assert!(reasons[6].contains("from 1 to 65535"), "{out}");
    }

    /// A line longer than [`MAX_ANSWER`] is refused, its rest skipped,
    /// and the prompt goes on.
    #[test]
    fn a_line_too_long_is_refused_and_skipped() {
        use std::io::Read;
        let long = std::io::repeat(b'7').take(3 * MAX_ANSWER as u64);
        let rest = Cursor::new(b"\n1\nlocalhost\n8001\n".to_vec());
        let mut input = std::io::BufReader::new(long.chain(rest));
        let mut out = Vec::new();
        let servers = servers_entry(&mut input, &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(servers[0].name(), "localhost:8001");
        assert!(
            out.contains("Invalid input. The answer is longer than"),
            "{out}"
        );
        assert_eq!(out.matches("Invalid input.").count(), 1, "{out}");
    }

    /// What `ask` prints for `invalid` refused answers before it returns:
    /// the question once per answer read, `Invalid input.` after each refused
    /// one, and a newline when the input ended.
    fn transcript(question: &str, invalid: usize, ended: bool) -> String {
        let mut out = format!("{question}Invalid input.\n").repeat(invalid);
        out.push_str(question);
        if ended {
            out.push('\n');
        }
        out
    }

    /// Lines of random bytes, with some that look like answers.
    fn answer_lines() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(
            prop_oneof![
                prop::collection::vec(any::<u8>(), 0..30),
                "[ \t]{0,2}[0-9+-]{0,6}[ \t\r]{0,2}".prop_map(String::into_bytes),
            ],
            0..8,
        )
        .prop_map(|lines| lines.join(&b'\n'))
    }

    /// Typed around an answer.
    fn white_space() -> impl Strategy<Value = String> {
        "[ \t]{0,3}"
    }

    /// A host that resolves without a name server, as typed and as it
    /// comes back.
    fn literal_host() -> impl Strategy<Value = (String, String)> {
        prop_oneof![
            any::<Ipv4Addr>().prop_map(|a| (a.to_string(), a.to_string())),
            any::<Ipv6Addr>().prop_map(|a| (a.to_string(), a.to_string())),
            any::<Ipv6Addr>().prop_map(|a| (format!("[{a}]"), a.to_string())),
            Just(("localhost".to_string(), "localhost".to_string())),
        ]
    }

    proptest! {
        /// Any bytes as answers to the number of servers and to a port: no
        /// panic, no I/O error, a value in range or the end of input, and
        /// exactly the questions and `Invalid input.` lines expected.
        #[test]
        fn any_answers_are_values_or_end_of_input(input in answer_lines()) {
            let lines = input.split(|&b| b == b'\n').count();
            let question = "Q? ";
            let mut out = Vec::new();
            let count = ask(&mut Cursor::new(&input[..]), &mut out, question, parse_count);
            let out_count = without_reasons(&String::from_utf8(out).unwrap());
            let mut out = Vec::new();
            let port = ask(&mut Cursor::new(&input[..]), &mut out, question, port_answer);
            let out_port = without_reasons(&String::from_utf8(out).unwrap());
            for (ok, out) in [(count.as_ref().map(|n| (1..=10).contains(n)), out_count), (port.as_ref().map(|p| *p >= 1), out_port)] {
                let invalid = out.matches("Invalid input.").count();
                prop_assert!(invalid <= lines);
                match ok {
                    Ok(in_range) => {
                        prop_assert!(in_range);
                        prop_assert_eq!(out, transcript(question, invalid, false));
                    }
                    Err(Error::PromptEof) => prop_assert_eq!(out, transcript(question, invalid, true)),
                    Err(other) => prop_assert!(false, "{}", other),
                }
            }
        }

        /// Any text as an address: no panic, and what passes is plain.
        #[test]
        fn any_text_is_a_plain_host_or_not(text in any::<String>()) {
            if let Some(host) = plain_host(&text) {
                prop_assert!(!host.is_empty() && host.len() <= 253);
                prop_assert!(!host.contains(|c: char| c.is_whitespace() || "/[]".contains(c)));
            }
        }

        /// Valid answers typed with white space around them are taken at
        /// once and come back equal.
        #[test]
        fn valid_answers_with_white_space_come_back_equal(
            servers in prop::collection::vec((literal_host(), 1u16..=65535), 1..=MAX_PROMPT_SERVERS),
            pad in prop::collection::vec((white_space(), white_space(), any::<bool>()), 64),
        ) {
            let mut pad = pad.into_iter().cycle();
            let mut line = |answer: &str| {
                let (before, after, crlf) = pad.next().unwrap_or_default();
                let end = if crlf { "\r\n" } else { "\n" };
                format!("{before}{answer}{after}{end}")
            };
            let mut input = line(&servers.len().to_string());
            for ((typed, _), port) in &servers {
                input.push_str(&line(typed));
                input.push_str(&line(&port.to_string()));
            }
            let mut out = Vec::new();
            let got = servers_entry(&mut Cursor::new(input.as_bytes()), &mut out);
            let out = String::from_utf8(out).unwrap();
            let expected: Vec<BackendSpec> = servers
                .iter()
                .map(|((_, host), port)| BackendSpec { host: host.clone(), port: *port, weight: 1, send_proxy: None, check: Default::default(), max_connections: None, backup: false, ends: Default::default() })
                .collect();
            prop_assert_eq!(got.ok(), Some(expected));
            prop_assert!(!out.contains("Invalid input."), "{}", out);
        }
    }
}
