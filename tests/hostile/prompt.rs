//! The interactive prompt: garbage, huge lines and an input that ends.
//!
//! rodizio runs as a child with no `--backend`, so it asks; standard input
//! is fed by a thread of the test and then closed, and the child must end
//! with exit 2 and one line saying why (or, fed valid answers, listen),
//! within a deadline and a capped address space; it is killed by its PID
//! otherwise.

use std::time::Duration;

use crate::child::{self, Ended};
use crate::common::limit_in_child;

/// Longest a run may take: even 100 MB of input goes by in seconds.
const WAIT: Duration = Duration::from_secs(30);
/// The child's address space: plenty for rodizio at the prompt, too
/// little to keep a 100 MB line.
const ADDRESS_SPACE: u64 = 128 << 20;

/// Runs `rodizio -l 127.0.0.1:0` with `input` on standard input, then
/// standard input closed.
fn run(input: Vec<u8>) -> Ended {
    let mut command = child::command(&["-l", "127.0.0.1:0", "--allow-root"]);
    command.env("RUST_LOG", "warn");
    limit_in_child(&mut command, libc::RLIMIT_AS, ADDRESS_SPACE);
    child::run_fed(&mut command, input, WAIT)
}

/// Checks that the input ran out: exit 2, and one line saying so.
fn ended_early(out: &Ended) {
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("standard input ended before the backends were entered"),
        "{}",
        out.stderr
    );
}

/// Every `Invalid input.` in `out` has a reason after it.
fn every_refusal_says_why(out: &str) {
    for line in out.lines() {
        if let Some(at) = line.find("Invalid input.") {
            let reason = &line[at + "Invalid input.".len()..];
            assert!(reason.trim().len() > 5, "no reason: {line:?}");
        }
    }
}

/// Garbage, NUL bytes and invalid UTF-8 at every question: refused with a
/// reason each time, and the end of input ends it.
#[test]
fn garbage_nul_bytes_and_invalid_utf8_are_refused() {
    let garbage: [&[u8]; 6] = [
        b"\0\0\0\n",
        b"\xff\xfe\xfd\n",
        b"\x1b[31mred\n",
        b"%s%n%x\n",
        b"\r\n",
        b"' OR 1=1 --\n",
    ];
    // At the first question, then at the address, then at the port.
    for prefix in [&b""[..], b"1\n", b"1\n127.0.0.1\n"] {
        let mut input = prefix.to_vec();
        for g in garbage {
            input.extend_from_slice(g);
        }
        let out = run(input);
        ended_early(&out);
        assert_eq!(
            out.stdout.matches("Invalid input.").count(),
            garbage.len(),
            "{}",
            out.stdout
        );
        every_refusal_says_why(&out.stdout);
    }
}

/// A 100 MB line with no newline: refused as too long, in bounded memory
/// (a child capped at 128 MiB of address space could not keep it).
#[test]
fn a_100_mb_line_is_refused_in_bounded_memory() {
    let out = run(vec![b'7'; 100 << 20]);
    ended_early(&out);
    assert!(
        out.stdout
            .contains("Invalid input. The answer is longer than"),
        "{}",
        &out.stdout[..out.stdout.len().min(300)]
    );
    // And a long line that ends is skipped: the prompt goes on.
    let mut input = vec![b'a'; 10 << 20];
    input.extend_from_slice(b"\n1\n127.0.0.1\n");
    let out = run(input);
    ended_early(&out);
    assert!(
        out.stdout.contains("Enter the port of the 1 server"),
        "{}",
        out.stdout
    );
}

/// Ctrl-D (the end of input) at each question, and input closed half-way
/// through a line: exit 2 with the reason.
#[test]
fn end_of_input_at_each_question_exits_2() {
    for input in [
        &b""[..],
        b"2",
        b"2\n",
        b"2\n127.0.",
        b"2\n127.0.0.1\n",
        b"2\n127.0.0.1\n8001\n",
        b"2\n127.0.0.1\n8001\nlocalhost\n",
    ] {
        let out = run(input.to_vec());
        ended_early(&out);
        assert!(
            !out.stdout.contains("Load balancer listening"),
            "{}",
            out.stdout
        );
    }
}

/// Numbers with signs, spaces inside and around, and far too big: each
/// refused with the range, or taken when it is one.
#[test]
fn signed_spaced_and_huge_numbers() {
    let refused = [
        "-1",
        "- 1",
        "1 0",
        "1_0",
        "0x1",
        "1e1",
        "99999999999999999999999999999999999999",
        "-99999999999999999999",
        "١",
    ];
    let mut input = String::new();
    for r in refused {
        input.push_str(r);
        input.push('\n');
    }
    let out = run(input.into_bytes());
    ended_early(&out);
    assert_eq!(
        out.stdout.matches("Invalid input.").count(),
        refused.len(),
        "{}",
        out.stdout
    );
    assert_eq!(
        out.stdout.matches("from 1 to 10").count(),
        refused.len(),
        "{}",
        out.stdout
    );
    for line in out.stdout.lines() {
        assert!(line.len() < 200, "{line}");
    }
    // Ports the same way, after a valid count and address.
    let mut input = String::from("  +1  \n 127.0.0.1 \n");
    for r in refused.iter().chain(&["0", "65536", "-8001"]) {
        input.push_str(r);
        input.push('\n');
    }
    let out = run(input.into_bytes());
    ended_early(&out);
    assert_eq!(
        out.stdout.matches("from 1 to 65535").count(),
        refused.len() + 3,
        "{}",
        out.stdout
    );
}
