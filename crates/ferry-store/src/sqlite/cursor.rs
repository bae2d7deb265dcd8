//! Cursor dispatch on SQLite.
//!
//! SQLite has one writer at a time and a write transaction holds the write lock from its first
//! write to its commit, so AUTOINCREMENT `seq` order is commit order: a reader that sees row `n`
//! sees every row below it. The read's horizon is `sqlite_sequence`'s value for the outbox, read
//! in the same snapshot as the rows.
use ferry_core::{
    now_micros, CasReport, ClaimRequest, ClaimedEvent, CursorAdvance, CursorBatch, CursorPos,
    CursorRead, ExceptionOutcomes, SlotCursor, SlotId, StoreError,
};
use sqlx::{Row, SqliteConnection};

use super::sql;
use crate::error::{db_err, Ctx};
use crate::exceptions::{claimed_exceptions, exception_row};
use crate::lookup::advance_applied;
use crate::outcome::Outcome;
use crate::protocol::cursor::Cursor;
use crate::protocol::switch::Switch;
use crate::rows::cursor_from;
use crate::seq_read::{SeqRange, SeqRanges, SeqRead};
use crate::sqlite::{cas_in, SqliteStore};

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

impl Switch for SqliteStore {
    const TO_CURSOR: &'static [&'static str] = &sql::TO_CURSOR;
    const TO_ROW: &'static [&'static str] = &sql::TO_ROW;
}

impl Cursor for SqliteStore {
    async fn load_cursors(
        &self,
        owner: &str,
        slots: &[SlotId],
    ) -> Result<Vec<SlotCursor>, StoreError> {
        let rows: Vec<(i64, i64, i64, i64, i64)> = sqlx::query_as(sql::LOAD_CURSORS)
            .bind(owner)
            .bind(now_micros())
            .bind(json(slots))
            .fetch_all(self.pool())
            .await
            .map_err(|e| db_err("load cursors", e))?;
        Ok(rows
            .into_iter()
            .map(|(s, e, v, x, q)| cursor_from((s, e, v), CursorPos::new(x, q)))
            .collect())
    }

    async fn read_batch(&self, req: &CursorRead) -> Result<CursorBatch, StoreError> {
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
    }

    async fn advance_cursors(
        c: &mut SqliteConnection,
        req: &CursorAdvance,
    ) -> Result<usize, sqlx::Error> {
        let slots: Vec<serde_json::Value> = req
            .slots
            .iter()
            .map(|s| serde_json::json!([s.slot, s.epoch, s.version, s.to.xid, s.to.seq]))
            .collect();
        let moved: Vec<i64> = sqlx::query_scalar(sql::ADVANCE)
            .bind(serde_json::Value::Array(slots).to_string())
            .bind(&req.claim_id)
            .bind(&req.owner)
            .bind(now_micros())
            .fetch_all(&mut *c)
            .await?;
        Ok(moved.len())
    }

    async fn insert_exceptions(
        c: &mut SqliteConnection,
        req: &CursorAdvance,
    ) -> Result<(), sqlx::Error> {
        let now = now_micros();
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
            .execute(&mut *c)
            .await
            .map(drop)
    }

    async fn lookup_advance(&self, claim_id: &str) -> Result<bool, StoreError> {
        advance_applied(self.pool(), claim_id).await
    }

    async fn claim_exceptions(&self, req: &ClaimRequest) -> Result<Vec<ClaimedEvent>, StoreError> {
        let now = now_micros();
        let mut tx = self.begin_write().await.ctx("claim exceptions: begin")?;
        let claimed: Vec<(i64, i64, i32)> = crate::sqlite::claim_in(
            &mut tx,
            ("ferry_outbox_exception", "x"),
            "seq, claim_version, attempts",
            req,
            now,
            // exception rows are few: no window
            i64::MAX,
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
    }

    async fn settle_exceptions(&self, out: &ExceptionOutcomes) -> Result<CasReport, StoreError> {
        let now = now_micros();
        let mut tx = self.begin_write().await.ctx("settle exceptions: begin")?;
        let mut report = CasReport::default();
        for o in Outcome::settling(out) {
            let done = cas_in(&mut tx, "ferry_outbox_exception", &o, now).await?;
            report.items.extend(done.items);
        }
        tx.commit().await.ctx("settle exceptions: commit")?;
        Ok(report)
    }
}
