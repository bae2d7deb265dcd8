//! MariaDB 10.6+ backend (tested on 10.11). MySQL is not supported: the migrations use
//! MariaDB-only DDL.
//!
//! Sessions run at `READ COMMITTED`; all times are `UTC_TIMESTAMP(6)` so the session time zone
//! of an application's connection never shifts them. Claim, in one short transaction:
//! 1. (fenced claims) read which of the requested slots the owner holds a live lease on;
//! 2. a plain (non-locking) read picks due candidates whose aggregate has no unfinished lower
//!    version — a locking read would also lock, or `SKIP LOCKED` past, the predecessor rows the
//!    subquery examines, which could hide an in-flight v1 and release v2;
//! 3. `SELECT … FOR UPDATE SKIP LOCKED` re-checks that each candidate is still due under its
//!    row lock (a predecessor seen SENT cannot become unfinished again, so step 2's verdict
//!    stays true);
//! 4. `UPDATE` increments `claim_version` and sets `claim_id`/`lease_until`; the returned token
//!    is the locked row's version + 1, read while the lock is held;
//! 5. commit.
//!
//! MariaDB has no `UPDATE … RETURNING`: ack, release and extend run one statement per chunk of
//! 1,000 tokens and, when the affected-row count is short, are redone row-locked to say which
//! items were fenced; retry and quarantine run one statement per item.
mod cursor;
mod sql;
mod ticker;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferry_core::store::prelude::*;
use ferry_core::{
    BoxFuture, CasReport, ClaimRequest, ClaimToken, ClaimedEvent, EnqueueError, EventRecord,
    Limits, NewEvent, OperatorAction, OutboxStatus, QuarantinedEvent, SlotId, SlotLease,
    StoreError, StoreErrorKind, ValidatedEvent,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{Executor, MySql, MySqlPool, QueryBuilder, Row, Transaction};

use crate::common::{
    claiming, enqueue_in_own_tx, micros, push_intent, record_from, record_sql, status_from,
    url_options, Ctx, InsertIntents, StatusRow,
};
use crate::ops::{self, operator_outcome, OperatorParam, OperatorSql, Pools};
use crate::outcome::{Outcome, Transition};
use crate::{db_err, enqueue_err, ConnectOptions, MIGRATIONS_MYSQL};

/// Rows per multi-row statement (9 placeholders per row: 9,000 per statement, far below the
/// protocol's 65,535).
const CHUNK: usize = 1000;

crate::common::enqueue_fns!(MySqlConnection);

impl InsertIntents for MySqlConnection {
    async fn insert_intents(&mut self, rows: &[ValidatedEvent]) -> Result<(), EnqueueError> {
        let conn = self;
        for chunk in rows.chunks(CHUNK) {
            let mut qb: QueryBuilder<MySql> = QueryBuilder::new(
                "INSERT INTO ferry_outbox (event_id, aggregate_id, aggregate_version, shard_slot, topic, msg_key, \
                 event_type, headers, payload) ",
            );
            qb.push_values(chunk, |mut b, r| {
                push_intent(&mut b, r, r.shard_slot as i16)
            });
            qb.build()
                .execute(&mut *conn)
                .await
                .map_err(|e| enqueue_err(chunk, e))?;
        }
        Ok(())
    }
}

/// The MySQL/MariaDB outbox store.
#[derive(Debug, Clone)]
pub struct MyStore {
    pool: MySqlPool,
    limits: Limits,
    /// Rows claims passed over under contention ([`OutboxStore::rows_skipped_locked`]).
    skipped: Arc<AtomicU64>,
    /// Cursor dispatch's horizon ticker (started by the first cursor read).
    ticker: Arc<crate::mysql::ticker::Ticker>,
}

pub(crate) const COLUMNS: &str = "seq, event_id, claim_id, claim_version, aggregate_id, aggregate_version, shard_slot, \
    topic, msg_key, event_type, headers, payload, attempts, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at)";

pub(crate) fn claimed_from_row(r: &sqlx::mysql::MySqlRow) -> ClaimedEvent {
    ClaimedEvent {
        token: ClaimToken {
            seq: r.get(0),
            event_id: txt(r, 1),
            claim_id: otxt(r, 2).unwrap_or_default(),
            claim_version: r.get(3),
        },
        aggregate_id: txt(r, 4),
        aggregate_version: r.get(5),
        shard_slot: r.get::<i16, _>(6) as SlotId,
        topic: txt(r, 7),
        key: txt(r, 8),
        event_type: txt(r, 9),
        headers: txt(r, 10),
        payload: txt(r, 11),
        attempts: r.get(12),
        created_at: r.get(13),
    }
}

/// A `ferry_slot_lease` row read as `slot, owner, epoch, lease_until` (µs).
fn lease_from_row(r: &sqlx::mysql::MySqlRow) -> SlotLease {
    SlotLease {
        slot: r.get::<i16, _>(0) as SlotId,
        owner: txt(r, 1),
        epoch: r.get(2),
        lease_until: r.get(3),
    }
}

/// Reads a text column. The schema uses `utf8mb4_bin` (byte-exact keys), which the server
/// reports with the BINARY flag, so sqlx decodes it as bytes; the bytes are UTF-8 we wrote.
fn txt(r: &sqlx::mysql::MySqlRow, i: usize) -> String {
    otxt(r, i).unwrap_or_default()
}

fn otxt(r: &sqlx::mysql::MySqlRow, i: usize) -> Option<String> {
    r.get::<Option<Vec<u8>>, _>(i).map(|b| {
        String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    })
}

pub(crate) fn push_list<'a, T>(qb: &mut QueryBuilder<'a, MySql>, items: impl IntoIterator<Item = T>)
where
    T: 'a + sqlx::Encode<'a, MySql> + sqlx::Type<MySql> + Send,
{
    let mut sep = qb.separated(", ");
    for i in items {
        sep.push_bind(i);
    }
}

/// `{head} FROM ferry_outbox WHERE seq IN (candidates) AND <still due> ORDER BY seq LIMIT n`:
/// the window the claim's locking re-check reads, and its contention recount reads again.
fn due_window<'a>(head: &str, candidates: &[i64], limit: usize) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::<MySql>::new(format!("{head} FROM ferry_outbox WHERE seq IN ("));
    push_list(&mut qb, candidates.iter().copied());
    qb.push(
        ") AND ((state = 'PENDING' AND available_at <= UTC_TIMESTAMP(6)) OR (state = 'CLAIMED' AND lease_until <= UTC_TIMESTAMP(6))) \
         ORDER BY seq LIMIT ",
    );
    qb.push_bind(limit as i64);
    qb
}

/// Due rows of one state in the owner's slots, in `seq` order, whose aggregate has no unfinished
/// lower version. `FORCE INDEX`: `ferry_outbox_due` (state, seq, shard_slot, available_at,
/// lease_until) yields seq order and filters slot and due time without touching rows; left to
/// itself the optimizer walked the primary key through every SENT row, or sorted all pending rows
/// of the slots, once the table grew (docs/schema.md, "MariaDB claim plan").
fn candidate_query<'a>(
    state: &str,
    due_column: &str,
    slots: &[i16],
    limit: usize,
) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::<MySql>::new(format!(
        "SELECT o.seq FROM ferry_outbox o FORCE INDEX (ferry_outbox_due) WHERE o.state = '{state}' \
         AND o.shard_slot IN ("
    ));
    push_list(&mut qb, slots.iter().copied());
    qb.push(format!(
        ") AND {due_column} <= UTC_TIMESTAMP(6) \
         AND NOT EXISTS (SELECT 1 FROM ferry_outbox p WHERE p.aggregate_id = o.aggregate_id \
           AND p.state IN ('PENDING', 'CLAIMED', 'QUARANTINED') AND p.aggregate_version < o.aggregate_version) \
         ORDER BY o.seq LIMIT "
    ));
    qb.push_bind(limit as i64);
    qb
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
    let mut qb = QueryBuilder::<MySql>::new("SELECT slot FROM ferry_slot_lease WHERE owner = ");
    qb.push_bind(&f.owner)
        .push(" AND lease_until > UTC_TIMESTAMP(6) AND slot IN (");
    push_list(&mut qb, req.slots.iter().map(|s| *s as i16));
    qb.push(")");
    qb.build_query_scalar()
        .fetch_all(conn)
        .await
        .map_err(|e| db_err("claim: slot fence", e))
}

/// A CAS predicate over tokens: `seq IN (…) AND (seq, claim_version, claim_id) IN ((…), …)`.
fn push_tokens<'a>(qb: &mut QueryBuilder<'a, MySql>, tokens: &'a [ClaimToken]) {
    qb.push("state = 'CLAIMED' AND seq IN (");
    push_list(qb, tokens.iter().map(|t| t.seq));
    qb.push(") AND (seq, claim_version, claim_id) IN (");
    let mut first = true;
    for t in tokens {
        if !first {
            qb.push(", ");
        }
        first = false;
        qb.push("(")
            .push_bind(t.seq)
            .push(", ")
            .push_bind(t.claim_version)
            .push(", ")
            .push_bind(&t.claim_id)
            .push(")");
    }
    qb.push(")");
}

/// The SET clause of an outcome, the same on both tables. Per-item values are bound in the
/// order the clause reads them (delay, then text).
fn outcome_set(to: Transition) -> Cow<'static, str> {
    match to {
        Transition::Ack => "state = 'SENT', sent_at = UTC_TIMESTAMP(6), lease_until = NULL".into(),
        Transition::Retry => "available_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, last_error = ?, state = 'PENDING', \
             lease_until = NULL, attempts = attempts + 1"
            .into(),
        Transition::Quarantine => "available_at = available_at + INTERVAL ? MICROSECOND, last_error = ?, state = 'QUARANTINED', \
             lease_until = NULL, attempts = attempts + 1"
            .into(),
        Transition::Release => {
            "state = 'PENDING', lease_until = NULL, available_at = UTC_TIMESTAMP(6)".into()
        }
        Transition::Extend { lease_us } => {
            format!("lease_until = UTC_TIMESTAMP(6) + INTERVAL {lease_us} MICROSECOND").into()
        }
    }
}

impl MyStore {
    /// Connects to `url`; migrates unless `opts.migrate` is false.
    pub async fn connect(url: &str, opts: &ConnectOptions) -> Result<Self, StoreError> {
        let conn: MySqlConnectOptions = url_options(url, "MySQL", &crate::redact_url(url))?;
        Self::connect_with(conn, opts).await
    }

    /// Connects with explicit options.
    pub async fn connect_with(
        conn: MySqlConnectOptions,
        opts: &ConnectOptions,
    ) -> Result<Self, StoreError> {
        let pool = crate::pool_options::<MySql>(
            opts.max_connections,
            opts.acquire_timeout,
            crate::PING_IDLE_AFTER,
        )
        .after_connect(|c, _| {
            Box::pin(async move {
                c.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .await?;
                // MariaDB 10.3+: abort a session idle for 10 s inside a transaction, so a
                // stalled relay cannot hold its row locks (and block a takeover) forever.
                // MySQL has no such variable; the error is ignored there.
                let _ = c.execute("SET SESSION idle_transaction_timeout = 10").await;
                Ok(())
            })
        });
        let pool = crate::open_pool(pool, conn)
            .await
            .map_err(|e| db_err("cannot connect to MySQL/MariaDB", e))?;
        let store = Self {
            pool,
            limits: opts.limits,
            skipped: Arc::default(),
            ticker: Arc::default(),
        };
        if opts.migrate {
            store.migrate().await?;
        }
        Ok(store)
    }

    /// The pool, for the application's own transactions.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    pub(crate) fn ticker(&self) -> &Arc<crate::mysql::ticker::Ticker> {
        &self.ticker
    }

    /// Applies pending migrations under `GET_LOCK('ferry_migrate:<db>')`. MySQL DDL is not
    /// transactional, so every statement is idempotent (`IF NOT EXISTS`) and a migration that
    /// died half-way is simply re-run; its version row is written last.
    pub async fn migrate(&self) -> Result<Vec<i64>, StoreError> {
        use crate::migrate::{apply_mysql, OUTBOX_LOCK, OUTBOX_TABLE};
        let mut conn = self.pool.acquire().await.ctx("migrate: connect")?;
        apply_mysql(&mut conn, OUTBOX_LOCK, OUTBOX_TABLE, MIGRATIONS_MYSQL).await
    }

    /// A fenced outcome on `ferry_outbox` ([`Self::cas_on`]).
    async fn cas(&self, o: Outcome<'_>) -> Result<CasReport, StoreError> {
        self.cas_on("ferry_outbox", &o).await
    }

    /// One CAS per batch on `table` (`ferry_outbox` or `ferry_outbox_exception`, fixed
    /// constants), in a transaction of its own. A transition with per-item values (retry,
    /// quarantine: the rare paths) runs one statement per item inside that transaction.
    pub(crate) async fn cas_on(
        &self,
        table: &str,
        o: &Outcome<'_>,
    ) -> Result<CasReport, StoreError> {
        let (tokens, set) = (&o.tokens[..], outcome_set(o.to));
        let per_item = match o.to {
            Transition::Retry | Transition::Quarantine => Some(&o.items[..]),
            Transition::Ack | Transition::Release | Transition::Extend { .. } => None,
        };
        if tokens.is_empty() {
            return Ok(CasReport::default());
        }
        let mut tx = self.pool.begin().await.ctx("outcome: begin")?;
        let report = if let Some(values) = per_item {
            let mut applied = HashMap::new();
            for (t, (delay, text)) in tokens.iter().zip(values) {
                let n = sqlx::query(&format!(
                    "UPDATE {table} SET {set} WHERE state = 'CLAIMED' AND seq = ? AND claim_version = ? AND claim_id = ?"
                ))
                .bind(*delay)
                .bind(*text)
                .bind(t.seq)
                .bind(t.claim_version)
                .bind(&t.claim_id)
                .execute(&mut *tx)
                .await
                .map_err(|e| db_err("outcome update", e))?
                .rows_affected();
                if n == 1 {
                    applied.insert(t.seq, (t.claim_version, t.claim_id.clone()));
                }
            }
            CasReport::from_applied(tokens, &applied)
        } else {
            let mut total = 0usize;
            for chunk in tokens.chunks(CHUNK) {
                let mut qb = QueryBuilder::<MySql>::new(format!("UPDATE {table} SET {set} WHERE "));
                push_tokens(&mut qb, chunk);
                total += qb
                    .build()
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_err("outcome update", e))?
                    .rows_affected() as usize;
            }
            if total == tokens.len() {
                CasReport::all_applied(tokens)
            } else {
                // Short count: some tokens are stale. Redo the batch row-locked so the report can
                // name exactly which items applied and which were fenced.
                tx.rollback()
                    .await
                    .map_err(|e| db_err("outcome: rollback", e))?;
                tx = self
                    .pool
                    .begin()
                    .await
                    .map_err(|e| db_err("outcome: begin", e))?;
                let mut applied = HashMap::new();
                for chunk in tokens.chunks(CHUNK) {
                    let mut qb = QueryBuilder::<MySql>::new(format!(
                        "SELECT seq, claim_version, claim_id FROM {table} WHERE "
                    ));
                    push_tokens(&mut qb, chunk);
                    qb.push(" FOR UPDATE");
                    let matching: Vec<(i64, i64, String)> = qb
                        .build()
                        .fetch_all(&mut *tx)
                        .await
                        .map_err(|e| db_err("outcome lock", e))?
                        .iter()
                        .map(|r| (r.get(0), r.get(1), txt(r, 2)))
                        .collect();
                    if matching.is_empty() {
                        continue;
                    }
                    let mut qb = QueryBuilder::<MySql>::new(format!(
                        "UPDATE {table} SET {set} WHERE seq IN ("
                    ));
                    push_list(&mut qb, matching.iter().map(|m| m.0));
                    qb.push(")");
                    qb.build()
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| db_err("outcome update", e))?;
                    applied.extend(matching.into_iter().map(|(seq, cv, cid)| (seq, (cv, cid))));
                }
                CasReport::from_applied(tokens, &applied)
            }
        };
        tx.commit().await.ctx("outcome: commit")?;
        Ok(report)
    }

    /// Status in cursor mode: unfinished = past the slot's cursor, or an open exception.
    async fn cursor_status(&self) -> Result<OutboxStatus, StoreError> {
        // The lowest cursor first, bound as a value: as a subquery in the range the optimizer
        // walked far more of the table (1.3-3.5 s per status under load with ~1,300 intents
        // behind, every 5 s, on the cores the producers need).
        let low: Option<i64> = sqlx::query_scalar(sql::STATUS_CURSORS)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| db_err("status: cursors", e))?;
        // The backlog behind the cursors and the exception rows in two statements: one
        // aggregate over a `UNION ALL` of both materialised the backlog first and cost half as
        // much again (0.8 s against 0.5 s of server CPU for 200,000 intents behind;
        // docs/notes/2026-12-03-performance-log.md, "The status count of a backlog, cheaper").
        // Each is a consistent read of its own: an intent that an advance turns into an
        // exception row between them is counted in both (gauges only).
        let (behind, behind_age): (i64, Option<i64>) = sqlx::query_as(sql::STATUS_BACKLOG)
            // no cursor yet (no slot was ever owned in cursor mode): nothing is behind one
            .bind(low.unwrap_or(i64::MAX))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| db_err("status: backlog", e))?;
        let (pending, claimed, quarantined, age, blocked): StatusRow =
            sqlx::query_as(sql::STATUS_EXCEPTIONS)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| db_err("status: exceptions", e))?;
        // the oldest unfinished intent of either part: the larger age (`None` < `Some`)
        let oldest = behind_age.max(age);
        Ok(status_from((
            behind + pending,
            claimed,
            quarantined,
            oldest,
            blocked,
        )))
    }

    async fn operator_update(
        &self,
        event_id: &str,
        operator: &str,
        target: &str,
    ) -> Result<(), StoreError> {
        // positional: the operator's placeholder (SET) comes before the event id's (WHERE)
        const SQL: OperatorSql = OperatorSql {
            event_id: "?",
            operator: "?",
            now: "UTC_TIMESTAMP(6)",
            binds: &[OperatorParam::Operator, OperatorParam::EventId],
        };
        let mode = self.stored_mode().await?;
        let pools = Pools::My(&self.pool);
        let n = ops::operator_update(pools, mode, target, &SQL, event_id, operator).await?;
        operator_outcome(n, event_id, self.record(event_id)).await
    }
}

impl ferry_core::RowDispatch for MyStore {
    fn claim<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>> {
        Box::pin(claiming(req, async move {
            let mut tx = self.pool.begin().await.ctx("claim: begin")?;
            let slots = fenced_slots(&mut tx, req).await?;
            if slots.is_empty() {
                return Ok(Vec::new());
            }
            // Over-fetch candidates: a concurrent claimer may hold some of them locked (SKIP
            // LOCKED then passes over them), and without spares a contended claim would come
            // back short or empty while other due rows wait. A fenced claim has its slots to
            // itself (only a takeover races it), so it reads few spares: each candidate costs a
            // row lookup and a predecessor probe (docs/notes/2026-12-02-performance-log.md, "MariaDB").
            let want = if req.fence.is_some() {
                req.limit + 16
            } else {
                req.limit.saturating_mul(3) + 16
            };
            let mut candidates = Vec::with_capacity(want);
            for (state, due) in [
                ("PENDING", "o.available_at"),
                // leases that expired (their relay died or gave up)
                ("CLAIMED", "o.lease_until"),
            ] {
                let mut qb = candidate_query(state, due, &slots, want);
                let mut found: Vec<i64> = qb
                    .build_query_scalar()
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(|e| db_err("claim: candidates", e))?;
                candidates.append(&mut found);
            }
            candidates.sort_unstable();
            candidates.truncate(want);
            if candidates.is_empty() {
                return Ok(Vec::new());
            }
            let mut qb = due_window(&format!("SELECT {COLUMNS}"), &candidates, req.limit);
            qb.push(" FOR UPDATE SKIP LOCKED");
            let rows = qb
                .build()
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| db_err("claim: lock", e))?;
            if rows.len() < req.limit.min(candidates.len()) {
                // Short of both the limit and the candidates: some candidates were locked by a
                // concurrent transaction (SKIP LOCKED passed over them) or taken since they were
                // read. A plain read sees the locked ones still due (their claim has not
                // committed); those in the claim's window, less ours, were skipped.
                let mut qb = due_window("SELECT count(*) FROM (SELECT seq", &candidates, req.limit);
                qb.push(") w");
                let window: i64 = qb
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
            let mut qb = QueryBuilder::<MySql>::new(
                "UPDATE ferry_outbox SET state = 'CLAIMED', claim_version = claim_version + 1, claim_id = ",
            );
            qb.push_bind(&req.claim_id)
                .push(", lease_until = UTC_TIMESTAMP(6) + INTERVAL ")
                .push_bind(micros(req.lease))
                .push(" MICROSECOND WHERE seq IN (");
            push_list(&mut qb, items.iter().map(|i| i.token.seq));
            qb.push(")");
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
        }))
    }

    fn rows_skipped_locked(&self) -> Option<u64> {
        Some(self.skipped.load(Ordering::Relaxed))
    }

    fn lookup_claim<'a>(
        &'a self,
        claim_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT {COLUMNS} FROM ferry_outbox WHERE claim_id = ? AND state = 'CLAIMED' ORDER BY seq"
            );
            crate::common::lookup_claim(&self.pool, &sql, claim_id, claimed_from_row).await
        })
    }

    crate::outcome::row_outcomes!();
}

impl ferry_core::SlotOwnership for MyStore {
    fn acquire_slots<'a>(
        &'a self,
        req: &'a ferry_core::SlotRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<SlotLease>, StoreError>> {
        let (owner, slots, ttl) = (req.owner, req.slots, req.ttl);
        Box::pin(async move {
            if slots.is_empty() {
                return Ok(Vec::new());
            }
            let mut tx = self.pool.begin().await.ctx("acquire slots: begin")?;
            // MySQL evaluates SET assignments left to right: compute epoch before owner changes.
            let mut qb =
                QueryBuilder::<MySql>::new("UPDATE ferry_slot_lease SET epoch = IF(owner <=> ");
            qb.push_bind(owner)
                .push(", epoch, epoch + 1), owner = ")
                .push_bind(owner)
                .push(", lease_until = UTC_TIMESTAMP(6) + INTERVAL ")
                .push_bind(micros(ttl))
                .push(" MICROSECOND WHERE slot IN (");
            push_list(&mut qb, slots.iter().map(|s| *s as i16));
            qb.push(") AND (owner IS NULL OR owner = ")
                .push_bind(owner)
                .push(" OR lease_until <= UTC_TIMESTAMP(6))");
            qb.build()
                .execute(&mut *tx)
                .await
                .map_err(|e| db_err("acquire slots", e))?;
            let mut qb = QueryBuilder::<MySql>::new(
                "SELECT slot, owner, epoch, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', lease_until) FROM ferry_slot_lease WHERE owner = ",
            );
            qb.push_bind(owner)
                .push(" AND lease_until > UTC_TIMESTAMP(6) AND slot IN (");
            push_list(&mut qb, slots.iter().map(|s| *s as i16));
            qb.push(") ORDER BY slot");
            let rows = qb
                .build()
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| db_err("acquire slots: read", e))?;
            tx.commit().await.ctx("acquire slots: commit")?;
            Ok(rows.iter().map(lease_from_row).collect())
        })
    }

    fn release_slots<'a>(
        &'a self,
        req: &'a ferry_core::SlotRelease<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (owner, slots) = (req.owner, req.slots);
        Box::pin(async move {
            if slots.is_empty() {
                return Ok(());
            }
            let mut qb = QueryBuilder::<MySql>::new(
                "UPDATE ferry_slot_lease SET owner = NULL, lease_until = NULL WHERE owner = ",
            );
            qb.push_bind(owner).push(" AND slot IN (");
            push_list(&mut qb, slots.iter().map(|s| *s as i16));
            qb.push(")");
            qb.build()
                .execute(&self.pool)
                .await
                .map_err(|e| db_err("release slots", e))?;
            Ok(())
        })
    }

    fn heartbeat_member<'a>(
        &'a self,
        req: &'a ferry_core::MemberHeartbeat<'a>,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        let (owner, ttl) = (req.owner, req.ttl);
        Box::pin(async move {
            // the row is locked by the upsert; assignments run left to right, so `instance` is
            // ours afterwards exactly when the row was ours or expired, and only then is the
            // lease renewed
            sqlx::query(sql::MEMBER_HEARTBEAT)
                .bind(owner)
                .bind(req.instance)
                .bind(micros(ttl))
                .bind(req.sink_stalled_us())
                .execute(&self.pool)
                .await
                .map_err(|e| db_err("member heartbeat", e))?;
            let holder: Option<Vec<u8>> = sqlx::query_scalar(sql::MEMBER_INSTANCE)
                .bind(owner)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| db_err("member heartbeat", e))?;
            if holder.as_deref() != Some(req.instance.as_bytes()) {
                return Err(crate::owner_in_use(owner));
            }
            let owners: Vec<Vec<u8>> = sqlx::query_scalar(sql::LIVE_MEMBERS)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| db_err("members", e))?;
            Ok(owners
                .into_iter()
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .collect())
        })
    }

    fn members(&self) -> BoxFuture<'_, Result<Vec<ferry_core::MemberInfo>, StoreError>> {
        Box::pin(async move {
            let rows: Vec<(Vec<u8>, Option<i64>)> = sqlx::query_as(sql::MEMBERS_WITH_STALLS)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| db_err("members", e))?;
            Ok(crate::members_from(rows.into_iter().map(
                |(owner, stalled)| (String::from_utf8_lossy(&owner).into_owned(), stalled),
            )))
        })
    }

    fn leave_member<'a>(&'a self, owner: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query(sql::LEAVE_MEMBER)
                .bind(owner)
                .execute(&self.pool)
                .await
                .map_err(|e| db_err("leave", e))?;
            Ok(())
        })
    }

    fn slot_leases(&self) -> BoxFuture<'_, Result<Vec<SlotLease>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(sql::SLOT_LEASES)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| db_err("slot leases", e))?;
            Ok(rows.iter().map(lease_from_row).collect())
        })
    }
}

impl ferry_core::OperatorActions for MyStore {
    fn enqueue<'a>(
        &'a self,
        events: &'a [NewEvent],
    ) -> BoxFuture<'a, Result<Vec<String>, EnqueueError>> {
        Box::pin(enqueue_in_own_tx(
            events,
            &self.limits,
            self.pool.begin(),
            Transaction::commit,
        ))
    }

    fn requeue<'a>(&'a self, req: &'a OperatorAction<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.operator_update(req.event_id, req.operator, "PENDING"))
    }

    fn skip<'a>(&'a self, req: &'a OperatorAction<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.operator_update(req.event_id, req.operator, "SKIPPED"))
    }

    fn list_quarantined(
        &self,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<QuarantinedEvent>, StoreError>> {
        Box::pin(async move {
            let sql = match self.stored_mode().await? {
                ferry_core::DispatchMode::Row => {
                    "SELECT q.event_id, q.aggregate_id, q.aggregate_version, q.last_error, q.attempts, \
                   (SELECT COUNT(*) FROM ferry_outbox s WHERE s.aggregate_id = q.aggregate_id \
                      AND s.state IN ('PENDING', 'CLAIMED', 'QUARANTINED') AND s.aggregate_version > q.aggregate_version) \
                 FROM ferry_outbox q WHERE q.state = 'QUARANTINED' ORDER BY q.seq LIMIT ?"
                }
                // successors are held exceptions, or not yet read past the cursor
                ferry_core::DispatchMode::Cursor => {
                    "SELECT o.event_id, q.aggregate_id, q.aggregate_version, q.last_error, q.attempts, \
                   (SELECT COUNT(*) FROM ferry_outbox_cursor_view s WHERE s.aggregate_id = q.aggregate_id \
                      AND s.state IN ('PENDING', 'CLAIMED', 'QUARANTINED') AND s.aggregate_version > q.aggregate_version) \
                 FROM ferry_outbox_exception q JOIN ferry_outbox o ON o.seq = q.seq \
                 WHERE q.state = 'QUARANTINED' ORDER BY q.seq LIMIT ?"
                }
            };
            let rows = sqlx::query(sql)
                .bind(limit as i64)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| db_err("list quarantined", e))?;
            Ok(rows
                .iter()
                .map(|r| QuarantinedEvent {
                    event_id: txt(r, 0),
                    aggregate_id: txt(r, 1),
                    aggregate_version: r.get(2),
                    last_error: otxt(r, 3),
                    attempts: r.get(4),
                    blocked_successors: r.get(5),
                })
                .collect())
        })
    }

    fn status(&self) -> BoxFuture<'_, Result<OutboxStatus, StoreError>> {
        Box::pin(async move {
            if self.stored_mode().await? == ferry_core::DispatchMode::Cursor {
                return self.cursor_status().await;
            }
            let r = sqlx::query(
                // Counts read the state prefix of ferry_outbox_due (no row lookups); the oldest
                // unfinished intent is the lowest seq of each unfinished state (one index probe
                // each). A single aggregate over all unfinished rows took over a second with a
                // 60k backlog.
                "SELECT (SELECT count(*) FROM ferry_outbox WHERE state = 'PENDING'), \
                   (SELECT count(*) FROM ferry_outbox WHERE state = 'CLAIMED'), \
                   (SELECT count(*) FROM ferry_outbox WHERE state = 'QUARANTINED'), \
                   (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) AS SIGNED) FROM ferry_outbox \
                      WHERE seq = (SELECT min(seq) FROM ferry_outbox WHERE state = 'PENDING')), \
                   (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) AS SIGNED) FROM ferry_outbox \
                      WHERE seq = (SELECT min(seq) FROM ferry_outbox WHERE state = 'CLAIMED')), \
                   (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) AS SIGNED) FROM ferry_outbox \
                      WHERE seq = (SELECT min(seq) FROM ferry_outbox WHERE state = 'QUARANTINED')), \
                   (SELECT count(DISTINCT aggregate_id) FROM ferry_outbox WHERE state = 'QUARANTINED')",
            )
            .fetch_one(&self.pool)
            .await
            .map_err(|e| db_err("status", e))?;
            Ok(OutboxStatus {
                pending: r.get(0),
                claimed: r.get(1),
                quarantined: r.get(2),
                oldest_unfinished_age_us: [3, 4, 5]
                    .into_iter()
                    .filter_map(|i| r.get::<Option<i64>, _>(i))
                    .max(),
                blocked_aggregates: r.get(6),
            })
        })
    }

    fn record<'a>(
        &'a self,
        event_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<EventRecord>, StoreError>> {
        Box::pin(async move {
            let r = sqlx::query(&record_sql(self.stored_mode().await?, "?"))
                .bind(event_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| db_err("record", e))?;
            r.map(|r| {
                record_from((
                    txt(&r, 0),
                    txt(&r, 1),
                    r.get(2),
                    otxt(&r, 3),
                    r.get(4),
                    otxt(&r, 5),
                    otxt(&r, 6),
                    txt(&r, 7),
                ))
            })
            .transpose()
        })
    }
}

/// `ferry_status_cache` on MariaDB ([`crate::common::shared_status`]; migration 5).
const STATUS_CACHE: crate::common::StatusCacheSql = crate::common::StatusCacheSql {
    lease: "UPDATE ferry_status_cache SET computing_until = UTC_TIMESTAMP(6) + INTERVAL 60 SECOND \
            WHERE id = 1 AND (computed_at IS NULL OR computed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND) \
              AND (computing_until IS NULL OR computing_until < UTC_TIMESTAMP(6))",
    stored: "SELECT pending, claimed, quarantined, \
               oldest_age_us + TIMESTAMPDIFF(MICROSECOND, computed_at, UTC_TIMESTAMP(6)), blocked \
             FROM ferry_status_cache WHERE id = 1 AND computed_at IS NOT NULL",
    clear: "UPDATE ferry_status_cache SET computing_until = NULL WHERE id = 1",
    store: "UPDATE ferry_status_cache SET pending = ?, claimed = ?, quarantined = ?, \
              oldest_age_us = ?, blocked = ?, computed_at = UTC_TIMESTAMP(6), computing_until = NULL \
            WHERE id = 1",
};

impl ferry_core::OutboxStore for MyStore {
    fn backend(&self) -> &'static str {
        "mysql"
    }

    fn shared_status(
        &self,
        max_age: std::time::Duration,
    ) -> BoxFuture<'_, Result<OutboxStatus, StoreError>> {
        use ferry_core::OperatorActions;
        Box::pin(crate::common::shared_status(
            &self.pool,
            &STATUS_CACHE,
            sqlx::mysql::MySqlQueryResult::rows_affected,
            max_age,
            self.status(),
        ))
    }

    fn purge_sent<'a>(
        &'a self,
        req: &'a ferry_core::PurgeRequest<'a>,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            ops::purge_sent(Pools::My(&self.pool), self.stored_mode().await?, req).await
        })
    }

    fn reconcile<'a>(
        &'a self,
        req: &'a ferry_core::ReconcileRequest,
    ) -> BoxFuture<'a, Result<ferry_core::ReconcileReport, StoreError>> {
        Box::pin(async move {
            ops::reconcile(Pools::My(&self.pool), self.stored_mode().await?, req).await
        })
    }

    fn cursor(&self) -> Option<&dyn ferry_core::CursorStore> {
        Some(self)
    }

    fn server_warnings(
        &self,
    ) -> BoxFuture<'_, Result<Vec<ferry_core::SettingWarning>, StoreError>> {
        Box::pin(async move {
            let s = crate::server_settings::read_mysql(&self.pool).await?;
            Ok(crate::server_settings::mysql_warnings(&s))
        })
    }
}
