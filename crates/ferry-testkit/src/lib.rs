//! Test support for ferry, in one crate: what the workspace's tests, `ferry lab` and loadgen
//! share, and what no production relay needs.
//!
//! * [`TestDb`]: a fresh, isolated database per test on every backend (a SQLite file in a
//!   temporary directory, a PostgreSQL schema, a MariaDB database), dropped by
//!   [`TestDb::cleanup`]; [`AnyDb`] adds the in-memory store for tests that need no SQL.
//! * [`backend_tests!`]: the one per-backend test macro (modules `sqlite`, `postgres`, `mysql`,
//!   optionally `memory`, or `row::…`/`cursor::…` per dispatch mode).
//! * [`wait_until`]: tests wait on conditions, never on fixed sleeps.
//! * [`EmbeddedKafka`]: librdkafka's mock cluster on its own thread; [`kafka`]: topics and
//!   watermarks of an external broker through its admin API.
//! * [`Verifier`]: a Kafka consumer that reads a topic back and checks duplicates and
//!   per-aggregate order ([`OrderCheck`]), with an optional per-message hook;
//!   [`read_records`] reads a topic's messages back.
//! * [`RelayTask`]: an in-process relay on a task of its own, stopped through its token;
//!   [`RelayProcess`]: a `ferry relay` child process (free metrics port, log file, signals).
//! * [`memory::MemoryStore`]: the in-memory store (not durable) that benches measure the engine
//!   with and tests use where no SQL is needed; the reference model of the claim protocol.
//! * [`conformance`]: the store and cursor conformance suites as exported exercises, one
//!   `pub async fn` per case ([`store_conformance!`] / [`cursor_conformance!`] instantiate them).
//!
//! Library crates take this crate only as a `[dev-dependency]` (their integration tests use
//! it); the binaries `ferry` (for `ferry lab`) and `loadgen` depend on it normally, for the
//! embedded cluster, the verifier and isolated databases. It depends on `ferry-core` and
//! `ferry-store`, never on the relay, so no crate's tests see two copies of a type.
//!
//! Server backends are skipped (with a printed reason) when `FERRY_TEST_POSTGRES_URL` /
//! `FERRY_TEST_MYSQL_URL` are unset, unless `FERRY_REQUIRE_DBS=1` (CI), where a missing URL
//! fails the test.
#![warn(missing_docs, unreachable_pub)]

pub mod conformance;
mod db;
pub mod embedded;
pub mod kafka;
mod macros;
pub mod memory;
pub mod process;
mod task;
pub mod verify;
mod wait;

pub use db::{
    create_namespace, env_url, mysql_url_with_db, AnyDb, Cleanup, OpenTx, TempDir, TestDb,
};
pub use embedded::{EmbeddedKafka, EmbeddedKafkaError};
pub use ferry_core::DispatchMode;
pub use ferry_store::Backend;
pub use process::{RelayProcess, SpawnError, Stdout};
pub use task::{Joined, RelayTask};
pub use verify::{
    read_records, Hook, OrderCheck, Received, Record, Verifier, VerifyError, VerifyReport,
    COMMIT_TS_HEADER,
};
pub use wait::{poll_until, wait_until, wait_until_every};

/// `sql` with its `?` placeholders written as PostgreSQL's `$1, $2, …` when `postgres`: one
/// statement text for every backend.
pub fn placeholder(sql: &str, postgres: bool) -> std::borrow::Cow<'_, str> {
    if !postgres {
        return sql.into();
    }
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for ch in sql.chars() {
        if ch == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(ch);
        }
    }
    out.into()
}

/// An unfenced claim over every slot of up to `limit` events, leased for `lease`.
pub fn claim_all(limit: usize, lease: std::time::Duration) -> ferry_core::ClaimRequest {
    ferry_core::ClaimRequest::new((0..ferry_core::SLOT_COUNT).collect(), limit, lease)
}

/// A retry outcome for `token`: due again after `delay`, with `error` as its `last_error`.
pub fn retry_item(
    token: &ferry_core::ClaimToken,
    delay: std::time::Duration,
    error: &str,
) -> ferry_core::RetryItem {
    ferry_core::RetryItem {
        token: token.clone(),
        delay,
        error: error.into(),
    }
}

/// A purge of every SENT row (no age limit, no consumer filter), `batch` rows per delete
/// transaction; set other fields with struct update syntax.
pub fn purge_all(batch: usize) -> ferry_core::PurgeRequest<'static> {
    ferry_core::PurgeRequest {
        older_than: std::time::Duration::ZERO,
        batch,
        consumer: None,
        dry_run: false,
        vacuum: false,
    }
}

/// `n` claimed events for sending straight to a sink (no store): aggregates `order-{i}` for `i`
/// in `first..first + n`, each at version 1, keyed by its aggregate, with `payload`.
pub fn claimed_events(
    topic: &str,
    first: usize,
    n: usize,
    payload: &str,
) -> Vec<ferry_core::ClaimedEvent> {
    (first..first + n)
        .map(|i| {
            let agg = format!("order-{i}");
            ferry_core::ClaimedEvent {
                token: ferry_core::ClaimToken {
                    seq: i as i64 + 1,
                    event_id: format!("01890a5d-ac96-774b-bcce-{i:012x}"),
                    claim_id: "01890a5d-ac96-774b-bcce-00000000ffff".into(),
                    claim_version: 1,
                },
                shard_slot: ferry_core::slot_for(&agg),
                key: agg.clone(),
                aggregate_id: agg,
                aggregate_version: 1,
                topic: topic.into(),
                event_type: "OrderCreated".into(),
                headers: "{}".into(),
                payload: payload.into(),
                attempts: 0,
                created_at: 0,
            }
        })
        .collect()
}

/// A test intent of aggregate `agg`, version `v`, on `topic`: its id is `e-{agg}-{v}` (so a test
/// can name it) and its payload `{"agg":…,"v":…}` (so a reader can tell what it got).
pub fn intent(topic: &str, agg: &str, v: i64) -> ferry_core::NewEvent {
    ferry_core::NewEvent::new(
        agg,
        v,
        topic,
        "OrderChanged",
        format!(r#"{{"agg":"{agg}","v":{v}}}"#),
    )
    .with_id(format!("e-{agg}-{v}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn placeholders_are_numbered_for_postgres() {
        let sql = "UPDATE t SET a = ? WHERE b = ?";
        assert_eq!(super::placeholder(sql, false), sql);
        assert_eq!(
            super::placeholder(sql, true),
            "UPDATE t SET a = $1 WHERE b = $2"
        );
    }
}
