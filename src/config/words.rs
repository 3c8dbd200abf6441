//! The config file's messages in the operator's words: serde's names of
//! Rust types (`expected u32`) turned into "a whole number from 0 to
//! 4294967295", echoes of huge values cut short, invisible characters
//! named; serde's JSON errors as one line with the key and its place.
//! Also used for the admin API's JSON bodies, which serde reads too.
//!
//! Pure functions, called on whatever thread words an error.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C reads no file.

use std::path::Path;

use crate::error::Error;

/// A character as a message shows it: `'x'`, or `U+FEFF` for one that
/// cannot be seen (a control character, a byte order mark, a space).
pub(crate) fn shown(c: char) -> String {
    if c.is_control() || c.is_whitespace() || c == '\u{feff}' || c == '\u{200b}' {
        format!("U+{:04X}", u32::from(c))
    } else {
        format!("'{c}'")
    }
}

/// Longest message kept whole: a value or a key can be megabytes long,
/// and serde echoes it.
pub(crate) const MAX_MESSAGE: usize = 200;

/// `message`, cut after [`MAX_MESSAGE`] characters with a note of how
/// much was left out.
pub(crate) fn clip(message: &str) -> String {
    let count = message.chars().count();
    if count <= MAX_MESSAGE {
        return message.to_string();
    }
    let kept: String = message.chars().take(MAX_MESSAGE - 40).collect();
    format!("{kept}... ({} more characters)", count - (MAX_MESSAGE - 40))
}

/// serde's words for numbers made the operator's: `expected u32` becomes
/// `expected a whole number from 0 to 4294967295`, and "integer `-1`" and
/// "floating point `1e300`" the number alone. For the config file and the
/// admin API's JSON bodies alike.
pub fn in_words(message: &str) -> String {
    let mut text = message.to_string();
    for kind in ["integer", "floating point"] {
        text = text.replace(&format!("{kind} `"), "`");
    }
    const TYPES: [(&str, &str); 8] = [
        ("u8", " from 0 to 255"),
        ("u16", " from 0 to 65535"),
        ("u32", " from 0 to 4294967295"),
        ("u64", " from 0 to 18446744073709551615"),
        ("usize", " from 0 to 18446744073709551615"),
        ("i8", ""),
        ("i32", ""),
        ("i64", ""),
    ];
    for (ty, range) in TYPES {
        for end in [" ", ",", ")", ""] {
            let rust = format!("expected {ty}{end}");
            if end.is_empty() && !text.ends_with(&rust) {
                continue;
            }
            text = text.replace(&rust, &format!("expected a whole number{range}{end}"));
        }
    }
    for ty in ["f32", "f64"] {
        text = text.replace(&format!("expected {ty}"), "expected a number");
    }
    text
}

/// Turns serde's error into one line with the line, column and key.
pub(super) fn json_error(path: &Path, text: &str, at: &str, inner: serde_json::Error) -> Error {
    let (line, column) = (inner.line(), inner.column());
    let full = inner.to_string();
    let suffix = format!(" at line {line} column {column}");
    let bare = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
    let message = match inner.classify() {
        serde_json::error::Category::Syntax if bare == "recursion limit exceeded" => {
            "JSON nested too deeply (at most 128 levels of [ and {)".to_string()
        }
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            format!("JSON syntax error: {bare}")
        }
        serde_json::error::Category::Io => format!("cannot be read: {bare}"),
        serde_json::error::Category::Data => match bare.strip_prefix("unknown field ") {
            Some(rest) => unknown_key(at, rest),
            None if bare.starts_with("duplicate field ") => {
                let key = bare.split('`').nth(1).unwrap_or_default();
                format!("`{key}` is written twice: keep one")
            }
            None if at == "." || at.is_empty() => bare,
            None => format!("`{at}`: {bare}"),
        },
    };
    let position = if line == 0 {
        // Errors raised outside the parser (none today) carry no place.
        key_position(text, at)
    } else {
        Some((line, column))
    };
    Error::ConfigFile {
        path: path.to_path_buf(),
        position,
        message: clip(&in_words(&message)),
    }
}

/// `unknown key `x` (did you mean `y`?)` from serde's "`x`, expected one
/// of `a`, `b`" (`rest`), where `at` is the path serde was at.
pub(super) fn unknown_key(at: &str, rest: &str) -> String {
    // Between backquotes: the unknown key first, then the known ones.
    let quoted: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
    let Some((key, known)) = quoted.split_first() else {
        return format!("unknown key {rest}");
    };
    let full = if at == "." || at.is_empty() || at == *key {
        key.to_string()
    } else if at.ends_with(&format!(".{key}")) {
        at.to_string()
    } else {
        format!("{at}.{key}")
    };
    match closest(key, known) {
        Some(near) => format!("unknown key `{full}` (did you mean `{near}`?)"),
        None => format!("unknown key `{full}`"),
    }
}

/// The known key nearest to `key`, if it is near enough to be a typo: at
/// most two edits, or a quarter of the key's length for long keys.
pub(super) fn closest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    let length = key.chars().count();
    if length > 64 {
        // No known key is that long, and the distance costs its length
        // times theirs: a key of a megabyte would take seconds.
        return None;
    }
    let limit = 2.max(length / 4);
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance: insertions, deletions and substitutions.
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Where `"key":` is written in `text`, as (line, column) from 1.
pub(super) fn key_position(text: &str, key: &str) -> Option<(usize, usize)> {
    let quoted = format!("\"{key}\"");
    for (n, line) in text.lines().enumerate() {
        let mut from = 0;
        while let Some(found) = line[from..].find(&quoted) {
            let at = from + found;
            let after = line[at + quoted.len()..].trim_start();
            if after.starts_with(':') {
                return Some((n + 1, line[..at].chars().count() + 1));
            }
            from = at + quoted.len();
        }
    }
    None
}

/// Where the first `{` is, as (line, column) from 1; (1, 1) if none.
pub(super) fn object_start(text: &str) -> (usize, usize) {
    text.lines()
        .enumerate()
        .find_map(|(n, line)| line.find('{').map(|at| (n + 1, at + 1)))
        .unwrap_or((1, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_clipped_and_invisible_characters_named() {
        let long = "x".repeat(10_000);
        let clipped = clip(&long);
        assert!(clipped.len() < MAX_MESSAGE + 40, "{}", clipped.len());
        assert!(clipped.ends_with("(9840 more characters)"), "{clipped}");
        assert_eq!(clip("short"), "short");
        assert_eq!(shown('\u{feff}'), "U+FEFF");
        assert_eq!(shown('\0'), "U+0000");
        assert_eq!(shown('['), "'['");
    }
}
