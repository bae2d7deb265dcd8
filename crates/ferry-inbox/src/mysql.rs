//! MySQL 8.0+ / MariaDB 10.6+ (tested on MariaDB 10.11).
//!
//! Dedupe is a plain `INSERT` whose duplicate-key error (1062) means `Duplicate`: a second
//! transaction inserting the same key waits for the first's record lock, then gets the
//! duplicate (first committed) or inserts (first rolled back). A failed statement rolls back
//! only itself in InnoDB, so the caller's transaction stays usable. `INSERT IGNORE` is not
//! used: it would also turn truncation and other errors into warnings.
//!
//! The aggregate row is created/locked with `INSERT … ON DUPLICATE KEY UPDATE` (an exclusive
//! lock straight away: a `SELECT … FOR UPDATE` on a missing row would take a gap lock under
//! `REPEATABLE READ`, and two such transactions inserting the same new aggregate deadlock),
//! then read with `SELECT … FOR UPDATE`. Every read of inbox rows is a locking read
//! (`LOCK IN SHARE MODE`), which sees the latest committed rows even under `REPEATABLE READ`.
use std::collections::{BTreeMap, HashSet};

use sqlx::{MySql, MySqlConnection};

use crate::delivery::Delivery;
use crate::engine::{self, AggState, Ops};
use crate::error::{db_err, is_unique_violation, InboxError};
use crate::gap::GapInfo;
use crate::migrate::MIGRATIONS_MYSQL;

engine::entry_points!(MySqlConnection);

/// The subset of `event_ids` recorded (effect committed) for `consumer`.
pub async fn consumed<S: AsRef<str>>(
    conn: &mut MySqlConnection,
    consumer: &str,
    event_ids: &[S],
) -> Result<HashSet<String>, InboxError> {
    let mut out = HashSet::new();
    // 1 000 placeholders per statement: well under the protocol's 65 535.
    for chunk in event_ids.chunks(1_000) {
        let rows: Vec<Vec<u8>> = engine::keys_in::<MySql, _>("SELECT event_id", consumer, chunk)
            .build_query_scalar()
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| db_err("consumed", e))?;
        out.extend(rows.into_iter().map(text));
    }
    Ok(out)
}

/// See `postgres::prune_candidates`.
pub(crate) async fn prune_candidates(
    conn: &mut MySqlConnection,
    consumer: &str,
    older_than_us: i64,
    after: &str,
    limit: usize,
) -> Result<Vec<String>, InboxError> {
    let ids: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT i.event_id FROM ferry_inbox i JOIN ferry_inbox_aggregate a \
         ON a.consumer = i.consumer AND a.aggregate_id = i.aggregate_id \
         WHERE i.consumer = ? AND i.event_id > ? \
         AND i.recorded_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
         AND i.aggregate_version <= a.applied_upto ORDER BY i.event_id LIMIT ?",
    )
    .bind(consumer)
    .bind(after)
    .bind(older_than_us)
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| db_err("prune", e))?;
    Ok(ids.into_iter().map(text).collect())
}

/// See `postgres::delete_rows`.
pub(crate) async fn delete_rows(
    conn: &mut MySqlConnection,
    consumer: &str,
    event_ids: &[String],
) -> Result<u64, InboxError> {
    Ok(engine::keys_in::<MySql, _>("DELETE", consumer, event_ids)
        .build()
        .execute(&mut *conn)
        .await
        .map_err(|e| db_err("prune", e))?
        .rows_affected())
}

/// Number of consumed events per consumer.
pub async fn consumed_counts(
    conn: &mut MySqlConnection,
) -> Result<BTreeMap<String, i64>, InboxError> {
    let rows: Vec<(Vec<u8>, i64)> =
        sqlx::query_as("SELECT consumer, COUNT(*) FROM ferry_inbox GROUP BY consumer")
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| db_err("consumed_counts", e))?;
    Ok(rows.into_iter().map(|(c, n)| (text(c), n)).collect())
}

/// Aggregates with an open version gap for `consumer`, oldest gap first.
pub async fn gaps(conn: &mut MySqlConnection, consumer: &str) -> Result<Vec<GapInfo>, InboxError> {
    let rows: Vec<(Vec<u8>, i64, i64, i64)> = sqlx::query_as(
        "SELECT aggregate_id, applied_upto, max_seen, gap_since_us FROM ferry_inbox_aggregate \
         WHERE consumer = ? AND gap_since_us IS NOT NULL ORDER BY gap_since_us, aggregate_id",
    )
    .bind(consumer)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| db_err("gaps", e))?;
    Ok(rows
        .into_iter()
        .map(|(id, upto, max_seen, since)| engine::gap_info((text(id), upto, max_seen, since)))
        .collect())
}

/// Applies pending inbox migrations under `GET_LOCK('ferry_inbox_migrate:<database>', 300)`.
/// MySQL DDL is not transactional, so every statement is idempotent (`IF NOT EXISTS`) and a
/// migration that died half-way is simply re-run; its version row is written last. Returns
/// the versions applied by this call.
pub async fn migrate(conn: &mut MySqlConnection) -> Result<Vec<i64>, InboxError> {
    Ok(ferry_store::migrate::apply_mysql(
        conn,
        "ferry_inbox_migrate",
        "ferry_inbox_migrations",
        MIGRATIONS_MYSQL,
    )
    .await?)
}

/// A `utf8mb4_bin` column is reported with the BINARY flag, so sqlx decodes it as bytes; they
/// are the UTF-8 this crate wrote.
fn text(b: Vec<u8>) -> String {
    String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

impl Ops for MySqlConnection {
    async fn lock_aggregate(
        &mut self,
        consumer: &str,
        aggregate_id: &str,
    ) -> Result<AggState, InboxError> {
        sqlx::query(
            "INSERT INTO ferry_inbox_aggregate (consumer, aggregate_id) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE applied_upto = applied_upto",
        )
        .bind(consumer)
        .bind(aggregate_id)
        .execute(&mut *self)
        .await
        .map_err(|e| db_err("lock aggregate", e))?;
        let (upto, max_seen, gap_since_us): (i64, i64, Option<i64>) = sqlx::query_as(
            "SELECT applied_upto, max_seen, gap_since_us FROM ferry_inbox_aggregate \
             WHERE consumer = ? AND aggregate_id = ? FOR UPDATE",
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
        match sqlx::query(
            "INSERT INTO ferry_inbox (consumer, event_id, aggregate_id, aggregate_version) \
             VALUES (?, ?, ?, ?)",
        )
        .bind(&d.consumer)
        .bind(&d.event_id)
        .bind(&d.aggregate_id)
        .bind(d.aggregate_version)
        .execute(&mut *self)
        .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_unique_violation(&e) => Ok(false),
            Err(e) => Err(db_err("record", e)),
        }
    }

    engine::delete_and_recorded_above! {
        delete: "DELETE FROM ferry_inbox WHERE consumer = ? AND event_id = ?",
        recorded_above: "SELECT aggregate_version FROM ferry_inbox WHERE consumer = ? \
                         AND aggregate_id = ? AND aggregate_version > ? \
                         ORDER BY aggregate_version LOCK IN SHARE MODE",
    }

    engine::version_rows!(rows:
        "SELECT aggregate_version FROM ferry_inbox WHERE consumer = ? AND aggregate_id = ? \
         AND aggregate_version = ? LOCK IN SHARE MODE"
    );

    async fn store_aggregate(
        &mut self,
        consumer: &str,
        aggregate_id: &str,
        s: &AggState,
    ) -> Result<(), InboxError> {
        sqlx::query(
            "UPDATE ferry_inbox_aggregate SET applied_upto = ?, max_seen = ?, gap_since_us = ?, \
             updated_at = UTC_TIMESTAMP(6) WHERE consumer = ? AND aggregate_id = ?",
        )
        .bind(s.upto)
        .bind(s.max_seen)
        .bind(s.gap_since_us)
        .bind(consumer)
        .bind(aggregate_id)
        .execute(&mut *self)
        .await
        .map_err(|e| db_err("update aggregate", e))?;
        Ok(())
    }
}
