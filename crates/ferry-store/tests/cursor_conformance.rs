//! The cursor-dispatch conformance suite on this workspace's stores: every case of
//! `ferry_testkit::conformance::cursor` on SQLite, PostgreSQL and MariaDB.
//!
//! Each test gets its own database (see `ferry_testkit::TestDb`), so tests run in parallel.
ferry_testkit::cursor_conformance!();
