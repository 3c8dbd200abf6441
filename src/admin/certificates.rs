//! The stats page's table of the certificates a service serves (TLS
//! termination): each one's first name, its file, and the days left until
//! its `notAfter`, marked when under [`NEAR_DAYS`] or past. The dates are
//! the ones `rodizio_tls_certificate_expiry_seconds` exports in
//! `/metrics` ([`crate::tls_term::Expiry`], read when the certificates are
//! loaded); plain HTML, no JavaScript.
//!
//! # Threads
//!
//! Built on the admin handler thread serving the page, from the
//! terminator it loads (one `ArcSwap` load); shares nothing.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::fmt::Write;

use crate::tls_term::Terminator;

/// Under this many days left, a certificate is marked (and was warned of
/// when loaded).
pub use crate::tls_term::NEAR_DAYS;

/// One served certificate, as the page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertRow {
    /// Its first DNS name, or `-` when it has none.
    pub name: String,
    /// Its file, as configured.
    pub file: String,
    /// Seconds until its `notAfter` (negative once past); `None` when the
    /// date could not be read.
    pub seconds_left: Option<i64>,
}

/// The certificates `terminator` serves, `now` seconds since the epoch.
pub fn rows(terminator: &Terminator, now: i64) -> Vec<CertRow> {
    terminator
        .expiry()
        .iter()
        .map(|e| CertRow {
            name: e.name.clone().unwrap_or_else(|| "-".into()),
            file: e.file.clone(),
            seconds_left: e.not_after.map(|t| t - now),
        })
        .collect()
}

/// A row's class and its words: `("near", "12 days")`,
/// `("expired", "expired 3 days ago")`.
fn state(seconds_left: Option<i64>) -> (&'static str, String) {
    const DAY: i64 = 86_400;
    match seconds_left {
        None => ("unknown", "date not read".into()),
        Some(s) if s <= 0 => {
            let ago = (-s) / DAY;
            ("expired", format!("expired {}", days_ago(ago)))
        }
        Some(s) => {
            let days = s / DAY;
            let class = if days < NEAR_DAYS { "near" } else { "ok" };
            let unit = if days == 1 { "day" } else { "days" };
            (class, format!("{days} {unit}"))
        }
    }
}

/// `today`, `1 day ago`, `3 days ago`.
fn days_ago(days: i64) -> String {
    match days {
        0 => "today".into(),
        1 => "1 day ago".into(),
        n => format!("{n} days ago"),
    }
}

/// Appends the table (nothing when `certs` is empty); `id` its HTML id,
/// `esc` the page's escaping.
pub fn table(html: &mut String, certs: &[CertRow], id: &str, esc: fn(&str) -> String) {
    if certs.is_empty() {
        return;
    }
    let _ = writeln!(
        html,
        "<table id=\"{id}\" class=\"certificates\"><tr><th>certificate</th><th>file</th>\
<th>expires in</th></tr>"
    );
    for c in certs {
        let (class, words) = state(c.seconds_left);
        let mark = match class {
            "near" => " <strong>renew soon</strong>",
            "expired" => " <strong>EXPIRED</strong>",
            _ => "",
        };
        let _ = writeln!(
            html,
            "<tr class=\"cert {class}\"><td class=\"name\">{}</td><td class=\"name\">{}</td>\
<td class=\"days\">{}{mark}</td></tr>",
            esc(&c.name),
            esc(&c.file),
            esc(&words),
        );
    }
    html.push_str("</table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, seconds_left: Option<i64>) -> CertRow {
        CertRow {
            name: name.into(),
            file: format!("/etc/ssl/{name}.pem"),
            seconds_left,
        }
    }

    fn plain(text: &str) -> String {
        text.to_string()
    }

    #[test]
    fn days_left_and_marks() {
        let day = 86_400;
        let mut html = String::new();
        table(
            &mut html,
            &[
                row("fine.test", Some(30 * day - 5)),
                row("near.test", Some(12 * day + 10)),
                row("old.test", Some(-3 * day - 10)),
                row("odd.test", None),
            ],
            "certificates",
            plain,
        );
        assert!(html.contains("<td class=\"name\">fine.test</td>"), "{html}");
        assert!(html.contains("<td class=\"days\">29 days</td>"), "{html}");
        assert!(
            html.contains("<tr class=\"cert near\"><td class=\"name\">near.test</td>"),
            "{html}"
        );
        assert!(
            html.contains("12 days <strong>renew soon</strong>"),
            "{html}"
        );
        assert!(
            html.contains("expired 3 days ago <strong>EXPIRED</strong>"),
            "{html}"
        );
        assert!(html.contains("date not read"), "{html}");
        assert_eq!(html.matches("<strong>").count(), 2, "{html}");
        assert!(!html.contains("<script"), "{html}");
    }

    #[test]
    fn no_certificates_no_table() {
        let mut html = String::new();
        table(&mut html, &[], "certificates", plain);
        assert!(html.is_empty());
        assert_eq!(state(Some(86_400)).1, "1 day");
        assert_eq!(state(Some(0)).1, "expired today");
    }
}
