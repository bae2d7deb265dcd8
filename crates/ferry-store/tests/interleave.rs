//! The interleaving suite on this workspace's stores: every case of
//! `ferry_testkit::conformance::interleave` on SQLite, PostgreSQL and MariaDB. Producer
//! transactions that contend for business rows run step by step in scripted and explored
//! orders; the outbox is then drained in cursor or row dispatch and every aggregate's versions
//! must come out in order.
//!
//! Each test gets its own database (see `ferry_testkit::TestDb`), so tests run in parallel.
ferry_testkit::interleave_conformance!();
