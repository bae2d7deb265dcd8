//! The backend-independent decision: what a delivery means given the aggregate's state.
//!
//! Each backend implements [`Ops`] (a handful of parameterised statements on the caller's
//! connection); [`record`] and [`accept_gap`] are written once on top of them.
use ferry_core::now_micros;

use crate::{Baseline, Delivery, GapPolicy, InboxConfig, InboxError, Verdict};

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

/// Records `d` and decides; see [`Verdict`] and the crate docs.
pub(crate) async fn record<C: Ops>(
    c: &mut C,
    cfg: &InboxConfig,
    d: &Delivery,
) -> Result<Verdict, InboxError> {
    d.validate(cfg)?;
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
        let mut upto = v;
        if agg.max_seen > v {
            // versions recorded ahead of the gap this delivery closes (Report)
            for x in c.recorded_above(consumer, agg_id, v).await? {
                if x == upto + 1 {
                    upto = x;
                } else if x > upto + 1 {
                    break;
                }
            }
        }
        agg.upto = upto;
        agg.max_seen = agg.max_seen.max(upto);
        agg.gap_since_us = if agg.max_seen > agg.upto {
            agg.gap_since_us.or(Some(now_micros()))
        } else {
            None
        };
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
    let mut upto = through;
    for x in c.recorded_above(consumer, aggregate_id, through).await? {
        if x == upto + 1 {
            upto = x;
        } else if x > upto + 1 {
            break;
        }
    }
    tracing::warn!(consumer = %consumer, aggregate_id = %aggregate_id, from = agg.upto,
        through, applied_upto = upto, "inbox: operator accepted a version gap");
    agg.upto = upto;
    agg.max_seen = agg.max_seen.max(upto);
    agg.gap_since_us = if agg.max_seen > agg.upto {
        agg.gap_since_us.or(Some(now_micros()))
    } else {
        None
    };
    c.store_aggregate(consumer, aggregate_id, &agg).await?;
    Ok(upto)
}
