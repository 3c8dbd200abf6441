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
        serde_json::error::Category::Syntax => format!("JSON syntax error: {bare}"),
        serde_json::error::Category::Eof => {
            format!("JSON syntax error: the file ends too soon ({bare})")
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
        // serde counts columns from 1 but says 0 right after a line
        // break (the file ending there): the line's first column.
        Some((line, column.max(1)))
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
    Place::whole(text).key(key)
}

/// A part of the file's text where keys are looked for: the whole file
/// but the `services` array for the top level, one element of it for a
/// service, so that each finds its own `"backends"`, not the first one.
#[derive(Debug, Clone)]
pub(super) struct Place<'a> {
    text: &'a str,
    within: std::ops::Range<usize>,
    hidden: std::ops::Range<usize>,
}

impl<'a> Place<'a> {
    /// The whole of `text`.
    pub(super) fn whole(text: &'a str) -> Place<'a> {
        Place {
            text,
            within: 0..text.len(),
            hidden: 0..0,
        }
    }

    /// The top level: everything but the `services` array.
    pub(super) fn top(text: &'a str) -> Place<'a> {
        let hidden = array_items(text, "services").map_or(0..0, |(all, _)| all);
        Place {
            hidden,
            ..Place::whole(text)
        }
    }

    /// Each element of the `services` array (none if it is not found).
    pub(super) fn services(text: &'a str) -> Vec<Place<'a>> {
        let items = array_items(text, "services").map_or_else(Vec::new, |(_, items)| items);
        items
            .into_iter()
            .map(|within| Place {
                within,
                ..Place::whole(text)
            })
            .collect()
    }

    /// The byte offsets where `"word"` is followed by a colon, in order.
    fn keys(&self, word: &str) -> Vec<usize> {
        let quoted = format!("\"{word}\"");
        let part = &self.text[self.within.clone()];
        let start = self.within.start;
        part.match_indices(&quoted)
            .map(move |(at, q)| (start + at, start + at + q.len()))
            .filter(|(at, _)| !self.hidden.contains(at))
            .filter(|(_, end)| self.text[*end..].trim_start().starts_with(':'))
            .map(|(at, _)| at)
            .collect()
    }

    /// Where `"key":` is written, as (line, column) from 1.
    pub(super) fn key(&self, key: &str) -> Option<(usize, usize)> {
        self.keys(key).first().map(|&at| line_column(self.text, at))
    }

    /// Where `"name": "NAME"` is written, as (line, column) from 1.
    pub(super) fn name(&self, name: &str) -> Option<(usize, usize)> {
        let value = serde_json::to_string(name).ok()?;
        self.keys("name")
            .into_iter()
            .find(|&at| {
                let rest = self.text[at + "\"name\"".len()..].trim_start();
                rest.strip_prefix(':')
                    .is_some_and(|r| r.trim_start().starts_with(&value))
            })
            .map(|at| line_column(self.text, at))
    }
}

/// Byte offset `at` of `text` as (line, column) from 1.
fn line_column(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at];
    let line_start = before.rfind('\n').map_or(0, |n| n + 1);
    (
        before.matches('\n').count() + 1,
        before[line_start..].chars().count() + 1,
    )
}

/// The array under the key `key` (its first place): its range, brackets
/// included, and each element's, found by a scan that skips strings.
fn array_items(
    text: &str,
    key: &str,
) -> Option<(std::ops::Range<usize>, Vec<std::ops::Range<usize>>)> {
    let at = *Place::whole(text).keys(key).first()?;
    let after = at + key.len() + 2;
    let colon = after + text[after..].find(':')?;
    let open = colon + 1 + text[colon + 1..].find(|c: char| !c.is_whitespace())?;
    if !text[open..].starts_with('[') {
        return None;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let (mut items, mut item) = (Vec::new(), None);
    for (i, c) in text[open..].char_indices().map(|(i, c)| (open + i, c)) {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        if depth == 1 && item.is_none() && !c.is_whitespace() && c != ',' && c != ']' {
            item = Some(i);
        }
        match c {
            '"' => in_string = true,
            '[' | '{' => depth += 1,
            ']' | '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    items.extend(item.map(|s| s..i));
                    return Some((open..i + 1, items));
                }
                if depth == 1 {
                    items.extend(item.take().map(|s| s..i + 1));
                }
            }
            ',' if depth == 1 => items.extend(item.take().map(|s| s..i)),
            _ => {}
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
