//! Durations and sizes as people write them (`500ms`, `3s`, `64k`), parsed
//! and printed the same way for flags, the config file and log lines.
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
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (examples: 500ms, 3s, 10m)"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "'{text}': unknown unit '{unit}' (use ms, s, m or h)"
            ))
        }
    };
    if !seconds.is_finite() || seconds > 1e9 {
        return Err(format!("'{text}' is too long"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
