//! Producers in other languages: the SQL and Python examples of docs/schema.md ("Producing from
//! any language", files in `docs/examples/`) commit intents with one plain INSERT each, leaving
//! the shard slot, key and event id to the database; a relay (the backend's default dispatch)
//! delivers them to Kafka, and a consumer checks that every intent arrived, in version order.
//!
//! Needs `sqlite3` / `psql` / `mysql` and `python3` with psycopg 3 / PyMySQL; without them the tests are
//! skipped with a printed reason, and `FERRY_REQUIRE_PRODUCERS=1` (set by `.ci/run`) turns the
//! skip into a failure.
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use ferry_relay::{KafkaConfig, KafkaSink, Relay, RelayConfig};
use ferry_store::Backend;
use ferry_testkit::embedded::EmbeddedKafka;
use ferry_testkit::{RelayTask, TestDb};

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/examples")
        .join(name)
}

/// Whether the SQL client and the Python driver for `backend` are here (else the reason).
fn tools(backend: Backend) -> Result<(), String> {
    let (cli, module) = match backend {
        Backend::Postgres => ("psql", "psycopg"),
        Backend::Mysql => ("mysql", "pymysql"),
        Backend::Sqlite => ("sqlite3", "sqlite3"),
    };
    let ok = |c: &mut Command| c.output().map(|o| o.status.success()).unwrap_or(false);
    if !ok(Command::new(cli).arg("--version")) {
        return Err(format!("{cli} not found"));
    }
    if !ok(Command::new("python3").args(["-c", &format!("import {module}")])) {
        return Err(format!("python3 cannot import {module} (set PYTHONPATH)"));
    }
    Ok(())
}

fn run(what: &str, c: &mut Command) {
    let o = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        o.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

async fn foreign_producers_arrive_in_order(backend: Backend) {
    if let Err(why) = tools(backend) {
        assert!(
            std::env::var("FERRY_REQUIRE_PRODUCERS").as_deref() != Ok("1"),
            "FERRY_REQUIRE_PRODUCERS=1 but {why}"
        );
        println!("skipped: foreign producers: {why}");
        return;
    }
    let Some(db) = TestDb::open(backend).await else {
        return;
    };
    // the SQL example (one aggregate, 3 versions; SQLite's 2; and one binary payload), then the
    // Python one (2 × 5, and one binary payload)
    let expected = match backend {
        Backend::Sqlite => 14,
        _ => 15,
    };
    match backend {
        Backend::Sqlite => {
            let path = db.url.trim_start_matches("sqlite://").to_string();
            let file = std::fs::File::open(example("produce_sqlite.sql")).unwrap();
            run(
                "sqlite3 < produce_sqlite.sql",
                Command::new("sqlite3").arg(&path).stdin(file),
            );
            run(
                "python3 producer_sqlite.py",
                Command::new("python3")
                    .arg(example("producer_sqlite.py"))
                    .env("DATABASE_PATH", &path),
            );
        }
        Backend::Postgres => {
            let schema = format!("-c search_path={}", db.name());
            run(
                "psql produce_postgres.sql",
                Command::new("psql")
                    .args([db.admin_url(), "-q", "-v", "ON_ERROR_STOP=1", "-f"])
                    .arg(example("produce_postgres.sql"))
                    .env("PGOPTIONS", &schema),
            );
            run(
                "python3 producer_postgres.py",
                Command::new("python3")
                    .arg(example("producer_postgres.py"))
                    .env("DATABASE_URL", db.admin_url())
                    .env("PGOPTIONS", &schema),
            );
        }
        _ => {
            let u = url_parts(&db.url);
            let file = std::fs::File::open(example("produce_mysql.sql")).unwrap();
            run(
                "mysql < produce_mysql.sql",
                Command::new("mysql")
                    .args(["-h", &u.0, "-P", &u.1, "-u", &u.2, &u.3])
                    .stdin(file),
            );
            run(
                "python3 producer_mysql.py",
                Command::new("python3")
                    .arg(example("producer_mysql.py"))
                    .env("DATABASE_URL", &db.url),
            );
        }
    }
    let kafka = EmbeddedKafka::with_topic(1, "orders", 4).expect("mock Kafka cluster");
    // none of the examples gives a key: each record's Kafka key must be its aggregate id (on
    // PostgreSQL the row stores none, migration 16), which keeps an aggregate on one partition
    let wrong_keys = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = wrong_keys.clone();
    let hook: ferry_testkit::verify::Hook = Box::new(move |m| {
        let agg = m.headers.iter().find(|(k, _)| *k == "ferry-aggregate-id");
        let agg = agg.and_then(|(_, v)| *v);
        if agg.is_none() || m.key != agg {
            let key = m.key.map(String::from_utf8_lossy);
            seen.lock()
                .unwrap()
                .push(format!("key {key:?} at offset {}", m.offset));
        }
    });
    let verifier = ferry_testkit::verify::Verifier::start_with_hook(
        kafka.bootstrap_servers(),
        "orders",
        4,
        &[],
        Some(hook),
    )
    .expect("verifier");
    let sink = KafkaSink::new(KafkaConfig {
        brokers: kafka.bootstrap_servers().to_string(),
        ordered: true,
        ..Default::default()
    })
    .unwrap();
    let cfg = RelayConfig {
        dispatch: Some(ferry_relay::preferred_dispatch(db.store.backend())),
        heartbeat: Duration::from_millis(200),
        poll_idle: Duration::from_millis(50),
        ..Default::default()
    };
    let relay = Relay::new(db.store.clone(), Arc::new(sink), cfg).unwrap();
    let relay = RelayTask::spawn(|cancel| relay.run(cancel));
    let r = verifier
        .wait_until(Duration::from_secs(60), |r| r.delivered >= expected)
        .await;
    assert_eq!(r.delivered, expected, "{r:?}");
    assert_eq!(r.ordering_violations, 0, "{r:?}");
    assert_eq!(r.foreign, 0, "every record carries ferry's headers: {r:?}");
    assert_eq!(
        *wrong_keys.lock().unwrap(),
        Vec::<String>::new(),
        "keys other than the aggregate id"
    );
    relay.stop().await;
    db.cleanup().await;
}

/// (host, port, user, database) of a `mysql://user@host:port/db` URL.
fn url_parts(url: &str) -> (String, String, String, String) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let (auth, rest) = rest.split_once('@').unwrap_or(("root", rest));
    let (hostport, db) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, port) = hostport.split_once(':').unwrap_or((hostport, "3306"));
    let user = auth.split(':').next().unwrap_or("root");
    let db = db.split('?').next().unwrap_or(db);
    (host.into(), port.into(), user.into(), db.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_sql_and_python_producers() {
    foreign_producers_arrive_in_order(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_sql_and_python_producers() {
    foreign_producers_arrive_in_order(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_sql_and_python_producers() {
    foreign_producers_arrive_in_order(Backend::Mysql).await;
}
