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
mod claim;
mod cursor;
mod gate;
mod outcome;
mod rows;
mod sql;
mod ticker;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use ferry_core::{
    ClaimRequest, ClaimedEvent, DispatchMode, EnqueueError, EventRecord, Limits, MemberHeartbeat,
    OutboxStatus, SlotLease, SlotRelease, SlotRequest, StoreError, ValidatedEvent,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{Executor, MySql, MySqlPool, QueryBuilder, Row};

use crate::enqueue::{push_intent, InsertIntents};
use crate::error::{db_err, enqueue_err, url_options, Ctx};
use crate::lookup::record_sql;
use crate::migrate::MIGRATIONS_MYSQL;
use crate::options::ConnectOptions;
use crate::protocol::Ops;
use crate::rows::{record_from, status_from, StatusRow};
use crate::time::micros;
use rows::{claimed_from_row, lease_from_row, otxt, txt};
use sql::{fetch_rows, owned_slots, CHUNK, STATUS_CACHE};

crate::enqueue::enqueue_fns!(MySqlConnection);

impl InsertIntents for MySqlConnection {
    async fn insert_intents(&mut self, rows: &[ValidatedEvent]) -> Result<(), EnqueueError> {
        let conn = self;
        for chunk in rows.chunks(CHUNK) {
            let mut qb: QueryBuilder<MySql> = QueryBuilder::new(sql::INSERT_HEAD);
            qb.push_values(chunk, |mut b, r| {
                push_intent(&mut b, r, r.shard_slot as i16);
                let (text, bytes) = r.payload.columns();
                b.push_bind(text).push_bind(bytes);
            });
            qb.build()
                .execute(&mut *conn)
                .await
                .map_err(|e| enqueue_err(chunk, e))?;
        }
        Ok(())
    }
}

/// The store's handle on its ticker task (started by the first cursor read).
#[derive(Debug, Default)]
pub(crate) struct Ticker {
    pub(crate) started: AtomicBool,
    pub(crate) wake: tokio::sync::Notify,
}

/// The MySQL/MariaDB outbox store.
#[derive(Debug, Clone)]
pub struct MyStore {
    pub(crate) pool: MySqlPool,
    pub(crate) limits: Limits,
    /// Rows claims passed over under contention ([`ferry_core::RowDispatch::rows_skipped_locked`]).
    skipped: Arc<AtomicU64>,
    /// Cursor dispatch's horizon ticker (started by the first cursor read).
    ticker: Arc<Ticker>,
    /// Where a row claim's next scan for heads starts ([`claim`]).
    heads_from: crate::heads::HeadsFrom,
}

impl MyStore {
    /// Connects to `url`; migrates unless `opts.migrate` is false.
    pub async fn connect(url: &str, opts: &ConnectOptions) -> Result<Self, StoreError> {
        let conn: MySqlConnectOptions = url_options(url, "MySQL", &crate::url::redact_url(url))?;
        Self::connect_with(conn, opts).await
    }

    /// Connects with explicit options.
    pub async fn connect_with(
        conn: MySqlConnectOptions,
        opts: &ConnectOptions,
    ) -> Result<Self, StoreError> {
        let pool = crate::pool::pool_options::<MySql>(
            opts.max_connections,
            opts.acquire_timeout,
            crate::pool::PING_IDLE_AFTER,
        )
        .after_connect(|c, _| {
            Box::pin(async move {
                c.execute(sql::SESSION_READ_COMMITTED).await?;
                // MariaDB 10.3+: abort a session idle for 10 s inside a transaction, so a
                // stalled relay cannot hold its row locks (and block a takeover) forever.
                // MySQL has no such variable; the error is ignored there.
                let _ = c.execute(sql::SESSION_IDLE_TIMEOUT).await;
                Ok(())
            })
        });
        let pool = crate::pool::open_pool(pool, conn)
            .await
            .map_err(|e| db_err("cannot connect to MySQL/MariaDB", e))?;
        let store = Self {
            pool,
            limits: opts.limits,
            skipped: Arc::default(),
            ticker: Arc::default(),
            heads_from: Default::default(),
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

    pub(crate) fn ticker(&self) -> &Arc<Ticker> {
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
        // much again (0.8 s against 0.5 s of server CPU for 200,000 intents behind).
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
}

crate::protocol::impls::store_traits!(MyStore, sql);
crate::protocol::impls::handles! {
    MyStore: sqlx::MySqlConnection, sqlx::Transaction<'static, sqlx::MySql>, My, pool.begin;
}

impl Ops for MyStore {
    async fn claim_rows(&self, req: &ClaimRequest) -> Result<Vec<ClaimedEvent>, StoreError> {
        self.claim_locked(req).await
    }

    fn rows_skipped_locked(&self) -> Option<u64> {
        Some(self.skipped.load(Ordering::Relaxed))
    }

    async fn lookup_claim(&self, claim_id: &str) -> Result<Vec<ClaimedEvent>, StoreError> {
        crate::lookup::lookup_claim(&self.pool, &sql::lookup_claim(), claim_id, claimed_from_row)
            .await
    }

    async fn acquire_slots(&self, req: &SlotRequest<'_>) -> Result<Vec<SlotLease>, StoreError> {
        let (owner, slots) = (req.owner, req.slots);
        let mut tx = self.pool.begin().await.ctx("acquire slots: begin")?;
        sql::acquire_slots(owner, micros(req.ttl), slots)
            .build()
            .execute(&mut *tx)
            .await
            .map_err(|e| db_err("acquire slots", e))?;
        let lease = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', lease_until)";
        let mut qb = owned_slots(&format!("slot, owner, epoch, {lease}"), owner, "", slots);
        let rows = fetch_rows(&mut qb, &mut *tx, "acquire slots: read").await?;
        tx.commit().await.ctx("acquire slots: commit")?;
        Ok(rows.iter().map(lease_from_row).collect())
    }

    async fn release_slots(&self, req: &SlotRelease<'_>) -> Result<(), sqlx::Error> {
        sql::release_slots(req.owner, req.slots)
            .build()
            .execute(&self.pool)
            .await
            .map(drop)
    }

    /// MariaDB's upsert changes the row whether or not it was ours: the row says who holds it.
    /// Its assignments run left to right, so `instance` is ours afterwards exactly when the row
    /// was ours or expired, and only then was the lease renewed.
    async fn member_held(&self, req: &MemberHeartbeat<'_>, _: u64) -> Result<bool, StoreError> {
        let holder: Option<Vec<u8>> = sqlx::query_scalar(sql::MEMBER_INSTANCE)
            .bind(req.owner)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| db_err("member heartbeat", e))?;
        Ok(holder.as_deref() == Some(req.instance.as_bytes()))
    }

    async fn status_rows(&self) -> Result<OutboxStatus, StoreError> {
        let r = sqlx::query(
            // Counts read the state prefix of ferry_outbox_due (no row lookups); the oldest
            // unfinished intent is the lowest seq of each unfinished state (one index probe
            // each). A single aggregate over all unfinished rows took over a second with a
            // 60k backlog.
            sql::STATUS_ROWS,
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
    }

    async fn status_cursor(&self) -> Result<OutboxStatus, StoreError> {
        self.cursor_status().await
    }

    async fn record(
        &self,
        mode: DispatchMode,
        id: &str,
    ) -> Result<Option<EventRecord>, StoreError> {
        let r = sqlx::query(&record_sql(mode, "?", sql::RECORD_PAYLOAD))
            .bind(id)
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
                otxt(&r, 7),
                r.get(8),
            ))
        })
        .transpose()
    }

    async fn shared_status(
        &self,
        max_age: std::time::Duration,
    ) -> Result<OutboxStatus, StoreError> {
        crate::status_cache::shared_status(
            &self.pool,
            &STATUS_CACHE,
            sqlx::mysql::MySqlQueryResult::rows_affected,
            max_age,
            crate::protocol::status(self),
        )
        .await
    }

    async fn server_warnings(&self) -> Result<Vec<ferry_core::SettingWarning>, StoreError> {
        let s = crate::server_settings::read_mysql(&self.pool).await?;
        Ok(crate::server_settings::mysql_warnings(&s))
    }
}
