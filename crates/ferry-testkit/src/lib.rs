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
//! * [`workload`]: a simulated business whose producers contend for aggregates through their
//!   business rows' locks (the tables, the business transaction, producer tasks): what
//!   loadgen runs, and the relay's tests meet.
//! * [`docs`]: the command lines the documentation shows, checked against the program's flags.
//! * [`conformance`]: the store and cursor conformance suites as exported exercises, one
//!   `pub async fn` per case ([`store_conformance!`] / [`cursor_conformance!`] instantiate them).
//!
//! Library crates take this crate only as a `[dev-dependency]` (their integration tests use
//! it); the binaries `ferry` (for `ferry lab`) and `loadgen` depend on it normally, for the
//! embedded cluster, the verifier and isolated databases. It depends on `ferry-core` and
//! `ferry-store` (and `ferry-inbox`, whose pools the workload runs on), never on the relay, so
//! no crate's tests see two copies of a type.
//!
//! Server backends are skipped (with a printed reason) when `FERRY_TEST_POSTGRES_URL` /
//! `FERRY_TEST_MYSQL_URL` are unset, unless `FERRY_REQUIRE_DBS=1` (CI), where a missing URL
//! fails the test.
#![warn(missing_docs, unreachable_pub)]

pub mod conformance;
mod db;
pub mod docs;
pub mod embedded;
mod fixtures;
pub mod kafka;
mod macros;
pub mod memory;
pub mod process;
mod sql;
mod task;
pub mod verify;
mod wait;
pub mod workload;

pub use db::{
    create_namespace, env_url, memory_sqlite, mysql_url_with_db, AnyDb, Cleanup, OpenTx, TempDir,
    TestDb,
};
pub use embedded::{EmbeddedKafka, EmbeddedKafkaError};
pub use ferry_core::DispatchMode;
pub use ferry_store::Backend;
pub use fixtures::{
    claim_all, claimed_events, intent, plain_insert_binary, purge_all, retry_item, BINARY_PAYLOAD,
};
pub use process::{RelayProcess, SpawnError, Stdout};
pub use sql::placeholder;
pub use task::{Joined, RelayTask};
pub use verify::{
    read_records, Hook, OrderCheck, Received, Record, Verifier, VerifyError, VerifyReport,
    COMMIT_TS_HEADER,
};
pub use wait::{poll_until, wait_until, wait_until_every};
