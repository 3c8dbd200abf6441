//! The interactive entry of backends, asked exactly as the article's C does.
//!
//! [`servers_entry`] is generic over its input and output, so the binary
//! passes standard input and output while tests pass a `Cursor` and a
//! `Vec<u8>` and check every byte that was printed.
//!
//! The questions and the `Invalid input.` answer are the C's, word for word.
//! Each answer is one line, read as bytes. Anything invalid (a line that is
//! not UTF-8, not a number, out of range, an address that does not resolve, a
//! port outside 1..65535) prints `Invalid input.` and asks the same question
//! again; white space around an answer is ignored. End of input returns
//! [`Error::PromptEof`] instead of asking forever. It runs on the main
//! thread before the balancer starts, so nothing here is shared.
//!
//! # Corresponds to the C article
//!
//! `servers_entry()`. The C reads with `scanf("%d")` and `scanf("%s")`,
//! checks only the number of servers, and loops forever on a non-number
//! (`scanf` leaves it unread, so the same token fails again and again) or
//! at end of input. It stores the address in a 20-byte buffer with no length
//! limit (`scanf("%s")` overflows it with a long name) and never checks the
//! port. Here each answer is read as a line of bytes and validated.

use std::io::{BufRead, Write};
use std::net::ToSocketAddrs;

use crate::backend::{parse_port, BackendSpec};
use crate::config::MAX_PROMPT_SERVERS;
use crate::error::{Error, Result};

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
            parse_port,
        )?;
        servers.push(BackendSpec {
            host,
            port,
            weight: 1,
            send_proxy: None,
        });
    }
    Ok(servers)
}

/// Prints `question`, reads one line, and returns it converted by `parse`;
/// prints `Invalid input.` and asks again while `parse` says `None`.
fn ask<R: BufRead, W: Write, T>(
    input: &mut R,
    output: &mut W,
    question: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<T> {
    let write_err = |e| Error::io("writing the prompt", e);
    let mut line = Vec::new();
    loop {
        output.write_all(question.as_bytes()).map_err(write_err)?;
        output.flush().map_err(write_err)?;
        line.clear();
        // Bytes, not `read_line`: a line that is not UTF-8 would make
        // `read_line` fail, and the prompt end, on what is only one more
        // invalid answer.
        let read = input
            .read_until(b'\n', &mut line)
            .map_err(|e| Error::io("reading the prompt's answer", e))?;
        if read == 0 {
            // Finish the prompt's line so the error starts on its own.
            let _ = output.write_all(b"\n");
            return Err(Error::PromptEof);
        }
        let answer = std::str::from_utf8(&line).ok().map(str::trim);
        if let Some(value) = answer.and_then(&parse) {
            return Ok(value);
        }
        output.write_all(b"Invalid input.\n").map_err(write_err)?;
    }
}

/// A number of servers, 1 to [`MAX_PROMPT_SERVERS`].
fn parse_count(text: &str) -> Option<usize> {
    text.parse::<usize>()
        .ok()
        .filter(|n| (1..=MAX_PROMPT_SERVERS).contains(n))
}

/// An address is valid when it is a plain host name or IP literal (brackets
/// allowed around IPv6) that resolves.
fn valid_host(text: &str) -> Option<String> {
    let host = plain_host(text)?;
    if host.chars().all(|c| c.is_ascii_digit() || c == '.')
        && host.parse::<std::net::Ipv4Addr>().is_err()
    {
        // `3` would resolve to 0.0.0.3: a slip, not an address.
        return None;
    }
    // Port 1 is a placeholder: only the host part is being resolved.
    let resolves = (host, 1).to_socket_addrs().map(|mut a| a.next().is_some());
    resolves.unwrap_or(false).then(|| host.to_string())
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
        assert_eq!(out.matches("Invalid input.\n").count(), 5 + 3 + 3);
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
        assert_eq!(out.matches("Invalid input.\n").count(), 3, "{out}");
        assert_eq!(out.matches("Enter the number of servers").count(), 2);
        assert_eq!(out.matches("Enter the address of the 1 server").count(), 2);
        assert_eq!(out.matches("Enter the port of the 1 server").count(), 2);
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
            let out_count = String::from_utf8(out).unwrap();
            let mut out = Vec::new();
            let port = ask(&mut Cursor::new(&input[..]), &mut out, question, parse_port);
            let out_port = String::from_utf8(out).unwrap();
            for (ok, out) in [(count.as_ref().map(|n| (1..=10).contains(n)), out_count), (port.as_ref().map(|p| *p >= 1), out_port)] {
                let invalid = out.matches("Invalid input.\n").count();
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
                .map(|((_, host), port)| BackendSpec { host: host.clone(), port: *port, weight: 1, send_proxy: None })
                .collect();
            prop_assert_eq!(got.ok(), Some(expected));
            prop_assert!(!out.contains("Invalid input."), "{}", out);
        }
    }
}
