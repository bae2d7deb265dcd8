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
use std::time::Duration;

use ferry_core::{EnqueueError, Limits, NewEvent, OutboxStore, StoreError, StoreErrorKind};

mod dialect;
mod enqueue;
mod error;
mod exceptions;
mod lookup;
pub mod migrate;
pub mod mysql;
mod operator;
mod outcome;
pub mod postgres;
mod request;
mod rows;
mod seq_read;
mod server_settings;
pub mod sqlite;
mod status_cache;

pub use error::not_quarantined;
pub use migrate::{Migration, MIGRATIONS_MYSQL, MIGRATIONS_POSTGRES, MIGRATIONS_SQLITE};
pub use operator::validate_identifier;

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

/// How long a pooled connection may sit idle before [`pool_options`]' pools check it with a
/// ping on acquire (30 s).
pub const PING_IDLE_AFTER: Duration = Duration::from_secs(30);

/// The pool options of every ferry pool (the stores', the Inbox's): `max_connections`,
/// `acquire_timeout`, and a liveness check only for connections idle at least
/// `ping_idle_after`.
///
/// sqlx's default pings every connection it hands out, on top of the ping it always sends when
/// a connection goes back to the pool (sqlx 0.8): two extra round trips per statement run on
/// the pool. A connection that broke while in use is still found by that return ping and
/// discarded. One that breaks while idle (a server restart, a proxy's idle cut-off) is found by
/// the ping on acquire once it has been idle `ping_idle_after`; one that breaks sooner fails its
/// next statement once, which every caller already treats as a store error (the relay retries).
/// Tests: `idle_connections_killed_by_the_server_are_replaced_*` (tests/pool.rs).
///
/// A connection still inside a transaction when it is handed out again is closed instead: its
/// COMMIT or ROLLBACK failed and the rollback its `Transaction` queued on drop failed too. On
/// SQLite a COMMIT that fails with "database or disk is full" leaves it so (sqlx counts the
/// transaction as open while SQLite already rolled it back, and every later `begin` on that
/// connection failed with "attempted to call begin_with at non-zero transaction depth").
/// Test: `a_full_disk_is_survived` (tests/disk_full.rs).
pub fn pool_options<DB: sqlx::Database>(
    max_connections: u32,
    acquire_timeout: Duration,
    ping_idle_after: Duration,
) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            Box::pin(async move {
                if sqlx::Connection::is_in_transaction(conn) {
                    tracing::warn!("closing a pooled connection left inside a failed transaction");
                    return Ok(false);
                }
                if meta.idle_for >= ping_idle_after {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

/// Opens `pool` on `options`. sqlx retries a failing first connection until the pool's acquire
/// timeout and then reports only `PoolTimedOut`; one direct connection attempt then names the
/// cause instead (connection refused, unknown host, TLS, ...).
pub async fn open_pool<DB: sqlx::Database>(
    pool: sqlx::pool::PoolOptions<DB>,
    options: <DB::Connection as sqlx::Connection>::Options,
) -> Result<sqlx::Pool<DB>, sqlx::Error> {
    match pool.connect_with(options.clone()).await {
        Err(sqlx::Error::PoolTimedOut) => {
            match <DB::Connection as sqlx::Connection>::connect_with(&options).await {
                Err(cause) => Err(cause),
                Ok(conn) => {
                    let _ = sqlx::Connection::close(conn).await;
                    Err(sqlx::Error::PoolTimedOut)
                }
            }
        }
        opened => opened,
    }
}

/// How to open a store.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Pool size (default 10).
    pub max_connections: u32,
    /// How long to wait for a connection (default 10 s).
    pub acquire_timeout: Duration,
    /// Apply the embedded migrations on connect (default true).
    pub migrate: bool,
    /// Enqueue limits: payload size (default 960 KiB), checked before anything is written.
    pub limits: Limits,
    /// Count the rows claims skip as locked
    /// ([`rows_skipped_locked`](ferry_core::RowDispatch::rows_skipped_locked)) where that costs
    /// something (default false). PostgreSQL then recounts the window of every claim that comes
    /// back short: a second walk of the dispatch index, measured at +40–90 % claim latency
    /// (docs/tuning.md); worth it when diagnosing competing relays. MariaDB counts only when
    /// rows were actually passed over, SQLite never skips: both always report.
    pub measure_contention: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            migrate: true,
            limits: Limits::default(),
            measure_contention: false,
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

/// `url` with any password replaced by `***`, safe to print.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let userinfo = &authority[..at];
    let redacted = match userinfo.find(':') {
        Some(colon) => format!("{}:***", &userinfo[..colon]),
        None => userinfo.to_string(),
    };
    format!("{}://{}@{}", &url[..scheme_end], redacted, &rest[at + 1..])
}

/// Classifies a sqlx error the same way on every backend (shared with ferry-inbox).
pub fn error_kind(e: &sqlx::Error) -> StoreErrorKind {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => StoreErrorKind::Unavailable,
        sqlx::Error::Database(d) => {
            // sqlx reports the SQLSTATE as `code()`; MySQL's own error number says more.
            let code = match d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                Some(my) => my.number().to_string(),
                None => d.code().map(|c| c.to_string()).unwrap_or_default(),
            };
            let msg = d.message().to_ascii_lowercase();
            match code.as_str() {
                // PostgreSQL serialization failure / deadlock / lock timeout; MySQL deadlock /
                // lock wait timeout / MariaDB "record has changed since last read"; SQLite
                // BUSY / LOCKED / BUSY_SNAPSHOT
                "40001" | "40P01" | "55P03" | "1213" | "1205" | "1020" | "5" | "6" | "517" => {
                    StoreErrorKind::Conflict
                }
                // undefined table/column (PostgreSQL, MySQL)
                "42P01" | "42703" | "1146" | "1054" => StoreErrorKind::Schema,
                // PostgreSQL admin shutdown / idle-in-transaction timeout; MySQL server gone
                "57P01" | "25P03" | "2006" | "2013" | "1927" => StoreErrorKind::Unavailable,
                // conditions that pass: PostgreSQL crash shutdown, starting up or in recovery,
                // too many connections, connection failures; MySQL too many connections;
                // SQLite database or disk full
                "57P02" | "57P03" | "53300" | "08000" | "08001" | "08003" | "08004" | "08006"
                | "1040" | "13" => StoreErrorKind::Unavailable,
                _ if msg.contains("no such table") || msg.contains("no such column") => {
                    StoreErrorKind::Schema
                }
                _ => StoreErrorKind::Other,
            }
        }
        _ => StoreErrorKind::Other,
    }
}

/// A duration in whole microseconds, saturating.
pub(crate) fn micros(d: Duration) -> i64 {
    d.as_micros().min(i64::MAX as u128) as i64
}

/// A heartbeat of `owner` found its membership row held, live, by another instance (every store
/// gives this error, including ones outside this crate).
pub fn owner_in_use(owner: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::OwnerInUse,
        format!("owner id {owner:?} is held by another live relay process (its membership has not expired)"),
    )
}

/// [`ferry_core::SlotOwnership::members`] from `(owner, sink_stalled_us)` rows.
pub(crate) fn members_from(
    rows: impl IntoIterator<Item = (String, Option<i64>)>,
) -> Vec<ferry_core::MemberInfo> {
    rows.into_iter()
        .map(|(owner, sink_stalled_us)| ferry_core::MemberInfo {
            owner,
            sink_stalled_us,
        })
        .collect()
}

/// Maps a sqlx error to the store's classification, keeping the source.
pub(crate) fn db_err(context: &str, e: sqlx::Error) -> StoreError {
    let kind = error_kind(&e);
    let hint = if kind == StoreErrorKind::Schema {
        " (run `ferry migrate`)"
    } else {
        ""
    };
    StoreError::with_source(kind, format!("{context}: {e}{hint}"), e)
}

/// Classifies a unique violation raised by an enqueue of `events`, naming the duplicate.
pub(crate) fn enqueue_err(events: &[ferry_core::ValidatedEvent], e: sqlx::Error) -> EnqueueError {
    if let sqlx::Error::Database(d) = &e {
        if d.kind() == sqlx::error::ErrorKind::UniqueViolation {
            // The constraint name (PostgreSQL) or message (MySQL, SQLite) says which key.
            let mut text = d.message().to_string();
            if let Some(c) = d.constraint() {
                text.push(' ');
                text.push_str(c);
            }
            if let Some(pg) = d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                if let Some(detail) = pg.detail() {
                    text.push(' ');
                    text.push_str(detail);
                }
            }
            let by_id = text.contains("event_id");
            for ev in events {
                if by_id {
                    if text.contains(&ev.event_id) || events.len() == 1 {
                        return EnqueueError::DuplicateEventId {
                            event_id: ev.event_id.clone(),
                        };
                    }
                } else {
                    let pg = format!("({}, {})", ev.aggregate_id, ev.aggregate_version);
                    let my = format!("'{}-{}'", ev.aggregate_id, ev.aggregate_version);
                    if text.contains(&pg) || text.contains(&my) || events.len() == 1 {
                        return EnqueueError::DuplicateVersion {
                            aggregate_id: ev.aggregate_id.clone(),
                            version: ev.aggregate_version,
                        };
                    }
                }
            }
            return EnqueueError::Store(format!("duplicate key: {text}"));
        }
    }
    EnqueueError::Store(db_err("enqueue failed", e).to_string())
}

/// Validates `events` for an enqueue (shared by every backend).
pub(crate) fn validate(
    events: &[NewEvent],
    limits: &Limits,
) -> Result<Vec<ferry_core::ValidatedEvent>, EnqueueError> {
    ferry_core::validate_batch(events, limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(
            redact_url("mysql://root@127.0.0.1/test"),
            "mysql://root@127.0.0.1/test"
        );
        assert_eq!(redact_url("sqlite:///tmp/x.db"), "sqlite:///tmp/x.db");
        assert_eq!(
            redact_url("postgres://u:p@ss@h/db?x=1"),
            "postgres://u:***@h/db?x=1"
        );
    }

    #[test]
    fn scheme_errors_name_the_choices() {
        let e = Backend::from_url("redis://u:pw@h").unwrap_err().to_string();
        assert!(e.contains("postgres://") && !e.contains("pw"), "{e}");
    }
}
