//! A certificate's `notAfter`, read by a small DER walk to the validity
//! field (RFC 5280, 4.1): no X.509 library is pulled in for one date.
//!
//! # Threads
//!
//! Pure functions, called when certificates are loaded.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

/// One DER element: its tag and contents, and what follows it.
fn element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let mut len = 0usize;
        for &b in &rest[..n] {
            len = (len << 8) | usize::from(b);
        }
        rest = &rest[n..];
        len
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// The `notAfter` of a DER certificate, in seconds since the Unix epoch.
pub(super) fn not_after(der: &[u8]) -> Option<i64> {
    let (SEQUENCE, cert, _) = element(der)? else {
        return None;
    };
    let (SEQUENCE, mut tbs, _) = element(cert)? else {
        return None;
    };
    // [0] version, when present.
    if tbs.first() == Some(&0xa0) {
        tbs = element(tbs)?.2;
    }
    // serialNumber, signature, issuer.
    for _ in 0..3 {
        tbs = element(tbs)?.2;
    }
    let (SEQUENCE, validity, _) = element(tbs)? else {
        return None;
    };
    let (_, _, rest) = element(validity)?; // notBefore
    let (tag, time, _) = element(rest)?;
    parse_time(tag, std::str::from_utf8(time).ok()?)
}

/// `YYMMDDHHMMSSZ` (UTCTime, 1950..2049) or `YYYYMMDDHHMMSSZ`
/// (GeneralizedTime) in seconds since the epoch.
fn parse_time(tag: u8, text: &str) -> Option<i64> {
    let digits = text.strip_suffix('Z')?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (year, rest) = match (tag, digits.len()) {
        (UTC_TIME, 12) => {
            let yy: i64 = digits[..2].parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &digits[2..])
        }
        (GENERALIZED_TIME, 14) => (digits[..4].parse().ok()?, &digits[4..]),
        _ => return None,
    };
    let field = |i: usize| rest[i..i + 2].parse::<i64>().ok();
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

/// Days since 1970-01-01 of a date of the proleptic Gregorian calendar
/// (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_in_both_notations() {
        assert_eq!(parse_time(UTC_TIME, "700101000000Z"), Some(0));
        assert_eq!(parse_time(UTC_TIME, "491231235959Z"), Some(2_524_607_999));
        assert_eq!(
            parse_time(GENERALIZED_TIME, "20380119031408Z"),
            Some(2_147_483_648)
        );
        assert_eq!(parse_time(UTC_TIME, "70010100000Z"), None);
        assert_eq!(parse_time(UTC_TIME, "701301000000Z"), None);
        assert_eq!(parse_time(GENERALIZED_TIME, "700101000000Z"), None);
    }

    proptest::proptest! {
        /// Any bytes, and a certificate-shaped sequence with lying lengths
        /// inside, give a date or None: no panic, no read past the end.
        #[test]
        fn any_bytes_give_a_date_or_none(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = not_after(&bytes);
            let mut wrapped = vec![SEQUENCE, 0x82, 0xff, 0xff, SEQUENCE, 0x84, 0x7f, 0xff, 0xff, 0xff];
            wrapped.extend_from_slice(&bytes);
            proptest::prop_assert_eq!(not_after(&wrapped), None);
        }

        /// Any text after either time tag: a time or None.
        #[test]
        fn any_time_text_gives_a_time_or_none(text in ".{0,20}") {
            let _ = parse_time(UTC_TIME, &text);
            let _ = parse_time(GENERALIZED_TIME, &text);
        }
    }

    #[test]
    fn garbage_and_truncated_der_give_none() {
        assert_eq!(not_after(&[]), None);
        assert_eq!(not_after(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(not_after(&[0x30, 0x03, 0x30, 0x01]), None);
        assert_eq!(not_after(&[0x02, 0x01, 0x00]), None);
    }
}
