//! The run's database: an isolated namespace per run, the business transaction, and the
//! store-side checks and costs.
//!
//! The business: `loadgen_aggregates (aggregate_id PRIMARY KEY, ver)` holds one row per
//! aggregate (created up front with `ver` 0); `loadgen_orders` one row per order, i.e. per
//! version of an aggregate. A business transaction first takes each of its orders' versions from
//! the aggregate's row (`ver = ver + 1`, in the orders' order, which producers make random), so
//! it holds that row's lock until it ends, exactly as an application that updates an aggregate
//! and writes its event does; then it inserts the orders and their outbox intents.
//!
//! Isolation (ferry-testkit's): PostgreSQL gets a fresh schema (selected with `search_path` in
//! the URL, so child `ferry relay` processes see the same tables), MySQL a fresh database,
//! SQLite a fresh file in a temporary directory. They are dropped after the run unless
//! `--keep-db`. An explicit SQLite file is emptied first, but only if it holds loadgen's own
//! table (or nothing).
mod checks;
mod costs;
mod database;
mod orders;

pub use checks::VersionCheck;
pub use costs::{PgCosts, SqliteWrites, TableStats};
pub use database::{new_histogram, Database, PoolHandle, PURGE, RELAY};
pub use orders::{dialect, Rollback, TxError};
