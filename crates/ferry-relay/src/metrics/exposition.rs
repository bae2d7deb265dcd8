//! The Prometheus text exposition of a [`Metrics`]: every family's name and help, and the
//! values derived at scrape time (ages in seconds, the SLO ratio, the alert level); and
//! [`sample`], which reads one back.
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use hdrhistogram::Histogram;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeMetric,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::state::Metrics;

/// Encodes a [`Metrics`] on every scrape: the values are read from the atomics and histograms at
/// that moment (a collector, since the hot path updates plain atomics, and several values are
/// derived at scrape time: ages in seconds, the SLO ratio, the alert level).
#[derive(Debug)]
struct Exposition(Arc<Metrics>);

/// A counter: `name` is the exposed sample name, `_total` included (prometheus-client appends
/// the suffix itself, so it is taken off here; the full name stays greppable in this file).
fn counter<N: EncodeCounterValue>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: N,
) -> fmt::Result {
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
            "ferry_retention_runs_total",
            "Retention runs of this relay (relay.retention): purges of SENT rows older than the window.",
            l(&m.retention_runs),
        )?;
        counter(
            e,
            "ferry_retention_failed_runs_total",
            "Retention runs that failed (retried at the next period; the rows stay until a run succeeds).",
            l(&m.retention_failed_runs),
        )?;
        histogram(
            e,
            "ferry_retention_run_seconds",
            "Duration of this relay's retention runs, vacuums and failed runs included.",
            &m.retention_run.snapshot(),
            1e6,
            &LATENCY_BUCKETS,
        )?;
        counter(
            e,
            "ferry_retention_purged_total",
            "Outbox rows deleted by this relay's retention runs.",
            l(&m.retention_purged),
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
        gauge(
            e,
            "ferry_paused_topics",
            "Topics paused by ferry pause (a pause of every topic counts one); 0: nothing paused.",
            g(&m.paused_topics),
        )?;
        // the ages are kept in µs with -1 for none; exposed in seconds, 0 for none
        let secs = |us: i64| if us < 0 { 0.0 } else { us as f64 / 1e6 };
        gauge(
            e,
            "ferry_oldest_unfinished_age_seconds",
            "Age of the oldest unsent intent.",
            secs(g(&m.oldest_unfinished_age_us)),
        )?;
        let dispatch = g(&m.dispatch_cursor);
        if dispatch >= 0 {
            gauge(
                e,
                "ferry_dispatch_cursor",
                "1 when the relay dispatches with per-slot cursors, 0 with per-row claims.",
                dispatch,
            )?;
        }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::metrics::state::AlertThresholds;

    fn value(text: &str, name: &str) -> f64 {
        sample(text, name).unwrap_or_else(|| panic!("{name} not exported:\n{text}"))
    }

    /// The dispatch gauge is left out until the relay has read its mode: a scrape in between
    /// (a relay restarted, waiting for its database) must not report row dispatch.
    #[test]
    fn dispatch_mode_is_exported_once_known() {
        let m = Arc::new(Metrics::default());
        m.dispatch_cursor.store(-1, Ordering::Relaxed);
        assert_eq!(sample(&m.render(), "ferry_dispatch_cursor"), None);
        for mode in [0, 1] {
            m.dispatch_cursor.store(mode, Ordering::Relaxed);
            assert_eq!(value(&m.render(), "ferry_dispatch_cursor"), mode as f64);
        }
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
        let doc = include_str!("../../../../docs/operations.md");
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
