//! Test support for ferry, in one crate: what the workspace's tests, `ferry lab` and loadgen
//! share, and what no production relay needs.
//!
//! * [`TestDb`]: a fresh, isolated database per test on every backend (a SQLite file in a
//!   temporary directory, a PostgreSQL schema, a MariaDB database), dropped by
//!   [`TestDb::cleanup`]; [`AnyDb`] adds the in-memory store for tests that need no SQL.
//! * [`backend_tests!`]: the one per-backend test macro (modules `sqlite`, `postgres`, `mysql`,
//!   optionally `memory`, or `row::…`/`cursor::…` per dispatch mode).
//! * [`wait_until`]: tests wait on conditions, never on fixed sleeps.
//! * [`EmbeddedKafka`]: librdkafka's mock cluster on its own thread.
//! * [`Verifier`]: a Kafka consumer that reads a topic back and checks duplicates and
//!   per-aggregate order ([`OrderCheck`]), with an optional per-message hook.
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
mod macros;
pub mod verify;
mod wait;

pub use db::{
    create_namespace, env_url, mysql_url_with_db, AnyDb, Cleanup, OpenTx, TempDir, TestDb,
};
pub use embedded::{EmbeddedKafka, EmbeddedKafkaError};
pub use ferry_core::DispatchMode;
pub use ferry_store::Backend;
pub use verify::{
    Hook, OrderCheck, Received, Verifier, VerifyError, VerifyReport, COMMIT_TS_HEADER,
};
pub use wait::{poll_until, wait_until, wait_until_every};

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
