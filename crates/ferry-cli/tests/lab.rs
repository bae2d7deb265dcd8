//! `ferry lab --case all --json` passes on SQLite, PostgreSQL and MariaDB.
use std::process::Command;

#[path = "../src/lab_cases.rs"]
mod lab_cases;

fn lab(url: Option<&str>, case: &str) -> (Option<i32>, serde_json::Value, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
    cmd.args(["lab", "--case", case, "--json"])
        .env("FERRY_LOG", "warn")
        .env_remove("FERRY_DATABASE_URL");
    if let Some(u) = url {
        cmd.args(["--database-url", u]);
    }
    let o = cmd.output().expect("run ferry lab");
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
    (o.status.code(), v, stderr)
}

#[track_caller]
fn assert_all_held(url: Option<&str>) {
    let (code, v, stderr) = lab(url, "all");
    assert_eq!(code, Some(0), "ferry lab failed: {v:#}\n{stderr}");
    assert_eq!(v["all_held"], true, "{v:#}");
    let cases: Vec<&str> = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["case"].as_str().unwrap())
        .collect();
    let expected = lab_cases::CASES.to_vec();
    assert_eq!(cases, expected);
    let case = |n: &str| {
        v["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["case"] == n)
            .unwrap()["facts"]
            .clone()
    };
    assert_eq!(case("send-before-mark")["deliveries_at_receiver"], 2);
    assert_eq!(case("send-before-mark")["effects_applied"], 1);
    assert_eq!(case("mark-before-send")["deliveries_at_receiver"], 0);
    assert_eq!(case("stale-claim")["a_update_rows"], 0);
    assert_eq!(case("stale-cursor")["a_advance"], "Fenced");
    assert_eq!(case("stale-cursor")["b_advance"], "Applied");
    assert_eq!(case("stale-cursor")["effects_applied"], 1);
    assert_eq!(case("two-sessions")["a_stale_update_rows"], 0);
    assert_eq!(case("kafka-duplicate")["effects_applied"], 1);
}

#[test]
fn lab_all_cases_hold_on_sqlite() {
    assert_all_held(None);
}

#[test]
fn lab_all_cases_hold_on_postgres() {
    let Some(url) = ferry_testkit::env_url(ferry_store::Backend::Postgres) else {
        return;
    };
    assert_all_held(Some(&url));
}

/// MariaDB: every case, the stale cursor behind the commit gate included.
#[test]
fn lab_all_cases_hold_on_mysql() {
    let Some(url) = ferry_testkit::env_url(ferry_store::Backend::Mysql) else {
        return;
    };
    assert_all_held(Some(&url));
}

#[test]
fn lab_rejects_unknown_case() {
    let (code, _, stderr) = lab(None, "everything");
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("--case") && stderr.contains("mark-before-send"),
        "{stderr}"
    );
}
