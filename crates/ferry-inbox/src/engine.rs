//! The backend-independent decision: what a delivery means given the aggregate's state.
//!
//! Each backend implements [`Ops`] (a handful of parameterised statements on the caller's
//! connection); [`record`] and [`accept_gap`] are written once on top of them, and
//! [`entry_points!`] gives each backend module its public `record` / `accept_gap`.
//!
//! The `Ops` impls themselves stay per backend although some statements read alike (MariaDB
//! and SQLite share `?` placeholders): the SQL differs where it matters (conflict handling,
//! locking reads, who supplies timestamps), and one generic impl would need sqlx `Executor`,
//! `Encode`, `Decode` and `IntoArguments` bounds for every bind and column, more text than the
//! statements it would share.
use ferry_core::now_micros;
use sqlx::query::QueryScalar;
use sqlx::{Database, Encode, FromRow, QueryBuilder, Type};

use crate::config::{Baseline, GapPolicy, InboxConfig};
use crate::delivery::Delivery;
use crate::error::InboxError;
use crate::gap::GapInfo;
use crate::verdict::Verdict;

/// The tracked state of one `(consumer, aggregate)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AggState {
    /// Highest version applied contiguously (0: none).
    pub(crate) upto: i64,
    /// Highest version seen (recorded or held back).
    pub(crate) max_seen: i64,
    /// Since when a gap is open (µs), `None` when `max_seen <= upto`.
    pub(crate) gap_since_us: Option<i64>,
}

impl AggState {
    /// Moves the contiguous mark to `through`, then over the versions in `recorded_above`
    /// (recorded above `through`, ascending) that follow it without a hole, and opens or closes
    /// the gap to match: a gap is open while a version above the mark has been seen.
    fn mark_through(&mut self, through: i64, recorded_above: &[i64]) {
        let mut upto = through;
        for &x in recorded_above {
            if x == upto + 1 {
                upto = x;
            } else if x > upto + 1 {
                break;
            }
        }
        self.upto = upto;
        self.max_seen = self.max_seen.max(upto);
        self.gap_since_us = if self.max_seen > self.upto {
            self.gap_since_us.or(Some(now_micros()))
        } else {
            None
        };
    }
}

/// The statements a backend provides. Every method runs on the caller's transaction.
pub(crate) trait Ops: Send {
    /// Creates the aggregate's row if missing and locks it until the transaction ends
    /// (`FOR UPDATE` / the write lock), returning its state read under that lock.
    async fn lock_aggregate(
        &mut self,
        consumer: &str,
        aggregate_id: &str,
    ) -> Result<AggState, InboxError>;
    /// Inserts the inbox row; `false` when `(consumer, event_id)` exists (committed by another
    /// transaction: an uncommitted one makes this wait).
    async fn insert(&mut self, d: &Delivery) -> Result<bool, InboxError>;
    /// Deletes the inbox row this transaction just inserted (a verdict that records nothing).
    async fn delete(&mut self, consumer: &str, event_id: &str) -> Result<(), InboxError>;
    /// Versions recorded for the aggregate above `above`, ascending.
    async fn recorded_above(
        &mut self,
        consumer: &str,
        aggregate_id: &str,
        above: i64,
    ) -> Result<Vec<i64>, InboxError>;
    /// How many inbox rows carry this aggregate version.
    async fn version_rows(
        &mut self,
        consumer: &str,
        aggregate_id: &str,
        version: i64,
    ) -> Result<i64, InboxError>;
    /// Writes the aggregate's state.
    async fn store_aggregate(
        &mut self,
        consumer: &str,
        aggregate_id: &str,
        state: &AggState,
    ) -> Result<(), InboxError>;
}

/// The statement `sql` of [`Ops::recorded_above`] or [`Ops::version_rows`] with its binds, the
/// same on every backend: the consumer, the aggregate, a version.
pub(crate) fn per_version<'q, DB, O>(
    sql: &'q str,
    consumer: &'q str,
    aggregate_id: &'q str,
    version: i64,
) -> QueryScalar<'q, DB, O, <DB as Database>::Arguments<'q>>
where
    DB: Database,
    &'q str: Encode<'q, DB> + Type<DB>,
    i64: Encode<'q, DB> + Type<DB>,
    (O,): for<'r> FromRow<'r, DB::Row>,
{
    sqlx::query_scalar(sql)
        .bind(consumer)
        .bind(aggregate_id)
        .bind(version)
}

/// [`Ops::delete`] and [`Ops::recorded_above`] for a backend: the same binds and decoding on
/// every backend, only the statement text differs (placeholders, locking clause).
macro_rules! delete_and_recorded_above {
    (delete: $delete:expr, recorded_above: $above:expr $(,)?) => {
        async fn delete(&mut self, consumer: &str, event_id: &str) -> Result<(), InboxError> {
            sqlx::query($delete)
                .bind(consumer)
                .bind(event_id)
                .execute(&mut *self)
                .await
                .map_err(|e| $crate::error::db_err("unrecord", e))?;
            Ok(())
        }

        async fn recorded_above(
            &mut self,
            consumer: &str,
            aggregate_id: &str,
            above: i64,
        ) -> Result<Vec<i64>, InboxError> {
            $crate::engine::per_version($above, consumer, aggregate_id, above)
                .fetch_all(&mut *self)
                .await
                .map_err(|e| $crate::error::db_err("read recorded versions", e))
        }
    };
}
pub(crate) use delete_and_recorded_above;

/// [`Ops::version_rows`] for a backend, by `count: <a COUNT(*) of the version's rows>`
/// (PostgreSQL, SQLite) or `rows: <a read of them>`, counted here (MariaDB, whose reads of inbox
/// rows are locking reads).
macro_rules! version_rows {
    ($how:ident: $sql:expr) => {
        async fn version_rows(
            &mut self,
            consumer: &str,
            aggregate_id: &str,
            version: i64,
        ) -> Result<i64, InboxError> {
            let q = $crate::engine::per_version($sql, consumer, aggregate_id, version);
            $crate::engine::version_rows!(@$how q, &mut *self)
                .map_err(|e| $crate::error::db_err("count version", e))
        }
    };
    (@count $q:ident, $conn:expr) => {
        $q.fetch_one($conn).await
    };
    (@rows $q:ident, $conn:expr) => {
        $q.fetch_all($conn).await.map(|rows: Vec<i64>| rows.len() as i64)
    };
}
pub(crate) use version_rows;

/// Records `d` and decides; see [`Verdict`] and the crate docs.
pub(crate) async fn record<C: Ops>(
    c: &mut C,
    cfg: &InboxConfig,
    d: &Delivery,
) -> Result<Verdict, InboxError> {
    d.validate(cfg)?;
    if let Some(key) = d.replay_key().filter(|_| cfg.accept_replays) {
        // a replay the consumer opted into: once per (event, replay), no version tracking
        let replayed = Delivery {
            event_id: key,
            replay_id: None,
            ..d.clone()
        };
        replayed.validate(&InboxConfig::new(GapPolicy::Off))?;
        return Ok(if c.insert(&replayed).await? {
            Verdict::New
        } else {
            Verdict::Duplicate
        });
    }
    if cfg.gap_policy == GapPolicy::Off {
        return Ok(if c.insert(d).await? {
            Verdict::New
        } else {
            Verdict::Duplicate
        });
    }
    let (consumer, agg_id, v) = (&d.consumer, &d.aggregate_id, d.aggregate_version);
    // Lock the aggregate first: deliveries of one aggregate to one consumer are serialized, so
    // the state read here cannot change until this transaction ends, and a concurrent
    // delivery of the same event waits here and then sees our committed row as a duplicate.
    let mut agg = c.lock_aggregate(consumer, agg_id).await?;
    // Insert before deciding: a duplicate is the common non-new case and costs one statement.
    // The rare verdicts that must record nothing delete the row again.
    if !c.insert(d).await? {
        return Ok(Verdict::Duplicate);
    }
    if cfg.baseline == Baseline::FirstSeen && agg.upto == 0 && agg.max_seen == 0 {
        agg.upto = v - 1;
    }
    let expected = agg.upto + 1;
    if v < expected {
        c.delete(consumer, &d.event_id).await?;
        tracing::warn!(consumer = %consumer, aggregate_id = %agg_id, version = v,
            applied_through = agg.upto, event_id = %d.event_id,
            "inbox: new event id for an already covered aggregate version; not applied");
        return Ok(Verdict::Stale {
            applied_through: agg.upto,
        });
    }
    if v == expected {
        // versions recorded ahead of the gap this delivery closes (Report)
        let ahead = if agg.max_seen > v {
            c.recorded_above(consumer, agg_id, v).await?
        } else {
            Vec::new()
        };
        agg.mark_through(v, &ahead);
        c.store_aggregate(consumer, agg_id, &agg).await?;
        return Ok(Verdict::New);
    }
    // v > expected: versions expected..v are missing.
    if v <= agg.max_seen && c.version_rows(consumer, agg_id, v).await? > 1 {
        c.delete(consumer, &d.event_id).await?;
        tracing::warn!(consumer = %consumer, aggregate_id = %agg_id, version = v,
            event_id = %d.event_id,
            "inbox: aggregate version already recorded under another event id; not applied");
        return Ok(Verdict::Stale {
            applied_through: agg.upto,
        });
    }
    agg.max_seen = agg.max_seen.max(v);
    agg.gap_since_us = agg.gap_since_us.or(Some(now_micros()));
    c.store_aggregate(consumer, agg_id, &agg).await?;
    if cfg.gap_policy == GapPolicy::HoldBack {
        c.delete(consumer, &d.event_id).await?;
        tracing::warn!(consumer = %consumer, aggregate_id = %agg_id, expected, got = v,
            event_id = %d.event_id, "inbox: version gap, holding the event back");
        Ok(Verdict::Early { expected, got: v })
    } else {
        tracing::warn!(consumer = %consumer, aggregate_id = %agg_id, expected, got = v,
            event_id = %d.event_id, "inbox: version gap, recorded");
        Ok(Verdict::Gap { expected, got: v })
    }
}

/// Moves the contiguous mark of `(consumer, aggregate_id)` to at least `through`, then over
/// any versions recorded right above it. Returns the new mark.
pub(crate) async fn accept_gap<C: Ops>(
    c: &mut C,
    consumer: &str,
    aggregate_id: &str,
    through: i64,
) -> Result<i64, InboxError> {
    let probe = Delivery::new(consumer, "-", aggregate_id, through.max(1));
    probe.validate(&InboxConfig::new(GapPolicy::Report))?;
    let mut agg = c.lock_aggregate(consumer, aggregate_id).await?;
    if through <= agg.upto {
        return Ok(agg.upto);
    }
    let ahead = c.recorded_above(consumer, aggregate_id, through).await?;
    let from = agg.upto;
    agg.mark_through(through, &ahead);
    tracing::warn!(consumer = %consumer, aggregate_id = %aggregate_id, from,
        through, applied_upto = agg.upto, "inbox: operator accepted a version gap");
    c.store_aggregate(consumer, aggregate_id, &agg).await?;
    Ok(agg.upto)
}

/// The `ferry_inbox_aggregate` columns `(aggregate_id, applied_upto, max_seen, gap_since_us)`
/// of a row with an open gap, as [`GapInfo`].
pub(crate) fn gap_info(
    (aggregate_id, applied_upto, max_seen, since_micros): (String, i64, i64, i64),
) -> GapInfo {
    GapInfo {
        aggregate_id,
        applied_upto,
        max_seen,
        since_micros,
    }
}

/// `<head> FROM ferry_inbox WHERE consumer = ? AND event_id IN (?, …)`, one bind per id: the
/// statements of `consumed` (`SELECT event_id`) and `prune` (`DELETE`) on the backends without
/// array binds (MariaDB, SQLite).
pub(crate) fn keys_in<'a, DB, S>(
    head: &'static str,
    consumer: &'a str,
    ids: &'a [S],
) -> QueryBuilder<'a, DB>
where
    DB: Database,
    &'a str: Encode<'a, DB> + Type<DB>,
    S: AsRef<str>,
{
    let mut qb = QueryBuilder::new(head);
    qb.push(" FROM ferry_inbox WHERE consumer = ");
    qb.push_bind(consumer).push(" AND event_id IN (");
    let mut list = qb.separated(", ");
    for id in ids {
        list.push_bind(id.as_ref());
    }
    qb.push(")");
    qb
}

/// Defines a backend module's public `record` and `accept_gap` on its connection type `$conn`
/// (which implements [`Ops`]): the same decision for every backend, with a concrete signature
/// so that callers pass `&mut *tx` of their own sqlx transaction.
macro_rules! entry_points {
    ($conn:ty) => {
        /// Records `delivery` inside the caller's transaction (`&mut *tx`) and returns what to
        /// do; see [`Verdict`](crate::Verdict). On `Err`, roll the transaction back.
        pub async fn record(
            conn: &mut $conn,
            config: &$crate::config::InboxConfig,
            delivery: &$crate::delivery::Delivery,
        ) -> Result<$crate::verdict::Verdict, $crate::error::InboxError> {
            $crate::engine::record(conn, config, delivery).await
        }

        /// Operator repair inside the caller's transaction: versions up to `through` of
        /// `aggregate_id` count as done for `consumer`. Returns the new contiguous mark.
        pub async fn accept_gap(
            conn: &mut $conn,
            consumer: &str,
            aggregate_id: &str,
            through: i64,
        ) -> Result<i64, $crate::error::InboxError> {
            $crate::engine::accept_gap(conn, consumer, aggregate_id, through).await
        }
    };
}
pub(crate) use entry_points;
