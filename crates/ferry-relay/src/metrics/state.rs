//! What the workers count into: [`Metrics`] (plain atomics and hdrhistograms, cheap to update
//! from every worker), [`Latency`], and the alert rules ([`AlertThresholds`], [`alert_level`]).
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;

/// A latency histogram in microseconds (1 µs .. 1 h, 3 significant digits).
#[derive(Debug)]
pub struct Latency(Mutex<Histogram<u64>>);

impl Default for Latency {
    fn default() -> Self {
        Self(Mutex::new(
            Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"),
        ))
    }
}

impl Latency {
    /// Records one duration.
    pub fn record(&self, d: Duration) {
        self.record_us(d.as_micros() as u64);
    }
    /// Records one value in µs, `n` times.
    pub fn record_n_us(&self, us: u64, n: u64) {
        let mut h = self.0.lock().expect("histogram lock");
        let _ = h.record_n(us.clamp(1, 3_600_000_000), n);
    }
    /// Records many values in µs under one lock.
    pub fn record_many_us(&self, values: impl IntoIterator<Item = u64>) {
        let mut h = self.0.lock().expect("histogram lock");
        for us in values {
            let _ = h.record(us.clamp(1, 3_600_000_000));
        }
    }
    /// Records one value in µs.
    pub fn record_us(&self, us: u64) {
        self.record_n_us(us, 1);
    }
    /// A copy of the histogram.
    pub fn snapshot(&self) -> Histogram<u64> {
        self.0.lock().expect("histogram lock").clone()
    }
}

/// Alert thresholds (defaults: 99.9 % within 30 s, warn at 5 min, critical at 1 h), exposed with the metrics so alert rules
/// and `ferry status` share one definition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AlertThresholds {
    /// Publish SLO: this share of intents... (default 0.999)
    pub slo_ratio: f64,
    /// ...is SENT within this time of its commit (default 30 s).
    pub slo_target: Duration,
    /// Warn when the oldest unsent intent is older (default 5 min).
    pub oldest_warning: Duration,
    /// Critical (pause related automatic compensation, escalate) when older (default 1 h).
    pub oldest_critical: Duration,
    /// Warn when events handed to the sink have had no ack for this long (default 30 s).
    pub sink_stall: Duration,
}

impl Default for AlertThresholds {
    fn default() -> Self {
        Self {
            slo_ratio: 0.999,
            slo_target: Duration::from_secs(30),
            oldest_warning: Duration::from_secs(300),
            oldest_critical: Duration::from_secs(3600),
            sink_stall: Duration::from_secs(30),
        }
    }
}

/// All relay metrics. Cheap to update from every worker.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Alert thresholds (set once at start).
    pub alerts: Mutex<AlertThresholds>,
    /// When the relay started, µs since the epoch (0: not started).
    pub started_us: AtomicI64,
    /// 1 once the relay resolved its dispatch mode and started its workers (`/ready`).
    pub dispatch_resolved: AtomicI64,
    /// The last tick of the relay's loops, µs since the epoch (`/healthz`).
    pub loop_tick_us: AtomicI64,
    /// The last database operation that succeeded (an ownership heartbeat, a status count),
    /// µs since the epoch (`/ready`).
    pub db_ok_us: AtomicI64,
    /// Events handed to the sink with no outcome yet ([`crate::sink::health::WatchedSink`]).
    pub sink_in_flight: AtomicI64,
    /// When the sink last went from idle to busy, µs since the epoch (0: idle).
    pub sink_busy_since_us: AtomicI64,
    /// When the sink last acked an event, µs since the epoch (0: never).
    pub sink_last_ack_us: AtomicI64,
    /// The last failed outcome's error text.
    pub sink_last_error: Mutex<Option<String>>,
    /// Items acked by the sink whose SENT CAS applied.
    pub sent: AtomicU64,
    /// Items scheduled for retry.
    pub retried: AtomicU64,
    /// Items quarantined.
    pub quarantined: AtomicU64,
    /// Items whose outcome was unknown (left for release/lease expiry).
    pub unknown: AtomicU64,
    /// CAS outcomes that updated zero rows (stale token), plus fenced lease renewals and, in
    /// cursor dispatch, the events of a fenced cursor advance.
    pub fenced: AtomicU64,
    /// Claim transactions run.
    pub claims: AtomicU64,
    /// Claims that returned nothing.
    pub empty_claims: AtomicU64,
    /// Due rows claims passed over because another transaction held them (the store's
    /// [`ferry_core::RowDispatch::rows_skipped_locked`]); meaningful only when
    /// `skipped_locked_known`.
    pub skipped_locked: AtomicU64,
    /// Whether the store reports `skipped_locked`.
    pub skipped_locked_known: std::sync::atomic::AtomicBool,
    /// Items claimed.
    pub claimed_items: AtomicU64,
    /// Failed store operations (claims, reads, outcome updates, ownership heartbeats), whether or
    /// not they were retried.
    pub store_errors: AtomicU64,
    /// Slots currently owned by this process.
    pub slots_owned: AtomicI64,
    /// Slot-lease renewals that found the slot taken (stale owner).
    pub slot_fenced: AtomicU64,
    /// Retention runs of this relay ([`crate::RetentionConfig`]).
    pub retention_runs: AtomicU64,
    /// Of which failed.
    pub retention_failed_runs: AtomicU64,
    /// Rows the retention runs deleted.
    pub retention_purged: AtomicU64,
    /// How long each retention run took (µs), failed ones included; a run dropped at shutdown
    /// is not recorded.
    pub retention_run: Latency,
    /// Outbox gauges from the status poller.
    pub pending: AtomicI64,
    /// Rows in CLAIMED (unknown exposure).
    pub claimed: AtomicI64,
    /// Rows in QUARANTINED.
    pub quarantined_rows: AtomicI64,
    /// Aggregates with at least one QUARANTINED event (its successors wait behind it).
    pub blocked_aggregates: AtomicI64,
    /// Pauses recorded by `ferry pause` (a pause of every topic counts one), from the status
    /// poller.
    pub paused_topics: AtomicI64,
    /// Age of the oldest unfinished intent (µs), -1 when none.
    pub oldest_unfinished_age_us: AtomicI64,
    /// Cursor mode: items the sink reported acked after an earlier version of their aggregate
    /// in the same batch was not (held and resent after it; the sink's ordering guarantee
    /// should keep this at 0).
    pub acked_after_failed_predecessor: AtomicU64,
    /// Intents whose stored `shard_slot` is not their aggregate's slot (`ferry_core::slot_for`):
    /// written by a producer that computed the slot itself, wrongly. Their aggregate's order is
    /// not guaranteed (see [`Metrics::note_misrouted`]).
    pub misrouted: AtomicU64,
    /// Events a shard worker handed to the sink after a later version of their aggregate (in
    /// the same batch, or earlier in the aggregate's epoch, legal resends excepted): the rule
    /// is in `crates/ferry-relay/src/order_watch.rs`. See [`Metrics::note_order_regression`].
    pub order_regressions: AtomicU64,
    /// Cursor mode (PostgreSQL, MariaDB): age of the oldest open write transaction (µs), which
    /// holds the read horizon back; -1 when none or not applicable.
    pub horizon_blocker_age_us: AtomicI64,
    /// Its backend pid (PostgreSQL; 0: a prepared transaction) or connection id (MariaDB); -1:
    /// none.
    pub horizon_blocker_pid: AtomicI64,
    /// MySQL/MariaDB: how many slots wait for it while reads go past it in the others; -1: not
    /// known, or every slot waits (or PostgreSQL, where only its own intents wait).
    pub horizon_held_slots: AtomicI64,
    /// 1 in cursor dispatch, 0 in row dispatch; -1 while a relay has not read its mode yet (not
    /// exported then).
    pub dispatch_cursor: AtomicI64,
    /// Items per claimed batch.
    pub batch_size: Latency,
    /// Claim transaction latency.
    pub claim_latency: Latency,
    /// Sink send latency per batch.
    pub send_latency: Latency,
    /// Outcome CAS latency per batch.
    pub ack_latency: Latency,
    /// From the intent's commit (created_at) to its SENT CAS.
    pub commit_to_ack: Latency,
    /// Events whose commit → SENT was measured ([`Metrics::record_commit_to_ack`]).
    pub slo_observed: AtomicU64,
    /// Of those, the ones SENT within the SLO target.
    pub slo_within: AtomicU64,
}

/// Whether the `n`th occurrence (from 1) of a condition that is logged per event is logged: the
/// first ten, then every 1,000th, so a flood costs about a line per thousand events and the
/// count stays in the metric.
fn log_nth(n: u64) -> bool {
    // `% 1000 < 1`: `is_multiple_of` (clippy's suggestion for `== 0`) needs Rust 1.87, the
    // workspace supports 1.80
    n <= 10 || n % 1000 < 1
}

impl Metrics {
    /// Counts (and logs, the first ten and then every 1,000th) the items whose stored slot is
    /// not their aggregate's: a foreign producer that set `shard_slot` itself, wrongly, splits
    /// the aggregate across slots, and then no relay can keep its versions in order. The
    /// items are still delivered; this makes the producer's bug visible. The check is one FNV
    /// hash of the aggregate id per item (not measured separately).
    pub fn note_misrouted(&self, items: &[ferry_core::ClaimedEvent]) {
        for e in items {
            let want = ferry_core::slot_for(&e.aggregate_id);
            if e.shard_slot != want {
                let n = self.misrouted.fetch_add(1, Ordering::Relaxed) + 1;
                if log_nth(n) {
                    tracing::error!(
                        event_id = %e.token.event_id,
                        aggregate_id = %e.aggregate_id,
                        stored_slot = e.shard_slot,
                        expected_slot = want,
                        misrouted_so_far = n,
                        "an intent's shard_slot is not its aggregate's slot: its producer computed the slot itself and got it wrong (leave shard_slot out of the INSERT); this aggregate's order is not guaranteed"
                    );
                }
            }
        }
    }

    /// Counts (and logs, the first ten and then every 1,000th) an event handed to the sink after
    /// a later version of its aggregate, `before` (the rule: `order_watch.rs`). The event is
    /// still delivered: the net only makes the reordering visible, with the aggregate, both
    /// versions, the slot and the topic to find it by.
    pub(crate) fn note_order_regression(
        &self,
        e: &ferry_core::ClaimedEvent,
        before: i64,
        same_batch: bool,
    ) {
        let n = self.order_regressions.fetch_add(1, Ordering::Relaxed) + 1;
        if log_nth(n) {
            tracing::error!(
                aggregate_id = %e.aggregate_id,
                sent_before = before,
                sent_now = e.aggregate_version,
                slot = e.shard_slot,
                topic = %e.topic,
                event_id = %e.token.event_id,
                same_batch,
                order_regressions_so_far = n,
                "an aggregate's version went down in what this relay handed to the sink: a consumer without an Inbox may apply it out of order (a producer that commits versions out of order, or a relay bug)"
            );
        }
    }

    /// Records commit → SENT times (µs) in the histogram and in the publish-SLO counts.
    pub fn record_commit_to_ack(&self, values: impl IntoIterator<Item = u64>) {
        let target = self
            .alerts
            .lock()
            .expect("alerts lock")
            .slo_target
            .as_micros() as u64;
        let (mut n, mut within) = (0u64, 0u64);
        self.commit_to_ack
            .record_many_us(values.into_iter().inspect(|us| {
                n += 1;
                if *us <= target {
                    within += 1;
                }
            }));
        self.slo_observed.fetch_add(n, Ordering::Relaxed);
        self.slo_within.fetch_add(within, Ordering::Relaxed);
    }

    /// Share of measured events SENT within the SLO target since start (1 when none measured).
    pub fn within_slo_ratio(&self) -> f64 {
        let n = self.slo_observed.load(Ordering::Relaxed);
        if n == 0 {
            1.0
        } else {
            self.slo_within.load(Ordering::Relaxed) as f64 / n as f64
        }
    }

    /// The alert level from the thresholds and the current gauges: [`alert_level`], and in
    /// cursor dispatch the same age thresholds applied to the oldest open write transaction
    /// that holds the read horizon back (as `ferry status` does).
    pub fn alert_level(&self) -> u8 {
        let a = *self.alerts.lock().expect("alerts lock");
        let age = self.oldest_unfinished_age_us.load(Ordering::Relaxed);
        let oldest = (age >= 0).then(|| Duration::from_micros(age as u64));
        let level = alert_level(
            &a,
            oldest,
            self.blocked_aggregates.load(Ordering::Relaxed),
            self.within_slo_ratio(),
        );
        let blocker = self.horizon_blocker_age_us.load(Ordering::Relaxed);
        let horizon = match (blocker >= 0).then(|| Duration::from_micros(blocker as u64)) {
            Some(b) if b >= a.oldest_critical => 2,
            Some(b) if b >= a.oldest_warning => 1,
            _ => 0,
        };
        let stalled = u8::from(self.sink_unacked(ferry_core::now_micros()) >= a.sink_stall);
        // a paused topic holds back its intents on purpose: visible as a warning, never
        // critical by itself (its age still reaches the age thresholds)
        let paused = u8::from(self.paused_topics.load(Ordering::Relaxed) > 0);
        level.max(horizon).max(stalled).max(paused)
    }

    /// [`sink_unacked`](Self::sink_unacked) when it has reached the stall threshold
    /// (`alerts.sink_stall`): what the membership heartbeat stores for `ferry status`.
    pub fn sink_stalled(&self, now_us: i64) -> Option<Duration> {
        let threshold = self.alerts.lock().map(|a| a.sink_stall).unwrap_or_default();
        let unacked = self.sink_unacked(now_us);
        (unacked >= threshold && !unacked.is_zero()).then_some(unacked)
    }

    /// How long the events handed to the sink have waited with no ack, at `now_us`: since the
    /// last ack or since the sink went busy, whichever is later; zero when nothing is in flight.
    pub fn sink_unacked(&self, now_us: i64) -> Duration {
        if self.sink_in_flight.load(Ordering::Relaxed) <= 0 {
            return Duration::ZERO;
        }
        let since = self
            .sink_busy_since_us
            .load(Ordering::Relaxed)
            .max(self.sink_last_ack_us.load(Ordering::Relaxed));
        if since <= 0 {
            return Duration::ZERO;
        }
        Duration::from_micros((now_us - since).max(0) as u64)
    }

    /// Time since the sink's last ack (since the relay started when none came yet; zero before
    /// the start).
    pub fn sink_last_ack_age(&self, now_us: i64) -> Duration {
        let last = self.sink_last_ack_us.load(Ordering::Relaxed);
        let from = if last > 0 {
            last
        } else {
            self.started_us.load(Ordering::Relaxed)
        };
        if from <= 0 {
            return Duration::ZERO;
        }
        Duration::from_micros((now_us - from).max(0) as u64)
    }
}

/// The alert level: 2 critical, 1 warning, 0 ok.
pub fn alert_level(
    a: &AlertThresholds,
    oldest: Option<Duration>,
    blocked: i64,
    within_slo: f64,
) -> u8 {
    match oldest {
        Some(age) if age >= a.oldest_critical => 2,
        Some(age) if age >= a.oldest_warning => 1,
        _ if blocked > 0 || within_slo < a.slo_ratio => 1,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per-event error logs (misrouted intents, order regressions): the first ten, then every
    /// 1,000th.
    #[test]
    fn per_event_logs_are_the_first_ten_then_every_thousandth() {
        let logged: Vec<u64> = (1..=3000).filter(|n| log_nth(*n)).collect();
        assert_eq!(logged, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1000, 2000, 3000]);
    }
}
