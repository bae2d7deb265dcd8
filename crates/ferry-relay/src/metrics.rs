//! Relay metrics: counters, gauges and hdrhistogram latency distributions, exposed in the
//! Prometheus text format (0.0.4) on `GET /metrics`. Names follow `ferry_<noun>_<unit>`.
//!
//! The exposition is encoded by `prometheus-client`, the Prometheus project's own Rust client,
//! and served by hyper ([`serve`]). Why `prometheus-client` and not `metrics` with its
//! Prometheus exporter: its [`Registry`] is a plain value with no process-global recorder, so
//! each [`Metrics`] has its own and several relays in one process (loadgen, the tests) never
//! mix their numbers; it encodes the 0.0.4 text format this endpoint has always served; and it
//! leaves the hot path alone: workers keep updating plain atomics and hdrhistograms (which
//! loadgen merges in process), and a [`Collector`] reads them once per scrape, which is also
//! where the derived values (ages in seconds, the SLO ratio, the alert level) are computed.
//! The `metrics` exporter would replace hdrhistogram with its own summaries and bring its own
//! HTTP server.
//!
//! Each latency distribution (and the batch size) is a Prometheus histogram with fixed buckets,
//! computed from its hdrhistogram at scrape time: buckets add up across relays and windows,
//! which quantile gauges cannot.
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

mod endpoint;

pub use endpoint::{
    get, live, ready, scrape, serve, ScrapeError, ServeConfig, DB_WITHIN, LIVE_WITHIN,
};

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
    /// Outbox gauges from the status poller.
    pub pending: AtomicI64,
    /// Rows in CLAIMED (unknown exposure).
    pub claimed: AtomicI64,
    /// Rows in QUARANTINED.
    pub quarantined_rows: AtomicI64,
    /// Aggregates with at least one QUARANTINED event (its successors wait behind it).
    pub blocked_aggregates: AtomicI64,
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
    /// 1 in cursor dispatch, 0 in row dispatch.
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

/// Encodes a [`Metrics`] on every scrape: the values are read from the atomics and histograms at
/// that moment (a collector, since the hot path updates plain atomics, and several values are
/// derived at scrape time: ages in seconds, the SLO ratio, the alert level).
#[derive(Debug)]
struct Exposition(Arc<Metrics>);

/// A counter: `name` is the exposed sample name, `_total` included (prometheus-client appends
/// the suffix itself, so it is taken off here; the full name stays greppable in this file).
fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    let base = name
        .strip_suffix("_total")
        .expect("counter names end in _total");
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(base, help, None, c.metric_type())?)
}

fn gauge<N: EncodeGaugeValue>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: N,
) -> fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

/// Whether the `n`th occurrence (from 1) of a condition that is logged per event is logged: the
/// first ten, then every 1,000th, so a flood costs about a line per thousand events and the
/// count stays in the metric.
fn log_nth(n: u64) -> bool {
    // `% 1000 < 1`: `is_multiple_of` (clippy's suggestion for `== 0`) needs Rust 1.87, the
    // workspace supports 1.80
    n <= 10 || n % 1000 < 1
}

/// Bucket bounds of the latency histograms, in seconds: 1 ms to 1 h, about three per decade,
/// fine where the SLO's 30 s and the alert ages fall.
pub const LATENCY_BUCKETS: [f64; 20] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0, 1800.0, 3600.0,
];
/// Bucket bounds of the batch-size histogram, in events.
pub const BATCH_BUCKETS: [f64; 12] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0,
];

/// An hdrhistogram as a Prometheus histogram (`name_bucket{le="…"}`, `name_sum`, `name_count`),
/// bucketed at scrape time: each bucket counts the recorded values at or below its bound (in
/// the histogram's units, `bounds` × `scale`), so histograms from many relays add up and any
/// quantile can be taken over any window with `histogram_quantile`. hdrhistogram keeps values
/// to 3 significant digits, so a value within 0.1 % of a bound may land in the next bucket.
fn histogram(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    h: &Histogram<u64>,
    scale: f64,
    bounds: &[f64],
) -> fmt::Result {
    let mut below = 0u64;
    let mut buckets: Vec<(f64, u64)> = bounds
        .iter()
        .map(|&b| {
            let upto = if h.is_empty() {
                0
            } else {
                h.count_between(0, (b * scale) as u64)
            };
            let n = upto.saturating_sub(below);
            below = below.max(upto);
            (b, n)
        })
        .collect();
    buckets.push((f64::INFINITY, h.len().saturating_sub(below)));
    let sum = h.mean() * h.len() as f64 / scale;
    e.encode_descriptor(name, help, None, MetricType::Histogram)?
        .encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, h.len(), &buckets, None)
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
        level.max(horizon).max(stalled)
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

    /// A registry that encodes these metrics on every scrape, this relay's own (there is no
    /// global registry: relays in one process each have theirs).
    pub fn registry(self: &Arc<Self>) -> Registry {
        let mut r = Registry::default();
        r.register_collector(Box::new(Exposition(self.clone())));
        r
    }

    /// Renders the Prometheus text exposition (what `GET /metrics` answers).
    pub fn render(self: &Arc<Self>) -> String {
        let mut out = String::with_capacity(8192);
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry())
            .expect("writing to a String cannot fail");
        out
    }
}

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let (m, e) = (&*self.0, &mut enc);
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let g = |a: &AtomicI64| a.load(Ordering::Relaxed);
        counter(
            e,
            "ferry_sent_total",
            "Events acked by the broker and marked SENT.",
            l(&m.sent),
        )?;
        counter(
            e,
            "ferry_retried_total",
            "Events scheduled for retry with backoff.",
            l(&m.retried),
        )?;
        counter(
            e,
            "ferry_quarantined_total",
            "Events quarantined (permanent errors or max attempts).",
            l(&m.quarantined),
        )?;
        counter(
            e,
            "ferry_unknown_total",
            "Sends whose outcome was unknown (resent later with the same id).",
            l(&m.unknown),
        )?;
        counter(
            e,
            "ferry_fenced_total",
            "Updates fenced by another relay: stale outcome CAS, lease renewals and releases, and the events of fenced cursor advances.",
            l(&m.fenced),
        )?;
        counter(e, "ferry_claims_total", "Claim transactions.", l(&m.claims))?;
        counter(
            e,
            "ferry_empty_claims_total",
            "Claim transactions that found nothing due.",
            l(&m.empty_claims),
        )?;
        if m.skipped_locked_known.load(Ordering::Relaxed) {
            counter(
                e,
                "ferry_claim_rows_skipped_locked_total",
                "Due rows claims passed over because a concurrent transaction held them (SKIP LOCKED).",
                l(&m.skipped_locked),
            )?;
        }
        counter(
            e,
            "ferry_claimed_events_total",
            "Events claimed.",
            l(&m.claimed_items),
        )?;
        counter(
            e,
            "ferry_store_errors_total",
            "Store operations that failed (claims, reads, outcome updates, ownership heartbeats); each is retried or its items are left to the lease.",
            l(&m.store_errors),
        )?;
        counter(
            e,
            "ferry_slot_fenced_total",
            "Slot lease renewals that found the slot owned by another relay.",
            l(&m.slot_fenced),
        )?;
        gauge(
            e,
            "ferry_slots_owned",
            "Shard slots owned by this relay process.",
            g(&m.slots_owned),
        )?;
        gauge(
            e,
            "ferry_pending_events",
            "Outbox rows in PENDING.",
            g(&m.pending),
        )?;
        gauge(
            e,
            "ferry_claimed_events",
            "Outbox rows in CLAIMED: unknown exposure (cursor dispatch: exception rows being retried).",
            g(&m.claimed),
        )?;
        gauge(
            e,
            "ferry_quarantined_events",
            "Outbox rows in QUARANTINED.",
            g(&m.quarantined_rows),
        )?;
        gauge(
            e,
            "ferry_blocked_aggregates",
            "Aggregates with at least one QUARANTINED event.",
            g(&m.blocked_aggregates),
        )?;
        // the ages are kept in µs with -1 for none; exposed in seconds, 0 for none
        let secs = |us: i64| if us < 0 { 0.0 } else { us as f64 / 1e6 };
        gauge(
            e,
            "ferry_oldest_unfinished_age_seconds",
            "Age of the oldest unsent intent.",
            secs(g(&m.oldest_unfinished_age_us)),
        )?;
        gauge(
            e,
            "ferry_dispatch_cursor",
            "1 when the relay dispatches with per-slot cursors, 0 with per-row claims.",
            g(&m.dispatch_cursor),
        )?;
        counter(
            e,
            "ferry_misrouted_events_total",
            "Intents read whose stored shard_slot is not their aggregate's slot (a producer computed it wrongly; that aggregate's order is not guaranteed).",
            m.misrouted.load(Ordering::Relaxed),
        )?;
        counter(
            e,
            "ferry_order_regressions_total",
            "Events handed to the sink after a later version of their aggregate (in one batch, or since the worker last resent that aggregate legitimately); legal resends are not counted. Should stay 0.",
            m.order_regressions.load(Ordering::Relaxed),
        )?;
        counter(
            e,
            "ferry_acked_after_failed_predecessor_total",
            "Cursor mode: items acked after an earlier version of their aggregate in the same batch was not (held and resent in order).",
            m.acked_after_failed_predecessor.load(Ordering::Relaxed),
        )?;
        gauge(
            e,
            "ferry_horizon_blocker_pid",
            "Cursor mode: the oldest open write transaction, which holds the read horizon back (PostgreSQL: backend pid, 0 for a prepared transaction; MySQL/MariaDB: connection id; -1: none).",
            g(&m.horizon_blocker_pid),
        )?;
        gauge(
            e,
            "ferry_horizon_blocker_age_seconds",
            "Cursor mode: age of the oldest open write transaction (PostgreSQL: its own intents wait for it; MySQL/MariaDB: the intents committed after it began wait for it, in the slots of ferry_horizon_held_slots once it is idle).",
            secs(g(&m.horizon_blocker_age_us)),
        )?;
        gauge(
            e,
            "ferry_horizon_held_slots",
            "Cursor mode, MySQL/MariaDB: slots whose reads wait for open write transactions that hold a gate row for long (the slots they wrote); -1: not known or every slot (or PostgreSQL).",
            g(&m.horizon_held_slots),
        )?;
        histogram(
            e,
            "ferry_batch_size_events",
            "Events per claimed batch.",
            &m.batch_size.snapshot(),
            1.0,
            &BATCH_BUCKETS,
        )?;
        histogram(
            e,
            "ferry_claim_latency_seconds",
            "Claim transaction latency.",
            &m.claim_latency.snapshot(),
            1e6,
            &LATENCY_BUCKETS,
        )?;
        histogram(
            e,
            "ferry_send_latency_seconds",
            "Sink send latency per batch.",
            &m.send_latency.snapshot(),
            1e6,
            &LATENCY_BUCKETS,
        )?;
        histogram(
            e,
            "ferry_ack_latency_seconds",
            "Outcome compare-and-set latency per batch.",
            &m.ack_latency.snapshot(),
            1e6,
            &LATENCY_BUCKETS,
        )?;
        histogram(
            e,
            "ferry_commit_to_ack_seconds",
            "Intent commit to SENT.",
            &m.commit_to_ack.snapshot(),
            1e6,
            &LATENCY_BUCKETS,
        )?;
        let a = *m.alerts.lock().expect("alerts lock");
        gauge(
            e,
            "ferry_publish_slo_target_seconds",
            "Publish SLO: the target time from commit to SENT.",
            a.slo_target.as_secs_f64(),
        )?;
        gauge(
            e,
            "ferry_publish_slo_objective_ratio",
            "Publish SLO: the share of events that should be SENT within the target.",
            a.slo_ratio,
        )?;
        gauge(
            e,
            "ferry_publish_within_slo_ratio",
            "Share of the events this relay SENT since it started that went from created_at to SENT within the SLO target (1 before any).",
            m.within_slo_ratio(),
        )?;
        counter(
            e,
            "ferry_publish_slo_events_total",
            "Events this relay SENT whose commit-to-SENT time was measured for the SLO.",
            l(&m.slo_observed),
        )?;
        counter(
            e,
            "ferry_publish_within_slo_events_total",
            "Of those, the events SENT within the SLO target (burn rate: 1 - rate(this) / rate(ferry_publish_slo_events_total), against 1 - the objective).",
            l(&m.slo_within),
        )?;
        gauge(
            e,
            "ferry_alert_oldest_warning_seconds",
            "Alert threshold: warning when the oldest unsent intent is older.",
            a.oldest_warning.as_secs_f64(),
        )?;
        gauge(
            e,
            "ferry_alert_oldest_critical_seconds",
            "Alert threshold: critical when the oldest unsent intent is older.",
            a.oldest_critical.as_secs_f64(),
        )?;
        let now = ferry_core::now_micros();
        gauge(
            e,
            "ferry_sink_in_flight_events",
            "Events handed to the sink with no outcome yet.",
            g(&m.sink_in_flight),
        )?;
        gauge(
            e,
            "ferry_sink_unacked_seconds",
            "How long the events handed to the sink have waited with no ack (0 when none is in flight); at ferry_alert_sink_stall_seconds the sink counts as stalled.",
            m.sink_unacked(now).as_secs_f64(),
        )?;
        gauge(
            e,
            "ferry_sink_last_ack_age_seconds",
            "Time since the sink's last ack (since the relay started when none came yet).",
            m.sink_last_ack_age(now).as_secs_f64(),
        )?;
        gauge(
            e,
            "ferry_alert_sink_stall_seconds",
            "Alert threshold: warning when events handed to the sink have had no ack for this long.",
            a.sink_stall.as_secs_f64(),
        )?;
        gauge(
            e,
            "ferry_alert_level",
            "0 ok, 1 warning (oldest unsent intent past the warning age, a blocked aggregate, the SLO ratio below its objective, an open transaction holding the horizon past the warning age, or a stalled sink), 2 critical (oldest unsent intent or the horizon blocker past the critical age).",
            i64::from(m.alert_level()),
        )?;
        Ok(())
    }
}

/// The value of the unlabelled sample `name` in a Prometheus text exposition, `None` when the
/// text does not carry it (loadgen and the tests read a relay's scrape with it).
///
/// Not a parser crate: the maintained ones (`prometheus-parse`) bring chrono, regex and a
/// second itertools into the build to read a handful of unlabelled numbers, and
/// prometheus-client only encodes. This reads the one line shape the 0.0.4 format gives an
/// unlabelled sample: `name value [timestamp]`.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        // the name must end at the space: not a longer name, not a labelled series
        let rest = l.strip_prefix(name)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
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

    fn value(text: &str, name: &str) -> f64 {
        sample(text, name).unwrap_or_else(|| panic!("{name} not exported:\n{text}"))
    }

    /// The endpoint exports the SLO ratio and the alert level, and the level follows each
    /// threshold: the SLO objective, a blocked aggregate, the warning and the critical age.
    #[test]
    fn alert_level_and_slo_ratio_follow_every_threshold() {
        let m = Arc::new(Metrics::default());
        m.oldest_unfinished_age_us.store(-1, Ordering::Relaxed);
        let t = m.render();
        assert_eq!(value(&t, "ferry_alert_level"), 0.0);
        assert_eq!(value(&t, "ferry_publish_within_slo_ratio"), 1.0);
        assert_eq!(value(&t, "ferry_publish_slo_target_seconds"), 30.0);
        assert_eq!(value(&t, "ferry_publish_slo_objective_ratio"), 0.999);
        assert_eq!(value(&t, "ferry_alert_oldest_warning_seconds"), 300.0);
        assert_eq!(value(&t, "ferry_alert_oldest_critical_seconds"), 3600.0);
        // 999 events within 30 s and 1 late: exactly at the objective, still ok
        m.record_commit_to_ack((0..999).map(|_| 1_000_000).chain([31_000_000]));
        let t = m.render();
        assert_eq!(value(&t, "ferry_publish_within_slo_ratio"), 0.999);
        assert_eq!(value(&t, "ferry_alert_level"), 0.0);
        // one more late event: below the objective → warning
        m.record_commit_to_ack([40_000_000]);
        let t = m.render();
        assert!(value(&t, "ferry_publish_within_slo_ratio") < 0.999);
        assert_eq!(value(&t, "ferry_alert_level"), 1.0);
        // a fresh relay: a blocked aggregate → warning
        let m = Arc::new(Metrics::default());
        m.horizon_blocker_age_us.store(-1, Ordering::Relaxed);
        m.oldest_unfinished_age_us
            .store(1_000_000, Ordering::Relaxed);
        assert_eq!(value(&m.render(), "ferry_alert_level"), 0.0);
        m.blocked_aggregates.store(1, Ordering::Relaxed);
        assert_eq!(value(&m.render(), "ferry_alert_level"), 1.0);
        m.blocked_aggregates.store(0, Ordering::Relaxed);
        // the oldest unsent intent past the warning age, then past the critical age
        m.oldest_unfinished_age_us
            .store(300_000_000, Ordering::Relaxed);
        assert_eq!(value(&m.render(), "ferry_alert_level"), 1.0);
        m.oldest_unfinished_age_us
            .store(3_600_000_000, Ordering::Relaxed);
        assert_eq!(value(&m.render(), "ferry_alert_level"), 2.0);
        // thresholds set at start are the ones applied and exported
        *m.alerts.lock().unwrap() = AlertThresholds {
            oldest_critical: Duration::from_secs(7200),
            ..AlertThresholds::default()
        };
        let t = m.render();
        assert_eq!(value(&t, "ferry_alert_level"), 1.0);
        assert_eq!(value(&t, "ferry_alert_oldest_critical_seconds"), 7200.0);
        // cursor dispatch: an open write transaction holding the horizon back, past each age
        let m = Arc::new(Metrics::default());
        m.oldest_unfinished_age_us.store(-1, Ordering::Relaxed);
        m.horizon_blocker_age_us
            .store(299_000_000, Ordering::Relaxed);
        assert_eq!(value(&m.render(), "ferry_alert_level"), 0.0);
        m.horizon_blocker_age_us
            .store(300_000_000, Ordering::Relaxed);
        assert_eq!(value(&m.render(), "ferry_alert_level"), 1.0);
        m.horizon_blocker_age_us
            .store(3_600_000_000, Ordering::Relaxed);
        assert_eq!(value(&m.render(), "ferry_alert_level"), 2.0);
    }

    /// docs/operations.md lists exactly the metric families the endpoint exposes (a summary's
    /// `_sum` and `_count` families are listed under its name).
    #[test]
    fn operations_doc_lists_exactly_the_exposed_metrics() {
        let m = Arc::new(Metrics::default());
        // exported only when the store measures it; the doc lists it
        m.skipped_locked_known.store(true, Ordering::Relaxed);
        let text = m.render();
        let families: std::collections::BTreeSet<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let exposed: std::collections::BTreeSet<&str> = families
            .iter()
            .copied()
            .filter(|f| {
                let base = f.strip_suffix("_sum").or_else(|| f.strip_suffix("_count"));
                !base.is_some_and(|b| families.contains(b))
            })
            .collect();
        let doc = include_str!("../../../docs/operations.md");
        let documented: std::collections::BTreeSet<&str> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `ferry_"))
            .filter_map(|l| Some(&l[..l.find(" |")?]))
            .flat_map(|cell| cell.split('`'))
            .map(|n| n.trim_start_matches("ferry_"))
            .filter(|n| !n.is_empty() && !n.starts_with(','))
            .collect();
        let exposed: std::collections::BTreeSet<&str> = exposed
            .iter()
            .map(|n| n.trim_start_matches("ferry_"))
            .collect();
        assert_eq!(documented, exposed, "docs/operations.md vs GET /metrics");
    }

    /// Latencies are histograms: cumulative buckets in seconds, `_sum` and `_count`, so that
    /// relays' distributions add up.
    #[test]
    fn latencies_are_bucketed_histograms() {
        let m = Arc::new(Metrics::default());
        for us in [500_000, 2_000_000, 40_000_000] {
            m.commit_to_ack.record_us(us);
        }
        let t = m.render();
        assert!(
            t.contains("# TYPE ferry_commit_to_ack_seconds histogram"),
            "{t}"
        );
        for (le, n) in [
            ("0.25", 0),
            ("0.5", 1),
            ("1", 1),
            ("2.5", 2),
            ("30", 2),
            ("60", 3),
            ("+Inf", 3),
        ] {
            let line = format!("ferry_commit_to_ack_seconds_bucket{{le=\"{le}\"}} {n}");
            assert!(t.lines().any(|l| l == line), "{line} not in:\n{t}");
        }
        assert_eq!(value(&t, "ferry_commit_to_ack_seconds_count"), 3.0);
        let sum = value(&t, "ferry_commit_to_ack_seconds_sum");
        assert!((sum - 42.5).abs() < 0.1, "{sum}");
        assert!(
            t.contains("ferry_batch_size_events_bucket{le=\"+Inf\"} 0"),
            "{t}"
        );
    }

    /// Per-event error logs (misrouted intents, order regressions): the first ten, then every
    /// 1,000th.
    #[test]
    fn per_event_logs_are_the_first_ten_then_every_thousandth() {
        let logged: Vec<u64> = (1..=3000).filter(|n| log_nth(*n)).collect();
        assert_eq!(logged, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1000, 2000, 3000]);
    }

    /// `sample` reads an unlabelled sample by its exact name: not a longer name that starts
    /// with it, not a labelled series, and a trailing timestamp is not the value.
    #[test]
    fn sample_reads_one_unlabelled_series_by_exact_name() {
        let text = "# HELP ferry_sent_total x\n# TYPE ferry_sent_total counter\n\
                    ferry_sent_total_other 9\nferry_sent_total{relay=\"a\"} 8\n\
                    ferry_sent_total 1234 1700000000000\nferry_age_seconds 0.25\n";
        assert_eq!(sample(text, "ferry_sent_total"), Some(1234.0));
        assert_eq!(sample(text, "ferry_age_seconds"), Some(0.25));
        assert_eq!(sample(text, "ferry_sent"), None);
        assert_eq!(sample(text, "ferry_fenced_total"), None);
    }
}
