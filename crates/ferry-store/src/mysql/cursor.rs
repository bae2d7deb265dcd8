//! Cursor dispatch on MySQL/MariaDB: a horizon from the commit gate.
//!
//! MySQL shows SQL no transaction id or snapshot, so a bare `seq > cursor` read would skip a row
//! whose transaction drew its `seq` early and committed late. The horizon comes from locks
//! instead: the commit gate and its ticker ([`crate::mysql::ticker`]). Reads return committed
//! rows with `cursor < seq <= horizon` in `seq` order, as on SQLite, where the horizon is per
//! slot while a long producer transaction holds a gate row (it holds back only the slots it
//! wrote); [`ferry_core::CursorStore::horizon`] reports the oldest open transaction and how many slots wait
//! for it.
//!
//! MariaDB has no partial indexes, so the row-dispatch indexes of `ferry_outbox` would take an
//! entry for every intent in cursor dispatch too, which reads none of them: they exist only while
//! the outbox is in row dispatch ([`ROW_INDEXES`]).
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferry_core::{
    CasReport, ClaimRequest, ClaimedEvent, CursorAdvance, CursorBatch, CursorPos, CursorRead,
    DispatchMode, ExceptionOutcomes, HorizonInfo, SlotCursor, SlotId, StoreError,
};
use sqlx::mysql::MySqlConnection;
use sqlx::{Executor, Row};

use super::rows::claimed_from_row;
use super::sql;
use super::sql::{fetch_rows, owned_slots, ROW_INDEXES};
use super::MyStore;
use crate::error::{db_err, Ctx};
use crate::exceptions::claimed_exceptions;
use crate::lookup::advance_applied;
use crate::outcome::Outcome;
use crate::protocol::cursor::Cursor;
use crate::protocol::switch::Switch;
use crate::rows::cursor_from;
use crate::seq_read::{SeqRange, SeqRanges, SeqRead};

/// How long that DDL waits for the table's metadata lock (transactions open on the outbox; new
/// producer statements queue behind a waiting DDL) before it gives up.
const INDEX_DDL_WAIT_S: u32 = 10;

impl MyStore {
    /// Makes the row-dispatch indexes ([`ROW_INDEXES`]) match `mode`: present in row dispatch,
    /// absent in cursor dispatch. Idempotent, and a no-op (one catalogue read) when they match.
    /// MariaDB commits DDL on its own, so this runs after the mode switch's transaction; a crash
    /// in between leaves the indexes of the other mode, which the next switch or relay start
    /// (the switch runs this also when the mode is unchanged) puts right. Extra indexes in
    /// cursor dispatch cost producers time, never correctness; row dispatch needs them, so a
    /// failure to build them is an error.
    async fn fit_row_indexes(&self, mode: DispatchMode) -> Result<(), StoreError> {
        let mut q = sqlx::query_scalar::<_, String>(sql::DISPATCH_MODE_INDEXES);
        for (name, _) in ROW_INDEXES {
            q = q.bind(name);
        }
        let present = q
            .fetch_all(self.pool())
            .await
            .map_err(|e| db_err("dispatch mode: indexes", e))?;
        let changes: Vec<String> = ROW_INDEXES
            .iter()
            .filter(|(name, _)| present.iter().any(|p| p == name) == (mode == DispatchMode::Cursor))
            .map(|(name, cols)| match mode {
                DispatchMode::Cursor => format!("DROP INDEX IF EXISTS {name}"),
                DispatchMode::Row => format!("ADD INDEX IF NOT EXISTS {name} ({cols})"),
            })
            .collect();
        if changes.is_empty() {
            return Ok(());
        }
        // identifiers and columns are constants: nothing here comes from input
        let ddl = sql::row_index_ddl(INDEX_DDL_WAIT_S, &changes);
        self.pool()
            .execute(ddl.as_str())
            .await
            .map_err(|e| db_err("dispatch mode: indexes", e))?;
        tracing::info!(dispatch = %mode, indexes = ?changes, "fitted the outbox's row-dispatch indexes to the dispatch mode");
        Ok(())
    }

    /// Starts the ticker task once, and nudges it (a reader is waiting for the horizon).
    fn nudge_ticker(&self) {
        let t = self.ticker();
        if !t.started.swap(true, Ordering::AcqRel) {
            let pool = self.pool().clone();
            let weak = Arc::downgrade(t);
            tokio::spawn(crate::mysql::ticker::run_ticker(pool, weak));
        }
        t.wake.notify_one();
    }
}

/// The range reads of one [`ferry_core::CursorStore::read_batch`]: on the pool, and with the per-row hold
/// check only when the read found an open exception row (`held_possible`).
struct Ranges<'a> {
    conn: &'a mut MySqlConnection,
    held_possible: bool,
}

impl SeqRanges for Ranges<'_> {
    /// Reads on the read's one connection (no shared snapshot is needed: every seq at or below
    /// the horizon is final), so a read costs one trip through the pool, not one per statement.
    /// A row's aggregate is held when it has an open exception row; when the read found none
    /// at its start, no row can be, and the statement leaves out the per-row probe (a
    /// dependent subquery: about a third of the statement's server time for 2,000 rows).
    async fn read_range(&mut self, r: &SeqRange) -> Result<Vec<(ClaimedEvent, bool)>, StoreError> {
        let mut qb = sql::cursor_range(r, self.held_possible);
        let rows = fetch_rows(&mut qb, &mut *self.conn, "cursor read").await?;
        Ok(rows
            .iter()
            .map(|r| (claimed_from_row(r), r.get::<i64, _>(15) != 0))
            .collect())
    }
}

impl Switch for MyStore {
    const TO_CURSOR: &'static [&'static str] = &sql::TO_CURSOR;
    const TO_ROW: &'static [&'static str] = &sql::TO_ROW;

    /// The row-dispatch indexes, fitted also when the mode is unchanged (a crash between the
    /// switch's commit and its DDL); in cursor dispatch a failure only costs producers time.
    async fn after_switch(&self, mode: DispatchMode, _: bool) -> Result<(), StoreError> {
        match mode {
            DispatchMode::Row => self.fit_row_indexes(mode).await?,
            DispatchMode::Cursor => {
                if let Err(e) = self.fit_row_indexes(mode).await {
                    tracing::warn!(error = %e, "cursor dispatch: the row-dispatch indexes stay (producers pay for them; the next relay start tries again)");
                }
            }
        }
        Ok(())
    }
}

impl Cursor for MyStore {
    async fn load_cursors(
        &self,
        owner: &str,
        slots: &[SlotId],
    ) -> Result<Vec<SlotCursor>, StoreError> {
        if slots.is_empty() {
            return Ok(Vec::new());
        }
        self.nudge_ticker();
        let cursor = " AND cursor_seq IS NOT NULL";
        let mut qb = owned_slots(
            "slot, epoch, cursor_version, cursor_seq",
            owner,
            cursor,
            slots,
        );
        let rows: Vec<(i16, i64, i64, i64)> = qb
            .build_query_as()
            .fetch_all(self.pool())
            .await
            .map_err(|e| db_err("load cursors", e))?;
        Ok(rows
            .into_iter()
            .map(|(s, e, v, q)| cursor_from((s, e, v), CursorPos::new(0, q)))
            .collect())
    }

    async fn read_batch(&self, req: &CursorRead) -> Result<CursorBatch, StoreError> {
        let Some(plan) = SeqRead::new(req) else {
            return Ok(CursorBatch::default());
        };
        // Every seq at or below the horizon is final (committed or rolled back), so any
        // later read sees all of them: no shared snapshot is needed.
        //
        // Whether any exception row is open, read in the same statement, before the range
        // reads: an exception row that opens later comes from an advance of this reader
        // (the slot's owner) that committed after this read began, and the worker keeps
        // that aggregate busy (its later versions cut from reads) until a read that began
        // after the commit (docs/architecture.md, "Why several versions per batch cannot
        // reorder"). Operator actions and the exception path only move open rows between
        // open states or close them.
        let mut conn = self.pool().acquire().await.ctx("cursor read: connect")?;
        let (horizon, open) = crate::mysql::ticker::read_horizon(&mut conn).await?;
        let mut ranges = Ranges {
            conn: &mut conn,
            held_possible: open,
        };
        let batch = if horizon.partial.is_none() {
            let (batch, caught_up) = plan.run(&mut ranges, horizon.horizon).await?;
            if caught_up {
                // caught up with the horizon: ask the ticker for a newer one
                self.nudge_ticker();
            }
            batch
        } else {
            // A long transaction holds some slots: each group of slots reads to its own
            // horizon, the largest group's (the slots it did not write) first.
            drop(plan);
            let mut groups: BTreeMap<i64, Vec<(SlotId, CursorPos)>> = BTreeMap::new();
            for (s, p) in &req.from {
                groups.entry(horizon.of(*s)).or_default().push((*s, *p));
            }
            let mut groups: Vec<(i64, Vec<(SlotId, CursorPos)>)> = groups.into_iter().collect();
            groups.sort_by_key(|(_, slots)| std::cmp::Reverse(slots.len()));
            let mut out = CursorBatch::default();
            for (n, (h, from)) in groups.into_iter().enumerate() {
                let limit = req.limit.saturating_sub(out.events.len());
                if n > 0 && limit == 0 {
                    // the limit is reached: these slots stay where they are, for now
                    out.slot_upto.extend(from.iter().copied());
                    out.more = true;
                    continue;
                }
                let sub = CursorRead { from, limit };
                let Some(plan) = SeqRead::new(&sub) else {
                    continue;
                };
                let (b, caught_up) = plan.run(&mut ranges, h).await?;
                if n == 0 {
                    if caught_up {
                        self.nudge_ticker();
                    }
                    out.upto = b.upto;
                    out.slot_upto.extend(b.slot_upto.iter().copied());
                } else {
                    out.slot_upto
                        .extend(sub.from.iter().map(|(s, _)| (*s, b.upto_of(*s))));
                }
                out.more |= b.more;
                out.events.extend(b.events);
            }
            out.events.sort_by_key(|e| e.pos);
            out
        };
        Ok(batch)
    }

    async fn advance_cursors(
        c: &mut MySqlConnection,
        req: &CursorAdvance,
    ) -> Result<usize, sqlx::Error> {
        let moved = sql::advance_cursors(req)
            .build()
            .execute(&mut *c)
            .await?
            .rows_affected();
        Ok(moved as usize)
    }

    async fn insert_exceptions(
        c: &mut MySqlConnection,
        req: &CursorAdvance,
    ) -> Result<(), sqlx::Error> {
        for chunk in req.exceptions.chunks(500) {
            sql::insert_exceptions(chunk)
                .build()
                .execute(&mut *c)
                .await?;
        }
        Ok(())
    }

    async fn lookup_advance(&self, claim_id: &str) -> Result<bool, StoreError> {
        advance_applied(self.pool(), claim_id).await
    }

    async fn claim_exceptions(&self, req: &ClaimRequest) -> Result<Vec<ClaimedEvent>, StoreError> {
        let mut tx = self.pool().begin().await.ctx("claim exceptions: begin")?;
        let slots = super::claim::fenced_slots(&mut tx, req).await?;
        if slots.is_empty() {
            return Ok(Vec::new());
        }
        // Due exception rows with no open lower version of their aggregate, locked; a plain
        // read first (as the row claim does) so the predecessor probe locks nothing.
        let mut qb = sql::exception_candidates(&slots, req.limit);
        let candidates: Vec<i64> = qb
            .build_query_scalar()
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| db_err("claim exceptions: candidates", e))?;
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let mut qb = sql::lock_exceptions(&candidates);
        let locked: Vec<(i64, i64, i32)> = fetch_rows(&mut qb, &mut *tx, "claim exceptions: lock")
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        if locked.is_empty() {
            return Ok(Vec::new());
        }
        let mut qb = sql::claim_update("ferry_outbox_exception", req, locked.iter().map(|l| l.0));
        qb.build()
            .execute(&mut *tx)
            .await
            .map_err(|e| db_err("claim exceptions: update", e))?;
        let mut qb = sql::intents(locked.iter().map(|l| l.0));
        let rows = fetch_rows(&mut qb, &mut *tx, "claim exceptions: read").await?;
        tx.commit().await.ctx("claim exceptions: commit")?;
        // the update gave each locked row claim version + 1
        Ok(claimed_exceptions(
            rows.iter().map(claimed_from_row),
            locked.iter().map(|(s, cv, a)| (*s, *cv + 1, *a)),
            &req.claim_id,
        ))
    }

    async fn settle_exceptions(&self, out: &ExceptionOutcomes) -> Result<CasReport, StoreError> {
        // each category in a transaction of its own (as the row-dispatch outcomes)
        let mut report = CasReport::default();
        for o in Outcome::settling(out) {
            report
                .items
                .extend(self.cas_on("ferry_outbox_exception", &o).await?.items);
        }
        Ok(report)
    }

    async fn horizon(&self) -> Result<HorizonInfo, StoreError> {
        // The oldest open write transaction other than the ticker's: the one the next
        // horizon waits for if it inserted an intent (its "pid" is the connection id, for
        // KILL). INNODB_TRX needs the PROCESS privilege; without it nothing is reported.
        // While the ticker reads past transactions that hold a gate row for long, the slots
        // they wrote are the ones that wait.
        let row = sqlx::query(sql::HORIZON_OLDEST_TRANSACTION)
            .fetch_optional(self.pool())
            .await;
        Ok(match row {
            Ok(Some(r)) => HorizonInfo {
                oldest_xact_age_us: r.get::<Option<i64>, _>(0).map(|a| a.max(0)),
                oldest_xact_pid: r.get(1),
                held_slots: r
                    .get::<Option<i64>, _>(2)
                    .and_then(|n| u32::try_from(n).ok()),
            },
            Ok(None) => HorizonInfo::default(),
            Err(e) => {
                tracing::debug!(error = %e, "horizon: INNODB_TRX not readable");
                HorizonInfo::default()
            }
        })
    }
}
