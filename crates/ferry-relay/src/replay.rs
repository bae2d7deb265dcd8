//! Replay (`ferry replay`): re-publish retained SENT events of a range through a sink, marked
//! with the [`HEADER_REPLAY`] header, each aggregate in version order.
//!
//! Steps: **scan** (what the filter matches per topic, the retention watermarks) → **check**
//! (refuse an unknown topic, a range retention cut, an empty match: [`check_replay`]) → **page**
//! (`page_size` events in `(aggregate_id, aggregate_version)` order) → **send** (one page at a
//! time: the next page is read only after every item of this one is acked) → **re-check** the
//! watermarks (a purge that ran meanwhile and cut the range fails the replay).
//!
//! Order: an aggregate's versions are sent in version order with their own message key, so they
//! go to one partition; within a page the sink enqueues them in order on an ordered producer
//! (`KafkaConfig::ordered`: idempotent, gapless), and a page is sent only after the previous one
//! was acked in full. The first item that is not acked stops the replay: nothing after it is
//! sent (docs/architecture.md, "Replay").
//!
//! A broker that does not answer: the ordered producer has no local timeout (a timeout would be a
//! gap), so a page waits. While it waits, the progress callback hears of it every
//! [`WAIT_REPORT_EVERY`] (how long, how many events, the client's last error), and after
//! [`ReplayPlan::ack_timeout`] without the page acked the replay stops with
//! [`ReplayError::NoAck`]: what was acked stays acked, and the same replay id runs it again.
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use ferry_core::replay::{
    check_replay, ReplayFilter, ReplayPageRequest, ReplayRefusal, TopicScan, HEADER_REPLAY,
};
use ferry_core::{ClaimedEvent, OutboxStore, Outcome, StoreError};

use crate::sink::Sink;

/// Default events per page (one read, one sink batch).
pub const DEFAULT_REPLAY_PAGE: usize = 500;

/// Default [`ReplayPlan::ack_timeout`].
pub const DEFAULT_REPLAY_ACK_TIMEOUT: Duration = Duration::from_secs(120);

/// How often a page waiting for its acks is reported (at most; sooner with a shorter ack
/// timeout).
pub const WAIT_REPORT_EVERY: Duration = Duration::from_secs(10);

/// What to replay, where, under which id.
#[derive(Debug, Clone)]
pub struct ReplayPlan {
    /// Which events.
    pub filter: ReplayFilter,
    /// Send every event to this topic instead of its own.
    pub to_topic: Option<String>,
    /// The value of the [`HEADER_REPLAY`] header on every message.
    pub replay_id: String,
    /// Events per page (at least 1).
    pub page_size: usize,
    /// How long a page may wait for its acks before the replay stops ([`ReplayError::NoAck`]).
    pub ack_timeout: Duration,
}

/// How far a replay got, for a progress line.
#[derive(Debug, Clone)]
pub struct ReplayProgress {
    /// Events acked so far.
    pub sent: u64,
    /// Events the scan matched.
    pub total: u64,
    /// Since the first send.
    pub elapsed: Duration,
    /// Set while a page waits for its acks (reported every [`WAIT_REPORT_EVERY`]).
    pub waiting: Option<ReplayWait>,
}

/// A page sent and not yet acked in full.
#[derive(Debug, Clone)]
pub struct ReplayWait {
    /// Its events.
    pub events: usize,
    /// Since it was handed to the sink.
    pub waited: Duration,
    /// The last error the sink's client reported on its own (a connection refused, every
    /// broker down), if any.
    pub last_error: Option<String>,
}

impl ReplayProgress {
    /// Events per second so far.
    pub fn rate(&self) -> f64 {
        self.sent as f64 / self.elapsed.as_secs_f64().max(1e-3)
    }
}

/// The result of a finished replay.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplaySummary {
    /// The replay id (the header's value).
    pub replay_id: String,
    /// Events sent and acked, per destination topic.
    pub sent_per_topic: BTreeMap<String, u64>,
    /// Events sent and acked in all.
    pub sent: u64,
    /// Events the scan matched (it can differ from `sent` when events of an open range were
    /// sent by the relay meanwhile).
    pub matched: u64,
    /// Seconds from the first send to the last ack.
    pub elapsed_secs: f64,
}

/// Why a replay failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// Refused before anything was sent.
    #[error("{0}")]
    Refused(#[from] ReplayRefusal),
    /// The store failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// An item was not acked: the replay stopped there.
    #[error("replay {replay_id} stopped after {sent} of {total} events: event {event_id} ({aggregate_id} v{version}) was not acked: {reason}; the replay stopped there (run it again with --replay-id {replay_id}: consumers that accept replays dedupe per replay id and event id)")]
    NotAcked {
        /// The replay.
        replay_id: String,
        /// Acked before it.
        sent: u64,
        /// Matched.
        total: u64,
        /// The event.
        event_id: String,
        /// Its aggregate.
        aggregate_id: String,
        /// Its version.
        version: i64,
        /// The sink's outcome.
        reason: String,
    },
    /// A page was not acked within the plan's ack timeout: the replay stopped there.
    #[error("replay {replay_id} stopped after {sent} of {total} events: the next {events} events were sent and not acknowledged within {waited_secs}s (last error: {}); nothing after them was sent (run it again with --replay-id {replay_id} once the broker answers: consumers that accept replays dedupe per replay id and event id)", last_error.as_deref().unwrap_or("none reported: connections may be open but unanswered"))]
    NoAck {
        /// The replay.
        replay_id: String,
        /// Acked before the page.
        sent: u64,
        /// Matched.
        total: u64,
        /// Events of the page.
        events: usize,
        /// Seconds it waited.
        waited_secs: u64,
        /// The sink client's last error.
        last_error: Option<String>,
    },
    /// A purge cut the range while the replay ran.
    #[error("replay {replay_id} sent {sent} events, but retention ran meanwhile and may have removed events of the range: {refusal}")]
    CutWhileRunning {
        /// The replay.
        replay_id: String,
        /// Acked.
        sent: u64,
        /// The refusal the range now meets.
        refusal: ReplayRefusal,
    },
}

/// A fresh replay id: a UUIDv7 (time-ordered, so ids sort by when the replays began).
pub fn new_replay_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Scans and checks `filter`: the per-topic scan and the number of events to send, or the
/// refusal (nothing sent).
pub async fn scan_replay(
    store: &dyn OutboxStore,
    filter: &ReplayFilter,
) -> Result<(Vec<TopicScan>, u64), ReplayError> {
    ferry_core::replay::check_filter(filter)?;
    let scan = store.replay_scan(filter).await?;
    let total = check_replay(filter, &scan)?;
    Ok((scan, total))
}

/// Runs `plan` through `sink` (scan, check, send page by page), calling `progress` after each
/// page.
pub async fn run_replay(
    store: &dyn OutboxStore,
    sink: &dyn Sink,
    plan: &ReplayPlan,
    mut progress: impl FnMut(ReplayProgress),
) -> Result<ReplaySummary, ReplayError> {
    let (_, total) = scan_replay(store, &plan.filter).await?;
    let started = Instant::now();
    let mut sent = 0u64;
    let mut per_topic: BTreeMap<String, u64> = BTreeMap::new();
    let mut after: Option<(String, i64)> = None;
    loop {
        let req = ReplayPageRequest {
            filter: &plan.filter,
            after: after.clone(),
            limit: plan.page_size.max(1),
        };
        let mut page = store.replay_page(&req).await?;
        let Some(last) = page.last() else { break };
        after = Some((last.aggregate_id.clone(), last.aggregate_version));
        for e in &mut page {
            mark(e, plan);
        }
        let outcomes = {
            let send = sink.send_batch(&page);
            tokio::pin!(send);
            let handed = tokio::time::Instant::now();
            let deadline = handed + plan.ack_timeout;
            let mut report = handed;
            loop {
                report += WAIT_REPORT_EVERY;
                tokio::select! {
                    o = &mut send => break o,
                    _ = tokio::time::sleep_until(report.min(deadline)) => {}
                }
                let waited = handed.elapsed();
                if waited >= plan.ack_timeout {
                    return Err(ReplayError::NoAck {
                        replay_id: plan.replay_id.clone(),
                        sent,
                        total,
                        events: page.len(),
                        waited_secs: waited.as_secs(),
                        last_error: sink.last_error(),
                    });
                }
                progress(ReplayProgress {
                    sent,
                    total,
                    elapsed: started.elapsed(),
                    waiting: Some(ReplayWait {
                        events: page.len(),
                        waited,
                        last_error: sink.last_error(),
                    }),
                });
            }
        };
        for (i, e) in page.iter().enumerate() {
            match outcomes.get(i) {
                Some(Outcome::Acked) => {}
                other => {
                    let reason = other.map_or_else(
                        || "the sink returned no outcome".to_string(),
                        |o| format!("{o:?}"),
                    );
                    // the items before it were acked (the loop returns at the first that is not)
                    return Err(ReplayError::NotAcked {
                        replay_id: plan.replay_id.clone(),
                        sent: sent + i as u64,
                        total,
                        event_id: e.token.event_id.clone(),
                        aggregate_id: e.aggregate_id.clone(),
                        version: e.aggregate_version,
                        reason,
                    });
                }
            }
        }
        sent += page.len() as u64;
        for e in &page {
            *per_topic.entry(e.topic.clone()).or_default() += 1;
        }
        progress(ReplayProgress {
            sent,
            total,
            elapsed: started.elapsed(),
            waiting: None,
        });
    }
    // a purge that ran meanwhile may have deleted rows of the range before a page read them
    let rescan = store.replay_scan(&plan.filter).await?;
    if let Err(refusal @ ReplayRefusal::RetentionCut { .. }) = check_replay(&plan.filter, &rescan) {
        return Err(ReplayError::CutWhileRunning {
            replay_id: plan.replay_id.clone(),
            sent,
            refusal,
        });
    }
    Ok(ReplaySummary {
        replay_id: plan.replay_id.clone(),
        sent_per_topic: per_topic,
        sent,
        matched: total,
        elapsed_secs: started.elapsed().as_secs_f64(),
    })
}

/// Readdresses `e` for the replay: the destination topic and the replay header (the stored
/// headers and the event id, aggregate and version headers the sink adds stay as they were).
fn mark(e: &mut ClaimedEvent, plan: &ReplayPlan) {
    if let Some(t) = &plan.to_topic {
        e.topic = t.clone();
    }
    let mut headers: HashMap<String, String> = serde_json::from_str(&e.headers).unwrap_or_default();
    headers.insert(HEADER_REPLAY.to_string(), plan.replay_id.clone());
    e.headers = serde_json::to_string(&headers).unwrap_or_else(|_| "{}".into());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_keeps_stored_headers_and_adds_the_replay_id() {
        let mut e = ClaimedEvent {
            token: ferry_core::ClaimToken {
                seq: 1,
                event_id: "e1".into(),
                claim_id: String::new(),
                claim_version: 0,
            },
            aggregate_id: "a".into(),
            aggregate_version: 1,
            shard_slot: 0,
            topic: "orders".into(),
            key: "a".into(),
            event_type: "T".into(),
            headers: r#"{"traceparent":"00-x"}"#.into(),
            payload: "{}".into(),
            attempts: 0,
            created_at: 0,
        };
        let plan = ReplayPlan {
            filter: ReplayFilter::default(),
            to_topic: Some("orders-replay".into()),
            replay_id: "r1".into(),
            page_size: 10,
            ack_timeout: DEFAULT_REPLAY_ACK_TIMEOUT,
        };
        mark(&mut e, &plan);
        assert_eq!(e.topic, "orders-replay");
        let h: HashMap<String, String> = serde_json::from_str(&e.headers).unwrap();
        assert_eq!(h["traceparent"], "00-x");
        assert_eq!(h[HEADER_REPLAY], "r1");
        assert_eq!(e.key, "a");
    }
}
