//! The running configuration, through the real binary and its admin API:
//! `POST /reload?dry_run=1` says what a reload of the file on disk would
//! do and changes nothing, then the reload does just that;
//! `GET /config?format=file` saves the configuration with the API's
//! changes, which `check-config` accepts and which, started, runs the same
//! setup; `check-config --diff OLD NEW` between two files, deciding as
//! the reload does (turning TLS on needs a restart of `tls_certs` alone);
//! a refused reload is logged once.

mod child;
mod common;
mod tls_certs;

use child::{run, Rodizio, Scratch};
use common::TestBackend;
use serde_json::{json, Value};

/// A config file over `backends` with the admin API on port 0.
fn config_text(backends: &[String], extra: &str) -> String {
    format!(
        r#"{{"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "health_check": "off",
            "backends": {}{extra}}}"#,
        serde_json::to_string(backends).unwrap()
    )
}

/// The backends `GET /backends` lists: address and weight.
fn backends(r: &Rodizio) -> Vec<(String, u64)> {
    let (status, body) = r.call("GET", "/backends", "");
    assert_eq!(status, 200, "{body}");
    let list: Value = serde_json::from_str(&body).unwrap();
    let list = list
        .as_array()
        .cloned()
        .or_else(|| list["backends"].as_array().cloned());
    list.unwrap_or_else(|| panic!("{body}"))
        .iter()
        .map(|b| {
            let name = b["address"].as_str().or(b["name"].as_str()).unwrap();
            (name.to_string(), b["weight"].as_u64().unwrap())
        })
        .collect()
}

/// The dry run lists the changes (added, reweighted, drained; the settings
/// needing a restart) and applies none; the reload then makes them.
#[test]
fn a_dry_run_tells_and_changes_nothing() {
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let (na, nb) = (a.addr().to_string(), b.addr().to_string());
    let nc = "127.0.0.1:9"; // never connected to: health checks are off
    let dir = Scratch::new("dry-run");
    let path = dir.file(
        "rodizio.json",
        config_text(&[na.clone(), nb.clone()], "").as_bytes(),
    );
    let r = Rodizio::start(&path, &[]);
    let before = backends(&r);
    dir.file(
        "rodizio.json",
        config_text(
            &[format!("{nb},weight=3"), nc.to_string()],
            r#", "workers": 8, "algorithm": "weighted-round-robin""#,
        )
        .as_bytes(),
    );
    let (status, body) = r.call("POST", "/reload?dry_run=1", "");
    assert_eq!(status, 200, "{body}");
    let plan: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        plan,
        json!({
            "dry_run": true,
            "changes": [
                format!("+1 backend ({nc})"),
                format!("weight {nb} 1 → 3"),
                "algorithm round-robin → weighted-round-robin",
                format!("draining {na} (0 connections)"),
            ],
            "needs_restart": ["workers"],
        })
    );
    assert_eq!(backends(&r), before, "a dry run changed the backends");
    let (_, config) = r.call("GET", "/config", "");
    let config: Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["algorithm"], "round-robin");
    // The reload does what the dry run said, in the same words.
    let (status, body) = r.call("POST", "/reload", "");
    assert_eq!(status, 200, "{body}");
    let summary: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        summary["summary"],
        format!(
            "reload: +1 backend ({nc}), weight {nb} 1 → 3, \
             algorithm round-robin → weighted-round-robin, draining {na} (0 connections)"
        )
    );
    let weight_of = |name: &str| {
        backends(&r)
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|x| x.1)
    };
    assert_eq!(weight_of(&nb), Some(3));
}

/// A reload the admin API asked for and the file refused: a 422 with the
/// reason, and the reason logged once (by the reload, as for SIGHUP), the
/// outcome of one that worked likewise.
#[test]
fn a_reload_through_the_api_is_logged_once() {
    let a = TestBackend::echo();
    let dir = Scratch::new("reload-once");
    let path = dir.file(
        "rodizio.json",
        config_text(&[a.addr().to_string()], "").as_bytes(),
    );
    let r = Rodizio::start(&path, &[]);
    dir.file("rodizio.json", b"{\n  \"workers\": 0,\n");
    let (status, body) = r.call("POST", "/reload", "");
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("JSON syntax error"), "{body}");
    dir.file(
        "rodizio.json",
        config_text(&[a.addr().to_string()], r#", "idle_timeout": "9s""#).as_bytes(),
    );
    let (status, body) = r.call("POST", "/reload", "");
    assert_eq!(status, 200, "{body}");
    // A third reload, with no change: once its line is read, every line
    // of the two before it is too.
    let (status, body) = r.call("POST", "/reload", "");
    assert_eq!(status, 200, "{body}");
    common::until("the third reload's line", || {
        r.stderr.text().contains("reload: no change")
    });
    let log = r.stderr.text();
    assert_eq!(log.matches("JSON syntax error").count(), 1, "{log}");
    assert_eq!(log.matches("idle_timeout 10m → 9s").count(), 1, "{log}");
    assert_eq!(log.matches("admin: POST /reload").count(), 3, "{log}");
}

/// `GET /config?format=file` after API changes (a backend added, one
/// reweighted, one deleted): `check-config` accepts the file, and a second
/// rodizio started from it runs the same backends and settings.
#[test]
fn the_running_config_saved_as_a_file_runs_the_same() {
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let (na, nb) = (a.addr().to_string(), b.addr().to_string());
    let c = TestBackend::echo();
    let nc = c.addr().to_string();
    let dir = Scratch::new("saved");
    let extra =
        r#", "algorithm": "weighted-round-robin", "connect_timeout": "1500ms", "workers": 64"#;
    let path = dir.file(
        "rodizio.json",
        config_text(&[na.clone(), nb.clone()], extra).as_bytes(),
    );
    let r = Rodizio::start(&path, &[]);
    let add = json!({"address": nc, "weight": 2}).to_string();
    assert_eq!(r.call("POST", "/backends", &add).0, 201);
    assert_eq!(
        r.call("PUT", &format!("/backends/{nb}"), r#"{"weight": 3}"#)
            .0,
        200
    );
    let (status, body) = r.call("DELETE", &format!("/backends/{na}"), "");
    assert!(status == 200 || status == 202, "{status} {body}");
    let (status, saved) = r.call("GET", "/config?format=file", "");
    assert_eq!(status, 200, "{saved}");
    let file: Value = serde_json::from_str(&saved).unwrap();
    assert_eq!(
        file["backends"],
        json!([format!("{nb},weight=3"), format!("{nc},weight=2")]),
        "{saved}"
    );
    let saved_path = dir.file("saved.json", saved.as_bytes());
    let checked = run(&["check-config", saved_path.to_str().unwrap()]);
    assert_eq!(checked.code, Some(0), "{}", checked.stderr);
    // The second one's admin API on a port of its own; nothing else given.
    let again = Rodizio::start(&saved_path, &["--admin", "127.0.0.1:0"]);
    assert_eq!(backends(&again), [(nb.clone(), 3), (nc.clone(), 2)]);
    let shown = |r: &Rodizio| {
        let (_, text) = r.call("GET", "/config", "");
        let mut v: Value = serde_json::from_str(&text).unwrap();
        v.as_object_mut().unwrap().remove("admin_listen");
        v
    };
    // The deleted backend leaves the first one's list once its reaper
    // has seen it idle.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while backends(&r).iter().any(|(name, _)| *name == na) {
        assert!(std::time::Instant::now() < deadline, "{na} never left");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (first, second) = (shown(&r), shown(&again));
    assert_eq!(first["connect_timeout"], "1500ms", "{first}");
    assert_eq!(first, second);
}

/// `check-config --diff OLD NEW`: one change a line, then what needs a
/// restart; exit 0; the same file twice says "no change".
#[test]
fn check_config_diff_between_two_files() {
    let dir = Scratch::new("diff");
    let old = dir.file(
        "old.json",
        br#"{"backends": ["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"]}"#,
    );
    let new = dir.file(
        "new.json",
        br#"{"backends": ["127.0.0.1:8001,weight=3", "127.0.0.1:8003", "127.0.0.1:8004"],
             "backlog": 128, "idle_timeout": "1m"}"#,
    );
    let (old, new) = (old.to_str().unwrap(), new.to_str().unwrap());
    let out = run(&["check-config", "--diff", old, new]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        out.stdout,
        "+1 backend (127.0.0.1:8004)\n\
         weight 127.0.0.1:8001 1 → 3\n\
         idle_timeout 10m → 1m\n\
         draining 127.0.0.1:8002 (0 connections)\n\
         needs a restart: backlog\n"
    );
    let same = run(&["check-config", "--diff", old, old]);
    assert_eq!((same.code, same.stdout.as_str()), (Some(0), "no change\n"));
}

/// Turning `tls_certs` on by reload needs a restart and names
/// `tls_certs` alone (not `backend_tls`, which did not change), in the
/// dry run, in the reload's own log and in `check-config --diff`, which
/// decide in one place.
#[test]
fn turning_tls_on_by_reload_names_tls_certs_alone_and_the_diff_agrees() {
    let backend = TestBackend::echo();
    let backends = [backend.addr().to_string()];
    let certs = tls_certs::Certs::new();
    let pair = certs.issue("site", &["localhost"], 1);
    let dir = Scratch::new("tls-switch");
    let old_text = config_text(&backends, "");
    let new_text = config_text(&backends, &format!(r#", "tls_certs": [{}]"#, pair.json()));
    let old = dir.file("old.json", old_text.as_bytes());
    let path = dir.file("rodizio.json", old_text.as_bytes());
    let r = Rodizio::start(&path, &[]);
    let new = dir.file("rodizio.json", new_text.as_bytes());
    let (status, body) = r.call("POST", "/reload?dry_run=1", "");
    assert_eq!(status, 200, "{body}");
    let plan: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(plan["needs_restart"], json!(["tls_certs"]), "{body}");
    assert_eq!(plan["changes"], json!([]), "{body}");
    let (status, body) = r.call("POST", "/reload", "");
    assert_eq!(status, 200, "{body}");
    let said = || r.stderr.text().contains("needs a restart to change");
    assert!(common::wait_for(std::time::Duration::from_secs(10), said));
    let log = r.stderr.text();
    assert!(log.contains("reload: tls_certs needs a restart"), "{log}");
    assert!(!log.contains("backend_tls"), "{log}");
    let out = run(&[
        "check-config",
        "--diff",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "needs a restart: tls_certs\n");
}
