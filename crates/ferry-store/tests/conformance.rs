//! The store conformance suite on this workspace's stores: every case of
//! `ferry_testkit::conformance::store` against SQLite, PostgreSQL and MariaDB, and every case
//! that does not need SQL also against the in-memory store.
//!
//! Each test gets its own database (see `ferry_testkit::TestDb`), so tests run in parallel.
ferry_testkit::store_conformance!();
