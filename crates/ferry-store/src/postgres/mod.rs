//! PostgreSQL backend (13+: cursor dispatch needs pg_current_xact_id and pg_snapshot; tested on 15).
//!
//! Claim: one short transaction of two statements — a `set_config` that turns bitmap and
//! sequential scans off for it, then a CTE that selects due, predecessor-free rows of the
//! requested slots in `seq` order `FOR UPDATE SKIP LOCKED`, whose outer `UPDATE … RETURNING`
//! increments `claim_version`, sets `claim_id`/`lease_until` and returns each token. Outcomes are one `UPDATE … FROM UNNEST(…) RETURNING seq` per batch, fenced on
//! `(state = 'CLAIMED', claim_version, claim_id)`.
mod cursor;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::store::prelude::*;
use ferry_core::{
    BoxFuture, CasReport, ClaimRequest, ClaimToken, ClaimedEvent, EnqueueError, EventRecord,
    Limits, NewEvent, OperatorAction, OutboxStatus, QuarantinedEvent, SlotId, SlotLease,
    StoreError, ValidatedEvent,
};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection, PgPool, Row, Transaction};

use crate::common::{
    claiming, enqueue_in_own_tx, lease_from, micros, quarantined_from, status_from, url_options,
    Ctx, InsertIntents, QuarantinedRow, StatusRow,
};
use crate::ops::{self, operator_outcome, OperatorParam, OperatorSql, Pools};
use crate::outcome::{Outcome, Transition};
use crate::{db_err, enqueue_err, ConnectOptions, MIGRATIONS_POSTGRES};

/// The `application_name` a ferry store's connections report when the URL sets none
/// (`?application_name=…` in the URL overrides it).
pub const APPLICATION_NAME: &str = "ferry";

const INSERT: &str = "INSERT INTO ferry_outbox \
    (event_id, aggregate_id, aggregate_version, shard_slot, topic, msg_key, event_type, headers, payload) \
    SELECT * FROM UNNEST($1::varchar[], $2::varchar[], $3::int8[], $4::int2[], $5::varchar[], \
    $6::varchar[], $7::varchar[], $8::text[], $9::text[])";

crate::common::enqueue_fns!(PgConnection);

impl InsertIntents for PgConnection {
    async fn insert_intents(&mut self, rows: &[ValidatedEvent]) -> Result<(), EnqueueError> {
        let conn = self;
        if rows.is_empty() {
            return Ok(());
        }
        let col = |f: fn(&ValidatedEvent) -> &str| {
            rows.iter().map(|r| f(r).to_owned()).collect::<Vec<_>>()
        };
        sqlx::query(INSERT)
            .bind(col(|r| &r.event_id))
            .bind(col(|r| &r.aggregate_id))
            .bind(rows.iter().map(|r| r.aggregate_version).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.shard_slot as i16).collect::<Vec<_>>())
            .bind(col(|r| &r.topic))
            .bind(col(|r| &r.key))
            .bind(col(|r| &r.event_type))
            .bind(col(|r| &r.headers))
            .bind(col(|r| &r.payload))
            .execute(&mut *conn)
            .await
            .map_err(|e| enqueue_err(rows, e))?;
        Ok(())
    }
}

/// The PostgreSQL outbox store.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    limits: Limits,
    /// Rows claims passed over under contention ([`OutboxStore::rows_skipped_locked`]).
    skipped: Arc<AtomicU64>,
    /// Whether claims measure `skipped` (`ConnectOptions::measure_contention`).
    measure: bool,
}

const CLAIM_COLUMNS: &str = "o.seq, o.event_id, o.claim_id, o.claim_version, o.aggregate_id, \
    o.aggregate_version, o.shard_slot, o.topic, o.msg_key, o.event_type, o.headers, o.payload, \
    o.attempts, (extract(epoch from o.created_at) * 1000000)::int8";

fn claimed_from_row(r: &sqlx::postgres::PgRow) -> ClaimedEvent {
    ClaimedEvent {
        token: ClaimToken {
            seq: r.get(0),
            event_id: r.get(1),
            claim_id: r.get(2),
            claim_version: r.get(3),
        },
        aggregate_id: r.get(4),
        aggregate_version: r.get(5),
        shard_slot: r.get::<i16, _>(6) as SlotId,
        topic: r.get(7),
        key: r.get(8),
        event_type: r.get(9),
        headers: r.get(10),
        payload: r.get(11),
        attempts: r.get(12),
        created_at: r.get(13),
    }
}

impl PgStore {
    /// Connects to `url`; migrates unless `opts.migrate` is false.
    pub async fn connect(url: &str, opts: &ConnectOptions) -> Result<Self, StoreError> {
        let conn: PgConnectOptions = url_options(url, "PostgreSQL", &crate::redact_url(url))?;
        Self::connect_with(conn, opts).await
    }

    /// Connects with explicit options (e.g. a `search_path` per test schema).
    pub async fn connect_with(
        conn: PgConnectOptions,
        opts: &ConnectOptions,
    ) -> Result<Self, StoreError> {
        // Every ferry transaction is a few statements long. A relay that stops inside one (GC
        // pause, SIGSTOP, lost network) would hold its row locks — and block the takeover of its
        // slots — forever; the server aborts such a session after 10 s idle in a transaction.
        let conn = conn.options([("idle_in_transaction_session_timeout", "10s")]);
        // Named in pg_stat_activity (and so in the logs' %a), unless the URL names it already.
        let conn = if conn.get_application_name().is_none() {
            conn.application_name(APPLICATION_NAME)
        } else {
            conn
        };
        let pool = crate::pool_options::<sqlx::Postgres>(
            opts.max_connections,
            opts.acquire_timeout,
            crate::PING_IDLE_AFTER,
        );
        let pool = crate::open_pool(pool, conn)
            .await
            .map_err(|e| db_err("cannot connect to PostgreSQL", e))?;
        let store = Self {
            pool,
            limits: opts.limits,
            skipped: Arc::default(),
            measure: opts.measure_contention,
        };
        if opts.migrate {
            store.migrate().await?;
        }
        Ok(store)
    }

    /// The pool, for the application's own transactions.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies pending embedded migrations under a transaction-scoped advisory lock keyed by
    /// the current schema; PostgreSQL DDL is transactional, so a migration applies fully or not
    /// at all, and a concurrent migrate waits for the lock and then finds nothing to do.
    pub async fn migrate(&self) -> Result<Vec<i64>, StoreError> {
        use crate::migrate::{apply_postgres, OUTBOX_LOCK, OUTBOX_TABLE};
        let mut conn = self.pool.acquire().await.ctx("migrate: connect")?;
        apply_postgres(&mut conn, OUTBOX_LOCK, OUTBOX_TABLE, MIGRATIONS_POSTGRES).await
    }

    /// A fenced outcome on `ferry_outbox` ([`cas_on`]).
    async fn cas(&self, o: Outcome<'_>) -> Result<CasReport, StoreError> {
        cas_on(&self.pool, &OUTBOX, &o).await
    }

    async fn operator_update(
        &self,
        event_id: &str,
        operator: &str,
        target: &str,
    ) -> Result<(), StoreError> {
        const SQL: OperatorSql = OperatorSql {
            event_id: "$1",
            operator: "$2",
            now: "now()",
            binds: &[OperatorParam::EventId, OperatorParam::Operator],
        };
        let mode = self.stored_mode().await?;
        let pools = Pools::Pg(&self.pool);
        let n = ops::operator_update(pools, mode, target, &SQL, event_id, operator).await?;
        operator_outcome(n, event_id, self.record(event_id)).await
    }
}

/// The table an outcome CAS updates: its name, its alias in the SET clause, the error context.
pub(crate) struct CasTable {
    table: &'static str,
    alias: &'static str,
    what: &'static str,
}

/// Row dispatch: the intents themselves.
pub(crate) const OUTBOX: CasTable = CasTable {
    table: "ferry_outbox",
    alias: "o",
    what: "outcome update",
};

/// Cursor dispatch: the exception rows.
pub(crate) const EXCEPTIONS: CasTable = CasTable {
    table: "ferry_outbox_exception",
    alias: "x",
    what: "exception outcome",
};

/// The SET clause of an outcome on the table aliased `a`; `t.delay_us` and `t.txt` are the
/// item's delay and text.
fn outcome_set(to: Transition, a: &str) -> String {
    match to {
        Transition::Ack => "state = 'SENT', sent_at = now(), lease_until = NULL".into(),
        Transition::Retry => format!(
            "state = 'PENDING', lease_until = NULL, attempts = {a}.attempts + 1, last_error = t.txt, \
             available_at = now() + t.delay_us * interval '1 microsecond'"
        ),
        Transition::Quarantine => format!(
            "state = 'QUARANTINED', lease_until = NULL, attempts = {a}.attempts + 1, last_error = t.txt"
        ),
        Transition::Release => "state = 'PENDING', lease_until = NULL, available_at = now()".into(),
        Transition::Extend { .. } => {
            "lease_until = now() + t.delay_us * interval '1 microsecond'".into()
        }
    }
}

/// One `UPDATE … FROM UNNEST(…) RETURNING` per batch on `on`, fenced on `(state = 'CLAIMED',
/// claim_version, claim_id)`; the per-item values travel as arrays beside the tokens.
pub(crate) async fn cas_on<'c>(
    ex: impl sqlx::PgExecutor<'c>,
    on: &CasTable,
    o: &Outcome<'_>,
) -> Result<CasReport, StoreError> {
    let tokens = &o.tokens[..];
    if tokens.is_empty() {
        return Ok(CasReport::default());
    }
    let (decl, cols) = match o.to {
        Transition::Ack | Transition::Release => ("", ""),
        Transition::Extend { .. } => (", $4::int8[]", ", delay_us"),
        Transition::Quarantine => (", $4::text[]", ", txt"),
        Transition::Retry => (", $4::int8[], $5::text[]", ", delay_us, txt"),
    };
    let (table, a, set) = (on.table, on.alias, outcome_set(o.to, on.alias));
    let sql = format!(
        "UPDATE {table} {a} SET {set} \
         FROM UNNEST($1::int8[], $2::int8[], $3::varchar[]{decl}) AS t(seq, cv, cid{cols}) \
         WHERE {a}.seq = t.seq AND {a}.state = 'CLAIMED' AND {a}.claim_version = t.cv AND {a}.claim_id = t.cid \
         RETURNING {a}.seq, {a}.claim_version, {a}.claim_id"
    );
    let mut q = sqlx::query_as::<_, (i64, i64, String)>(&sql)
        .bind(tokens.iter().map(|t| t.seq).collect::<Vec<_>>())
        .bind(tokens.iter().map(|t| t.claim_version).collect::<Vec<_>>())
        .bind(
            tokens
                .iter()
                .map(|t| t.claim_id.clone())
                .collect::<Vec<_>>(),
        );
    match o.to {
        Transition::Ack | Transition::Release => {}
        Transition::Extend { .. } => q = q.bind(o.delays()),
        Transition::Quarantine => q = q.bind(o.texts()),
        Transition::Retry => q = q.bind(o.delays()).bind(o.texts()),
    }
    let rows = q.fetch_all(ex).await.map_err(|e| db_err(on.what, e))?;
    Ok(CasReport::from_returned(tokens, rows))
}

/// The slot filter of a claim on the table aliased `a` (`$1` the requested slots, `$5` the
/// fence's owner). With a slot fence, only slots whose lease this owner holds at the claim's start
/// count: a relay whose lease ended claims nothing. The lease rows are read without a lock: a
/// share lock made the owner's own lease renewal (and a takeover) queue behind slow claims until
/// every lease expired. A claim racing a takeover is harmless: rows are taken one at a time under
/// SKIP LOCKED, state and token, never twice. ARRAY(...) is an InitPlan, evaluated once per claim
/// whatever the planner's row estimates (an IN-subquery became a per-row SubPlan on un-ANALYZEd
/// tables).
pub(crate) fn claim_slot_filter(a: &str, req: &ClaimRequest) -> String {
    if req.fence.is_some() {
        format!(
            "{a}.shard_slot = ANY(ARRAY(SELECT l.slot FROM ferry_slot_lease l WHERE l.slot = ANY($1) \
             AND l.owner = $5 AND l.lease_until > now()))"
        )
    } else {
        format!("{a}.shard_slot = ANY($1)")
    }
}

/// A claim statement (row or exception rows) with its parameters bound: `$1` the slots, `$2` the
/// limit, `$3` the claim id, `$4` the lease (µs), and with a fence `$5` its owner.
pub(crate) fn bind_claim<'q>(
    sql: &'q str,
    req: &'q ClaimRequest,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let q = sqlx::query(sql)
        .bind(req.slots.iter().map(|s| *s as i16).collect::<Vec<_>>())
        .bind(req.limit as i64)
        .bind(&req.claim_id)
        .bind(micros(req.lease));
    match &req.fence {
        Some(f) => q.bind(&f.owner),
        None => q,
    }
}

impl ferry_core::RowDispatch for PgStore {
    fn claim<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>> {
        Box::pin(claiming(req, async move {
            let slot_filter = claim_slot_filter("o", req);
            // The predecessor rule as "o is its aggregate's lowest unfinished version": a scalar
            // subquery stays a per-candidate index probe. The equivalent NOT EXISTS was planned,
            // under load, as an anti join scanning the whole unfinished index per candidate
            // (measured: 64M rows filtered, 82 s for one claim, against 6.7 ms for this form).
            let due = format!(
                "{slot_filter} \
                 AND o.phase = 0 \
                 AND ((o.state = 'PENDING' AND o.available_at <= now()) \
                   OR (o.state = 'CLAIMED' AND o.lease_until <= now())) \
                 AND o.aggregate_version = (SELECT min(p.aggregate_version) FROM ferry_outbox p \
                   WHERE p.aggregate_id = o.aggregate_id AND p.phase < 2)"
            );
            // With `measure`, `passed` counts contention: when the claim comes back short of its
            // limit, the same window read without locks (this statement's snapshot, where the
            // rows just claimed still look due) minus what was claimed is what SKIP LOCKED passed
            // over. The recount is an InitPlan under CASE, evaluated only for short claims; the
            // LEFT JOIN returns one row even when nothing was claimed.
            let head = format!(
                "WITH due AS ( \
                   SELECT o.seq FROM ferry_outbox o WHERE {due} \
                   ORDER BY o.seq LIMIT $2 \
                   FOR UPDATE OF o SKIP LOCKED)"
            );
            let update = "UPDATE ferry_outbox o SET state = 'CLAIMED', claim_version = o.claim_version + 1, \
                   claim_id = $3, lease_until = now() + $4 * interval '1 microsecond' \
                 FROM due WHERE o.seq = due.seq";
            let sql = if self.measure {
                format!(
                    "{head}, claimed AS ({update} RETURNING {CLAIM_COLUMNS}), \
                     passed AS ( \
                       SELECT CASE WHEN (SELECT count(*) FROM claimed) < $2 \
                         THEN (SELECT count(*) FROM (SELECT 1 FROM ferry_outbox o WHERE {due} \
                                 ORDER BY o.seq LIMIT $2) w) - (SELECT count(*) FROM claimed) \
                         ELSE 0 END AS n) \
                     SELECT c.*, passed.n FROM passed LEFT JOIN claimed c ON true"
                )
            } else {
                format!("{head} {update} RETURNING {CLAIM_COLUMNS}, 0::int8")
            };
            let mut tx = self.pool.begin().await.ctx("claim: begin")?;
            // Walk the dispatch index in seq order and stop after LIMIT matches. Left to itself,
            // the planner sometimes bitmap-scans and sorts the whole due backlog of the worker's
            // slots first (stats from a small backlog, generic plans), which grows with the backlog.
            sqlx::query("SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)")
                .execute(&mut *tx)
                .await
                .map_err(|e| db_err("claim: plan settings", e))?;
            let rows = bind_claim(&sql, req)
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| db_err("claim", e))?;
            tx.commit().await.map_err(|e| db_err("claim: commit", e))?;
            let passed: i64 = rows.first().map_or(0, |r| r.get(14));
            if passed > 0 {
                self.skipped.fetch_add(passed as u64, Ordering::Relaxed);
            }
            let mut items: Vec<ClaimedEvent> = rows
                .iter()
                .filter(|r| r.get::<Option<i64>, _>(0).is_some())
                .map(claimed_from_row)
                .collect();
            items.sort_by_key(|e| e.token.seq);
            Ok(items)
        }))
    }

    fn rows_skipped_locked(&self) -> Option<u64> {
        self.measure.then(|| self.skipped.load(Ordering::Relaxed))
    }

    fn lookup_claim<'a>(
        &'a self,
        claim_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT {CLAIM_COLUMNS} FROM ferry_outbox o WHERE o.phase = 0 AND o.claim_id = $1 AND o.state = 'CLAIMED' ORDER BY o.seq"
            );
            crate::common::lookup_claim(&self.pool, &sql, claim_id, claimed_from_row).await
        })
    }

    crate::outcome::row_outcomes!();
}

impl ferry_core::SlotOwnership for PgStore {
    fn acquire_slots<'a>(
        &'a self,
        req: &'a ferry_core::SlotRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<SlotLease>, StoreError>> {
        let (owner, slots, ttl) = (req.owner, req.slots, req.ttl);
        Box::pin(async move {
            let rows: Vec<(i16, String, i64, i64)> = sqlx::query_as(
                // Rows are locked in slot order first (the cursor advance does the same), so a
                // renewal and an advance over overlapping slots cannot deadlock.
                "UPDATE ferry_slot_lease l SET \
                   epoch = CASE WHEN l.owner IS DISTINCT FROM $1 THEN l.epoch + 1 ELSE l.epoch END, \
                   owner = $1, lease_until = now() + $3 * interval '1 microsecond' \
                 FROM (SELECT slot FROM ferry_slot_lease WHERE slot = ANY($2) ORDER BY slot FOR UPDATE) k \
                 WHERE l.slot = k.slot AND (l.owner IS NULL OR l.owner = $1 OR l.lease_until <= now()) \
                 RETURNING l.slot, l.owner, l.epoch, (extract(epoch from l.lease_until) * 1000000)::int8",
            )
            .bind(owner)
            .bind(slots.iter().map(|s| *s as i16).collect::<Vec<_>>())
            .bind(micros(ttl))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| db_err("acquire slots", e))?;
            let mut leases: Vec<SlotLease> = rows.into_iter().map(lease_from).collect();
            leases.sort_by_key(|l| l.slot);
            Ok(leases)
        })
    }

    fn release_slots<'a>(
        &'a self,
        req: &'a ferry_core::SlotRelease<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (owner, slots) = (req.owner, req.slots);
        Box::pin(async move {
            sqlx::query("UPDATE ferry_slot_lease l SET owner = NULL, lease_until = NULL \
              FROM (SELECT slot FROM ferry_slot_lease WHERE slot = ANY($2) ORDER BY slot FOR UPDATE) k \
              WHERE l.slot = k.slot AND l.owner = $1")
                .bind(owner)
                .bind(slots.iter().map(|s| *s as i16).collect::<Vec<_>>())
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
            // ON CONFLICT DO UPDATE locks the row and checks WHERE against its latest version:
            // of two instances racing for an expired row, one takes it
            let held = sqlx::query(
                "INSERT INTO ferry_relay_member (owner, instance, lease_until, sink_stalled_us) \
                 VALUES ($1, $3, now() + $2 * interval '1 microsecond', $4) \
                 ON CONFLICT (owner) DO UPDATE SET lease_until = EXCLUDED.lease_until, instance = EXCLUDED.instance, \
                   sink_stalled_us = EXCLUDED.sink_stalled_us \
                 WHERE ferry_relay_member.instance = EXCLUDED.instance OR ferry_relay_member.lease_until <= now()",
            )
            .bind(owner)
            .bind(micros(ttl))
            .bind(req.instance)
            .bind(req.sink_stalled_us())
            .execute(&self.pool)
            .await
            .map_err(|e| db_err("member heartbeat", e))?
            .rows_affected();
            if held == 0 {
                return Err(crate::owner_in_use(owner));
            }
            sqlx::query_scalar(
                "SELECT owner FROM ferry_relay_member WHERE lease_until > now() ORDER BY owner",
            )
            .fetch_all(&self.pool)
            .await
            .map_err(|e| db_err("members", e))
        })
    }

    fn members(&self) -> BoxFuture<'_, Result<Vec<ferry_core::MemberInfo>, StoreError>> {
        Box::pin(async move {
            let rows: Vec<(String, Option<i64>)> = sqlx::query_as(
                "SELECT owner, sink_stalled_us FROM ferry_relay_member WHERE lease_until > now() ORDER BY owner",
            )
            .fetch_all(&self.pool)
            .await
            .map_err(|e| db_err("members", e))?;
            Ok(crate::members_from(rows))
        })
    }

    fn leave_member<'a>(&'a self, owner: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query("DELETE FROM ferry_relay_member WHERE owner = $1")
                .bind(owner)
                .execute(&self.pool)
                .await
                .map_err(|e| db_err("leave", e))?;
            Ok(())
        })
    }

    fn slot_leases(&self) -> BoxFuture<'_, Result<Vec<SlotLease>, StoreError>> {
        Box::pin(async move {
            let rows: Vec<(i16, String, i64, i64)> = sqlx::query_as(
                "SELECT slot, owner, epoch, (extract(epoch from lease_until) * 1000000)::int8 FROM ferry_slot_lease \
                 WHERE owner IS NOT NULL ORDER BY slot",
            )
            .fetch_all(&self.pool)
            .await
            .map_err(|e| db_err("slot leases", e))?;
            Ok(rows.into_iter().map(lease_from).collect())
        })
    }
}

impl ferry_core::OperatorActions for PgStore {
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
                       (SELECT count(*) FROM ferry_outbox s WHERE s.aggregate_id = q.aggregate_id \
                          AND s.aggregate_version > q.aggregate_version \
                          AND s.phase < 2) \
                     FROM ferry_outbox q WHERE q.phase = 1 ORDER BY q.seq LIMIT $1"
                }
                // successors are held exceptions, or not yet read past the cursor
                ferry_core::DispatchMode::Cursor => {
                    "SELECT o.event_id, q.aggregate_id, q.aggregate_version, q.last_error, q.attempts, \
                       (SELECT count(*) FROM ferry_outbox_cursor_view s WHERE s.aggregate_id = q.aggregate_id \
                          AND s.aggregate_version > q.aggregate_version \
                          AND s.state IN ('PENDING', 'CLAIMED', 'QUARANTINED')) \
                     FROM ferry_outbox_exception q JOIN ferry_outbox o ON o.seq = q.seq \
                     WHERE q.state = 'QUARANTINED' ORDER BY q.seq LIMIT $1"
                }
            };
            let rows: Vec<QuarantinedRow> = sqlx::query_as(sql)
                .bind(limit as i64)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| db_err("list quarantined", e))?;
            Ok(rows.into_iter().map(quarantined_from).collect())
        })
    }

    fn status(&self) -> BoxFuture<'_, Result<OutboxStatus, StoreError>> {
        Box::pin(async move {
            const COUNTS: &str = "count(*) FILTER (WHERE state = 'PENDING'), \
                count(*) FILTER (WHERE state = 'CLAIMED'), count(*) FILTER (WHERE state = 'QUARANTINED'), \
                (extract(epoch from (now() - min(created_at))) * 1000000)::int8, \
                count(DISTINCT aggregate_id) FILTER (WHERE state = 'QUARANTINED')";
            let r: StatusRow = match self.stored_mode().await? {
                ferry_core::DispatchMode::Row => sqlx::query_as(&format!(
                    "SELECT {COUNTS} FROM ferry_outbox WHERE phase < 2"
                ))
                .fetch_one(&self.pool)
                .await
                .map_err(|e| db_err("status", e))?,
                ferry_core::DispatchMode::Cursor => {
                    self.check_xids(ferry_core::DispatchMode::Cursor).await?;
                    // Unfinished = not yet behind the slot's cursor, or an open exception. No row
                    // below the lowest window's lower snapshot xmin can be unfinished without an
                    // exception row: that bound (read first and bound as a value, so the planner
                    // estimates the range from it) keeps the scan off the dispatched history.
                    let low: i64 = sqlx::query_scalar(
                        "SELECT coalesce(min(pg_snapshot_xmin(t.snap)::text::int8), 0) FROM ferry_slot_lease l \
                         JOIN ferry_tick t ON t.tick_id = l.cursor_tick - 1",
                    )
                    .fetch_one(&self.pool)
                    .await
                    .map_err(|e| db_err("status: cursors", e))?;
                    let low = (low, 0i64);
                    // The rows past that bound are the newest part of the table, but once they
                    // are a few per cent of it the planner reads the whole table instead of
                    // the (xid, seq) index: on 11,000,000 rows with 1,000,000 past the bound a
                    // parallel sequential scan took 2.3–2.7 s (plus JIT), the index 0.6–0.8 s,
                    // and beside a burn-down that cost grew with the delivered history.
                    let mut tx = self.pool.begin().await.ctx("status: begin")?;
                    sqlx::query(
                        "SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)",
                    )
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_err("status: plan settings", e))?;
                    let r = sqlx::query_as(&format!(
                        "SELECT {COUNTS} FROM ( \
                           SELECT 'PENDING'::varchar AS state, v.created_at, v.aggregate_id \
                           FROM ferry_outbox_cursor_view v \
                           WHERE v.xid >= $1 AND v.state = 'PENDING' AND $2 = 0 \
                             AND NOT EXISTS (SELECT 1 FROM ferry_outbox_exception e WHERE e.seq = v.seq) \
                           UNION ALL \
                           SELECT x.state, o.created_at, x.aggregate_id FROM ferry_outbox_exception x \
                             JOIN ferry_outbox o ON o.seq = x.seq \
                           WHERE x.state IN ('PENDING', 'CLAIMED', 'QUARANTINED')) u"
                    ))
                    .bind(low.0)
                    .bind(low.1)
                    .persistent(false)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| db_err("status", e))?;
                    tx.commit().await.map_err(|e| db_err("status: commit", e))?;
                    r
                }
            };
            Ok(status_from(r))
        })
    }

    fn record<'a>(
        &'a self,
        event_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<EventRecord>, StoreError>> {
        Box::pin(async move {
            crate::common::record(&self.pool, self.stored_mode().await?, "$1", event_id).await
        })
    }
}

/// `ferry_status_cache` on PostgreSQL ([`crate::common::shared_status`]).
const STATUS_CACHE: crate::common::StatusCacheSql = crate::common::StatusCacheSql {
    lease: "UPDATE ferry_status_cache SET computing_until = now() + interval '60 seconds' \
            WHERE id = 1 AND (computed_at IS NULL OR computed_at < now() - make_interval(secs => $1::float8 / 1e6)) \
              AND (computing_until IS NULL OR computing_until < now())",
    stored: "SELECT pending, claimed, quarantined, \
               oldest_age_us + (extract(epoch from (now() - computed_at)) * 1000000)::int8, blocked \
             FROM ferry_status_cache WHERE id = 1 AND computed_at IS NOT NULL",
    clear: "UPDATE ferry_status_cache SET computing_until = NULL WHERE id = 1",
    store: "UPDATE ferry_status_cache SET pending = $1, claimed = $2, quarantined = $3, \
              oldest_age_us = $4, blocked = $5, computed_at = now(), computing_until = NULL \
            WHERE id = 1",
};

impl ferry_core::OutboxStore for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn shared_status(
        &self,
        max_age: std::time::Duration,
    ) -> BoxFuture<'_, Result<OutboxStatus, StoreError>> {
        use ferry_core::OperatorActions;
        Box::pin(crate::common::shared_status(
            &self.pool,
            &STATUS_CACHE,
            sqlx::postgres::PgQueryResult::rows_affected,
            max_age,
            self.status(),
        ))
    }

    fn listen_commits(
        &self,
        wake: std::sync::Arc<dyn Fn() + Send + Sync>,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut listener = sqlx::postgres::PgListener::connect_with(&self.pool)
                .await
                .map_err(|e| db_err("LISTEN connect", e))?;
            listener
                .listen("ferry_outbox")
                .await
                .map_err(|e| db_err("LISTEN", e))?;
            tokio::spawn(async move {
                loop {
                    match listener.recv().await {
                        Ok(_) => wake(),
                        Err(e) => {
                            // Notifications may have been lost while reconnecting: wake anyway.
                            tracing::warn!(error = %e, "LISTEN connection lost; reconnecting");
                            wake();
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
            });
            Ok(true)
        })
    }

    fn purge_sent<'a>(
        &'a self,
        req: &'a ferry_core::PurgeRequest<'a>,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let mode = self.stored_mode().await?;
            self.check_xids(mode).await?;
            ops::purge_sent(Pools::Pg(&self.pool), mode, req).await
        })
    }

    fn reconcile<'a>(
        &'a self,
        req: &'a ferry_core::ReconcileRequest,
    ) -> BoxFuture<'a, Result<ferry_core::ReconcileReport, StoreError>> {
        Box::pin(async move {
            let mode = self.stored_mode().await?;
            self.check_xids(mode).await?;
            ops::reconcile(Pools::Pg(&self.pool), mode, req).await
        })
    }

    fn cursor(&self) -> Option<&dyn ferry_core::CursorStore> {
        Some(self)
    }

    fn server_warnings(
        &self,
    ) -> BoxFuture<'_, Result<Vec<ferry_core::SettingWarning>, StoreError>> {
        Box::pin(async move {
            let s = crate::server_settings::read_pg(&self.pool).await?;
            Ok(crate::server_settings::pg_warnings(&s))
        })
    }
}

/// Opens a dedicated connection (used by tests and tools that need session state).
pub async fn connect_one(url: &str) -> Result<PgConnection, StoreError> {
    PgConnection::connect(url)
        .await
        .map_err(|e| db_err("connect", e))
}
