//! PostgreSQL's row-dispatch claim: a bounded window at the front of the backlog, then the heads
//! of the aggregates past it.
//!
//! A claim takes only each aggregate's lowest unfinished version (the predecessor rule), in `seq`
//! order, up to its limit. Walked without a bound, the dispatch index is read to its end whenever
//! fewer than the limit qualify: a few aggregates holding a deep backlog, lowest versions in
//! flight, stranded by a killed relay or backing off during a broker outage. Each claim then
//! costs the whole backlog, and the relay slows down as it falls behind. A burn-down of 100,000
//! intents over 100 aggregates of 1,000 versions each, committed aggregate after aggregate,
//! drained at 347 ev/s that way: each claim read the whole queue to find 25 lowest versions.
//!
//! So a claim reads in two steps, in one transaction:
//! 1. **The window** ([`sql::claim`]): the walk in `seq` order, as before, but only over the first
//!    [`window_rows`] rows of the claim's slots that no live claim holds (in-flight rows are
//!    passed, not counted). Oldest first, as before; when the backlog is shallow this is the
//!    whole claim.
//! 2. **Heads past it** ([`sql::claim_heads`]), only when the window was full (more rows lie past
//!    it) and came back short: a loose index scan over `ferry_outbox_unfinished` (aggregate_id,
//!    aggregate_version) visits at most [`window_rows`] aggregates, one index probe each for the
//!    next aggregate and for its lowest unfinished version, and claims those lowest versions that
//!    are due, in aggregate order. Each scan starts after the aggregate the previous one stopped
//!    at (the last claimed when it filled the limit, else the last visited) and wraps at the end,
//!    so every aggregate with a due lowest version is reached within (busy aggregates / window)
//!    short claims. The same burn-down drained at 2,832 ev/s.
//!
//! Both steps claim only rows that satisfy the claim's predicate as before (due, their
//! aggregate's lowest unfinished version, in a live slot of the owner, not paused) `FOR UPDATE
//! SKIP LOCKED` with new tokens; the steps bound *where* a claim looks, never *what* it may take.
//! Rows the window claimed are `CLAIMED` with a live lease when the second step reads them (the
//! same transaction), so it cannot take them twice. The order, loss and fencing arguments
//! (docs/architecture.md, docs/schema.md §4) are unchanged. Tests:
//! `heads_past_a_deep_backlog_are_claimed` and the rest of the store conformance suite.
use std::sync::atomic::Ordering;

use ferry_core::{ClaimRequest, ClaimedEvent, StoreError};
use sqlx::Row;

use super::{claimed_from_row, sql, PgStore};
use crate::error::{db_err, Ctx};
use crate::heads::window_rows;
use crate::time::micros;

impl PgStore {
    /// [`ferry_core::RowDispatch::claim`]: the window, then the heads past it (module docs).
    pub(super) async fn claim_window_then_heads(
        &self,
        req: &ClaimRequest,
    ) -> Result<Vec<ClaimedEvent>, StoreError> {
        let sql = sql::claim(req, self.measure);
        let window = window_rows(req.limit);
        let mut tx = self.pool.begin().await.ctx("claim: begin")?;
        // Walk the dispatch index in seq order and stop after LIMIT matches. Left to itself,
        // the planner sometimes bitmap-scans and sorts the whole due backlog of the worker's
        // slots first (stats from a small backlog, generic plans), which grows with the backlog.
        sqlx::query(sql::CLAIM_PLAN_SETTINGS)
            .execute(&mut *tx)
            .await
            .map_err(|e| db_err("claim: plan settings", e))?;
        let (mut items, window_end) = self.claim_window(&mut tx, &sql, req, window).await?;
        if window_end.is_some() && items.len() < req.limit {
            let more = self
                .claim_heads(&mut tx, req, req.limit - items.len(), window)
                .await?;
            items.extend(more);
        }
        tx.commit().await.map_err(|e| db_err("claim: commit", e))?;
        items.sort_by_key(|e| e.token.seq);
        Ok(items)
    }

    /// The window of a row claim ([`sql::claim`]): the rows claimed, and the window's last seq
    /// (`None`: the window reached the end of the backlog).
    async fn claim_window(
        &self,
        tx: &mut sqlx::PgConnection,
        sql: &str,
        req: &ClaimRequest,
        rows_max: i64,
    ) -> Result<(Vec<ClaimedEvent>, Option<i64>), StoreError> {
        let rows = bind_row_claim(sql, req, req.limit)
            .bind(rows_max)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| db_err("claim", e))?;
        let passed: i64 = rows.first().map_or(0, |r| r.get(15));
        if passed > 0 {
            self.skipped.fetch_add(passed as u64, Ordering::Relaxed);
        }
        let end = rows.first().and_then(|r| r.get::<Option<i64>, _>(16));
        Ok((claimed_rows(&rows), end))
    }

    /// The heads-first part of a row claim ([`sql::claim_heads`]) for up to `limit` rows,
    /// visiting at most `aggregates` aggregates from where the previous one stopped.
    async fn claim_heads(
        &self,
        tx: &mut sqlx::PgConnection,
        req: &ClaimRequest,
        limit: usize,
        aggregates: i64,
    ) -> Result<Vec<ClaimedEvent>, StoreError> {
        let sql = sql::claim_heads(req);
        let from = self.heads_from.get();
        let rows = bind_row_claim(&sql, req, limit)
            .bind(from)
            .bind(aggregates)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| db_err("claim: heads", e))?;
        let next: Option<String> = rows.first().and_then(|r| r.get(16));
        self.heads_from.set(next);
        Ok(claimed_rows(&rows))
    }
}

/// A row-claim statement's parameters `$1`–`$5` (`$5` the fence's owner, or "" unfenced).
fn bind_row_claim<'q>(
    sql: &'q str,
    req: &'q ClaimRequest,
    limit: usize,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql)
        .bind(req.slots.iter().map(|s| *s as i16).collect::<Vec<_>>())
        .bind(limit as i64)
        .bind(&req.claim_id)
        .bind(micros(req.lease))
        .bind(req.fence.as_ref().map_or("", |f| f.owner.as_str()))
}

/// The claimed rows of a row-claim statement's result (a row with NULL tokens means none).
fn claimed_rows(rows: &[sqlx::postgres::PgRow]) -> Vec<ClaimedEvent> {
    rows.iter()
        .filter(|r| r.get::<Option<i64>, _>(0).is_some())
        .map(claimed_from_row)
        .collect()
}
