//! Sink health: what the relay knows about a sink that has stopped answering.
//!
//! Every batch goes through [`WatchedSink`], which counts the events handed to the sink and not
//! yet answered, and notes when the last ack came and what the last error was. A broker that
//! stops answering (a hung process, a black-holed route, a partition without a leader) returns
//! no outcome at all: the sends just wait. [`watch`] turns that silence into a signal: once
//! events have waited [`crate::metrics::AlertThresholds::sink_stall`] with no ack, it logs a
//! WARN naming the sink and its last error (again every [`WARN_EVERY`] while it lasts), the
//! alert level goes to warning, and `ferry_sink_unacked_seconds` shows it; an INFO line says when
//! acks come again.
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{now_micros, BoxFuture, ClaimedEvent, Outcome};
use tokio_util::sync::CancellationToken;

use super::Sink;
use crate::metrics::Metrics;

/// How often the stall WARN repeats while the stall lasts.
pub const WARN_EVERY: Duration = Duration::from_secs(30);

/// A sink whose sends are counted in [`Metrics`] (in flight, last ack, last error).
pub struct WatchedSink {
    inner: Arc<dyn Sink>,
    metrics: Arc<Metrics>,
}

impl WatchedSink {
    /// Watches `inner`, counting into `metrics`.
    pub fn new(inner: Arc<dyn Sink>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }
}

/// Counts a batch's events as in flight while it lives (also when its future is dropped: an
/// abandoned send at the shutdown deadline).
struct InFlight<'a> {
    metrics: &'a Metrics,
    n: i64,
}

impl<'a> InFlight<'a> {
    fn enter(metrics: &'a Metrics, n: i64) -> Self {
        if metrics.sink_in_flight.fetch_add(n, Ordering::Relaxed) == 0 {
            metrics
                .sink_busy_since_us
                .store(now_micros(), Ordering::Relaxed);
        }
        Self { metrics, n }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self
            .metrics
            .sink_in_flight
            .fetch_sub(self.n, Ordering::Relaxed)
            == self.n
        {
            self.metrics.sink_busy_since_us.store(0, Ordering::Relaxed);
        }
    }
}

impl Sink for WatchedSink {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn last_error(&self) -> Option<String> {
        self.inner.last_error()
    }

    fn send_batch<'a>(&'a self, items: &'a [ClaimedEvent]) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(async move {
            let _counted = InFlight::enter(&self.metrics, items.len() as i64);
            let out = self.inner.send_batch(items).await;
            if out.iter().any(|o| matches!(o, Outcome::Acked)) {
                self.metrics
                    .sink_last_ack_us
                    .store(now_micros(), Ordering::Relaxed);
            }
            let failed = out.iter().find_map(|o| match o {
                Outcome::Acked => None,
                Outcome::Retry(e) | Outcome::Unknown(e) | Outcome::Permanent(e) => Some(e),
            });
            if let Some(e) = failed {
                *self
                    .metrics
                    .sink_last_error
                    .lock()
                    .expect("sink error lock") = Some(e.clone());
            }
            out
        })
    }
}

/// Checks the sink's health every second until `stop`: the stall WARN (rate-limited) and the
/// INFO line when acks come again. The gauges and the alert level derive the same state at
/// every scrape ([`Metrics::sink_unacked`]).
pub async fn watch(sink: Arc<dyn Sink>, metrics: Arc<Metrics>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned: Option<tokio::time::Instant> = None;
    let mut stalled_for = Duration::ZERO;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        metrics.loop_tick_us.store(now_micros(), Ordering::Relaxed);
        let limit = metrics.alerts.lock().expect("alerts lock").sink_stall;
        let unacked = metrics.sink_unacked(now_micros());
        if unacked >= limit {
            stalled_for = unacked;
            if warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                warned = Some(tokio::time::Instant::now());
                let last_error = sink
                    .last_error()
                    .or_else(|| {
                        metrics
                            .sink_last_error
                            .lock()
                            .expect("sink error lock")
                            .clone()
                    })
                    .unwrap_or_else(|| {
                        "none reported (connections may be open but unanswered)".into()
                    });
                tracing::warn!(
                    sink = %sink.describe(),
                    in_flight = metrics.sink_in_flight.load(Ordering::Relaxed),
                    unacked_secs = unacked.as_secs(),
                    last_error = %last_error,
                    "sink stalled: events handed to it have had no ack for {}s; they stay unsent \
                     and are resent, nothing is lost",
                    unacked.as_secs()
                );
            }
        } else if warned.take().is_some() {
            tracing::info!(
                sink = %sink.describe(),
                stalled_secs = stalled_for.as_secs(),
                "sink answering again after a stall"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::pending;

    /// Never answers: a broker that accepts and stays silent.
    struct Silent;
    impl Sink for Silent {
        fn name(&self) -> &'static str {
            "silent"
        }
        fn send_batch<'a>(&'a self, _: &'a [ClaimedEvent]) -> BoxFuture<'a, Vec<Outcome>> {
            Box::pin(pending())
        }
    }

    /// Answers with `outcome` for every item.
    struct Answers(Outcome);
    impl Sink for Answers {
        fn name(&self) -> &'static str {
            "answers"
        }
        fn send_batch<'a>(&'a self, items: &'a [ClaimedEvent]) -> BoxFuture<'a, Vec<Outcome>> {
            Box::pin(async move { vec![self.0.clone(); items.len()] })
        }
    }

    fn items(n: usize) -> Vec<ClaimedEvent> {
        (0..n as i64)
            .map(|i| ClaimedEvent {
                token: ferry_core::ClaimToken {
                    seq: i + 1,
                    event_id: format!("e-{i}"),
                    claim_id: "c".into(),
                    claim_version: 1,
                },
                aggregate_id: "a".into(),
                aggregate_version: i + 1,
                shard_slot: 0,
                topic: "t".into(),
                key: "a".into(),
                event_type: "E".into(),
                headers: "{}".into(),
                payload: "{}".into(),
                attempts: 0,
                created_at: 0,
            })
            .collect()
    }

    const S: i64 = 1_000_000;

    /// Events a silent sink holds count as in flight, their wait grows with the clock, and at
    /// the threshold the alert level turns to warning; an abandoned send (dropped future) is
    /// counted out, and the level goes back to ok.
    #[tokio::test]
    async fn a_silent_sink_is_a_stall_after_the_threshold() {
        let m = Arc::new(Metrics::default());
        m.oldest_unfinished_age_us.store(-1, Ordering::Relaxed);
        m.horizon_blocker_age_us.store(-1, Ordering::Relaxed);
        let sink = Arc::new(WatchedSink::new(Arc::new(Silent), m.clone()));
        let batch = items(3);
        let send = {
            let (sink, batch) = (sink.clone(), batch.clone());
            tokio::spawn(async move { sink.send_batch(&batch).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(m.sink_in_flight.load(Ordering::Relaxed), 3);
        let since = m.sink_busy_since_us.load(Ordering::Relaxed);
        assert!(since > 0);
        assert_eq!(m.sink_unacked(since + 29 * S), Duration::from_secs(29));
        assert_eq!(m.alert_level(), 0, "just sent: no stall yet");
        m.sink_busy_since_us
            .store(since - 31 * S, Ordering::Relaxed);
        assert_eq!(m.alert_level(), 1, "no ack for 31 s: stalled");
        send.abort();
        let _ = send.await;
        assert_eq!(m.sink_in_flight.load(Ordering::Relaxed), 0);
        assert_eq!(m.sink_unacked(since + 60 * S), Duration::ZERO);
        assert_eq!(m.alert_level(), 0);
    }

    /// An ack notes its time (the wait restarts from it); a failed outcome notes its error.
    #[tokio::test]
    async fn acks_and_errors_are_noted() {
        let m = Arc::new(Metrics::default());
        let acking = WatchedSink::new(Arc::new(Answers(Outcome::Acked)), m.clone());
        let before = now_micros();
        assert_eq!(acking.send_batch(&items(2)).await.len(), 2);
        assert!(m.sink_last_ack_us.load(Ordering::Relaxed) >= before);
        assert_eq!(m.sink_in_flight.load(Ordering::Relaxed), 0);
        let failing = WatchedSink::new(
            Arc::new(Answers(Outcome::Retry("broker down".into()))),
            m.clone(),
        );
        failing.send_batch(&items(1)).await;
        assert_eq!(
            m.sink_last_error.lock().unwrap().as_deref(),
            Some("broker down")
        );
        m.started_us.store(before - 5 * S, Ordering::Relaxed);
        m.sink_last_ack_us.store(0, Ordering::Relaxed);
        assert!(
            m.sink_last_ack_age(before) >= Duration::from_secs(5),
            "since the start"
        );
    }
}
