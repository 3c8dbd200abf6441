//! `docs/testing.md` covers every test file: each `tests/*.rs`, each
//! module of the hostile suite (`tests/hostile/*.rs`) and each shared
//! helper (`tests/*/mod.rs`, `tests/common/*.rs`) is named there as
//! `` `tests/PATH` ``, and every such name there is a file that exists. A
//! test file added, renamed or removed without its line fails here.

use std::collections::BTreeSet;
use std::path::Path;

/// The test files under `tests/`, as `tests/...` paths: the `.rs` files
/// at the top, in `tests/hostile/`, and in every helper directory.
fn test_files(root: &Path) -> BTreeSet<String> {
    let mut files = BTreeSet::new();
    let mut dirs = vec![root.join("tests")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(root).unwrap();
                files.insert(relative.to_string_lossy().into_owned());
            }
        }
    }
    files
}

/// The `` `tests/...rs` `` names in `text` (patterns such as `*.rs` aside).
fn named(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.starts_with("tests/") && s.ends_with(".rs") && !s.contains('*'))
        .map(str::to_string)
        .collect()
}

#[test]
fn docs_testing_names_every_test_file_and_no_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/testing.md")).unwrap();
    let files = test_files(root);
    assert!(files.contains("tests/testing_doc.rs"), "{files:?}");
    let named = named(&doc);
    let missing: Vec<&String> = files.difference(&named).collect();
    assert!(
        missing.is_empty(),
        "test files docs/testing.md does not name (as `tests/PATH`): {missing:?}"
    );
    let stale: Vec<&String> = named.difference(&files).collect();
    assert!(
        stale.is_empty(),
        "docs/testing.md names files that do not exist: {stale:?}"
    );
}
