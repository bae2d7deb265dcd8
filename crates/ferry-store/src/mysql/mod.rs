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

use ferry_core::store::prelude::*;
use ferry_core::{
    BoxFuture, ClaimRequest, ClaimedEvent, EnqueueError, EventRecord, Limits, OutboxStatus,
    QuarantinedEvent, SlotLease, StoreError, ValidatedEvent,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{Executor, MySql, MySqlPool, QueryBuilder, Row, Transaction};

use crate::enqueue::{push_intent, InsertIntents};
use crate::error::{db_err, enqueue_err, url_options, Ctx};
use crate::lookup::record_sql;
use crate::migrate::MIGRATIONS_MYSQL;
use crate::operator::{self, operator_outcome, Pools};
use crate::options::ConnectOptions;
use crate::request::claiming;
use crate::rows::{record_from, status_from, StatusRow};
use crate::time::micros;
use rows::{claimed_from_row, lease_from_row, otxt, txt};
use sql::{push_list, CHUNK, STATUS_CACHE};

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
    pool: MySqlPool,
    limits: Limits,
    /// Rows claims passed over under contention ([`OutboxStore::rows_skipped_locked`]).
    skipped: Arc<AtomicU64>,
    /// Cursor dispatch's horizon ticker (started by the first cursor read).
    ticker: Arc<Ticker>,
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

    async fn operator_update(
        &self,
        event_id: &str,
        operator: &str,
        target: &str,
    ) -> Result<(), StoreError> {
        let mode = self.stored_mode().await?;
        let pools = Pools::My(&self.pool);
        let n = operator::operator_update(pools, mode, target, &sql::OPERATOR, event_id, operator)
            .await?;
        operator_outcome(n, event_id, self.record(event_id)).await
    }
}

impl ferry_core::RowDispatch for MyStore {
    fn claim<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>> {
        Box::pin(claiming(req, async move { self.claim_rows(req).await }))
    }

    fn rows_skipped_locked(&self) -> Option<u64> {
        Some(self.skipped.load(Ordering::Relaxed))
    }

    fn lookup_claim<'a>(
        &'a self,
        claim_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>> {
        Box::pin(async move {
            let sql = sql::lookup_claim();
            crate::lookup::lookup_claim(&self.pool, &sql, claim_id, claimed_from_row).await
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
                return Err(crate::error::owner_in_use(owner));
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
            Ok(crate::rows::members_from(rows.into_iter().map(
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
    crate::operator::operator_writes!(pool.begin, Transaction::commit);

    fn list_quarantined(
        &self,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<QuarantinedEvent>, StoreError>> {
        Box::pin(async move {
            let sql = match self.stored_mode().await? {
                ferry_core::DispatchMode::Row => sql::QUARANTINED_ROWS,
                // successors are held exceptions, or not yet read past the cursor
                ferry_core::DispatchMode::Cursor => sql::QUARANTINED_CURSOR,
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
        })
    }

    fn record<'a>(
        &'a self,
        event_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<EventRecord>, StoreError>> {
        Box::pin(async move {
            let r = sqlx::query(&record_sql(
                self.stored_mode().await?,
                "?",
                sql::RECORD_PAYLOAD,
            ))
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
                    otxt(&r, 7),
                    r.get(8),
                ))
            })
            .transpose()
        })
    }
}

impl ferry_core::OutboxStore for MyStore {
    crate::operator::bulk::bulk_actions!(My, My, pool.begin, Transaction::commit);

    fn backend(&self) -> &'static str {
        "mysql"
    }

    fn shared_status(
        &self,
        max_age: std::time::Duration,
    ) -> BoxFuture<'_, Result<OutboxStatus, StoreError>> {
        use ferry_core::OperatorActions;
        Box::pin(crate::status_cache::shared_status(
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
            operator::purge::purge_sent(Pools::My(&self.pool), self.stored_mode().await?, req).await
        })
    }

    fn replay_scan<'a>(
        &'a self,
        filter: &'a ferry_core::replay::ReplayFilter,
    ) -> BoxFuture<'a, Result<Vec<ferry_core::replay::TopicScan>, StoreError>> {
        Box::pin(async move {
            let mode = self.stored_mode().await?;
            operator::replay::scan(Pools::My(&self.pool), mode, filter).await
        })
    }

    fn replay_page<'a>(
        &'a self,
        req: &'a ferry_core::replay::ReplayPageRequest<'a>,
    ) -> BoxFuture<'a, Result<ferry_core::replay::ReplayPage, StoreError>> {
        Box::pin(async move {
            let mode = self.stored_mode().await?;
            operator::replay::page(Pools::My(&self.pool), mode, req).await
        })
    }

    fn reconcile<'a>(
        &'a self,
        req: &'a ferry_core::ReconcileRequest,
    ) -> BoxFuture<'a, Result<ferry_core::ReconcileReport, StoreError>> {
        Box::pin(async move {
            operator::reconcile::reconcile(Pools::My(&self.pool), self.stored_mode().await?, req)
                .await
        })
    }

    fn cursor(&self) -> Option<&dyn ferry_core::CursorStore> {
        Some(self)
    }

    fn pause_control(&self) -> Option<&dyn ferry_core::PauseControl> {
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

crate::operator::pause::pause_control!(MyStore, My);
