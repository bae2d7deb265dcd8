//! PostgreSQL (12+; tested on 15).
//!
//! Dedupe is `INSERT … ON CONFLICT (consumer, event_id) DO NOTHING`: a second transaction
//! inserting the same key waits for the first; at `READ COMMITTED` it then inserts nothing
//! (`Duplicate`) or, if the first rolled back, inserts (`New`); at `REPEATABLE READ` and
//! `SERIALIZABLE` a conflicting row committed after its snapshot raises a serialization
//! failure (40001, retryable). The aggregate row is locked with `SELECT … FOR UPDATE`.
use std::collections::{BTreeMap, HashSet};

use sqlx::PgConnection;

use crate::delivery::Delivery;
use crate::engine::{self, AggState, Ops};
use crate::error::{db_err, InboxError};
use crate::gap::GapInfo;
use crate::migrate::MIGRATIONS_POSTGRES;

engine::entry_points!(PgConnection);

/// The subset of `event_ids` recorded (effect committed) for `consumer`.
pub async fn consumed<S: AsRef<str>>(
    conn: &mut PgConnection,
    consumer: &str,
    event_ids: &[S],
) -> Result<HashSet<String>, InboxError> {
    let mut out = HashSet::new();
    // 10 000 ids per statement: one array bind, bounded memory per round trip.
    for chunk in event_ids.chunks(10_000) {
        let ids: Vec<&str> = chunk.iter().map(AsRef::as_ref).collect();
        let rows: Vec<String> = sqlx::query_scalar(
            "SELECT event_id FROM ferry_inbox WHERE consumer = $1 AND event_id = ANY($2)",
        )
        .bind(consumer)
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| db_err("consumed", e))?;
        out.extend(rows);
    }
    Ok(out)
}

/// The next batch of [`Inbox::prune`](crate::Inbox::prune): up to `limit` event ids of
/// `consumer` after `after` (ascending), recorded more than `older_than_us` ago, whose version
/// the aggregate's contiguous mark covers.
pub(crate) async fn prune_candidates(
    conn: &mut PgConnection,
    consumer: &str,
    older_than_us: i64,
    after: &str,
    limit: usize,
) -> Result<Vec<String>, InboxError> {
    sqlx::query_scalar(
        "SELECT i.event_id FROM ferry_inbox i JOIN ferry_inbox_aggregate a \
         ON a.consumer = i.consumer AND a.aggregate_id = i.aggregate_id \
         WHERE i.consumer = $1 AND i.event_id > $2 \
         AND i.recorded_at < now() - $3 * interval '1 microsecond' \
         AND i.aggregate_version <= a.applied_upto ORDER BY i.event_id LIMIT $4",
    )
    .bind(consumer)
    .bind(after)
    .bind(older_than_us)
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| db_err("prune", e))
}

/// Deletes the inbox rows of `consumer` with these event ids; the rows deleted.
pub(crate) async fn delete_rows(
    conn: &mut PgConnection,
    consumer: &str,
    event_ids: &[String],
) -> Result<u64, InboxError> {
    Ok(
        sqlx::query("DELETE FROM ferry_inbox WHERE consumer = $1 AND event_id = ANY($2)")
            .bind(consumer)
            .bind(event_ids)
            .execute(&mut *conn)
            .await
            .map_err(|e| db_err("prune", e))?
            .rows_affected(),
    )
}

/// Number of consumed events per consumer.
pub async fn consumed_counts(conn: &mut PgConnection) -> Result<BTreeMap<String, i64>, InboxError> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT consumer, COUNT(*) FROM ferry_inbox GROUP BY consumer")
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| db_err("consumed_counts", e))?;
    Ok(rows.into_iter().collect())
}

/// Aggregates with an open version gap for `consumer`, oldest gap first.
pub async fn gaps(conn: &mut PgConnection, consumer: &str) -> Result<Vec<GapInfo>, InboxError> {
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT aggregate_id, applied_upto, max_seen, gap_since_us FROM ferry_inbox_aggregate \
         WHERE consumer = $1 AND gap_since_us IS NOT NULL ORDER BY gap_since_us, aggregate_id",
    )
    .bind(consumer)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| db_err("gaps", e))?;
    Ok(rows.into_iter().map(engine::gap_info).collect())
}

/// Applies pending inbox migrations in one transaction under
/// `pg_advisory_xact_lock(hashtext('ferry_inbox_migrate:' || current_schema()))`: DDL is
/// transactional, so a migration applies fully or not at all, and a concurrent migrate waits
/// and then finds nothing to do. Returns the versions applied by this call.
pub async fn migrate(conn: &mut PgConnection) -> Result<Vec<i64>, InboxError> {
    Ok(ferry_store::migrate::apply_postgres(
        conn,
        "ferry_inbox_migrate",
        "ferry_inbox_migrations",
        MIGRATIONS_POSTGRES,
    )
    .await?)
}

async fn select_for_update(
    conn: &mut PgConnection,
    consumer: &str,
    aggregate_id: &str,
) -> Result<Option<AggState>, InboxError> {
    let row: Option<(i64, i64, Option<i64>)> = sqlx::query_as(
        "SELECT applied_upto, max_seen, gap_since_us FROM ferry_inbox_aggregate \
         WHERE consumer = $1 AND aggregate_id = $2 FOR UPDATE",
    )
    .bind(consumer)
    .bind(aggregate_id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| db_err("lock aggregate", e))?;
    Ok(row.map(|(upto, max_seen, gap_since_us)| AggState {
        upto,
        max_seen,
        gap_since_us,
    }))
}

impl Ops for PgConnection {
    async fn lock_aggregate(
        &mut self,
        consumer: &str,
        aggregate_id: &str,
    ) -> Result<AggState, InboxError> {
        // The common case (known aggregate) is one locking read and writes nothing yet.
        if let Some(s) = select_for_update(self, consumer, aggregate_id).await? {
            return Ok(s);
        }
        let inserted = sqlx::query(
            "INSERT INTO ferry_inbox_aggregate (consumer, aggregate_id) VALUES ($1, $2) \
             ON CONFLICT (consumer, aggregate_id) DO NOTHING",
        )
        .bind(consumer)
        .bind(aggregate_id)
        .execute(&mut *self)
        .await
        .map_err(|e| db_err("create aggregate", e))?
        .rows_affected();
        if inserted == 1 {
            // our own uncommitted row: locked by the insert
            return Ok(AggState {
                upto: 0,
                max_seen: 0,
                gap_since_us: None,
            });
        }
        // a concurrent transaction created it first and committed (we waited for it)
        select_for_update(self, consumer, aggregate_id)
            .await?
            .ok_or_else(|| {
                db_err(
                    "lock aggregate",
                    sqlx::Error::Protocol(
                        "aggregate row vanished after a conflicting insert".into(),
                    ),
                )
            })
    }

    async fn insert(&mut self, d: &Delivery) -> Result<bool, InboxError> {
        let n = sqlx::query(
            "INSERT INTO ferry_inbox (consumer, event_id, aggregate_id, aggregate_version) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (consumer, event_id) DO NOTHING",
        )
        .bind(&d.consumer)
        .bind(&d.event_id)
        .bind(&d.aggregate_id)
        .bind(d.aggregate_version)
        .execute(&mut *self)
        .await
        .map_err(|e| db_err("record", e))?
        .rows_affected();
        Ok(n == 1)
    }

    engine::delete_and_recorded_above! {
        delete: "DELETE FROM ferry_inbox WHERE consumer = $1 AND event_id = $2",
        recorded_above: "SELECT aggregate_version FROM ferry_inbox WHERE consumer = $1 \
                         AND aggregate_id = $2 AND aggregate_version > $3 ORDER BY aggregate_version",
    }

    engine::version_rows!(count:
        "SELECT COUNT(*) FROM ferry_inbox WHERE consumer = $1 AND aggregate_id = $2 \
         AND aggregate_version = $3"
    );

    async fn store_aggregate(
        &mut self,
        consumer: &str,
        aggregate_id: &str,
        s: &AggState,
    ) -> Result<(), InboxError> {
        sqlx::query(
            "UPDATE ferry_inbox_aggregate SET applied_upto = $3, max_seen = $4, \
             gap_since_us = $5, updated_at = now() WHERE consumer = $1 AND aggregate_id = $2",
        )
        .bind(consumer)
        .bind(aggregate_id)
        .bind(s.upto)
        .bind(s.max_seen)
        .bind(s.gap_since_us)
        .execute(&mut *self)
        .await
        .map_err(|e| db_err("update aggregate", e))?;
        Ok(())
    }
}
