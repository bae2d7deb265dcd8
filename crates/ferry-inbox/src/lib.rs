//! The consumer-side Inbox of ferry: a downstream business effect is committed **exactly once**
//! per consumer, however many times the relay delivers the event (the relay delivers at least
//! once: docs/architecture.md, "The four crash windows" and "Consumers: the Inbox").
//!
//! # Contract
//!
//! * [`postgres::record`], [`mysql::record`] and [`sqlite::record`] run **inside the consumer's
//!   own sqlx transaction** (`&mut *tx`), before the effect. They insert `(consumer, event_id)`
//!   into `ferry_inbox`, whose primary key is the dedupe, and return a [`Verdict`]:
//!   [`Verdict::New`] (apply the effect in the same transaction and commit) or
//!   [`Verdict::Duplicate`] (skip the effect). Because the record and the effect share one
//!   local transaction, either both commit or neither does: a rolled-back consumer transaction
//!   leaves no inbox row, and the redelivery is `New` again. Tests (`tests/inbox_conformance.rs`,
//!   every backend): `duplicate_applies_effect_once`, `rollback_leaves_no_record`,
//!   `consumers_are_independent`.
//! * Two transactions delivering the same event at once never both get `New`: the second one
//!   waits on the first's uncommitted key (or, with gap detection on, on the aggregate's row
//!   lock) and then gets `Duplicate` when the first commits, `New` when it rolled back, or — at
//!   `REPEATABLE READ`/`SERIALIZABLE` on PostgreSQL, or on a deadlock — a retryable error
//!   ([`InboxError::is_transient`]). After **any** error, roll the transaction back. Tests:
//!   `concurrent_delivery_waits_for_the_first`, `racing_deliveries_apply_once`,
//!   `concurrent_versions_of_one_aggregate`.
//! * With gap detection on ([`GapPolicy::Report`] or [`GapPolicy::HoldBack`]), each delivery
//!   also locks `ferry_inbox_aggregate (consumer, aggregate_id)`, which stores the highest
//!   version applied contiguously (`applied_upto`). v(n+1) arriving before v(n) is
//!   [`Verdict::Gap`] (recorded, apply it if your projection tolerates it) under `Report`, and
//!   [`Verdict::Early`] (nothing recorded, do not apply, have it redelivered) under `HoldBack`.
//!   [`gaps`](Inbox::gaps) lists aggregates with an open gap; [`accept_gap`](Inbox::accept_gap)
//!   is the operator's repair when a missing version will never come. The decision is written
//!   once for every backend (`engine.rs`, `record` over each backend's statements). Tests:
//!   `gap_is_reported_and_closes`, `gap_is_held_back_until_the_predecessor`,
//!   `accept_gap_repairs_a_lost_version`, `first_seen_baseline_starts_mid_stream`.
//! * Invalid input ([`Delivery::validate`]: empty or over-long ids, a version below 1 when gaps
//!   are tracked) is refused before any statement runs. Test: `bad_input_writes_nothing`.
//! * [`Inbox::apply_once`] is the whole pattern in one call on a pool: begin, record, run the
//!   effect closure only when the verdict says so, commit.
//! * [`runner::ConsumerRunner`] (feature `kafka`, on by default) is the consumer loop around it:
//!   it reads a ferry topic, applies each message with `apply_once` on tasks keyed by the
//!   aggregate (so one aggregate is applied in order), retries transient errors, counts the
//!   verdicts and says when it has caught up with the topic. Test: `tests/consumer_runner.rs`.
//! * [`Inbox::prune`] deletes only rows older than its window **and** covered by their
//!   aggregate's contiguous mark, which never decreases: a pruned event delivered again is
//!   `Stale`, never `New`. Test: `prune_deletes_only_what_the_mark_covers`.
//!
//! ## What the caller does with each verdict
//!
//! | verdict | inbox row written | effect | then |
//! | --- | --- | --- | --- |
//! | `New` | yes | apply | commit, then acknowledge the message |
//! | `Gap` | yes | apply (or not, the record stays) | commit, acknowledge; alert on [`Inbox::gaps`] |
//! | `Duplicate` | no | skip | commit or roll back (nothing to keep), acknowledge |
//! | `Stale` | no | skip | commit or roll back, acknowledge; the version is covered already |
//! | `Early` | no | skip | **do not acknowledge**: commit (keeps the gap visible to `gaps`) or roll back, then make the transport redeliver it later |
//!
//! "Redeliver later" depends on the transport: a nack/requeue with delay or a visibility
//! timeout for queues; for a Kafka partition, the consumer must not block the partition on an
//! early message (v(n) may sit behind it in the same partition): park it in a retry topic or
//! table and commit the offset, or use `Report`. ferry's relay already delivers each aggregate
//! in version order (shard workers + predecessor rule), so a gap downstream means a repair or a
//! foreign producer skipped a version — it is an alert, not routine.
//!
//! # Schema
//!
//! Tables `ferry_inbox` and `ferry_inbox_aggregate`, created by this crate's own embedded
//! migrations in `crates/ferry-inbox/migrations/<backend>/NNNN_name.sql` and tracked in their
//! own table `ferry_inbox_migrations` (independent of the outbox's `ferry_schema_migrations`,
//! so a consumer database needs no outbox). Migrations apply under the same kind of lock as
//! the store's: a transaction-scoped advisory lock keyed by schema on PostgreSQL, `GET_LOCK`
//! keyed by database on MariaDB/MySQL, `BEGIN IMMEDIATE` on SQLite (tests
//! `concurrent_migrations_apply_once`, `fresh_concurrent_migrations`). Table names are fixed;
//! every value is a bind parameter.
//!
//! # Backend notes
//!
//! * SQLite: begin the consumer transaction with `BEGIN IMMEDIATE` (as `apply_once` does);
//!   a deferred transaction that read first may fail with `SQLITE_BUSY` on its first write
//!   (classified retryable).
//! * MariaDB/MySQL: correct at `READ COMMITTED` and at the default `REPEATABLE READ` (the
//!   inbox reads its own rows only with locking reads, which see the latest committed data).
#![deny(missing_docs)]
#![warn(unreachable_pub)]

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use ferry_core::BoxFuture;
use sqlx::{MySqlConnection, PgConnection, SqliteConnection};

mod engine;
mod error;
mod migrate;
pub mod mysql;
mod pool;
pub mod postgres;
#[cfg(feature = "kafka")]
pub mod runner;
pub mod sqlite;

pub use error::{BoxError, InboxError};
pub use ferry_store::Backend;
pub use migrate::{MIGRATIONS_MYSQL, MIGRATIONS_POSTGRES, MIGRATIONS_SQLITE};
pub use pool::{Conn, InboxPool, PoolOptions};
#[cfg(feature = "kafka")]
pub use runner::{Accept, ConsumerRunner, Effect, RunnerConfig, RunnerStats};
pub use sqlx::sqlite::SqliteSynchronous;

/// Rows [`Inbox::prune`] deletes per statement.
pub const PRUNE_BATCH: usize = 1_000;

/// The longest consumer name, event id or aggregate id accepted (the columns' width).
pub const MAX_IDENT_LEN: usize = 255;

/// Message header carrying the event id (set by ferry's Kafka sink).
pub const HEADER_EVENT_ID: &str = "ferry-event-id";
/// Message header carrying the aggregate id.
pub const HEADER_AGGREGATE_ID: &str = "ferry-aggregate-id";
/// Message header carrying the aggregate version (decimal text).
pub const HEADER_AGGREGATE_VERSION: &str = "ferry-aggregate-version";

/// One delivery of an event to one consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The consumer (one logical subscriber: a service, or a projection within it). Dedupe and
    /// gap tracking are per consumer, so two consumers each apply the event once.
    pub consumer: String,
    /// The event's id (`ferry-event-id`), stable across redeliveries.
    pub event_id: String,
    /// The aggregate (`ferry-aggregate-id`).
    pub aggregate_id: String,
    /// The aggregate version (`ferry-aggregate-version`), from 1.
    pub aggregate_version: i64,
}

impl Delivery {
    /// A delivery of `event_id` (aggregate `aggregate_id` at `aggregate_version`) to `consumer`.
    pub fn new(
        consumer: impl Into<String>,
        event_id: impl Into<String>,
        aggregate_id: impl Into<String>,
        aggregate_version: i64,
    ) -> Self {
        Self {
            consumer: consumer.into(),
            event_id: event_id.into(),
            aggregate_id: aggregate_id.into(),
            aggregate_version,
        }
    }

    /// Reads the ferry headers of a received message (`(key, value)` pairs, e.g. from
    /// rdkafka's `Headers::iter()`), naming the header that is missing or malformed.
    pub fn from_headers<'h>(
        consumer: impl Into<String>,
        headers: impl IntoIterator<Item = (&'h str, Option<&'h [u8]>)>,
    ) -> Result<Self, InboxError> {
        // per header: absent (None), present without value (Some(None)), or its bytes
        let (mut id, mut agg, mut ver): (Option<Option<&[u8]>>, _, _) = (None, None, None);
        for (k, v) in headers {
            match k {
                HEADER_EVENT_ID => id = Some(v),
                HEADER_AGGREGATE_ID => agg = Some(v),
                HEADER_AGGREGATE_VERSION => ver = Some(v),
                _ => {}
            }
        }
        fn text(header: &'static str, v: Option<Option<&[u8]>>) -> Result<String, InboxError> {
            let bytes = v.flatten().ok_or(InboxError::MissingHeader { header })?;
            std::str::from_utf8(bytes)
                .map(str::to_owned)
                .map_err(|_| InboxError::BadHeader {
                    header,
                    value: String::from_utf8_lossy(bytes).into_owned(),
                })
        }
        let event_id = text(HEADER_EVENT_ID, id)?;
        let aggregate_id = text(HEADER_AGGREGATE_ID, agg)?;
        let v = text(HEADER_AGGREGATE_VERSION, ver)?;
        let aggregate_version = v.trim().parse::<i64>().map_err(|_| InboxError::BadHeader {
            header: HEADER_AGGREGATE_VERSION,
            value: v.clone(),
        })?;
        Ok(Self::new(
            consumer,
            event_id,
            aggregate_id,
            aggregate_version,
        ))
    }

    /// Checks the fields against the columns (and versions from 1 when gaps are tracked).
    pub fn validate(&self, config: &InboxConfig) -> Result<(), InboxError> {
        let tracked = config.gap_policy != GapPolicy::Off;
        for (field, value, required) in [
            ("consumer", &self.consumer, true),
            ("event_id", &self.event_id, true),
            ("aggregate_id", &self.aggregate_id, tracked),
        ] {
            if required && value.trim().is_empty() {
                return Err(InboxError::Empty { field });
            }
            if value.len() > MAX_IDENT_LEN {
                return Err(InboxError::TooLong {
                    field,
                    len: value.len(),
                    limit: MAX_IDENT_LEN,
                });
            }
            if value.contains('\0') {
                return Err(InboxError::Nul {
                    field,
                    value: value.clone(),
                });
            }
        }
        if tracked && self.aggregate_version < 1 {
            return Err(InboxError::BadVersion {
                aggregate_id: self.aggregate_id.clone(),
                version: self.aggregate_version,
            });
        }
        Ok(())
    }
}

/// What to do when v(n+1) of an aggregate arrives before v(n).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GapPolicy {
    /// No per-aggregate tracking: only `(consumer, event_id)` dedupe. Cheapest (one insert);
    /// for unversioned messages or consumers that do not care about order.
    Off,
    /// Record the early event and return [`Verdict::Gap`] so the caller may apply it; the gap
    /// stays listed by `gaps()` until the missing versions arrive. The default: ferry delivers
    /// each aggregate in order, so a gap is an anomaly worth seeing but not worth stalling on.
    #[default]
    Report,
    /// Record nothing for the early event and return [`Verdict::Early`]: the caller skips the
    /// effect and has the message redelivered later (see the crate docs).
    HoldBack,
}

/// Where an aggregate's version sequence starts for a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Baseline {
    /// Versions start at 1 (ferry's outbox enforces it): a first delivery at v5 is a gap.
    #[default]
    FromOne,
    /// The first version this consumer sees of an aggregate starts its sequence: for
    /// consumers that attach to a stream mid-way (retention already dropped earlier versions).
    FirstSeen,
}

/// How [`record`](postgres::record) treats versions. `Default`: `Report` from version 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InboxConfig {
    /// Gap policy (default [`GapPolicy::Report`]).
    pub gap_policy: GapPolicy,
    /// Version baseline (default [`Baseline::FromOne`]).
    pub baseline: Baseline,
}

impl InboxConfig {
    /// A config with `gap_policy` and the default baseline.
    pub fn new(gap_policy: GapPolicy) -> Self {
        Self {
            gap_policy,
            baseline: Baseline::default(),
        }
    }

    /// The same config with `baseline`.
    pub fn with_baseline(mut self, baseline: Baseline) -> Self {
        self.baseline = baseline;
        self
    }
}

/// The outcome of recording one delivery. Deliberately exhaustive: a new kind of verdict
/// must make every caller's `match` decide what to do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// First delivery to this consumer (in order, when gaps are tracked): recorded. Apply the
    /// effect in the same transaction and commit.
    New,
    /// Already recorded for this consumer by a committed transaction: skip the effect.
    Duplicate,
    /// [`GapPolicy::Report`]: recorded although versions `expected..got` are missing. The
    /// caller may apply the effect; the aggregate is listed by `gaps()` until they arrive.
    Gap {
        /// The version that should have come next (highest contiguous + 1).
        expected: i64,
        /// The version that came.
        got: i64,
    },
    /// [`GapPolicy::HoldBack`]: arrived before its predecessor. Nothing recorded: skip the
    /// effect and have the message redelivered later.
    Early {
        /// The version that should come next.
        expected: i64,
        /// The version that came.
        got: i64,
    },
    /// Gap tracking on, and this new event id carries a version already covered for this
    /// consumer: at or below the contiguous mark (applied, or skipped by `accept_gap`), or
    /// recorded ahead of a gap under another event id. Nothing recorded; skip the effect.
    Stale {
        /// The highest version applied contiguously for the aggregate.
        applied_through: i64,
    },
}

impl Verdict {
    /// True when the caller applies the effect: [`Verdict::New`] and [`Verdict::Gap`].
    pub fn should_apply(&self) -> bool {
        matches!(self, Verdict::New | Verdict::Gap { .. })
    }

    /// A short lowercase name, for logs and metrics labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::New => "new",
            Verdict::Duplicate => "duplicate",
            Verdict::Gap { .. } => "gap",
            Verdict::Early { .. } => "early",
            Verdict::Stale { .. } => "stale",
        }
    }
}

/// One aggregate with an open gap for a consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GapInfo {
    /// The aggregate.
    pub aggregate_id: String,
    /// Highest version applied contiguously; `applied_upto + 1` is the missing one.
    pub applied_upto: i64,
    /// Highest version seen (recorded under `Report`, or held back under `HoldBack`).
    pub max_seen: i64,
    /// When the gap was first detected (µs since the Unix epoch).
    pub since_micros: i64,
}

impl GapInfo {
    /// The first missing version.
    pub fn missing(&self) -> i64 {
        self.applied_upto + 1
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ferry_headers() {
        let h: Vec<(&str, Option<&[u8]>)> = vec![
            ("ferry-event-type", Some(b"OrderCreated")),
            (HEADER_EVENT_ID, Some(b"e-7-1")),
            (HEADER_AGGREGATE_ID, Some(b"order-7")),
            (HEADER_AGGREGATE_VERSION, Some(b"3")),
        ];
        let d = Delivery::from_headers("billing", h).unwrap();
        assert_eq!(d, Delivery::new("billing", "e-7-1", "order-7", 3));
    }

    #[test]
    fn header_errors_name_the_header() {
        let h: Vec<(&str, Option<&[u8]>)> = vec![
            (HEADER_EVENT_ID, Some(b"e")),
            (HEADER_AGGREGATE_ID, Some(b"a")),
        ];
        let e = Delivery::from_headers("c", h).unwrap_err();
        assert!(
            matches!(e, InboxError::MissingHeader { header } if header == HEADER_AGGREGATE_VERSION)
        );
        let h: Vec<(&str, Option<&[u8]>)> = vec![
            (HEADER_EVENT_ID, Some(b"e")),
            (HEADER_AGGREGATE_ID, Some(b"a")),
            (HEADER_AGGREGATE_VERSION, Some(b"v2")),
        ];
        let e = Delivery::from_headers("c", h).unwrap_err().to_string();
        assert!(
            e.contains(HEADER_AGGREGATE_VERSION) && e.contains("v2"),
            "{e}"
        );
    }

    #[test]
    fn validation_follows_the_policy() {
        let off = InboxConfig::new(GapPolicy::Off);
        let report = InboxConfig::default();
        let unversioned = Delivery::new("c", "e", "", 0);
        assert!(unversioned.validate(&off).is_ok());
        assert!(matches!(
            unversioned.validate(&report),
            Err(InboxError::Empty {
                field: "aggregate_id"
            })
        ));
        assert!(matches!(
            Delivery::new("c", "e", "a", 0).validate(&report),
            Err(InboxError::BadVersion { version: 0, .. })
        ));
        assert!(matches!(
            Delivery::new(" ", "e", "a", 1).validate(&off),
            Err(InboxError::Empty { field: "consumer" })
        ));
        let long = "x".repeat(MAX_IDENT_LEN + 1);
        assert!(matches!(
            Delivery::new("c", long, "a", 1).validate(&off),
            Err(InboxError::TooLong {
                field: "event_id",
                len: 256,
                limit: 255
            })
        ));
        assert!(matches!(
            Delivery::new("c", "e\0-1", "a", 1).validate(&off),
            Err(InboxError::Nul {
                field: "event_id",
                ..
            })
        ));
    }

    #[test]
    fn only_new_and_gap_apply() {
        assert!(Verdict::New.should_apply());
        assert!(Verdict::Gap {
            expected: 2,
            got: 3
        }
        .should_apply());
        assert!(!Verdict::Duplicate.should_apply());
        assert!(!Verdict::Early {
            expected: 2,
            got: 3
        }
        .should_apply());
        assert!(!Verdict::Stale { applied_through: 4 }.should_apply());
    }
}
