//! Durations and sizes as people write them (`500ms`, `3s`, `64k`), parsed
//! and printed the same way for flags, the config file and log lines;
//! rates in bytes per second (`1m/s`); three-way settings (`off`, `on`,
//! `auto`: [`Switch`]); counts as log lines print them (`1 connection`,
//! `3 connections`); and text from outside as a line shows it ([`shown`]).
//!
//! A leaf: every other module may use it, it uses none of them. Pure
//! functions, called on whatever thread parses settings.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's sizes and times are `#define`d numbers.

use std::time::Duration;

/// Parses a duration: a number followed by `ms`, `s`, `m` or `h`
/// (`500ms`, `3s`, `10m`, `1h`); a bare number means seconds.
///
/// # Errors
///
/// A message saying what is wrong, for clap to print.
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let not_a_duration = || format!("'{text}' is not a duration (examples: 500ms, 3s, 10m)");
    let unit_nanos: u128 = match unit {
        "ms" => 1_000_000,
        "" | "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => {
            return Err(format!(
                "'{text}': unknown unit '{unit}' (use ms, s, m or h)"
            ))
        }
    };
    // Whole and fractional digits in integers, not through a float: a
    // float would turn 24321514718ms into 24321514.717999999 s.
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(not_a_duration());
    }
    let too_long = || format!("'{text}' is too long");
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_long())?
    };
    // Digits past the nanosecond change nothing; 18 fit a u128 product.
    let fraction = &fraction[..fraction.len().min(18)];
    let fraction_nanos = if fraction.is_empty() {
        0
    } else {
        let digits: u128 = fraction.parse().map_err(|_| not_a_duration())?;
        digits * unit_nanos / 10u128.pow(fraction.len() as u32)
    };
    let nanos = whole
        .checked_mul(unit_nanos)
        .and_then(|n| n.checked_add(fraction_nanos))
        .filter(|&n| n <= MAX_DURATION_NANOS)
        .ok_or_else(too_long)?;
    Ok(Duration::from_nanos(nanos as u64))
}

/// Longest duration accepted: 1e9 seconds (about 31 years).
const MAX_DURATION_NANOS: u128 = 1_000_000_000 * 1_000_000_000;

/// Parses a byte size: a number with an optional `k` or `m` suffix
/// (`65536`, `64k`, `1m`), powers of 1024.
///
/// # Errors
///
/// A message saying what is wrong, for clap to print.
pub fn parse_size(text: &str) -> std::result::Result<usize, String> {
    let lower = text.trim().to_ascii_lowercase();
    let lower = lower.strip_suffix('b').unwrap_or(&lower);
    let (number, factor) = if let Some(n) = lower.strip_suffix('k') {
        (n, 1024)
    } else if let Some(n) = lower.strip_suffix('m') {
        (n, 1024 * 1024)
    } else {
        (lower, 1)
    };
    number
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| format!("'{text}' is not a size (examples: 4096, 64k, 1m)"))
}

/// A number as short as it can be echoed in a message: `1.5`, `300`, but
/// `1e300` rather than its 301 digits.
pub fn short_number(v: f64) -> String {
    if v.is_finite() && v.abs() < 1e15 {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// Writes a duration the way [`parse_duration`] reads it, in the largest
/// unit that keeps it whole (`500ms`, `3s`, `10m`, `1h`; `1500ms`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if d.subsec_nanos() % 1_000_000 != 0 {
        return format!("{}ms", d.as_secs_f64() * 1000.0);
    }
    if ms == 0 {
        return "0s".into();
    }
    if ms % 3_600_000 == 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// Writes a size the way [`parse_size`] reads it (`64k`, `1m`, `4096`).
pub fn format_size(n: usize) -> String {
    if n != 0 && n % (1024 * 1024) == 0 {
        format!("{}m", n / (1024 * 1024))
    } else if n != 0 && n % 1024 == 0 && n >= 64 * 1024 {
        format!("{}k", n / 1024)
    } else {
        n.to_string()
    }
}

/// `n` and `noun`, plural (with an `s`) unless `n` is 1: `1 connection`,
/// `0 connections`, `3 failed checks`. The one way log lines print a count.
pub fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// The largest [`ByteRate`]: 1 TiB a second, more than any link.
pub const MAX_BYTE_RATE: u64 = 1 << 40;

/// Bytes per second, as people write them: a size (`1MB`, `100KB`, `64k`,
/// `4096`) with or without `/s`; `0` or `off` means no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRate(pub u64);

impl ByteRate {
    /// Parses a rate.
    ///
    /// # Errors
    ///
    /// A one-line message saying what is wrong, for clap to print.
    pub fn parse(text: &str) -> std::result::Result<ByteRate, String> {
        let trimmed = text.trim();
        if trimmed.eq_ignore_ascii_case("off") {
            return Ok(ByteRate(0));
        }
        let lower = trimmed.to_ascii_lowercase();
        let size = lower.strip_suffix("/s").unwrap_or(&lower);
        let n = parse_size(size).map_err(|_| {
            format!("'{text}' is not a rate in bytes per second (examples: 1MB, 100KB/s, 64k, off)")
        })? as u64;
        if n > MAX_BYTE_RATE {
            return Err(format!(
                "'{text}' is over the largest rate, {}/s",
                format_size(MAX_BYTE_RATE as usize)
            ));
        }
        Ok(ByteRate(n))
    }

    /// Bytes per second, `None` for no limit.
    pub fn per_second(self) -> Option<u64> {
        (self.0 > 0).then_some(self.0)
    }
}

impl std::str::FromStr for ByteRate {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<ByteRate, String> {
        ByteRate::parse(text)
    }
}

impl std::fmt::Display for ByteRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.per_second() {
            None => f.write_str("off"),
            Some(n) => write!(f, "{}/s", format_size(n as usize)),
        }
    }
}

/// Text from outside (a file's value, a peer's line, a name an operator
/// typed) as an error or log line shows it: each control character as the
/// JSON escape that writes it (`\u0000`, `\u001b`), so that no NUL, line
/// break or terminal escape sequence reaches the operator's screen or log
/// as it is; cut after `most` characters, with `...`.
pub fn shown(text: &str, most: usize) -> String {
    let mut out = String::with_capacity(text.len().min(most.saturating_mul(4)));
    for (i, c) in text.chars().enumerate() {
        if i == most {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// A setting with three values: `off`, `on` (the operator wants it), or
/// `auto` (the process decides where it can, or where it pays); `false`
/// and `true` are `off` and `on`, as files wrote the settings that were
/// switches first. `kernel_relay` and `yield_before_poll` are switches;
/// what `auto` means is each setting's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Switch {
    /// Never.
    #[default]
    Off,
    /// Always.
    On,
    /// Where the process can, or where it pays (each setting says which).
    Auto,
}

impl Switch {
    /// The word the file, the flag and `check-config` use.
    pub fn name(self) -> &'static str {
        match self {
            Switch::Off => "off",
            Switch::On => "on",
            Switch::Auto => "auto",
        }
    }
}

impl std::fmt::Display for Switch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Switch {
    type Err = String;

    /// `off`, `on`, `auto`; `false` and `true`.
    fn from_str(text: &str) -> std::result::Result<Switch, String> {
        match text.trim() {
            "off" | "false" => Ok(Switch::Off),
            "on" | "true" => Ok(Switch::On),
            "auto" => Ok(Switch::Auto),
            _ => Err(format!("'{text}': use off, on or auto")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_text_escapes_control_characters_and_is_cut() {
        assert_eq!(shown("plain words", 80), "plain words");
        assert_eq!(
            shown("'on\0' and \u{1b}[2J\r\n", 80),
            "'on\\u0000' and \\u001b[2J\\u000d\\u000a"
        );
        assert_eq!(shown("abcdef", 3), "abc...");
        assert_eq!(shown("abc", 3), "abc");
        // Escaped text is shown as it is: nothing is escaped twice.
        assert_eq!(shown("\\u001b", 80), "\\u001b");
        let dark = "\u{1b}".repeat(1 << 20);
        let cut = shown(&dark, 40);
        assert!(
            !cut.contains('\u{1b}') && cut.len() == 40 * 6 + 3,
            "{}",
            cut.len()
        );
    }

    #[test]
    fn counts_are_singular_for_one_only() {
        assert_eq!(count(1, "connection"), "1 connection");
        assert_eq!(count(0, "connection"), "0 connections");
        assert_eq!(count(3, "failed check"), "3 failed checks");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        for bad in ["", "s", "3x", "-1s", "abc"] {
            assert!(parse_duration(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn short_numbers() {
        assert_eq!(short_number(1.5), "1.5");
        assert_eq!(short_number(300.0), "300");
        assert_eq!(short_number(1e300), "1e300");
        assert_eq!(short_number(-2e20), "-2e20");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("64KiB".trim_end_matches("iB")), Ok(65536));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn formatted_values_parse_back() {
        for text in ["500ms", "3s", "10m", "1h", "1500ms", "90s"] {
            let d = parse_duration(text).unwrap();
            assert_eq!(format_duration(d), text);
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
        for n in [1, 4096, 65536, 128 * 1024, 1 << 20, 5000] {
            assert_eq!(parse_size(&format_size(n)), Ok(n), "{n}");
        }
        assert_eq!(format_size(65536), "64k");
        assert_eq!(format_size(4096), "4096");
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any whole number of milliseconds up to the longest accepted
            /// (1e9 s) is written and read back to the same duration.
            #[test]
            fn a_formatted_duration_parses_back(ms in 0u64..1_000_000_000_000) {
                let d = Duration::from_millis(ms);
                prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
            }

            /// Any size that fits is written and read back to itself.
            #[test]
            fn a_formatted_size_parses_back(n in any::<usize>()) {
                prop_assert_eq!(parse_size(&format_size(n)), Ok(n));
            }

            /// Random text never panics either parser.
            #[test]
            fn random_text_never_panics(text in ".{0,24}") {
                let _ = parse_duration(&text);
                let _ = parse_size(&text);
            }

            /// Text made of the parsers' own characters never panics either.
            #[test]
            fn number_like_text_never_panics(text in "[0-9.eE+-]{0,30}(ms|s|m|h|k|b|K|M)?") {
                let _ = parse_duration(&text);
                let _ = parse_size(&text);
            }
        }
    }

    #[test]
    fn byte_rates_parse_and_print_back() {
        for (text, n) in [
            ("1MB", 1 << 20),
            ("100KB/s", 102_400),
            ("64k", 65_536),
            ("4096", 4096),
            ("0", 0),
            ("off", 0),
            ("1m/S", 1 << 20),
        ] {
            let rate = ByteRate::parse(text).unwrap();
            assert_eq!(rate.0, n, "{text}");
            assert_eq!(ByteRate::parse(&rate.to_string()).unwrap(), rate, "{text}");
        }
        for bad in ["-1", "fast", "1.5m", "", "99999999999999999999", "2000000m"] {
            let err = ByteRate::parse(bad).unwrap_err();
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.contains(&format!("'{bad}'")), "{err}");
        }
    }
}
