//! Cursor dispatch on PostgreSQL: snapshot windows, as PgQ reads its event tables.
//!
//! Each row stores its inserting top-level transaction id (`ferry_outbox.xid`, default
//! `pg_current_xact_id()`). A *tick* stores a snapshot (`ferry_tick`); window `t` is the set of
//! rows whose transaction is visible in tick `t`'s snapshot and not in tick `t - 1`'s. Ticks
//! only grow (tick `t` is taken after tick `t - 1` committed), so every committed row is in
//! exactly one window, the first whose snapshot sees its transaction commit; and a window's row
//! set is fixed once its tick exists, so reading it in `seq` order in LIMIT-sized pieces can
//! never skip a row ("no skipped commit", whatever order transactions commit in). Within a
//! window the order is `seq`, never `xid`: a transaction takes its xid at its first write, and
//! may insert an aggregate's `v(n+1)` after a transaction with a higher xid committed `v(n)`;
//! the seq is drawn at the insert, after that commit. One read statement covers up to
//! `MAX_SPAN` (windows.rs) consecutive windows, each row's window being the first of their ticks whose
//! snapshot sees it, in `(window, seq)` order: positions keep their one-window meaning. A long
//! transaction delays only its own rows (it stays in the lower snapshots' running lists, which
//! reads look up by xid), and [`ferry_core::CursorStore::horizon`] reports it.
use std::collections::{HashMap, HashSet};

use ferry_core::{
    CasReport, ClaimRequest, ClaimToken, ClaimedEvent, CursorAdvance, CursorBatch, CursorEvent,
    CursorPos, CursorRead, ExceptionOutcomes, HorizonInfo, Payload, SlotCursor, SlotId, StoreError,
};
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::Row;

use super::sql::{self, read_sql, SlotBound};
use super::windows::{snapshot_bound, snapshot_xip};
use crate::error::{db_err, Ctx};
use crate::exceptions::exception_row;
use crate::outcome::Outcome;
use crate::postgres::{bind_claim, cas_on, slots_i16, PgStore, EXCEPTIONS};
use crate::protocol::cursor::Cursor;
use crate::rows::cursor_from;

/// Reads [`EVENT_COLUMNS`] starting at column `off`.
fn event_at(r: &PgRow, off: usize) -> ClaimedEvent {
    ClaimedEvent {
        token: ClaimToken {
            seq: r.get(off),
            event_id: r.get(off + 1),
            claim_id: r.get(off + 2),
            claim_version: r.get(off + 3),
        },
        aggregate_id: r.get(off + 4),
        aggregate_version: r.get(off + 5),
        shard_slot: r.get::<i16, _>(off + 6) as SlotId,
        topic: r.get(off + 7),
        key: r.get(off + 8),
        event_type: r.get(off + 9),
        headers: r.get(off + 10),
        payload: Payload::from_columns(r.get(off + 11), r.get(off + 12)),
        attempts: r.get(off + 13),
        created_at: r.get(off + 14),
    }
}

impl Cursor for PgStore {
    async fn load_cursors(
        &self,
        owner: &str,
        slots: &[SlotId],
    ) -> Result<Vec<SlotCursor>, StoreError> {
        // A position with an xid was written by a relay of a version that read windows in
        // (xid, seq) order; it goes back to its window's start (sent again, never skipped).
        let rows: Vec<(i16, i64, i64, i64, i64, i64)> = sqlx::query_as(sql::LOAD_CURSORS)
            .bind(owner)
            .bind(slots_i16(slots.iter().copied()))
            .fetch_all(self.pool())
            .await
            .map_err(|e| db_err("load cursors", e))?;
        Ok(rows
            .into_iter()
            .map(|(s, e, v, t, x, q)| cursor_from((s, e, v), CursorPos::at(t, x, q)))
            .collect())
    }

    async fn read_batch(&self, req: &CursorRead) -> Result<CursorBatch, StoreError> {
        let Some(min) = req.from.iter().map(|(_, p)| *p).min() else {
            return Ok(CursorBatch::default());
        };
        if req.limit == 0 {
            return Ok(CursorBatch {
                upto: min,
                ..CursorBatch::default()
            });
        }
        // Windows in order, from the lowest requested one, up to MAX_SPAN per statement:
        // each statement takes the slots whose position is in its span or below (rows at or
        // below a slot's own position are dropped), and a read goes on to the next span
        // while its first tick exists already (another reader took it), so a reader behind
        // the newest tick catches up in one call.
        let mut events = Vec::new();
        let mut t = min.tick;
        let mut start = min;
        let mut more = false;
        let upto = loop {
            let inside = start.tick == t && start.seq > 0;
            let span = self.span(t, inside, req.limit - events.len()).await?;
            let from: HashMap<SlotId, CursorPos> = req
                .from
                .iter()
                .copied()
                .filter(|(_, p)| p.tick <= span.last)
                .collect();
            let (lo_xmax, hi_xmax) = (snapshot_bound(&span.lo, 1)?, snapshot_bound(&span.hi, 1)?);
            let (lo_xip, hi_xip) = (snapshot_xip(&span.lo)?, snapshot_xip(&span.hi)?);
            let limit = req.limit - events.len();
            let one_window = span.last == t;
            if !one_window {
                // later windows of a span can hold lower xids than the start position
                start = CursorPos::at(t, i64::MIN, i64::MIN);
            }
            // Per slot, its position: rows a slot has read already are filtered here, so
            // they neither come back nor use up the limit when one slot lags the others (a
            // slot whose read was cut before an aggregate still in flight). Most reads have
            // every slot at one position (a batch's `upto` moves all the slots it read): one
            // bound for all, and in one window that bound is the start.
            let bound = |p: &CursorPos| {
                if p.tick >= t {
                    *p
                } else {
                    CursorPos::at(i64::MIN, i64::MIN, i64::MIN)
                }
            };
            let mut bounds = from.values().map(bound);
            let first = bounds.next();
            let uniform = first.filter(|b| bounds.all(|o| o == *b));
            let slot_bound = match uniform {
                Some(b) if one_window => {
                    if b.tick == t {
                        start = start.max(b);
                    }
                    SlotBound::Start
                }
                Some(_) => SlotBound::Uniform,
                None => SlotBound::PerSlot,
            };
            let n = ferry_core::SLOT_COUNT as usize;
            let slot_flags = from.len() < n;
            // At a window's start the primary-key scan begins at the window's lowest seq.
            let from_floor = start.seq <= 0;
            let sql = read_sql(one_window, from_floor, slot_flags, slot_bound);
            let mut q = sqlx::query(&sql)
                .bind(lo_xmax)
                .bind(hi_xmax)
                .bind(start.seq)
                .bind(span.seq_hi.unwrap_or(i64::MAX))
                .bind(&lo_xip)
                .bind(&hi_xip)
                .bind(limit as i64)
                .bind(t)
                .bind(span.last);
            if slot_flags {
                let mut read_slots = vec![false; n];
                for slot in from.keys() {
                    read_slots[*slot as usize] = true;
                }
                q = q.bind(read_slots);
            }
            match (slot_bound, uniform) {
                (SlotBound::Uniform, Some(b)) => q = q.bind(b.tick).bind(b.seq),
                (SlotBound::PerSlot, _) => {
                    let (mut ticks, mut seqs) = (vec![None::<i64>; n], vec![None::<i64>; n]);
                    for (slot, p) in &from {
                        let b = bound(p);
                        ticks[*slot as usize] = Some(b.tick);
                        seqs[*slot as usize] = Some(b.seq);
                    }
                    q = q.bind(ticks).bind(seqs);
                }
                _ => {}
            }
            let rows = q
                .fetch_all(self.pool())
                .await
                .map_err(|e| db_err("cursor read", e))?;
            // Positions are (window, seq): the xid is not part of the order.
            let pos = |r: &PgRow| CursorPos::at(r.get(1), 0, r.get(2));
            let full = rows.len() >= limit;
            let last = rows.last().map(pos);
            events.extend(
                rows.iter()
                    .filter(|r| {
                        let slot = r.get::<i16, _>(8) as SlotId;
                        from.get(&slot).is_some_and(|p| pos(r) > *p)
                    })
                    .map(|r| CursorEvent {
                        pos: pos(r),
                        held: r.get(17),
                        event: event_at(r, 2),
                    }),
            );
            match last {
                Some(last) if full => {
                    more = true;
                    break last;
                }
                // the span is read: the next read starts the window after it
                _ if !span.next => break CursorPos::at(span.last + 1, 0, 0),
                _ => {
                    t = span.last + 1;
                    start = CursorPos::at(t, 0, 0);
                }
            }
        };
        Ok(CursorBatch {
            events,
            upto,
            more,
            slot_upto: Vec::new(),
        })
    }

    async fn advance_cursors(
        c: &mut PgConnection,
        req: &CursorAdvance,
    ) -> Result<usize, sqlx::Error> {
        // rows are locked in slot order (as acquire_slots does): no deadlock between them.
        // The locking subquery is a CTE: evaluated once (as a join input it was rescanned,
        // and re-locked, for every slot: 67k buffer hits for 256 slots, 2.2k as a CTE).
        let mut slots = req.slots.clone();
        slots.sort_by_key(|s| s.slot);
        // Committed asynchronously, like the ticks: an advance lost in a server crash only
        // moves the cursor back, and its events are read and sent again (docs/architecture.md,
        // "The four crash windows"). Every later synchronous commit (a producer's, an
        // exception's SENT) flushes it first: the WAL is written in order.
        sqlx::query(sql::ADVANCE_ASYNC_COMMIT)
            .execute(&mut *c)
            .await?;
        let moved: Vec<i16> = sqlx::query_scalar(sql::ADVANCE_CURSORS)
            .bind(slots_i16(slots.iter().map(|s| s.slot)))
            .bind(slots.iter().map(|s| s.epoch).collect::<Vec<_>>())
            .bind(slots.iter().map(|s| s.version).collect::<Vec<_>>())
            .bind(slots.iter().map(|s| s.to.xid).collect::<Vec<_>>())
            .bind(slots.iter().map(|s| s.to.seq).collect::<Vec<_>>())
            .bind(&req.claim_id)
            .bind(&req.owner)
            .bind(slots.iter().map(|s| s.to.tick).collect::<Vec<_>>())
            .fetch_all(&mut *c)
            .await?;
        Ok(moved.into_iter().collect::<HashSet<i16>>().len())
    }

    async fn insert_exceptions(
        c: &mut PgConnection,
        req: &CursorAdvance,
    ) -> Result<(), sqlx::Error> {
        let rows: Vec<_> = req
            .exceptions
            .iter()
            .map(|x| (x, exception_row(&x.kind)))
            .collect();
        sqlx::query(sql::ADVANCE_EXCEPTIONS)
            .bind(rows.iter().map(|(x, _)| x.seq).collect::<Vec<_>>())
            .bind(slots_i16(rows.iter().map(|(x, _)| x.slot)))
            .bind(
                rows.iter()
                    .map(|(x, _)| x.aggregate_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                rows.iter()
                    .map(|(x, _)| x.aggregate_version)
                    .collect::<Vec<_>>(),
            )
            .bind(rows.iter().map(|(_, r)| r.0).collect::<Vec<_>>())
            .bind(rows.iter().map(|(_, r)| r.1).collect::<Vec<_>>())
            .bind(rows.iter().map(|(x, _)| x.attempts).collect::<Vec<_>>())
            .bind(rows.iter().map(|(_, r)| r.2).collect::<Vec<Option<&str>>>())
            .execute(&mut *c)
            .await
            .map(drop)
    }

    async fn lookup_advance(&self, claim_id: &str) -> Result<bool, StoreError> {
        sqlx::query_scalar(sql::LOOKUP_ADVANCE)
            .bind(claim_id)
            .fetch_one(self.pool())
            .await
            .map_err(|e| db_err("lookup advance", e))
    }

    async fn claim_exceptions(&self, req: &ClaimRequest) -> Result<Vec<ClaimedEvent>, StoreError> {
        let sql = sql::claim_exceptions(req);
        let rows = bind_claim(&sql, req)
            .fetch_all(self.pool())
            .await
            .map_err(|e| db_err("claim exceptions", e))?;
        Ok(rows
            .iter()
            .map(|r| {
                let mut e = event_at(r, 0);
                e.token.claim_id = r.get(15);
                e.token.claim_version = r.get(16);
                e.attempts = r.get(17);
                e
            })
            .collect())
    }

    async fn settle_exceptions(&self, out: &ExceptionOutcomes) -> Result<CasReport, StoreError> {
        let mut tx = self.pool().begin().await.ctx("settle exceptions: begin")?;
        let mut report = CasReport::default();
        for o in Outcome::settling(out) {
            report
                .items
                .extend(cas_on(&mut *tx, &EXCEPTIONS, &o).await?.items);
        }
        tx.commit().await.ctx("settle exceptions: commit")?;
        Ok(report)
    }

    async fn horizon(&self) -> Result<HorizonInfo, StoreError> {
        // The horizon (pg_snapshot_xmin) is the oldest xid still running anywhere in the
        // cluster: an open transaction that wrote (or asked for its xid), or a prepared one.
        let row: Option<(i64, Option<i64>)> = sqlx::query_as(sql::HORIZON)
            .fetch_optional(self.pool())
            .await
            .map_err(|e| db_err("horizon", e))?;
        Ok(match row {
            Some((pid, age)) => HorizonInfo {
                oldest_xact_age_us: age,
                oldest_xact_pid: Some(pid),
                held_slots: None,
            },
            None => HorizonInfo::default(),
        })
    }
}
