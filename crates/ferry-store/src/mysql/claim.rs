//! MariaDB's row-dispatch claim, in one short transaction: the slot fence, a plain read of
//! due candidates, their locking re-check `FOR UPDATE SKIP LOCKED`, the update of their tokens.
//!
//! The candidates come from a bounded window and, past it, the heads of aggregates
//! ([`crate::heads`]), as on PostgreSQL:
//! 1. **The window**: the PENDING candidates are read in `seq` order only up to the
//!    [`window_rows`]-th due PENDING row of the claim's slots ([`sql::window_end`], an index-only
//!    walk). Expired leases (CLAIMED rows, as many as the claims in flight at most) are read
//!    without a bound.
//! 2. **Heads past it**, only when the window has an end and the candidates came back short:
//!    [`MyStore::heads_past`] visits the aggregates with a PENDING version in aggregate order,
//!    reading `ferry_outbox_predecessor` (state, aggregate_id, aggregate_version) a bounded
//!    number of entries per statement: the first entry of each aggregate is its lowest PENDING
//!    version. It keeps those past the window that the window's predicate would take. Each scan
//!    starts after the aggregate the last one stopped at and wraps at the end, so every
//!    aggregate with a claimable head is reached.
//!
//! Both steps only choose candidates; the locking re-check and the update that follow are the
//! same for either, and the predicate is the same text ([`sql::candidate_query`],
//! [`sql::heads_after`]). Without the bound, a backlog of 100 aggregates × 500 versions drained
//! at about 60 ev/s, and slower as it went: every claim read the whole backlog to find the few
//! heads not in flight. With it, the same backlog drained at 1,694 ev/s (docs/performance.md,
//! "Row dispatch: deep backlogs").
use std::sync::atomic::Ordering;

use ferry_core::{ClaimRequest, ClaimedEvent, StoreError, StoreErrorKind};
use sqlx::mysql::MySqlConnection;
use sqlx::Row;

use super::rows::{claimed_from_row, txt};
use super::sql::{self, candidate_query, fetch_rows, window_end};
use super::MyStore;
use crate::error::{db_err, Ctx};
use crate::heads::window_rows;

impl MyStore {
    /// [`ferry_core::RowDispatch::claim`] of a request that names slots and rows (the module
    /// docs of [`super`] give its five steps).
    pub(super) async fn claim_locked(
        &self,
        req: &ClaimRequest,
    ) -> Result<Vec<ClaimedEvent>, StoreError> {
        let mut tx = self.pool.begin().await.ctx("claim: begin")?;
        let slots = fenced_slots(&mut tx, req).await?;
        if slots.is_empty() {
            return Ok(Vec::new());
        }
        // Over-fetch candidates: a concurrent claimer may hold some of them locked (SKIP
        // LOCKED then passes over them), and without spares a contended claim would come
        // back short or empty while other due rows wait. A fenced claim has its slots to
        // itself (only a takeover races it), so it reads few spares: each candidate costs a
        // row lookup and a predecessor probe.
        let want = if req.fence.is_some() {
            req.limit + 16
        } else {
            req.limit.saturating_mul(3) + 16
        };
        let window = window_rows(req.limit);
        let end: Option<i64> = window_end(&slots, window)
            .build_query_scalar()
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db_err("claim: window", e))?;
        let mut candidates = Vec::with_capacity(want);
        for (state, due, upto) in [
            ("PENDING", "o.available_at", end),
            // leases that expired (their relay died or gave up): few rows, never bounded
            ("CLAIMED", "o.lease_until", None),
        ] {
            let mut qb = candidate_query(state, due, &slots, upto, want);
            let mut found: Vec<i64> = qb
                .build_query_scalar()
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| db_err("claim: candidates", e))?;
            candidates.append(&mut found);
        }
        if let Some(end) = end {
            if candidates.len() < want {
                let mut heads = self
                    .heads_past(&mut tx, &slots, end, want - candidates.len(), window)
                    .await?;
                candidates.append(&mut heads);
            }
        }
        candidates.sort_unstable();
        candidates.truncate(want);
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let rows = fetch_rows(
            &mut sql::lock_due(&candidates, req.limit),
            &mut *tx,
            "claim: lock",
        )
        .await?;
        if rows.len() < req.limit.min(candidates.len()) {
            // Short of both the limit and the candidates: some candidates were locked by a
            // concurrent transaction (SKIP LOCKED passed over them) or taken since they were
            // read. A plain read sees the locked ones still due (their claim has not
            // committed); those in the claim's window, less ours, were skipped.
            let window: i64 = sql::count_due(&candidates, req.limit)
                .build_query_scalar()
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| db_err("claim: contention count", e))?;
            let passed = (window - rows.len() as i64).max(0) as u64;
            self.skipped.fetch_add(passed, Ordering::Relaxed);
        }
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let mut items: Vec<ClaimedEvent> = rows.iter().map(claimed_from_row).collect();
        let mut qb = sql::claim_update("ferry_outbox", req, items.iter().map(|i| i.token.seq));
        let n = qb
            .build()
            .execute(&mut *tx)
            .await
            .map_err(|e| db_err("claim: update", e))?
            .rows_affected();
        if n as usize != items.len() {
            return Err(StoreError::new(
                StoreErrorKind::Other,
                format!(
                    "claim: updated {n} of {} locked rows; rolled back",
                    items.len()
                ),
            ));
        }
        for it in &mut items {
            it.token.claim_version += 1;
            it.token.claim_id = req.claim_id.clone();
        }
        tx.commit().await.map_err(|e| db_err("claim: commit", e))?;
        Ok(items)
    }

    /// The claimable heads past the window's end `after`, up to `need` of them, visiting about
    /// `aggregates` aggregates with a PENDING version (at most one statement's worth more) from
    /// where the last scan stopped (module docs). Each statement ([`sql::heads_after`]) reads the
    /// next [`sql::HEAD_ENTRIES`] PENDING index entries and starts after the last aggregate the
    /// previous one saw, so it covers at least one aggregate and as many as the entries hold:
    /// MariaDB reads a correlated "next aggregate" subquery as a scan from the front of the
    /// index, and chooses its loose index scan for `GROUP BY` only when the statistics (which
    /// count SENT rows too) make it look cheap.
    async fn heads_past(
        &self,
        conn: &mut MySqlConnection,
        slots: &[i16],
        after: i64,
        need: usize,
        aggregates: i64,
    ) -> Result<Vec<i64>, StoreError> {
        let mut from = self.heads_from.get();
        let mut heads = Vec::new();
        let mut visited = 0;
        let next = 'scan: loop {
            if visited >= aggregates {
                break Some(from);
            }
            let rows = sql::heads_after(slots, after, &from)
                .build()
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| db_err("claim: heads", e))?;
            let mut entries = 0;
            for row in &rows {
                let aggregate = txt(row, 0);
                entries += row.get::<i64, _>(3);
                visited += 1;
                if row.get::<i64, _>(2) != 0 {
                    heads.push(row.get::<i64, _>(1));
                    if heads.len() >= need {
                        break 'scan Some(aggregate);
                    }
                }
                from = aggregate;
            }
            // past the last aggregate: the next scan starts at the first
            if entries < sql::HEAD_ENTRIES {
                break None;
            }
        };
        self.heads_from.set(next);
        Ok(heads)
    }
}

/// The requested slots a claim may take rows of: with a fence, those whose live lease the owner
/// holds. A plain read (no share lock): a locking read made lease renewals queue behind slow
/// claims; a claim racing a takeover is harmless (rows are claimed under SKIP LOCKED and state,
/// never twice). Shared by row claims and cursor dispatch's exception claims.
pub(crate) async fn fenced_slots(
    conn: &mut MySqlConnection,
    req: &ClaimRequest,
) -> Result<Vec<i16>, StoreError> {
    let Some(f) = &req.fence else {
        return Ok(req.slots.iter().map(|s| *s as i16).collect());
    };
    sql::owned_slots("slot", &f.owner, "", &req.slots)
        .build_query_scalar()
        .fetch_all(conn)
        .await
        .map_err(|e| db_err("claim: slot fence", e))
}
