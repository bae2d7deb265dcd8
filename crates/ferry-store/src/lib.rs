//! Outbox storage for ferry over sqlx: PostgreSQL, MariaDB (the `mysql` module; MySQL itself is
//! not supported, its migrations use MariaDB-only syntax: docs/schema.md §8) and SQLite. (The
//! in-memory store of tests and benches is `ferry_testkit::memory::MemoryStore`.)
//!
//! Each backend module offers
//! * `enqueue` / `enqueue_many`: insert publish intents inside **the caller's own sqlx
//!   transaction**, next to its business writes, so both commit or neither;
//! * a store type implementing [`ferry_core::OutboxStore`] (claim, lookup, fenced outcomes,
//!   operator actions, slot leases) and [`ferry_core::CursorStore`] (cursor dispatch);
//! * `migrate`: the embedded schema (`migrations/<backend>/`), applied under a lock.
//!
//! [`connect`] picks the backend from the URL scheme. The exact SQL of every operation and the
//! objects of each backend are in docs/schema.md; why it is sound is in docs/architecture.md.
//!
//! # Invariants
//!
//! The rules of `ferry_core` (its crate docs) hold for every store here; the shared
//! conformance suites `tests/conformance.rs` and `tests/cursor_conformance.rs` run each backend
//! through them. What this crate adds:
//!
//! * **An intent commits with the business row or not at all.** `enqueue_many` only inserts on
//!   the caller's connection; it never begins or commits. Tests:
//!   `rollback_leaves_neither_order_nor_intent`, `multi_row_enqueue_in_caller_transaction`.
//! * **The intent columns are immutable.** A trigger of the first migration of each backend
//!   rejects any `UPDATE` that changes an intent column (`event_id`, aggregate identity and
//!   version, `shard_slot`, topic, key, event type, headers, payload, `created_at`). Test:
//!   `intent_columns_are_immutable`.
//! * **A claim is one short transaction** that selects due, predecessor-free rows of the
//!   owner's *live* slot leases `FOR UPDATE SKIP LOCKED` (SQLite: under its single writer),
//!   sets the new `claim_version` / `claim_id` / `lease_until` and reads the tokens back before
//!   it commits. Tests: `concurrent_claimers_deliver_each_event_once`,
//!   `slot_leases_fence_claims`, `lease_expiry_and_takeover`.
//! * **Migrations apply once under a lock** (a transaction-scoped advisory lock on PostgreSQL,
//!   `GET_LOCK` on MariaDB, `BEGIN IMMEDIATE` on SQLite): a second concurrent migrate waits and
//!   then finds nothing to do. Tests: `concurrent_migrations_apply_once`,
//!   `fresh_concurrent_migrations`.
//! * **Retention never deletes an unfinished intent**: purge deletes only SENT rows older than
//!   its cut-off (in cursor dispatch, derived SENT). Tests: `purge_deletes_only_old_sent_rows`,
//!   `reconcile_and_purge_use_derived_states`.
//! * **Reconciliation puts every intent under the watermark in exactly one class.** Test:
//!   `reconcile_classifies_every_intent_once`.
//! * **No SQL is built from user text.** Every table, view, trigger and function name is a fixed
//!   constant and every value a bind parameter; the one user-supplied identifier, the business
//!   table and id column of `reconcile`, is checked by [`validate_identifier`] first.
//! * **Errors are classified the same on every backend** ([`error_kind`]: `Conflict` is
//!   retryable, `Schema` says "run `ferry migrate`"), and URLs in errors and logs go through
//!   [`redact_url`]. Tests: `redacts_passwords`, `scheme_errors_name_the_choices`.
#![deny(missing_docs)]
#![warn(unreachable_pub)]

use std::sync::Arc;

use ferry_core::{OutboxStore, StoreError, StoreErrorKind};

mod dialect;
mod enqueue;
mod error;
mod exceptions;
mod heads;
mod lookup;
pub mod migrate;
pub mod mysql;
mod operator;
mod options;
mod outcome;
mod pool;
pub mod postgres;
mod protocol;
mod request;
mod rows;
mod seq_read;
mod server_settings;
pub mod sqlite;
mod status_cache;
mod time;
mod url;

pub use dialect::numbered_placeholders;
pub use error::{error_kind, not_quarantined, owner_in_use};
pub use migrate::{Migration, MIGRATIONS_MYSQL, MIGRATIONS_POSTGRES, MIGRATIONS_SQLITE};
pub use operator::validate_identifier;
pub use options::ConnectOptions;
pub use pool::{open_pool, pool_options, PING_IDLE_AFTER};
pub use url::redact_url;

/// Which database a URL points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `postgres://` / `postgresql://`
    Postgres,
    /// `mysql://` / `mariadb://`
    Mysql,
    /// `sqlite:` / `sqlite://`
    Sqlite,
}

impl Backend {
    /// The backend of `url`, or a clear error naming the accepted schemes.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let scheme = url.split(':').next().unwrap_or("");
        scheme.parse().map_err(|_| {
            StoreError::new(
                StoreErrorKind::InvalidInput,
                format!(
                    "database URL {} has an unsupported scheme; use postgres://, mysql:// (MariaDB) or sqlite://",
                    redact_url(url)
                ),
            )
        })
    }

    /// `postgres`, `mysql` or `sqlite`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Mysql => "mysql",
            Self::Sqlite => "sqlite",
        }
    }
}

/// A backend by name: `postgres` (or `postgresql`), `mysql` (or `mariadb`), `sqlite`; case is
/// ignored.
impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" => Ok(Self::Postgres),
            "mysql" | "mariadb" => Ok(Self::Mysql),
            "sqlite" => Ok(Self::Sqlite),
            _ => Err(format!(
                "unknown database {s:?}; use postgres, mysql (MariaDB) or sqlite"
            )),
        }
    }
}

/// Opens the store named by `url` (scheme picks the backend) and, unless disabled, migrates it.
pub async fn connect(url: &str, opts: &ConnectOptions) -> Result<Arc<dyn OutboxStore>, StoreError> {
    Ok(match Backend::from_url(url)? {
        Backend::Postgres => Arc::new(postgres::PgStore::connect(url, opts).await?),
        Backend::Mysql => Arc::new(mysql::MyStore::connect(url, opts).await?),
        Backend::Sqlite => Arc::new(sqlite::SqliteStore::connect(url, opts).await?),
    })
}

/// Applies the embedded migrations to the database at `url` under the backend's lock.
/// Returns the versions applied by this call (empty when already up to date).
pub async fn migrate_url(url: &str) -> Result<Vec<i64>, StoreError> {
    let opts = ConnectOptions {
        migrate: false,
        max_connections: 2,
        ..Default::default()
    };
    match Backend::from_url(url)? {
        Backend::Postgres => {
            postgres::PgStore::connect(url, &opts)
                .await?
                .migrate()
                .await
        }
        Backend::Mysql => mysql::MyStore::connect(url, &opts).await?.migrate().await,
        Backend::Sqlite => {
            sqlite::SqliteStore::connect(url, &opts)
                .await?
                .migrate()
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_errors_name_the_choices() {
        let e = Backend::from_url("redis://u:pw@h").unwrap_err().to_string();
        assert!(e.contains("postgres://") && !e.contains("pw"), "{e}");
    }
}
