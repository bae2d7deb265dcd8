//! The run's database: an isolated namespace per run with the business tables
//! ([`ferry_testkit::workload::tx`]), and the store-side checks and costs.
//!
//! Isolation (ferry-testkit's): PostgreSQL gets a fresh schema (selected with `search_path` in
//! the URL, so child `ferry relay` processes see the same tables), MySQL a fresh database,
//! SQLite a fresh file in a temporary directory. They are dropped after the run unless
//! `--keep-db`. An explicit SQLite file is emptied first, but only if it holds loadgen's own
//! table (or nothing).
mod checks;
mod costs;
mod database;

pub use costs::{PgCosts, SqliteWrites, TableStats};
pub use database::{new_histogram, Database, PoolHandle, PURGE, RELAY};
