//! The interactive entry of backends, asked exactly as the article's C does.
//!
//! [`servers_entry`] is generic over its input and output, so the binary
//! passes standard input and output while tests pass a `Cursor` and a
//! `Vec<u8>` and check every byte that was printed.
//!
//! The questions and the `Invalid input.` answer are the C's, word for word.
//! Each answer is one line. Anything invalid (not a number, out of range, an
//! address that does not resolve, a port outside 1..65535) prints
//! `Invalid input.` and asks the same question again. End of input returns
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
//! port. Here each answer is read as a line and validated.

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
        |line| {
            line.parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_PROMPT_SERVERS).contains(n))
        },
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
    let mut line = String::new();
    loop {
        output.write_all(question.as_bytes()).map_err(write_err)?;
        output.flush().map_err(write_err)?;
        line.clear();
        let read = input
            .read_line(&mut line)
            .map_err(|e| Error::io("reading the prompt's answer", e))?;
        if read == 0 {
            // Finish the prompt's line so the error starts on its own.
            let _ = output.write_all(b"\n");
            return Err(Error::PromptEof);
        }
        if let Some(value) = parse(line.trim()) {
            return Ok(value);
        }
        output.write_all(b"Invalid input.\n").map_err(write_err)?;
    }
}

/// An address is valid when it is a plain host name or IP literal (brackets
/// allowed around IPv6) that resolves.
fn valid_host(text: &str) -> Option<String> {
    let host = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    let plain = !host.is_empty()
        && host.len() <= 253
        && !host.contains(char::is_whitespace)
        && !host.contains(['/', '[', ']']);
    if !plain {
        return None;
    }
    // Port 1 is a placeholder: only the host part is being resolved.
    let resolves = (host, 1).to_socket_addrs().map(|mut a| a.next().is_some());
    resolves.unwrap_or(false).then(|| host.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

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
}
