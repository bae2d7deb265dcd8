//! SQLite (3.35+; bundled 3.46).
//!
//! SQLite has one writer at a time, so two transactions recording the same event are
//! serialized by the database lock: the second waits (busy timeout) and then sees the first's
//! committed row. Begin the consumer transaction with `BEGIN IMMEDIATE`; every inbox call
//! writes before it reads, so even a deferred transaction takes the write lock on its first
//! inbox statement, unless it already read (then a stale snapshot fails with
//! `SQLITE_BUSY_SNAPSHOT`, classified retryable).
use std::collections::{BTreeMap, HashSet};

use ferry_core::now_micros;
use sqlx::{Sqlite, SqliteConnection};

use crate::delivery::Delivery;
use crate::engine::{self, AggState, Ops};
use crate::error::{db_err, InboxError};
use crate::gap::GapInfo;
use crate::migrate::MIGRATIONS_SQLITE;

engine::entry_points!(SqliteConnection);

/// The subset of `event_ids` recorded (effect committed) for `consumer`.
pub async fn consumed<S: AsRef<str>>(
    conn: &mut SqliteConnection,
    consumer: &str,
    event_ids: &[S],
) -> Result<HashSet<String>, InboxError> {
    let mut out = HashSet::new();
    // 1 000 placeholders per statement: under SQLite's 32 766 host-parameter limit.
    for chunk in event_ids.chunks(1_000) {
        let rows: Vec<String> = engine::keys_in::<Sqlite, _>("SELECT event_id", consumer, chunk)
            .build_query_scalar()
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| db_err("consumed", e))?;
        out.extend(rows);
    }
    Ok(out)
}

/// See `postgres::prune_candidates`.
pub(crate) async fn prune_candidates(
    conn: &mut SqliteConnection,
    consumer: &str,
    older_than_us: i64,
    after: &str,
    limit: usize,
) -> Result<Vec<String>, InboxError> {
    sqlx::query_scalar(
        "SELECT i.event_id FROM ferry_inbox i JOIN ferry_inbox_aggregate a \
         ON a.consumer = i.consumer AND a.aggregate_id = i.aggregate_id \
         WHERE i.consumer = ? AND i.event_id > ? AND i.recorded_at < ? \
         AND i.aggregate_version <= a.applied_upto ORDER BY i.event_id LIMIT ?",
    )
    .bind(consumer)
    .bind(after)
    .bind(now_micros().saturating_sub(older_than_us))
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| db_err("prune", e))
}

/// See `postgres::delete_rows`.
pub(crate) async fn delete_rows(
    conn: &mut SqliteConnection,
    consumer: &str,
    event_ids: &[String],
) -> Result<u64, InboxError> {
    Ok(engine::keys_in::<Sqlite, _>("DELETE", consumer, event_ids)
        .build()
        .execute(&mut *conn)
        .await
        .map_err(|e| db_err("prune", e))?
        .rows_affected())
}

/// Number of consumed events per consumer.
pub async fn consumed_counts(
    conn: &mut SqliteConnection,
) -> Result<BTreeMap<String, i64>, InboxError> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT consumer, COUNT(*) FROM ferry_inbox GROUP BY consumer")
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| db_err("consumed_counts", e))?;
    Ok(rows.into_iter().collect())
}

/// Aggregates with an open version gap for `consumer`, oldest gap first.
pub async fn gaps(conn: &mut SqliteConnection, consumer: &str) -> Result<Vec<GapInfo>, InboxError> {
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT aggregate_id, applied_upto, max_seen, gap_since_us FROM ferry_inbox_aggregate \
         WHERE consumer = ? AND gap_since_us IS NOT NULL ORDER BY gap_since_us, aggregate_id",
    )
    .bind(consumer)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| db_err("gaps", e))?;
    Ok(rows.into_iter().map(engine::gap_info).collect())
}

/// Applies pending inbox migrations inside one `BEGIN IMMEDIATE` transaction: the write lock
/// serializes concurrent migrates, and SQLite DDL is transactional. Returns the versions
/// applied by this call.
pub async fn migrate(conn: &mut SqliteConnection) -> Result<Vec<i64>, InboxError> {
    Ok(ferry_store::migrate::apply_sqlite(
        conn,
        "ferry_inbox_migrate",
        "ferry_inbox_migrations",
        MIGRATIONS_SQLITE,
    )
    .await?)
}

impl Ops for SqliteConnection {
    async fn lock_aggregate(
        &mut self,
        consumer: &str,
        aggregate_id: &str,
    ) -> Result<AggState, InboxError> {
        // write first: takes the database write lock before anything is read
        sqlx::query(
            "INSERT INTO ferry_inbox_aggregate (consumer, aggregate_id, updated_at) \
             VALUES (?, ?, ?) ON CONFLICT (consumer, aggregate_id) DO NOTHING",
        )
        .bind(consumer)
        .bind(aggregate_id)
        .bind(now_micros())
        .execute(&mut *self)
        .await
        .map_err(|e| db_err("lock aggregate", e))?;
        let (upto, max_seen, gap_since_us): (i64, i64, Option<i64>) = sqlx::query_as(
            "SELECT applied_upto, max_seen, gap_since_us FROM ferry_inbox_aggregate \
             WHERE consumer = ? AND aggregate_id = ?",
        )
        .bind(consumer)
        .bind(aggregate_id)
        .fetch_one(&mut *self)
        .await
        .map_err(|e| db_err("lock aggregate", e))?;
        Ok(AggState {
            upto,
            max_seen,
            gap_since_us,
        })
    }

    async fn insert(&mut self, d: &Delivery) -> Result<bool, InboxError> {
        let n = sqlx::query(
            "INSERT INTO ferry_inbox (consumer, event_id, aggregate_id, aggregate_version, \
             recorded_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (consumer, event_id) DO NOTHING",
        )
        .bind(&d.consumer)
        .bind(&d.event_id)
        .bind(&d.aggregate_id)
        .bind(d.aggregate_version)
        .bind(now_micros())
        .execute(&mut *self)
        .await
        .map_err(|e| db_err("record", e))?
        .rows_affected();
        Ok(n == 1)
    }

    engine::delete_and_recorded_above! {
        delete: "DELETE FROM ferry_inbox WHERE consumer = ? AND event_id = ?",
        recorded_above: "SELECT aggregate_version FROM ferry_inbox WHERE consumer = ? \
                         AND aggregate_id = ? AND aggregate_version > ? ORDER BY aggregate_version",
    }

    engine::version_rows!(count:
        "SELECT COUNT(*) FROM ferry_inbox WHERE consumer = ? AND aggregate_id = ? \
         AND aggregate_version = ?"
    );

    async fn store_aggregate(
        &mut self,
        consumer: &str,
        aggregate_id: &str,
        s: &AggState,
    ) -> Result<(), InboxError> {
        sqlx::query(
            "UPDATE ferry_inbox_aggregate SET applied_upto = ?, max_seen = ?, gap_since_us = ?, \
             updated_at = ? WHERE consumer = ? AND aggregate_id = ?",
        )
        .bind(s.upto)
        .bind(s.max_seen)
        .bind(s.gap_since_us)
        .bind(now_micros())
        .bind(consumer)
        .bind(aggregate_id)
        .execute(&mut *self)
        .await
        .map_err(|e| db_err("update aggregate", e))?;
        Ok(())
    }
}
