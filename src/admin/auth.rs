//! Who may use the admin API: with `--admin-token-file FILE`, a request
//! must carry the file's token, as `Authorization: Bearer TOKEN` (scripts,
//! Prometheus's `authorization`) or as the password of HTTP Basic
//! authentication, with any user name (a browser opening the stats page
//! asks for it; Prometheus's `basic_auth`). Scheme names are compared
//! without regard to case (RFC 7235). Without a token file every request
//! is allowed (the API listens on loopback unless told otherwise).
//!
//! Run by the admin runtime's thread, once per request; no state but the
//! token, which a reload may replace ([`Token`]: the file read again).
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C has no admin API.

use std::sync::Arc;

use arc_swap::ArcSwapOption;

/// The admin API's token, shared by the API and the reload, which reads
/// `admin_token_file` again and puts the new token in place.
#[derive(Debug, Clone, Default)]
pub struct Token(Arc<ArcSwapOption<String>>);

impl Token {
    /// A token cell holding `token` (`None`: no check).
    pub fn new(token: Option<String>) -> Token {
        Token(Arc::new(ArcSwapOption::from(token.map(Arc::new))))
    }

    /// From the next request on, `token` is the one to carry.
    pub fn set(&self, token: String) {
        self.0.store(Some(Arc::new(token)));
    }
}

/// The token a request must carry, if any.
#[derive(Debug, Clone, Default)]
pub(crate) struct Auth {
    token: Token,
}

impl Auth {
    /// Every request must carry the token `token` holds (none: no check).
    pub(crate) fn new(token: Token) -> Auth {
        Auth { token }
    }

    /// Whether a request with this `Authorization` header value may pass.
    pub(crate) fn allows(&self, header: Option<&[u8]>) -> bool {
        let token = self.token.0.load();
        let Some(token) = token.as_deref() else {
            return true;
        };
        let given = header.and_then(credential).unwrap_or_default();
        same_bytes(&given, token.as_bytes())
    }

    /// The `WWW-Authenticate` challenges of a 401: Bearer for scripts,
    /// Basic so that a browser asks for the token.
    pub(crate) const CHALLENGES: [&'static str; 2] = ["Bearer", "Basic realm=\"rodizio admin\""];
}

/// The secret in an `Authorization` value: a bearer token, or a Basic
/// password. `None` for another scheme or a malformed value.
fn credential(value: &[u8]) -> Option<Vec<u8>> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, rest) = value.split_once([' ', '\t'])?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(rest.as_bytes().to_vec());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let pair = base64_decode(rest)?;
        let colon = pair.iter().position(|&b| b == b':')?;
        return Some(pair[colon + 1..].to_vec());
    }
    None
}

/// Standard base64 (RFC 4648), padding optional; `None` when malformed,
/// non-canonical trailing bits included.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::engine::{general_purpose, DecodePaddingMode, Engine as _, GeneralPurpose};
    const STANDARD_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        general_purpose::PAD.with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    STANDARD_ANY_PADDING.decode(text).ok()
}

/// Equal bytes, compared in a time that depends on the lengths only.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same_bytes(b"secret", b"secret"));
        assert!(!same_bytes(b"secret", b"secreT"));
        assert!(!same_bytes(b"secret", b"secret2"));
        assert!(!same_bytes(b"", b"x"));
    }

    #[test]
    fn bearer_in_any_case_and_basic_with_any_user() {
        let token = Token::new(Some("s3cret".into()));
        let auth = Auth::new(token.clone());
        for ok in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER   s3cret ",
            // "admin:s3cret" and ":s3cret"
            "Basic YWRtaW46czNjcmV0",
            "basic OnMzY3JldA==",
            "Basic OnMzY3JldA",
        ] {
            assert!(auth.allows(Some(ok.as_bytes())), "{ok}");
        }
        for no in [
            "",
            "s3cret",
            "Bearer",
            "Bearer s3cre",
            "Bearer s3cret2",
            "Token s3cret",
            // "admin:wrong", "s3cret" (no colon), garbage
            "Basic YWRtaW46d3Jvbmc=",
            "Basic czNjcmV0",
            "Basic !!!!",
            "Basic Y",
        ] {
            assert!(!auth.allows(Some(no.as_bytes())), "{no}");
        }
        assert!(!auth.allows(None));
        assert!(!auth.allows(Some(&[0xff, 0xfe, b' ', b'x'])));
        assert!(Auth::new(Token::new(None)).allows(None));
        // A reload's new token replaces the old one at once.
        token.set("n3w".into());
        assert!(auth.allows(Some(b"Bearer n3w")));
        assert!(!auth.allows(Some(b"Bearer s3cret")));
    }

    #[test]
    fn base64_round_trips() {
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("Zg==").unwrap(), b"f");
        assert_eq!(base64_decode("Zm8=").unwrap(), b"fo");
        assert_eq!(base64_decode("Zm9v").unwrap(), b"foo");
        assert_eq!(base64_decode("Zm9vYmFy").unwrap(), b"foobar");
        assert!(base64_decode("Z").is_none());
        assert!(base64_decode("Zm9v YmFy").is_none());
        // "Zg==" with its unused low bits set.
        assert!(base64_decode("Zh==").is_none());
    }
}
