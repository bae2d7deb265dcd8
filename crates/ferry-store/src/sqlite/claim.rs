//! SQLite's row-dispatch claim: one `BEGIN IMMEDIATE` transaction (the database's one write lock,
//! taken up front, so no other writer interleaves) reading a bounded window at the front of the
//! backlog, then the heads of the aggregates past it, as on PostgreSQL and MariaDB
//! ([`crate::heads`]):
//! 1. **The window**: [`sql::window_end`] finds the seq of the [`window_rows`]-th row of the
//!    claim's slots that no live claim holds; [`sql::claim`] walks the dispatch index in `seq`
//!    order up to it, taking each due row that is its aggregate's lowest unfinished version.
//! 2. **Heads past it**, only when the window has an end and came back short of the limit:
//!    [`sql::heads_after`] visits at most [`window_rows`] aggregates with an unfinished version,
//!    in aggregate order from where the last scan stopped (a loose index scan of
//!    `ferry_outbox_unfinished`), and returns each one's lowest unfinished version and whether the
//!    claim may take it; [`sql::claim_seqs`] claims the first of those up to the limit. A scan
//!    that reached the last aggregate makes the next one start at the first.
//!
//! Walked without the bound, the claim's read went to the end of the backlog whenever fewer than
//! its limit qualified, holding the write lock (and every producer) the while: each claim cost
//! the whole backlog. Both steps claim only rows the claim's predicate accepts (due, the
//! aggregate's lowest unfinished version, in a live slot of the owner, not paused), and nothing
//! changes between them: the write lock is held from the first statement to the commit, so the
//! rows the window claimed are CLAIMED with a live lease when the heads are read, and no head can
//! be taken twice. Tests: `heads_past_a_deep_backlog_are_claimed`,
//! `predecessor_rule_past_the_window` and the rest of the store conformance suite.
use ferry_core::{now_micros, ClaimRequest, ClaimedEvent, StoreError};
use sqlx::{Row, SqliteConnection};

use super::sql::{self, COLUMNS};
use super::{claim_in, claimed_from_row, fence_owner, json_slots, SqliteStore};
use crate::error::{db_err, Ctx};
use crate::heads::window_rows;
use crate::time::micros;

impl SqliteStore {
    /// [`ferry_core::RowDispatch::claim`]: the window, then the heads past it (module docs).
    pub(super) async fn claim_window_then_heads(
        &self,
        req: &ClaimRequest,
    ) -> Result<Vec<ClaimedEvent>, StoreError> {
        let window = window_rows(req.limit);
        let mut tx = self.begin_write().await.ctx("claim: begin")?;
        let now = now_micros();
        let end: Option<i64> = sqlx::query_scalar(&sql::window_end(req.fence.is_some()))
            .bind(json_slots(&req.slots))
            .bind(now)
            .bind(fence_owner(req))
            .bind(window)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db_err("claim: window", e))?;
        let mut rows = claim_in(
            &mut tx,
            ("ferry_outbox", "o"),
            COLUMNS,
            req,
            now,
            end.unwrap_or(i64::MAX),
        )
        .await
        .map_err(|e| db_err("claim", e))?;
        if end.is_some() && rows.len() < req.limit {
            let seqs = self
                .heads_past(&mut tx, req, now, req.limit - rows.len(), window)
                .await?;
            if !seqs.is_empty() {
                let mut more = sqlx::query(&sql::claim_seqs())
                    .bind(serde_json::to_string(&seqs).expect("seqs serialize"))
                    .bind(now)
                    .bind(&req.claim_id)
                    .bind(micros(req.lease))
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(|e| db_err("claim: heads", e))?;
                rows.append(&mut more);
            }
        }
        tx.commit().await.map_err(|e| db_err("claim: commit", e))?;
        let mut items: Vec<ClaimedEvent> = rows.iter().map(claimed_from_row).collect();
        items.sort_by_key(|e| e.token.seq);
        Ok(items)
    }

    /// The seqs of up to `need` claimable heads, visiting at most `aggregates` aggregates from
    /// where the last scan stopped ([`sql::heads_after`]); records where the next one starts:
    /// after the last head taken when `need` were found, after the last aggregate visited when
    /// the scan stopped at `aggregates`, at the first aggregate when it reached the last one.
    async fn heads_past(
        &self,
        conn: &mut SqliteConnection,
        req: &ClaimRequest,
        now: i64,
        need: usize,
        aggregates: i64,
    ) -> Result<Vec<i64>, StoreError> {
        let rows = sqlx::query(&sql::heads_after(req.fence.is_some()))
            .bind(json_slots(&req.slots))
            .bind(now)
            .bind(fence_owner(req))
            .bind(self.heads_from.get())
            .bind(aggregates)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| db_err("claim: heads", e))?;
        let mut seqs = Vec::new();
        for row in &rows {
            if row.get::<Option<bool>, _>(2) == Some(true) {
                seqs.push(row.get::<i64, _>(1));
                if seqs.len() >= need {
                    self.heads_from.set(Some(row.get(0)));
                    return Ok(seqs);
                }
            }
        }
        let reached_the_end = (rows.len() as i64) < aggregates;
        self.heads_from.set(match rows.last() {
            Some(last) if !reached_the_end => Some(last.get(0)),
            _ => None,
        });
        Ok(seqs)
    }
}
