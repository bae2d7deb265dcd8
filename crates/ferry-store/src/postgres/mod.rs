//! PostgreSQL backend (13+: cursor dispatch needs pg_current_xact_id and pg_snapshot; tested on 15).
//!
//! Claim: one short transaction of two statements — a `set_config` that turns bitmap and
//! sequential scans off for it, then a CTE that selects due, predecessor-free rows of the
//! requested slots in `seq` order `FOR UPDATE SKIP LOCKED`, whose outer `UPDATE … RETURNING`
//! increments `claim_version`, sets `claim_id`/`lease_until` and returns each token. Outcomes are one `UPDATE … FROM UNNEST(…) RETURNING seq` per batch, fenced on
//! `(state = 'CLAIMED', claim_version, claim_id)`.
mod claim;
mod cursor;
mod mode;
mod sql;
mod windows;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{
    CasReport, ClaimRequest, ClaimToken, ClaimedEvent, DispatchMode, EnqueueError, EventRecord,
    Limits, OutboxStatus, Payload, SlotId, SlotLease, SlotRelease, SlotRequest, StoreError,
    ValidatedEvent,
};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection, PgPool, Row};

use crate::enqueue::InsertIntents;
use crate::error::{db_err, enqueue_err, url_options, Ctx};
use crate::migrate::MIGRATIONS_POSTGRES;
use crate::options::ConnectOptions;
use crate::outcome::{Outcome, Transition};
use crate::protocol::Ops;
use crate::rows::{lease_from, status_from, StatusRow};
use crate::time::micros;
use sql::{INSERT, STATUS_CACHE};

/// The `application_name` a ferry store's connections report when the URL sets none
/// (`?application_name=…` in the URL overrides it).
pub const APPLICATION_NAME: &str = "ferry";

crate::enqueue::enqueue_fns!(PgConnection);

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
            // a key equal to the aggregate id is stored as NULL (migration 16): every read is
            // coalesce(msg_key, aggregate_id)
            .bind(
                rows.iter()
                    .map(|r| (r.key != r.aggregate_id).then(|| r.key.clone()))
                    .collect::<Vec<_>>(),
            )
            .bind(col(|r| &r.event_type))
            .bind(col(|r| &r.headers))
            .bind(
                rows.iter()
                    .map(|r| r.payload.as_text().map(str::to_owned))
                    .collect::<Vec<_>>(),
            )
            .bind(
                rows.iter()
                    .map(|r| r.payload.as_binary().map(<[u8]>::to_vec))
                    .collect::<Vec<_>>(),
            )
            .execute(&mut *conn)
            .await
            .map_err(|e| enqueue_err(rows, e))?;
        Ok(())
    }
}

/// The PostgreSQL outbox store.
#[derive(Debug, Clone)]
pub struct PgStore {
    pub(crate) pool: PgPool,
    pub(crate) limits: Limits,
    /// Rows claims passed over under contention ([`ferry_core::RowDispatch::rows_skipped_locked`]).
    skipped: Arc<AtomicU64>,
    /// Whether claims measure `skipped` (`ConnectOptions::measure_contention`).
    measure: bool,
    /// The aggregate id after which the next heads-first claim starts ("" for the first).
    heads_from: crate::heads::HeadsFrom,
}

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
        payload: Payload::from_columns(r.get(11), r.get(12)),
        attempts: r.get(13),
        created_at: r.get(14),
    }
}

impl PgStore {
    /// Connects to `url`; migrates unless `opts.migrate` is false.
    pub async fn connect(url: &str, opts: &ConnectOptions) -> Result<Self, StoreError> {
        let conn: PgConnectOptions = url_options(url, "PostgreSQL", &crate::url::redact_url(url))?;
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
        let pool = crate::pool::pool_options::<sqlx::Postgres>(
            opts.max_connections,
            opts.acquire_timeout,
            crate::pool::PING_IDLE_AFTER,
        );
        let pool = crate::pool::open_pool(pool, conn)
            .await
            .map_err(|e| db_err("cannot connect to PostgreSQL", e))?;
        let store = Self {
            pool,
            limits: opts.limits,
            skipped: Arc::default(),
            measure: opts.measure_contention,
            heads_from: Default::default(),
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
    let sql = sql::cas(on.table, on.alias, o.to);
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

crate::protocol::impls::store_traits!(PgStore, sql);
crate::protocol::impls::handles! {
    PgStore: sqlx::PgConnection, sqlx::Transaction<'static, sqlx::Postgres>, Pg, pool.begin;
}

impl Ops for PgStore {
    async fn check_windows(&self, mode: DispatchMode) -> Result<(), StoreError> {
        self.check_xids(mode).await
    }

    async fn claim_rows(&self, req: &ClaimRequest) -> Result<Vec<ClaimedEvent>, StoreError> {
        self.claim_window_then_heads(req).await
    }

    fn rows_skipped_locked(&self) -> Option<u64> {
        self.measure.then(|| self.skipped.load(Ordering::Relaxed))
    }

    async fn lookup_claim(&self, claim_id: &str) -> Result<Vec<ClaimedEvent>, StoreError> {
        crate::lookup::lookup_claim(&self.pool, &sql::lookup_claim(), claim_id, claimed_from_row)
            .await
    }

    async fn acquire_slots(&self, req: &SlotRequest<'_>) -> Result<Vec<SlotLease>, StoreError> {
        // Rows are locked in slot order first (the cursor advance does the same), so a renewal
        // and an advance over overlapping slots cannot deadlock.
        let rows: Vec<(i16, String, i64, i64)> = sqlx::query_as(sql::ACQUIRE_SLOTS)
            .bind(req.owner)
            .bind(slots_i16(req.slots.iter().copied()))
            .bind(micros(req.ttl))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| db_err("acquire slots", e))?;
        Ok(rows.into_iter().map(lease_from).collect())
    }

    async fn release_slots(&self, req: &SlotRelease<'_>) -> Result<(), sqlx::Error> {
        sqlx::query(sql::RELEASE_SLOTS)
            .bind(req.owner)
            .bind(slots_i16(req.slots.iter().copied()))
            .execute(&self.pool)
            .await
            .map(drop)
    }

    async fn status_rows(&self) -> Result<OutboxStatus, StoreError> {
        let r: StatusRow = sqlx::query_as(&sql::status_rows())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| db_err("status", e))?;
        Ok(status_from(r))
    }

    async fn status_cursor(&self) -> Result<OutboxStatus, StoreError> {
        // Unfinished = not yet behind the slot's cursor, or an open exception. No row below the
        // lowest window's lower snapshot xmin can be unfinished without an exception row: that
        // bound (read first and bound as a value, so the planner estimates the range from it)
        // keeps the scan off the dispatched history.
        let low: i64 = sqlx::query_scalar(sql::STATUS_LOW_XID)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| db_err("status: cursors", e))?;
        // The rows past that bound are the newest part of the table, but once they are a few
        // per cent of it the planner reads the whole table instead of the (xid, seq) index: on
        // 11,000,000 rows with 1,000,000 past the bound a parallel sequential scan took 2.3–2.7 s
        // (plus JIT), the index 0.6–0.8 s, and beside a burn-down that cost grew with the
        // delivered history.
        let mut tx = self.pool.begin().await.ctx("status: begin")?;
        sqlx::query(sql::STATUS_PLAN_SETTINGS)
            .execute(&mut *tx)
            .await
            .map_err(|e| db_err("status: plan settings", e))?;
        let r: StatusRow = sqlx::query_as(&sql::status_cursor())
            .bind(low)
            .bind(0i64)
            .persistent(false)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| db_err("status", e))?;
        tx.commit().await.map_err(|e| db_err("status: commit", e))?;
        Ok(status_from(r))
    }

    async fn record(&self, m: DispatchMode, id: &str) -> Result<Option<EventRecord>, StoreError> {
        crate::lookup::record(&self.pool, m, "$1", sql::RECORD_PAYLOAD, id).await
    }

    async fn shared_status(&self, max_age: Duration) -> Result<OutboxStatus, StoreError> {
        crate::status_cache::shared_status(
            &self.pool,
            &STATUS_CACHE,
            sqlx::postgres::PgQueryResult::rows_affected,
            max_age,
            crate::protocol::status(self),
        )
        .await
    }

    async fn listen_commits(&self, wake: Arc<dyn Fn() + Send + Sync>) -> Result<bool, StoreError> {
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
    }

    async fn server_warnings(&self) -> Result<Vec<ferry_core::SettingWarning>, StoreError> {
        let s = crate::server_settings::read_pg(&self.pool).await?;
        Ok(crate::server_settings::pg_warnings(&s))
    }
}

/// Slots as PostgreSQL's `int2[]`.
pub(crate) fn slots_i16(slots: impl IntoIterator<Item = SlotId>) -> Vec<i16> {
    slots.into_iter().map(|s| s as i16).collect()
}

/// Opens a dedicated connection (used by tests and tools that need session state).
pub async fn connect_one(url: &str) -> Result<PgConnection, StoreError> {
    PgConnection::connect(url)
        .await
        .map_err(|e| db_err("connect", e))
}
