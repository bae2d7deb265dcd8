//! [`Inbox`]: a pool plus an [`InboxConfig`], over the per-backend functions.
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use ferry_core::BoxFuture;
use sqlx::{MySqlConnection, PgConnection, SqliteConnection};

use crate::config::{GapPolicy, InboxConfig};
use crate::delivery::Delivery;
use crate::error::{self, BoxError, InboxError};
use crate::gap::GapInfo;
use crate::pool::{Conn, InboxPool};
use crate::verdict::Verdict;
use crate::{mysql, postgres, sqlite};

/// Rows [`Inbox::prune`] deletes per statement.
pub const PRUNE_BATCH: usize = 1_000;

/// A pool plus an [`InboxConfig`]: the convenience layer over the per-backend functions.
#[derive(Debug, Clone)]
pub struct Inbox {
    pool: InboxPool,
    config: InboxConfig,
}

/// Runs `$body` with `$c` bound to a pooled connection of whichever backend, and `$m` to its
/// module.
macro_rules! with_conn {
    ($self:expr, |$c:ident, $m:ident| $body:expr) => {
        match &$self.pool {
            InboxPool::Postgres(p) => {
                let mut guard = p.acquire().await.map_err(|e| error::db_err("acquire", e))?;
                let $c: &mut PgConnection = &mut guard;
                use crate::postgres as $m;
                $body
            }
            InboxPool::Mysql(p) => {
                let mut guard = p.acquire().await.map_err(|e| error::db_err("acquire", e))?;
                let $c: &mut MySqlConnection = &mut guard;
                use crate::mysql as $m;
                $body
            }
            InboxPool::Sqlite(p) => {
                let mut guard = p.acquire().await.map_err(|e| error::db_err("acquire", e))?;
                let $c: &mut SqliteConnection = &mut guard;
                use crate::sqlite as $m;
                $body
            }
        }
    };
}

impl Inbox {
    /// Wraps an existing pool (e.g. the application's, or `ferry_store`'s `pool().clone()`).
    /// Does not migrate; call [`Inbox::migrate`] once at startup.
    pub fn new(pool: InboxPool, config: InboxConfig) -> Self {
        Self { pool, config }
    }

    /// Connects to `url` (pool of 10) and applies the embedded migrations.
    pub async fn connect(url: &str, config: InboxConfig) -> Result<Self, InboxError> {
        let inbox = Self::new(InboxPool::connect(url, 10).await?, config);
        inbox.migrate().await?;
        Ok(inbox)
    }

    /// The pool the inbox runs on, e.g. to open a consumer transaction by hand.
    pub fn pool(&self) -> &InboxPool {
        &self.pool
    }

    /// The gap policy and baseline every `apply_once` records with.
    pub fn config(&self) -> &InboxConfig {
        &self.config
    }

    /// Applies pending inbox migrations under the backend's lock; returns the versions this
    /// call applied (empty when up to date, including after waiting for a concurrent migrate).
    pub async fn migrate(&self) -> Result<Vec<i64>, InboxError> {
        with_conn!(self, |c, m| m::migrate(c).await)
    }

    /// Inbox + effect in one local transaction: begins (SQLite: `BEGIN IMMEDIATE`), records
    /// `delivery`, runs `effect` on the same transaction only when the verdict
    /// [should apply](Verdict::should_apply), and commits. `Duplicate` and `Stale` roll back
    /// (nothing to keep); `Early` commits the aggregate's high-water mark so `gaps()` shows
    /// the hold-back (the caller must still arrange redelivery). If the effect fails, the
    /// transaction rolls back and nothing is recorded: the redelivery is `New` again.
    ///
    /// A transient error ([`InboxError::is_transient`]: a concurrent delivery of the same
    /// event on a stricter isolation level, a deadlock, `SQLITE_BUSY`) may simply be retried.
    pub async fn apply_once<F>(&self, delivery: &Delivery, effect: F) -> Result<Verdict, InboxError>
    where
        F: for<'c> FnOnce(Conn<'c>, &'c Delivery) -> BoxFuture<'c, Result<(), BoxError>>,
    {
        macro_rules! run {
            ($tx:expr, $m:ident, $variant:ident) => {{
                let mut tx = $tx.map_err(|e| error::db_err("begin", e))?;
                let verdict = $m::record(&mut tx, &self.config, delivery).await?;
                if verdict.should_apply() {
                    effect(Conn::$variant(&mut tx), delivery)
                        .await
                        .map_err(error::effect_err)?;
                }
                if verdict.should_apply() || matches!(verdict, Verdict::Early { .. }) {
                    tx.commit().await.map_err(|e| error::db_err("commit", e))?;
                } else {
                    tx.rollback()
                        .await
                        .map_err(|e| error::db_err("rollback", e))?;
                }
                Ok(verdict)
            }};
        }
        match &self.pool {
            InboxPool::Postgres(p) => run!(p.begin().await, postgres, Postgres),
            InboxPool::Mysql(p) => run!(p.begin().await, mysql, Mysql),
            InboxPool::Sqlite(p) => run!(p.begin_with("BEGIN IMMEDIATE").await, sqlite, Sqlite),
        }
    }

    /// The subset of `event_ids` whose effect `consumer` has committed.
    pub async fn consumed<S: AsRef<str>>(
        &self,
        consumer: &str,
        event_ids: &[S],
    ) -> Result<HashSet<String>, InboxError> {
        with_conn!(self, |c, m| m::consumed(c, consumer, event_ids).await)
    }

    /// Number of consumed events per consumer.
    pub async fn consumed_counts(&self) -> Result<BTreeMap<String, i64>, InboxError> {
        with_conn!(self, |c, m| m::consumed_counts(c).await)
    }

    /// Inbox retention: deletes the dedupe rows of `consumer` recorded more than `older_than`
    /// ago whose version is covered by their aggregate's contiguous mark (`applied_upto`), in
    /// batches of at most [`PRUNE_BATCH`] rows (a SELECT of the candidates, then one DELETE),
    /// so deliveries are not held up. Returns the rows deleted.
    ///
    /// Safe against redelivery: a pruned event delivered again is [`Verdict::Stale`] (its
    /// version is covered), so its effect is not applied twice. Kept: rows above the mark
    /// (recorded past an open gap, still needed to close it) and every row of a consumer that
    /// records with [`GapPolicy::Off`] (no mark: the row is the only dedupe record).
    /// [`Inbox::consumed`] and [`Inbox::consumed_counts`] count rows, so they no longer count
    /// a pruned event; `ferry purge --consumer` and `ferry reconcile --consumer` count a
    /// version covered by the mark as consumed, with or without its row.
    pub async fn prune(&self, consumer: &str, older_than: Duration) -> Result<u64, InboxError> {
        Delivery::new(consumer, "-", "-", 1).validate(&InboxConfig::new(GapPolicy::Off))?;
        let older_than_us = i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
        // keyset batches by event id: no batch rescans what earlier ones passed; the rows a
        // batch picked stay eligible until it deletes them (inbox rows never change and the
        // mark never decreases)
        let (mut total, mut after) = (0u64, String::new());
        loop {
            let ids = with_conn!(self, |c, m| {
                m::prune_candidates(c, consumer, older_than_us, &after, PRUNE_BATCH).await
            })?;
            if !ids.is_empty() {
                total += with_conn!(self, |c, m| m::delete_rows(c, consumer, &ids).await)?;
            }
            match ids.last() {
                Some(last) if ids.len() == PRUNE_BATCH => after = last.clone(),
                _ => return Ok(total),
            }
            tracing::debug!(consumer, deleted = total, "inbox prune: batch done");
        }
    }

    /// Aggregates with an open gap for `consumer`, oldest gap first.
    pub async fn gaps(&self, consumer: &str) -> Result<Vec<GapInfo>, InboxError> {
        with_conn!(self, |c, m| m::gaps(c, consumer).await)
    }

    /// Operator repair: treat every version of `aggregate_id` up to `through` as done for
    /// `consumer` (missing ones will never come), in its own transaction. Returns the new
    /// contiguous mark (which may move further over versions recorded ahead of the gap).
    pub async fn accept_gap(
        &self,
        consumer: &str,
        aggregate_id: &str,
        through: i64,
    ) -> Result<i64, InboxError> {
        macro_rules! run {
            ($tx:expr, $m:ident) => {{
                let mut tx = $tx.map_err(|e| error::db_err("begin", e))?;
                let upto = $m::accept_gap(&mut tx, consumer, aggregate_id, through).await?;
                tx.commit().await.map_err(|e| error::db_err("commit", e))?;
                Ok(upto)
            }};
        }
        match &self.pool {
            InboxPool::Postgres(p) => run!(p.begin().await, postgres),
            InboxPool::Mysql(p) => run!(p.begin().await, mysql),
            InboxPool::Sqlite(p) => run!(p.begin_with("BEGIN IMMEDIATE").await, sqlite),
        }
    }
}
