//! The shared status count (`ferry_status_cache`, PostgreSQL and MariaDB): one relay counts under
//! a lease, the others read what it stored.
use ferry_core::{OutboxStatus, StoreError, StoreErrorKind};

use crate::error::db_err;
use crate::rows::{status_from, StatusRow};

/// The statements of a backend's `ferry_status_cache` (PostgreSQL, MariaDB): take the counting
/// lease (`max_age` in µs bound once), read the stored count (its oldest age moved on by the
/// time since), give the lease back, store a count (five values bound).
pub(crate) struct StatusCacheSql {
    pub(crate) lease: &'static str,
    pub(crate) stored: &'static str,
    pub(crate) clear: &'static str,
    pub(crate) store: &'static str,
}

/// [`ferry_core::OutboxStore::shared_status`] over a `ferry_status_cache` row: the relay that
/// wins the lease counts with `count` and stores the result; the others read the stored count
/// (younger than `max_age`, or older while the winner counts), or get a `Conflict` error while
/// nothing is stored yet. A winner whose count fails gives the lease back; one that dies holds
/// it for the lease's 60 s.
pub(crate) async fn shared_status<DB, F>(
    pool: &sqlx::Pool<DB>,
    sql: &StatusCacheSql,
    rows_affected: fn(&DB::QueryResult) -> u64,
    max_age: std::time::Duration,
    count: F,
) -> Result<OutboxStatus, StoreError>
where
    DB: sqlx::Database,
    F: std::future::Future<Output = Result<OutboxStatus, StoreError>>,
    i64: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<i64>: for<'q> sqlx::Encode<'q, DB>,
    StatusRow: for<'r> sqlx::FromRow<'r, DB::Row>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let max_age_us = max_age.as_micros().min(i64::MAX as u128) as i64;
    // A lease statement that matches nothing changes no row: the relays that read the stored
    // count pay a primary-key lookup for it.
    let leased = sqlx::query(sql.lease)
        .bind(max_age_us)
        .execute(pool)
        .await
        .map_err(|e| db_err("status: lease", e))?;
    // (sqlx has no backend-independent `rows_affected`: each backend passes its own)
    let won = rows_affected(&leased) == 1;
    if !won {
        let stored: Option<StatusRow> = sqlx::query_as(sql.stored)
            .fetch_optional(pool)
            .await
            .map_err(|e| db_err("status: stored", e))?;
        return match stored {
            Some(r) => Ok(status_from(r)),
            // Nothing stored yet: another relay is counting for the first time. Counting here
            // too would repeat the walk once per relay, at once, when a fleet starts on a large
            // backlog; the caller keeps its gauges and asks again next interval.
            None => Err(StoreError::new(
                StoreErrorKind::Conflict,
                "status: another relay is counting; no count stored yet",
            )),
        };
    }
    let s = match count.await {
        Ok(s) => s,
        Err(e) => {
            // give the lease back so that another relay (or the next poll) counts
            let _ = sqlx::query(sql.clear).execute(pool).await;
            return Err(e);
        }
    };
    sqlx::query(sql.store)
        .bind(s.pending)
        .bind(s.claimed)
        .bind(s.quarantined)
        .bind(s.oldest_unfinished_age_us)
        .bind(s.blocked_aggregates)
        .execute(pool)
        .await
        .map_err(|e| db_err("status: store", e))?;
    Ok(s)
}
