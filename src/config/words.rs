//! The config file's messages in the operator's words: serde's names of
//! Rust types (`expected u32`) turned into "a whole number from 0 to
//! 4294967295", echoes of huge values cut short, invisible characters
//! named. Also used for the admin API's JSON bodies, which serde reads too.
//!
//! Pure functions, called on whatever thread words an error.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C reads no file.

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
