//! `ferry status` warns about server settings that are harmful to ferry (docs/operations.md,
//! "Server settings"), with the warning exit status. What a test can change on its own
//! database or session is changed for real here: PostgreSQL's `autovacuum_enabled` on the
//! outbox, the outbox sequence's `CACHE` in cursor dispatch, and `track_counts` for one session.
//! The server-wide settings (`autovacuum`, `fsync`, `full_page_writes`, MariaDB's
//! `innodb_flush_log_at_trx_commit`) cannot be flipped on a shared server: these tests expect
//! whatever the server has (the rules and their wording are unit tests in
//! `crates/ferry-store/src/server_settings.rs`).
use std::collections::BTreeSet;
use std::process::Output;

use ferry_core::DispatchMode;
use ferry_store::Backend;
use ferry_testkit::TestDb;
use sqlx::Connection;

mod support;
use support::ferry;

fn text_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// `ferry status --json` on `url`: its exit code and the settings it warned about.
fn warned_settings(url: &str) -> (Option<i32>, BTreeSet<String>) {
    let o = ferry(&["status", "--database-url", url, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("status --json ({e}): {}", text_of(&o)));
    let settings = v["server_settings"]
        .as_array()
        .unwrap_or_else(|| panic!("no server_settings in {v}"))
        .iter()
        .map(|w| w["setting"].as_str().expect("setting").to_string())
        .collect();
    (o.status.code(), settings)
}

/// The server-wide PostgreSQL settings `ferry status` warns about that this server has off
/// (on this machine `autovacuum`; none on a server with the defaults).
async fn pg_server_wide_off(url: &str) -> BTreeSet<String> {
    let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
    let off: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM pg_settings WHERE setting = 'off' \
         AND name IN ('autovacuum', 'track_counts', 'fsync', 'full_page_writes')",
    )
    .fetch_all(&mut c)
    .await
    .expect("pg_settings");
    off.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_status_warns_about_the_outbox_reloption_and_a_cached_sequence() {
    let Some(db) = TestDb::open(Backend::Postgres).await else {
        return;
    };
    let global = pg_server_wide_off(&db.url).await;

    // a fresh outbox: nothing but what the server has server-wide (autovacuum here)
    let (code, warned) = warned_settings(&db.url);
    assert_eq!(warned, global);
    assert_eq!(code, Some(if global.is_empty() { 0 } else { 4 }));
    let o = ferry(&["status", "--database-url", &db.url]);
    let out = text_of(&o);
    if global.is_empty() {
        assert!(out.contains("status:              OK"), "{out}");
    } else {
        assert!(out.contains("status:              WARNING"), "{out}");
    }
    assert!(!out.contains("autovacuum_enabled"), "{out}");
    assert!(!out.contains("CACHE"), "{out}");

    // what an operator can do to one database: autovacuum off for the outbox, and a cached
    // sequence while the outbox is in cursor dispatch
    db.store
        .cursor()
        .expect("cursor dispatch")
        .set_dispatch_mode(DispatchMode::Cursor, "settings-test")
        .await
        .expect("cursor dispatch");
    db.exec("ALTER TABLE ferry_outbox SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    db.exec("ALTER TABLE ferry_outbox ALTER COLUMN seq SET CACHE 5")
        .await
        .unwrap();
    let seq = format!("{}.ferry_outbox_seq_seq", db.name());
    let o = ferry(&["status", "--database-url", &db.url]);
    let out = text_of(&o);
    assert_eq!(o.status.code(), Some(4), "{out}");
    assert!(out.contains("status:              WARNING"), "{out}");
    let line = |needle: &str| {
        out.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{out}"))
            .to_string()
    };
    let reloption = line("ferry_outbox has autovacuum_enabled = false");
    assert!(
        reloption.starts_with("  - ")
            && reloption.contains("ALTER TABLE ferry_outbox RESET (autovacuum_enabled)"),
        "{reloption}"
    );
    let cached = line(&format!("{seq} has CACHE 5 in cursor dispatch"));
    assert!(
        cached.starts_with("  - ")
            && cached.contains("lower seq")
            && cached.contains(&format!("ALTER SEQUENCE {seq} CACHE 1")),
        "{cached}"
    );
    let (code, warned) = warned_settings(&db.url);
    let mut expected = global.clone();
    expected.insert("ferry_outbox.autovacuum_enabled".into());
    expected.insert(format!("{seq}.cache"));
    assert_eq!((code, warned), (Some(4), expected));

    // a warning never lowers a critical backlog: the exit code is the higher level
    db.store
        .enqueue(&[ferry_testkit::intent("orders", "order-1", 1)])
        .await
        .unwrap();
    let o = ferry(&[
        "status",
        "--database-url",
        &db.url,
        "--oldest-warning",
        "0s",
        "--oldest-critical",
        "0s",
    ]);
    assert_eq!(o.status.code(), Some(5), "{}", text_of(&o));
    assert!(text_of(&o).contains("ferry_outbox has autovacuum_enabled = false"));

    // fixed as the warnings say: nothing left but the server-wide settings
    db.exec("ALTER TABLE ferry_outbox RESET (autovacuum_enabled)")
        .await
        .unwrap();
    db.exec(&format!("ALTER SEQUENCE {seq} CACHE 1"))
        .await
        .unwrap();
    let (_, warned) = warned_settings(&db.url);
    assert_eq!(warned, global);
    db.cleanup().await;
}

/// `track_counts` is a superuser setting PostgreSQL lets a session change: `ferry status`
/// connected with it off (as a role or database default would have it) warns about it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_status_warns_about_track_counts_off() {
    let Some(db) = TestDb::open(Backend::Postgres).await else {
        return;
    };
    let mut c = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    let superuser: bool =
        sqlx::query_scalar("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            .fetch_one(&mut c)
            .await
            .expect("rolsuper");
    if !superuser {
        println!("skipped: track_counts can be set per session by a superuser only");
        db.cleanup().await;
        return;
    }
    let global = pg_server_wide_off(&db.url).await;
    let url = format!("{}&options[track_counts]=off", db.url);
    let o = ferry(&["status", "--database-url", &url]);
    let out = text_of(&o);
    assert_eq!(o.status.code(), Some(4), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("  - track_counts = off: ")
                && l.contains("set track_counts = on")),
        "{out}"
    );
    let (_, warned) = warned_settings(&url);
    let mut expected = global;
    expected.insert("track_counts".into());
    assert_eq!(warned, expected);
    db.cleanup().await;
}

/// `innodb_flush_log_at_trx_commit` is global only: the warning follows the server's value
/// (1 on this machine, the default: no warning, exit 0 on a fresh outbox).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_status_follows_innodb_flush_log_at_trx_commit() {
    let Some(db) = TestDb::open(Backend::Mysql).await else {
        return;
    };
    let flush = db
        .scalar("SELECT CAST(@@GLOBAL.innodb_flush_log_at_trx_commit AS SIGNED)")
        .await
        .unwrap();
    let (code, warned) = warned_settings(&db.url);
    if flush == 1 || flush == 3 {
        assert_eq!((code, warned), (Some(0), BTreeSet::new()));
    } else {
        let expected = BTreeSet::from(["innodb_flush_log_at_trx_commit".to_string()]);
        assert_eq!((code, warned), (Some(4), expected));
        let o = ferry(&["status", "--database-url", &db.url]);
        assert!(
            text_of(&o).contains(&format!("  - innodb_flush_log_at_trx_commit = {flush}: ")),
            "{}",
            text_of(&o)
        );
    }
    db.cleanup().await;
}

/// SQLite has no server settings to report: a fresh outbox is OK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_status_reports_no_server_settings() {
    let db = TestDb::sqlite().await;
    let (code, warned) = warned_settings(&db.url);
    assert_eq!((code, warned), (Some(0), BTreeSet::new()));
}
