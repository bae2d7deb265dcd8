//! Cursor dispatch on SQLite.
//!
//! SQLite has one writer at a time and a write transaction holds the write lock from its first
//! write to its commit, so AUTOINCREMENT `seq` order is commit order: a reader that sees row `n`
//! sees every row below it. The read's horizon is `sqlite_sequence`'s value for the outbox, read
//! in the same snapshot as the rows.
use std::collections::HashSet;

use ferry_core::{
    now_micros, AdvanceResult, BoxFuture, CasReport, ClaimRequest, ClaimedEvent, CursorAdvance,
    CursorBatch, CursorPos, CursorRead, CursorStore, DispatchMode, ExceptionOutcomes, SlotCursor,
    SlotId, StoreError,
};
use sqlx::Row;

use super::sql;
use crate::error::{db_err, mode_in_use, Ctx};
use crate::exceptions::{claimed_exceptions, exception_row};
use crate::lookup::advance_applied;
use crate::outcome::Outcome;
use crate::request::{claiming, slotless_advance};
use crate::seq_read::{SeqRange, SeqRanges, SeqRead};
use crate::sqlite::SqliteStore;

fn json(v: &[impl Into<i64> + Copy]) -> String {
    let v: Vec<i64> = v.iter().map(|x| (*x).into()).collect();
    serde_json::to_string(&v).expect("serialize")
}

/// A cursor read's statements run in the read's transaction (one snapshot with the head).
impl SeqRanges for sqlx::SqliteConnection {
    async fn read_range(&mut self, r: &SeqRange) -> Result<Vec<(ClaimedEvent, bool)>, StoreError> {
        let rows = sqlx::query(&sql::read_range())
            .bind(r.lo)
            .bind(r.hi)
            .bind(json(&r.slots))
            .bind(r.limit as i64)
            .fetch_all(&mut *self)
            .await
            .map_err(|e| db_err("cursor read", e))?;
        Ok(rows
            .iter()
            .map(|r| (crate::sqlite::claimed_from_row(r), r.get::<bool, _>(14)))
            .collect())
    }
}

impl SqliteStore {
    pub(crate) async fn stored_mode(&self) -> Result<DispatchMode, StoreError> {
        crate::lookup::stored_mode::<_, String>(self.pool()).await
    }
}

impl CursorStore for SqliteStore {
    fn dispatch_mode(&self) -> BoxFuture<'_, Result<DispatchMode, StoreError>> {
        Box::pin(self.stored_mode())
    }

    fn set_dispatch_mode<'a>(
        &'a self,
        mode: DispatchMode,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let now = now_micros();
            let mut tx = self.begin_write().await.ctx("dispatch mode: begin")?;
            let current: String = sqlx::query_scalar(sql::DISPATCH_MODE)
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| db_err("dispatch mode", e))?;
            if current == mode.as_str() {
                return Ok(false);
            }
            let others: i64 = sqlx::query_scalar(sql::DISPATCH_MODE_MEMBERS)
                .bind(owner)
                .bind(now)
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| db_err("dispatch mode: members", e))?;
            if others > 0 {
                return Err(mode_in_use(&current, others, mode));
            }
            let stmts: &[&str] = match mode {
                DispatchMode::Cursor => &sql::TO_CURSOR,
                DispatchMode::Row => &sql::TO_ROW,
            };
            for s in stmts {
                sqlx::query(s)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_err("dispatch mode: convert", e))?;
            }
            sqlx::query(sql::DISPATCH_MODE_SET)
                .bind(mode.as_str())
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(|e| db_err("dispatch mode: set", e))?;
            tx.commit().await.ctx("dispatch mode: commit")?;
            Ok(true)
        })
    }

    fn load_cursors<'a>(
        &'a self,
        owner: &'a str,
        slots: &'a [SlotId],
    ) -> BoxFuture<'a, Result<Vec<SlotCursor>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(sql::LOAD_CURSORS)
                .bind(owner)
                .bind(now_micros())
                .bind(json(slots))
                .fetch_all(self.pool())
                .await
                .map_err(|e| db_err("load cursors", e))?;
            Ok(rows
                .iter()
                .map(|r| SlotCursor {
                    slot: r.get::<i64, _>(0) as SlotId,
                    epoch: r.get(1),
                    version: r.get(2),
                    pos: CursorPos::new(r.get(3), r.get(4)),
                })
                .collect())
        })
    }

    fn read_batch<'a>(
        &'a self,
        req: &'a CursorRead,
    ) -> BoxFuture<'a, Result<CursorBatch, StoreError>> {
        Box::pin(async move {
            let Some(plan) = SeqRead::new(req) else {
                return Ok(CursorBatch::default());
            };
            // One read transaction: the head and the rows come from the same snapshot.
            let mut tx = self.pool().begin().await.ctx("cursor read: begin")?;
            let head: i64 = sqlx::query_scalar(sql::CURSOR_READ_HEAD)
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| db_err("cursor read: head", e))?;
            let (batch, _) = plan.run(&mut *tx, head).await?;
            tx.commit().await.ctx("cursor read: end")?;
            Ok(batch)
        })
    }

    fn advance<'a>(
        &'a self,
        req: &'a CursorAdvance,
    ) -> BoxFuture<'a, Result<AdvanceResult, StoreError>> {
        Box::pin(async move {
            if let Some(done) = slotless_advance(req) {
                return done;
            }
            let now = now_micros();
            let slots: Vec<serde_json::Value> = req
                .slots
                .iter()
                .map(|s| serde_json::json!([s.slot, s.epoch, s.version, s.to.xid, s.to.seq]))
                .collect();
            let mut tx = self.begin_write().await.ctx("advance: begin")?;
            let moved: Vec<i64> = sqlx::query_scalar(sql::ADVANCE)
                .bind(serde_json::Value::Array(slots).to_string())
                .bind(&req.claim_id)
                .bind(&req.owner)
                .bind(now)
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| db_err("advance", e))?;
            let distinct: HashSet<SlotId> = req.slots.iter().map(|s| s.slot).collect();
            if moved.len() != distinct.len() {
                // dropping the transaction rolls it back: nothing of this advance is written
                return Ok(AdvanceResult::Fenced);
            }
            if !req.exceptions.is_empty() {
                let items: Vec<serde_json::Value> = req
                    .exceptions
                    .iter()
                    .map(|x| {
                        let (state, delay, err) = exception_row(&x.kind);
                        let due = now.saturating_add(delay);
                        serde_json::json!([
                            x.seq,
                            x.slot,
                            x.aggregate_id,
                            x.aggregate_version,
                            state,
                            due,
                            x.attempts,
                            err
                        ])
                    })
                    .collect();
                sqlx::query(sql::ADVANCE_EXCEPTIONS)
                    .bind(serde_json::Value::Array(items).to_string())
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_err("advance: exceptions", e))?;
            }
            tx.commit().await.ctx("advance: commit")?;
            Ok(AdvanceResult::Applied)
        })
    }

    fn lookup_advance<'a>(&'a self, claim_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(advance_applied(self.pool(), claim_id))
    }

    fn claim_exceptions<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>> {
        Box::pin(claiming(req, async move {
            let now = now_micros();
            let mut tx = self.begin_write().await.ctx("claim exceptions: begin")?;
            let claimed: Vec<(i64, i64, i32)> = crate::sqlite::claim_in(
                &mut tx,
                ("ferry_outbox_exception", "x"),
                "seq, claim_version, attempts",
                req,
                now,
            )
            .await
            .and_then(|rows| rows.iter().map(sqlx::FromRow::from_row).collect())
            .map_err(|e| db_err("claim exceptions", e))?;
            if claimed.is_empty() {
                return Ok(Vec::new());
            }
            let seqs: Vec<i64> = claimed.iter().map(|c| c.0).collect();
            let rows = sqlx::query(&sql::events_by_seq())
                .bind(json(&seqs))
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| db_err("claim exceptions: read", e))?;
            tx.commit().await.ctx("claim exceptions: commit")?;
            Ok(claimed_exceptions(
                rows.iter().map(crate::sqlite::claimed_from_row),
                claimed,
                &req.claim_id,
            ))
        }))
    }

    fn settle_exceptions<'a>(
        &'a self,
        out: &'a ExceptionOutcomes,
    ) -> BoxFuture<'a, Result<CasReport, StoreError>> {
        Box::pin(async move {
            let now = now_micros();
            let mut tx = self.begin_write().await.ctx("settle exceptions: begin")?;
            let mut report = CasReport::default();
            for o in Outcome::settling(out) {
                let done =
                    crate::sqlite::cas_in(&mut tx, "ferry_outbox_exception", &o, now).await?;
                report.items.extend(done.items);
            }
            tx.commit().await.ctx("settle exceptions: commit")?;
            Ok(report)
        })
    }
}
