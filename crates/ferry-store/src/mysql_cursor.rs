//! Cursor dispatch on MySQL/MariaDB: a horizon from the commit gate.
//!
//! MySQL shows SQL no transaction id or snapshot, so a bare `seq > cursor` read would skip a row
//! whose transaction drew its `seq` early and committed late. The horizon comes from locks
//! instead (migration 0003):
//! * every transaction that inserts an intent holds a shared lock on one of two gate rows
//!   (`ferry_commit_gate`) from before its first `seq` is drawn until it ends (the
//!   `ferry_outbox_gate` trigger; a shared request `SKIP LOCKED` passes over a row that is held
//!   or awaited exclusively, so a producer does not wait for the ticker; MariaDB 10.11 ignores
//!   `SKIP LOCKED` in a trigger from a statement's second row on, so later rows re-take the gate
//!   the first row took);
//! * one ticker per database (a relay that won `GET_LOCK('ferry_ticker:<db>')`) alternates: while
//!   it holds row `g` exclusively, every producer that could still be open holds `g'`; it reads
//!   the head `M = max(seq)`, releases `g` and waits for `g'` exclusively. When that is granted,
//!   every transaction that held `g'` when `M` was read has ended, so every `seq <= M` is
//!   committed or rolled back: `M` becomes the horizon (`ferry_horizon`, published with the next
//!   release).
//!
//! Reads return committed rows with `cursor < seq <= horizon` in `seq` order, as on SQLite. The
//! price: an open producer transaction holds the horizon (not other producers) until it ends;
//! [`CursorStore::horizon`] reports the oldest one.
//!
//! MariaDB has no partial indexes, so the row-dispatch indexes of `ferry_outbox` would take an
//! entry for every intent in cursor dispatch too, which reads none of them: they exist only while
//! the outbox is in row dispatch ([`ROW_INDEXES`]).
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ferry_core::{
    AdvanceResult, BoxFuture, CasReport, ClaimRequest, ClaimedEvent, CursorAdvance, CursorBatch,
    CursorPos, CursorRead, CursorStore, DispatchMode, ExceptionOutcomes, HorizonInfo, SlotCursor,
    SlotId, StoreError,
};
use sqlx::mysql::MySqlConnection;
use sqlx::{Connection, Executor, MySql, MySqlPool, QueryBuilder, Row};

use crate::common::{
    advance_applied, claimed_exceptions, claiming, exception_row, micros, mode_in_use,
    slotless_advance, Ctx, SeqRange, SeqRanges, SeqRead,
};
use crate::db_err;
use crate::mysql::{claimed_from_row, push_list, MyStore, COLUMNS};
use crate::outcome::Outcome;

/// The ticker's pace while intents keep arriving, and its poll when nothing does (a reader that
/// caught up wakes it at once).
const BUSY_TICK: Duration = Duration::from_millis(1);
const IDLE_TICK: Duration = Duration::from_millis(50);
/// The ticker writes `ferry_horizon.ticked_at` at least this often, even when nothing is new.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// A ticker that has not written `ticked_at` for this long while holding the election lock (a
/// paused or hung process; or one waiting this long for an open producer transaction) has its
/// connection killed by a relay that wants to tick, which then takes over.
const STALE_TICKER_S: i64 = 30;

/// The row-dispatch indexes of `ferry_outbox` (migrations 0001 and 0002) and their columns.
/// Cursor dispatch never reads them and never updates an outbox row, but without partial
/// indexes each one still takes an entry for every intent a producer writes: a switch to cursor
/// dispatch drops them, a switch to row dispatch builds them again (row claims force
/// `ferry_outbox_due`).
const ROW_INDEXES: [(&str, &str); 4] = [
    (
        "ferry_outbox_due",
        "state, seq, shard_slot, available_at, lease_until",
    ),
    (
        "ferry_outbox_predecessor",
        "aggregate_id, state, aggregate_version",
    ),
    ("ferry_outbox_claim_id", "claim_id"),
    ("ferry_outbox_sent_at", "state, sent_at"),
];
/// How long that DDL waits for the table's metadata lock (transactions open on the outbox; new
/// producer statements queue behind a waiting DDL) before it gives up.
const INDEX_DDL_WAIT_S: u32 = 10;

/// `COLUMNS` qualified with `o.`, in the order [`claimed_from_row`] reads.
const COLUMNS_O: &str =
    "o.seq, o.event_id, o.claim_id, o.claim_version, o.aggregate_id, o.aggregate_version, \
    o.shard_slot, o.topic, o.msg_key, o.event_type, o.headers, o.payload, o.attempts, \
    TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', o.created_at)";

/// The store's handle on its ticker task (started by the first cursor read).
#[derive(Debug, Default)]
pub(crate) struct Ticker {
    started: AtomicBool,
    wake: tokio::sync::Notify,
}

impl MyStore {
    pub(crate) async fn stored_mode(&self) -> Result<DispatchMode, StoreError> {
        crate::common::stored_mode::<_, Vec<u8>>(self.pool()).await
    }

    /// The mode switch's transaction (docs/schema.md, "Switching modes"): `false` when the
    /// outbox is in `mode` already.
    async fn convert_mode(&self, mode: DispatchMode, owner: &str) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await.ctx("dispatch mode: begin")?;
        let current: Vec<u8> =
            sqlx::query_scalar("SELECT mode FROM ferry_dispatch WHERE id = 1 FOR UPDATE")
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| db_err("dispatch mode", e))?;
        let current = String::from_utf8_lossy(&current).into_owned();
        if current == mode.as_str() {
            return Ok(false);
        }
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM ferry_relay_member WHERE owner <> ? AND lease_until > UTC_TIMESTAMP(6)",
        )
        .bind(owner)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| db_err("dispatch mode: members", e))?;
        if others > 0 {
            return Err(mode_in_use(&current, others, mode));
        }
        let stmts: &[&str] = match mode {
            DispatchMode::Cursor => &[
                // Quarantined rows stay parked as exception rows (they hold their successors).
                "INSERT INTO ferry_outbox_exception (seq, shard_slot, aggregate_id, aggregate_version, state, \
                   available_at, attempts, last_error, resolved_by, resolved_at) \
                 SELECT seq, shard_slot, aggregate_id, aggregate_version, state, available_at, attempts, \
                   last_error, resolved_by, resolved_at \
                 FROM ferry_outbox WHERE state = 'QUARANTINED' \
                 ON DUPLICATE KEY UPDATE state = VALUES(state)",
                // Each slot's cursor sits just below its first unfinished row (or at the
                // head): the cursor sends the row-mode backlog in order and passes over rows
                // row mode already finished (their state is not PENDING).
                "UPDATE ferry_slot_lease l \
                 LEFT JOIN (SELECT shard_slot, min(seq) - 1 AS below FROM ferry_outbox \
                            WHERE state IN ('PENDING', 'CLAIMED') GROUP BY shard_slot) u ON u.shard_slot = l.slot \
                 SET l.cursor_seq = coalesce(u.below, (SELECT coalesce(max(seq), 0) FROM ferry_outbox)), \
                   l.cursor_version = l.cursor_version + 1, l.cursor_claim_id = NULL, \
                   l.epoch = l.epoch + 1, l.owner = NULL, l.lease_until = NULL",
            ],
            DispatchMode::Row => &[
                // Rows behind their slot's cursor take the state the cursor gave them (the
                // view's effective state, written out: MySQL cannot update a table through a
                // view of itself). SET runs left to right: `state` goes last.
                "UPDATE ferry_outbox o JOIN ferry_slot_lease l ON l.slot = o.shard_slot \
                 LEFT JOIN ferry_outbox_exception x ON x.seq = o.seq \
                 SET o.sent_at = CASE WHEN coalesce(x.state, CASE WHEN o.state NOT IN ('PENDING', 'CLAIMED') THEN o.state \
                       WHEN l.cursor_seq IS NOT NULL AND o.seq <= l.cursor_seq THEN 'SENT' ELSE 'PENDING' END) = 'SENT' \
                       THEN coalesce(o.sent_at, x.sent_at, UTC_TIMESTAMP(6)) END, \
                   o.attempts = coalesce(x.attempts, o.attempts), o.last_error = coalesce(x.last_error, o.last_error), \
                   o.resolved_by = coalesce(x.resolved_by, o.resolved_by), \
                   o.available_at = coalesce(x.available_at, o.available_at), o.lease_until = NULL, \
                   o.state = CASE coalesce(x.state, CASE WHEN o.state NOT IN ('PENDING', 'CLAIMED') THEN o.state \
                       WHEN l.cursor_seq IS NOT NULL AND o.seq <= l.cursor_seq THEN 'SENT' ELSE 'PENDING' END) \
                     WHEN 'CLAIMED' THEN 'PENDING' \
                     ELSE coalesce(x.state, CASE WHEN o.state NOT IN ('PENDING', 'CLAIMED') THEN o.state \
                       WHEN l.cursor_seq IS NOT NULL AND o.seq <= l.cursor_seq THEN 'SENT' ELSE 'PENDING' END) END \
                 WHERE x.seq IS NOT NULL OR o.state = 'CLAIMED' \
                   OR (o.state = 'PENDING' AND l.cursor_seq IS NOT NULL AND o.seq <= l.cursor_seq)",
                "DELETE FROM ferry_outbox_exception",
                "UPDATE ferry_slot_lease SET cursor_seq = NULL, cursor_claim_id = NULL, \
                   cursor_version = cursor_version + 1, epoch = epoch + 1, owner = NULL, lease_until = NULL",
            ],
        };
        for s in stmts {
            sqlx::query(s)
                .execute(&mut *tx)
                .await
                .map_err(|e| db_err("dispatch mode: convert", e))?;
        }
        sqlx::query(
            "UPDATE ferry_dispatch SET mode = ?, changed_at = UTC_TIMESTAMP(6) WHERE id = 1",
        )
        .bind(mode.as_str())
        .execute(&mut *tx)
        .await
        .map_err(|e| db_err("dispatch mode: set", e))?;
        tx.commit().await.ctx("dispatch mode: commit")?;
        Ok(true)
    }

    /// Makes the row-dispatch indexes ([`ROW_INDEXES`]) match `mode`: present in row dispatch,
    /// absent in cursor dispatch. Idempotent, and a no-op (one catalogue read) when they match.
    /// MariaDB commits DDL on its own, so this runs after the mode switch's transaction; a crash
    /// in between leaves the indexes of the other mode, which the next switch or relay start
    /// (the switch runs this also when the mode is unchanged) puts right. Extra indexes in
    /// cursor dispatch cost producers time, never correctness; row dispatch needs them, so a
    /// failure to build them is an error.
    async fn fit_row_indexes(&self, mode: DispatchMode) -> Result<(), StoreError> {
        let mut q = sqlx::query_scalar::<_, String>(
            "SELECT DISTINCT CAST(index_name AS CHAR) FROM information_schema.STATISTICS \
             WHERE table_schema = DATABASE() AND table_name = 'ferry_outbox' \
               AND index_name IN (?, ?, ?, ?)",
        );
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
        // identifiers and columns are the constants above: nothing here comes from input
        let ddl = format!(
            "ALTER TABLE ferry_outbox WAIT {INDEX_DDL_WAIT_S} {}",
            changes.join(", ")
        );
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
            tokio::spawn(run_ticker(pool, weak));
        }
        t.wake.notify_one();
    }
}

/// The range reads of one [`CursorStore::read_batch`]: on the pool, and with the per-row hold
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
        let held = if self.held_possible {
            "EXISTS (SELECT 1 FROM ferry_outbox_exception x \
               WHERE x.aggregate_id = o.aggregate_id AND x.state IN ('PENDING', 'CLAIMED', 'QUARANTINED'))"
        } else {
            "0"
        };
        let mut qb = QueryBuilder::<MySql>::new(format!(
            "SELECT {COLUMNS_O}, {held} FROM ferry_outbox o WHERE o.seq > "
        ));
        qb.push_bind(r.lo)
            .push(" AND o.seq <= ")
            .push_bind(r.hi)
            .push(" AND o.shard_slot IN (");
        push_list(&mut qb, r.slots.iter().map(|s| *s as i16));
        qb.push(") AND o.state IN ('PENDING', 'CLAIMED') ORDER BY o.seq LIMIT ")
            .push_bind(r.limit as i64);
        let rows = qb
            .build()
            .fetch_all(&mut *self.conn)
            .await
            .map_err(|e| db_err("cursor read", e))?;
        Ok(rows
            .iter()
            .map(|r| (claimed_from_row(r), r.get::<i64, _>(14) != 0))
            .collect())
    }
}

/// Runs ticker sessions until the store is dropped; a failed session (lost connection, lock
/// wait timeout) starts over after a pause.
async fn run_ticker(pool: MySqlPool, ticker: Weak<Ticker>) {
    loop {
        match tick_session(&pool, &ticker).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cursor horizon ticker: starting over");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        if ticker.upgrade().is_none() {
            return;
        }
    }
}

async fn gate_wait(conn: &mut MySqlConnection, parity: i8) -> Result<(), StoreError> {
    conn.execute("START TRANSACTION")
        .await
        .map_err(|e| db_err("ticker: begin", e))?;
    sqlx::query("SELECT parity FROM ferry_commit_gate WHERE parity = ? FOR UPDATE")
        .bind(parity)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| db_err("ticker: gate", e))?;
    Ok(())
}

/// One ticker session on a dedicated connection: wins the election (or waits for it), then
/// alternates the gate rows and publishes each closed head. Returns `Ok` when the store is gone.
async fn tick_session(pool: &MySqlPool, ticker: &Weak<Ticker>) -> Result<(), StoreError> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| db_err("ticker: connect", e))?
        .detach();
    // The pool's sessions end transactions idle for 10 s; the ticker's must not end that way
    // (it would look like a crash): a stopped ticker is replaced by the stale-ticker check below
    // instead, whether it stopped inside a transaction or between two. (MySQL has no such
    // variable: the error is ignored.)
    let _ = conn
        .execute("SET SESSION idle_transaction_timeout = 0")
        .await;
    // Another process may tick this database: wait for its lock (it is released when that
    // process's connection ends), checking now and then that this store still exists.
    // `unregistered`: a holder of the lock that has not (yet) written its connection id into
    // `ferry_horizon`, and since when this session has seen it so.
    let mut unregistered: Option<(i64, tokio::time::Instant)> = None;
    loop {
        let got: Option<i64> =
            sqlx::query_scalar("SELECT GET_LOCK(CONCAT('ferry_ticker:', DATABASE()), 1)")
                .fetch_one(&mut conn)
                .await
                .map_err(|e| db_err("ticker: election", e))?;
        if got == Some(1) {
            break;
        }
        if ticker.upgrade().is_none() {
            return Ok(());
        }
        // The holder stopped ticking (a stopped process keeps its connection, and with it the
        // lock, outside any transaction the server would time out): end its session. Killing a
        // ticker is always safe; the horizon only moves on a closed head. A holder that stopped
        // between winning the lock and registering (the next statements below) never writes
        // `ticked_at`: it is stale once this session has seen it unregistered for as long.
        let (holder, registered, stale): (Option<i64>, Option<i64>, i64) = sqlx::query_as(
            "SELECT CAST(IS_USED_LOCK(CONCAT('ferry_ticker:', DATABASE())) AS SIGNED), ticker_conn, \
               CAST(coalesce(ticked_at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND, 0) AS SIGNED) \
             FROM ferry_horizon WHERE id = 1",
        )
        .bind(STALE_TICKER_S)
        .fetch_one(&mut conn)
        .await
        .map_err(|e| db_err("ticker: stale check", e))?;
        let Some(holder) = holder else {
            unregistered = None;
            continue;
        };
        let kill = if registered == Some(holder) {
            unregistered = None;
            stale == 1
        } else {
            match unregistered {
                Some((h, since)) if h == holder => {
                    since.elapsed() >= Duration::from_secs(STALE_TICKER_S as u64)
                }
                _ => {
                    unregistered = Some((holder, tokio::time::Instant::now()));
                    false
                }
            }
        };
        if kill {
            tracing::warn!(
                connection = holder,
                "cursor horizon ticker: the elected ticker has not ticked for {STALE_TICKER_S} s; ending its session and taking over"
            );
            unregistered = None;
            // KILL takes no placeholder; `holder` is an integer read from the database
            if let Err(e) = conn
                .execute(format!("KILL CONNECTION {holder}").as_str())
                .await
            {
                tracing::warn!(error = %e, "cursor horizon ticker: cannot end the stale ticker's session");
            }
        }
    }
    let me: i64 = sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
        .fetch_one(&mut conn)
        .await
        .map_err(|e| db_err("ticker: connection id", e))?;
    // claim the ticker's row at once, so a ticker that hangs before its first horizon can be
    // recognised as stale too
    sqlx::query(
        "UPDATE ferry_horizon SET ticker_conn = ?, ticked_at = UTC_TIMESTAMP(6) WHERE id = 1",
    )
    .bind(me)
    .execute(&mut conn)
    .await
    .map_err(|e| db_err("ticker: register", e))?;
    let mut held: i8 = 0;
    gate_wait(&mut conn, held).await?;
    // `closed`: a head every transaction of which has ended (publishable); `published`: the
    // last value written.
    let mut closed: Option<i64> = None;
    let mut published: Option<i64> = None;
    let mut beat = tokio::time::Instant::now();
    loop {
        let Some(t) = ticker.upgrade() else {
            let _ = conn.close().await;
            return Ok(());
        };
        // Holding `held` exclusively: every transaction that may still own a seq below the
        // head read now holds the other row.
        let head: i64 =
            sqlx::query_scalar("SELECT CAST(coalesce(max(seq), 0) AS SIGNED) FROM ferry_outbox")
                .fetch_one(&mut conn)
                .await
                .map_err(|e| db_err("ticker: head", e))?;
        if closed.is_some() && (closed != published || beat.elapsed() >= HEARTBEAT) {
            sqlx::query(
                "UPDATE ferry_horizon SET horizon_seq = GREATEST(horizon_seq, ?), \
                 ticked_at = UTC_TIMESTAMP(6), ticker_conn = ? WHERE id = 1",
            )
            .bind(closed)
            .bind(me)
            .execute(&mut conn)
            .await
            .map_err(|e| db_err("ticker: publish", e))?;
            published = closed;
            beat = tokio::time::Instant::now();
        }
        conn.execute("COMMIT")
            .await
            .map_err(|e| db_err("ticker: release", e))?;
        if Some(head) != closed {
            tokio::time::sleep(BUSY_TICK).await;
        } else {
            tokio::select! {
                _ = t.wake.notified() => {}
                _ = tokio::time::sleep(IDLE_TICK) => {}
            }
        }
        drop(t);
        held = 1 - held;
        gate_wait(&mut conn, held).await?;
        closed = Some(head);
    }
}

impl CursorStore for MyStore {
    fn dispatch_mode(&self) -> BoxFuture<'_, Result<DispatchMode, StoreError>> {
        Box::pin(self.stored_mode())
    }

    fn set_dispatch_mode<'a>(
        &'a self,
        mode: DispatchMode,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let changed = self.convert_mode(mode, owner).await?;
            match mode {
                DispatchMode::Row => self.fit_row_indexes(mode).await?,
                DispatchMode::Cursor => {
                    if let Err(e) = self.fit_row_indexes(mode).await {
                        tracing::warn!(error = %e, "cursor dispatch: the row-dispatch indexes stay (producers pay for them; the next relay start tries again)");
                    }
                }
            }
            Ok(changed)
        })
    }

    fn load_cursors<'a>(
        &'a self,
        owner: &'a str,
        slots: &'a [SlotId],
    ) -> BoxFuture<'a, Result<Vec<SlotCursor>, StoreError>> {
        Box::pin(async move {
            if slots.is_empty() {
                return Ok(Vec::new());
            }
            self.nudge_ticker();
            let mut qb = QueryBuilder::<MySql>::new(
                "SELECT slot, epoch, cursor_version, cursor_seq FROM ferry_slot_lease WHERE owner = ",
            );
            qb.push_bind(owner).push(
                " AND lease_until > UTC_TIMESTAMP(6) AND cursor_seq IS NOT NULL AND slot IN (",
            );
            push_list(&mut qb, slots.iter().map(|s| *s as i16));
            qb.push(") ORDER BY slot");
            let rows = qb
                .build()
                .fetch_all(self.pool())
                .await
                .map_err(|e| db_err("load cursors", e))?;
            Ok(rows
                .iter()
                .map(|r| SlotCursor {
                    slot: r.get::<i16, _>(0) as SlotId,
                    epoch: r.get(1),
                    version: r.get(2),
                    pos: CursorPos::new(0, r.get(3)),
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
            let (horizon, open): (i64, i64) = sqlx::query_as(
                "SELECT horizon_seq, EXISTS (SELECT 1 FROM ferry_outbox_exception \
                   WHERE state IN ('PENDING', 'CLAIMED', 'QUARANTINED')) \
                 FROM ferry_horizon WHERE id = 1",
            )
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| db_err("cursor read: horizon", e))?;
            let mut ranges = Ranges {
                conn: &mut conn,
                held_possible: open != 0,
            };
            let (batch, caught_up) = plan.run(&mut ranges, horizon).await?;
            if caught_up {
                // caught up with the horizon: ask the ticker for a newer one
                self.nudge_ticker();
            }
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
            let distinct: HashSet<SlotId> = req.slots.iter().map(|s| s.slot).collect();
            let mut tx = self.pool().begin().await.ctx("advance: begin")?;
            let mut qb =
                QueryBuilder::<MySql>::new("UPDATE ferry_slot_lease SET cursor_seq = CASE slot");
            for s in &req.slots {
                qb.push(" WHEN ")
                    .push_bind(s.slot as i16)
                    .push(" THEN ")
                    .push_bind(s.to.seq);
            }
            qb.push(" END, cursor_version = cursor_version + 1, cursor_claim_id = ")
                .push_bind(&req.claim_id)
                .push(" WHERE owner = ")
                .push_bind(&req.owner)
                .push(" AND lease_until > UTC_TIMESTAMP(6) AND cursor_seq IS NOT NULL AND (slot, epoch, cursor_version) IN (");
            let mut sep = false;
            for s in &req.slots {
                if sep {
                    qb.push(", ");
                }
                sep = true;
                qb.push("(")
                    .push_bind(s.slot as i16)
                    .push(", ")
                    .push_bind(s.epoch)
                    .push(", ")
                    .push_bind(s.version)
                    .push(")");
            }
            qb.push(")");
            let moved = qb
                .build()
                .execute(&mut *tx)
                .await
                .map_err(|e| db_err("advance", e))?
                .rows_affected();
            if moved as usize != distinct.len() {
                // dropping the transaction rolls it back: nothing of this advance is written
                return Ok(AdvanceResult::Fenced);
            }
            for chunk in req.exceptions.chunks(500) {
                let mut qb = QueryBuilder::<MySql>::new(
                    "INSERT INTO ferry_outbox_exception (seq, shard_slot, aggregate_id, aggregate_version, state, \
                       available_at, attempts, last_error) ",
                );
                qb.push_values(chunk, |mut b, x| {
                    let (state, delay, err) = exception_row(&x.kind);
                    b.push_bind(x.seq)
                        .push_bind(x.slot as i16)
                        .push_bind(&x.aggregate_id)
                        .push_bind(x.aggregate_version)
                        .push_bind(state)
                        .push("UTC_TIMESTAMP(6) + INTERVAL ")
                        .push_bind_unseparated(delay)
                        .push_unseparated(" MICROSECOND")
                        .push_bind(x.attempts)
                        .push_bind(err.map(str::to_string));
                });
                // an exception row already there (a resend) keeps its state
                qb.push(" ON DUPLICATE KEY UPDATE seq = seq");
                qb.build()
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
            let mut tx = self.pool().begin().await.ctx("claim exceptions: begin")?;
            let slots = crate::mysql::fenced_slots(&mut tx, req).await?;
            if slots.is_empty() {
                return Ok(Vec::new());
            }
            // Due exception rows with no open lower version of their aggregate, locked; a plain
            // read first (as the row claim does) so the predecessor probe locks nothing.
            let mut qb = QueryBuilder::<MySql>::new(
                "SELECT x.seq FROM ferry_outbox_exception x WHERE x.shard_slot IN (",
            );
            push_list(&mut qb, slots.iter().copied());
            qb.push(
                ") AND ((x.state = 'PENDING' AND x.available_at <= UTC_TIMESTAMP(6)) \
                   OR (x.state = 'CLAIMED' AND x.lease_until <= UTC_TIMESTAMP(6))) \
                 AND NOT EXISTS (SELECT 1 FROM ferry_outbox_exception p WHERE p.aggregate_id = x.aggregate_id \
                   AND p.state IN ('PENDING', 'CLAIMED', 'QUARANTINED') AND p.aggregate_version < x.aggregate_version) \
                 ORDER BY x.seq LIMIT ",
            )
            .push_bind(req.limit as i64);
            let candidates: Vec<i64> = qb
                .build_query_scalar()
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| db_err("claim exceptions: candidates", e))?;
            if candidates.is_empty() {
                return Ok(Vec::new());
            }
            let mut qb = QueryBuilder::<MySql>::new(
                "SELECT seq, claim_version, attempts FROM ferry_outbox_exception WHERE seq IN (",
            );
            push_list(&mut qb, candidates.iter().copied());
            qb.push(
                ") AND ((state = 'PENDING' AND available_at <= UTC_TIMESTAMP(6)) \
                   OR (state = 'CLAIMED' AND lease_until <= UTC_TIMESTAMP(6))) \
                 ORDER BY seq FOR UPDATE SKIP LOCKED",
            );
            let locked: Vec<(i64, i64, i32)> = qb
                .build()
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| db_err("claim exceptions: lock", e))?
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect();
            if locked.is_empty() {
                return Ok(Vec::new());
            }
            let mut qb = QueryBuilder::<MySql>::new(
                "UPDATE ferry_outbox_exception SET state = 'CLAIMED', claim_version = claim_version + 1, claim_id = ",
            );
            qb.push_bind(&req.claim_id)
                .push(", lease_until = UTC_TIMESTAMP(6) + INTERVAL ")
                .push_bind(micros(req.lease))
                .push(" MICROSECOND WHERE seq IN (");
            push_list(&mut qb, locked.iter().map(|l| l.0));
            qb.push(")");
            qb.build()
                .execute(&mut *tx)
                .await
                .map_err(|e| db_err("claim exceptions: update", e))?;
            let mut qb = QueryBuilder::<MySql>::new(format!(
                "SELECT {COLUMNS} FROM ferry_outbox WHERE seq IN ("
            ));
            push_list(&mut qb, locked.iter().map(|l| l.0));
            qb.push(") ORDER BY seq");
            let rows = qb
                .build()
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| db_err("claim exceptions: read", e))?;
            tx.commit().await.ctx("claim exceptions: commit")?;
            // the update gave each locked row claim version + 1
            Ok(claimed_exceptions(
                rows.iter().map(claimed_from_row),
                locked.iter().map(|(s, cv, a)| (*s, *cv + 1, *a)),
                &req.claim_id,
            ))
        }))
    }

    fn settle_exceptions<'a>(
        &'a self,
        out: &'a ExceptionOutcomes,
    ) -> BoxFuture<'a, Result<CasReport, StoreError>> {
        Box::pin(async move {
            // each category in a transaction of its own (as the row-dispatch outcomes)
            let mut report = CasReport::default();
            for o in Outcome::settling(out) {
                let done = self.cas_on("ferry_outbox_exception", &o).await?;
                report.items.extend(done.items);
            }
            Ok(report)
        })
    }

    fn horizon(&self) -> BoxFuture<'_, Result<HorizonInfo, StoreError>> {
        Box::pin(async move {
            // The oldest open write transaction other than the ticker's: the one the next
            // horizon waits for if it inserted an intent (its "pid" is the connection id, for
            // KILL). INNODB_TRX needs the PROCESS privilege; without it nothing is reported.
            let row = sqlx::query(
                "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) AS SIGNED), \
                   CAST(t.trx_mysql_thread_id AS SIGNED) \
                 FROM information_schema.INNODB_TRX t \
                 WHERE t.trx_rows_modified > 0 \
                   AND t.trx_mysql_thread_id <> coalesce((SELECT ticker_conn FROM ferry_horizon WHERE id = 1), 0) \
                   AND t.trx_mysql_thread_id <> CONNECTION_ID() \
                 ORDER BY t.trx_started LIMIT 1",
            )
            .fetch_optional(self.pool())
            .await;
            Ok(match row {
                Ok(Some(r)) => HorizonInfo {
                    oldest_xact_age_us: r.get::<Option<i64>, _>(0).map(|a| a.max(0)),
                    oldest_xact_pid: r.get(1),
                },
                Ok(None) => HorizonInfo::default(),
                Err(e) => {
                    tracing::debug!(error = %e, "horizon: INNODB_TRX not readable");
                    HorizonInfo::default()
                }
            })
        })
    }
}
