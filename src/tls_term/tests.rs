use super::*;
use std::io::Write;

#[test]
fn a_pair_is_cert_comma_key() {
    let pair: CertPair = "a.pem,a.key".parse().unwrap();
    assert_eq!(pair.cert, PathBuf::from("a.pem"));
    assert_eq!(pair.key, PathBuf::from("a.key"));
    assert_eq!(pair.to_string(), "a.pem,a.key");
    for bad in ["a.pem", ",a.key", "a.pem,", ""] {
        let err = bad.parse::<CertPair>().unwrap_err();
        assert!(err.starts_with("expected CERT,KEY"), "{err}");
    }
}

#[test]
fn the_file_lists_pairs_as_objects() {
    let list: CertList =
        serde_json::from_str(r#"[{"cert": "a.pem", "key": "a.key"}, {"cert": "b", "key": "c"}]"#)
            .unwrap();
    assert_eq!(list.0.len(), 2);
    // Written back as the file takes it, and read back the same.
    let written = list.to_string();
    assert_eq!(
        written,
        r#"[{"cert": "a.pem", "key": "a.key"}, {"cert": "b", "key": "c"}]"#
    );
    assert_eq!(serde_json::from_str::<CertList>(&written).unwrap(), list);
    assert_eq!(CertList::default().to_string(), "off");
    assert!(serde_json::from_str::<CertList>(r#"[{"cert": "a.pem"}]"#).is_err());
    assert_eq!(
        serde_json::from_str::<CertList>(r#""off""#).unwrap(),
        CertList::default()
    );
    assert!(serde_json::from_str::<CertList>(r#""a.pem""#).is_err());
    assert!(serde_json::from_str::<CertList>(r#"[{"cert": "a", "key": "b", "x": 1}]"#).is_err());
}

#[test]
fn off_by_default_and_no_terminator_without_certificates() {
    let s = TlsSettings::default();
    assert!(!s.on());
    assert_eq!(s.handshake_timeout, DEFAULT_HANDSHAKE_TIMEOUT);
    assert!(Terminator::load(&s).unwrap().is_none());
}

/// A bad file fails in one line naming it, without a Rust type's name.
#[test]
fn unreadable_and_non_pem_files_are_named() {
    let dir = std::env::temp_dir().join(format!("rodizio-tls-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("junk.pem");
    std::fs::File::create(&junk)
        .unwrap()
        .write_all(b"hello, not a certificate\n")
        .unwrap();
    let cases = [
        (dir.join("missing.pem"), junk.clone(), "cannot read"),
        (junk.clone(), junk.clone(), "holds no PEM certificate"),
    ];
    for (cert, key, want) in cases {
        let settings = TlsSettings {
            certs: CertList(vec![CertPair { cert, key }]),
            ..TlsSettings::default()
        };
        let err = Terminator::load(&settings).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
        assert!(!err.contains('\n') && !err.contains("Error"), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
