//! Delivery verification: a real Kafka consumer reads a topic back while a run goes on and
//! checks every delivery for duplicates, per-aggregate order and (at the end) loss.
//!
//! The consumer uses `assign()` (no group join) on every partition from the beginning and runs
//! on its own thread, concurrently with the producers: the mock cluster keeps only ~5 MiB per
//! partition, so reading after a long run would report retention drops as losses.
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use hdrhistogram::Histogram;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

/// The header a producer may set to its commit time (µs since the epoch) for latency.
pub const COMMIT_TS_HEADER: &str = "ferry-commit-ts";

/// A latency histogram in µs, 1 µs to 1 h, 3 significant digits (the relay's own bounds):
/// the verifier's, the workload's producers' and loadgen's.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

/// What the verifier observed so far.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct VerifyReport {
    /// Messages consumed (with duplicates).
    pub consumed: u64,
    /// Distinct events delivered.
    pub delivered: u64,
    /// Messages whose event id was seen before.
    pub duplicates: u64,
    /// First deliveries of v(n+1) before v(n).
    pub ordering_violations: u64,
    /// Messages without ferry headers (ignored).
    pub foreign: u64,
    /// A few example violations.
    pub examples: Vec<String>,
    /// Errors the consumer reported instead of a message (a broker down, a fetch that
    /// failed). Not part of the verdict: shown when a wait for deliveries comes up short.
    #[serde(skip)]
    pub consumer_errors: u64,
    /// The first few of those errors.
    #[serde(skip)]
    pub consumer_error_examples: Vec<String>,
}

/// Per-aggregate order of first appearances: v(n+1) seen before v(n) is a violation; a version
/// at or below the highest one seen (a resend) is not. The verifier checks first deliveries
/// with it; loadgen checks the order in which in-process relays hand batches to a sink.
#[derive(Debug, Default)]
pub struct OrderCheck {
    /// Per aggregate: the highest version seen.
    upto: HashMap<String, i64>,
    /// Versions seen before their predecessor.
    pub violations: u64,
    /// Up to ten violations, `agg: v3 first <verb> before v2`.
    pub examples: Vec<String>,
}

impl OrderCheck {
    /// Notes version `ver` of `agg`; `verb` names the event in examples (`delivered`, `sent`).
    pub fn observe(&mut self, agg: &str, ver: i64, verb: &str) {
        let upto = match self.upto.get_mut(agg) {
            Some(u) => u,
            None => self.upto.entry(agg.to_string()).or_insert(0),
        };
        if ver <= *upto {
            return;
        }
        if ver > *upto + 1 {
            self.violations += 1;
            if self.examples.len() < 10 {
                let next = *upto + 1;
                self.examples
                    .push(format!("{agg}: v{ver} first {verb} before v{next}"));
            }
        }
        *upto = ver;
    }
}

#[derive(Default)]
struct State {
    report: VerifyReport,
    ids: HashSet<String>,
    order: OrderCheck,
    latency: Option<Histogram<u64>>,
}

/// One consumed message, as a per-message hook sees it (after the verifier counted it).
#[derive(Debug)]
pub struct Received<'a> {
    /// Partition.
    pub partition: i32,
    /// Offset in the partition.
    pub offset: i64,
    /// The message key.
    pub key: Option<&'a [u8]>,
    /// Every header, in order (`ferry-event-id`, `ferry-aggregate-id`, … and any others).
    pub headers: &'a [(&'a str, Option<&'a [u8]>)],
    /// The message value.
    pub payload: Option<&'a [u8]>,
}

/// A per-message hook: runs on the verifier's consumer thread for every message, so a hook
/// that blocks (a full queue) slows the read-back down.
pub type Hook = Box<dyn FnMut(&Received<'_>) + Send>;

/// A running verifier.
pub struct Verifier {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

/// A verifier start failure.
#[derive(Debug, thiserror::Error)]
#[error("verifier: {0}")]
pub struct VerifyError(String);

impl Verifier {
    /// Starts consuming `topic` (all `partitions`) from `brokers`.
    pub fn start(brokers: &str, topic: &str, partitions: i32) -> Result<Self, VerifyError> {
        Self::start_with(brokers, topic, partitions, &[])
    }

    /// [`Verifier::start`] with extra librdkafka properties (TLS, SASL: the same ones the
    /// relay's sink gets through `--kafka-property`).
    pub fn start_with(
        brokers: &str,
        topic: &str,
        partitions: i32,
        properties: &[(String, String)],
    ) -> Result<Self, VerifyError> {
        Self::start_with_hook(brokers, topic, partitions, properties, None)
    }

    /// [`Verifier::start_with`] calling `hook` for every consumed message.
    pub fn start_with_hook(
        brokers: &str,
        topic: &str,
        partitions: i32,
        properties: &[(String, String)],
        mut hook: Option<Hook>,
    ) -> Result<Self, VerifyError> {
        let mut config = ClientConfig::new();
        for (k, v) in properties {
            config.set(k, v);
        }
        let consumer: BaseConsumer = config
            .set("bootstrap.servers", brokers)
            .set(
                "group.id",
                format!("ferry-verifier-{}", uuid::Uuid::new_v4().simple()),
            )
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "10")
            .create()
            .map_err(|e| VerifyError(e.to_string()))?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .map_err(|e| VerifyError(e.to_string()))?;
        }
        consumer
            .assign(&tpl)
            .map_err(|e| VerifyError(e.to_string()))?;
        let state = Arc::new(Mutex::new(State {
            latency: Some(new_histogram()),
            ..Default::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop) = (state.clone(), stop.clone());
            thread::Builder::new()
                .name("ferry-verifier".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let Some(msg) = consumer.poll(Duration::from_millis(50)) else {
                            continue;
                        };
                        let msg = match msg {
                            Ok(m) => m,
                            Err(e) => {
                                let mut st = state.lock().expect("verifier lock");
                                st.report.consumer_errors += 1;
                                if st.report.consumer_error_examples.len() < 5 {
                                    st.report.consumer_error_examples.push(e.to_string());
                                }
                                continue;
                            }
                        };
                        let headers: Vec<(&str, Option<&[u8]>)> = msg
                            .headers()
                            .map(|h| h.iter().map(|h| (h.key, h.value)).collect())
                            .unwrap_or_default();
                        let (mut id, mut agg, mut ver, mut ts) = (None, None, None, None);
                        for (key, value) in &headers {
                            let v = value.map(|v| String::from_utf8_lossy(v).into_owned());
                            match *key {
                                "ferry-event-id" => id = v,
                                "ferry-aggregate-id" => agg = v,
                                "ferry-aggregate-version" => {
                                    ver = v.and_then(|v| v.parse::<i64>().ok())
                                }
                                COMMIT_TS_HEADER => ts = v.and_then(|v| v.parse::<i64>().ok()),
                                _ => {}
                            }
                        }
                        state
                            .lock()
                            .expect("verifier lock")
                            .observe(id, agg, ver, ts);
                        if let Some(hook) = hook.as_mut() {
                            hook(&Received {
                                partition: msg.partition(),
                                offset: msg.offset(),
                                key: msg.key(),
                                headers: &headers,
                                payload: msg.payload(),
                            });
                        }
                    }
                })
                .map_err(|e| VerifyError(e.to_string()))?
        };
        Ok(Self {
            state,
            stop,
            thread: Some(thread),
        })
    }

    /// Makes room for `n` more distinct event ids at once. The set of ids seen grows by
    /// doubling, and a doubling rehashes every id under the lock that the readers of
    /// [`report`](Self::report) wait on: at about 30 million ids that took tens of seconds, long
    /// enough for a consumer that stopped reading to fall behind a broker's retention. A run that
    /// knows its size reserves it up front.
    pub fn reserve(&self, n: usize) {
        self.state.lock().expect("verifier lock").ids.reserve(n);
    }

    /// The report so far.
    pub fn report(&self) -> VerifyReport {
        let s = self.state.lock().expect("verifier lock");
        VerifyReport {
            ordering_violations: s.order.violations,
            examples: s.order.examples.clone(),
            ..s.report.clone()
        }
    }

    /// Event ids delivered so far.
    pub fn delivered_ids(&self) -> HashSet<String> {
        self.state.lock().expect("verifier lock").ids.clone()
    }

    /// Whether `event_id` was delivered.
    pub fn was_delivered(&self, event_id: &str) -> bool {
        self.state
            .lock()
            .expect("verifier lock")
            .ids
            .contains(event_id)
    }

    /// Commit→consumed latency (µs) of first deliveries carrying [`COMMIT_TS_HEADER`].
    pub fn latency(&self) -> Histogram<u64> {
        self.state
            .lock()
            .expect("verifier lock")
            .latency
            .clone()
            .expect("histogram")
    }

    /// Waits until `pred(report)` holds or `timeout` passes; returns the last report.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        pred: impl Fn(&VerifyReport) -> bool,
    ) -> VerifyReport {
        crate::wait::poll_until(timeout, Duration::from_millis(20), || async {
            pred(&self.report())
        })
        .await;
        self.report()
    }
}

/// One consumed message, owned ([`read_records`]).
#[derive(Debug, Clone)]
pub struct Record {
    /// The message key.
    pub key: Option<Vec<u8>>,
    /// The message value.
    pub payload: Option<Vec<u8>>,
    /// Every header, in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Record {
    /// The headers as `(key, value)` pairs (what `ferry_inbox::Delivery::from_headers` takes).
    pub fn header_pairs(&self) -> impl Iterator<Item = (&str, Option<&[u8]>)> {
        self.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref()))
    }
}

/// Reads `topic` (all `partitions`) from the beginning until `expect` messages arrived, then
/// `grace` longer (for late duplicates), or until `wait` passed (with `expect` 0: all of it);
/// returns every message read.
pub async fn read_records(
    brokers: &str,
    topic: &str,
    partitions: i32,
    expect: usize,
    wait: Duration,
    grace: Duration,
) -> Result<Vec<Record>, VerifyError> {
    let seen: Arc<Mutex<Vec<Record>>> = Arc::default();
    let hook = {
        let seen = seen.clone();
        move |m: &Received<'_>| {
            let owned = |b: Option<&[u8]>| b.map(<[u8]>::to_vec);
            let record = Record {
                key: owned(m.key),
                payload: owned(m.payload),
                headers: m
                    .headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), owned(*v)))
                    .collect(),
            };
            seen.lock().expect("reader lock").push(record);
        }
    };
    let reader = Verifier::start_with_hook(brokers, topic, partitions, &[], Some(Box::new(hook)))?;
    let count = || seen.lock().expect("reader lock").len();
    let reached = crate::wait::poll_until(wait, Duration::from_millis(50), || async {
        expect > 0 && count() >= expect
    })
    .await;
    if reached {
        tokio::time::sleep(grace).await;
    }
    // joining the consumer thread waits out its current poll
    tokio::task::spawn_blocking(move || drop(reader))
        .await
        .map_err(|e| VerifyError(e.to_string()))?;
    let records = std::mem::take(&mut *seen.lock().expect("reader lock"));
    Ok(records)
}

impl State {
    fn observe(
        &mut self,
        id: Option<String>,
        agg: Option<String>,
        ver: Option<i64>,
        ts: Option<i64>,
    ) {
        self.report.consumed += 1;
        let (Some(id), Some(agg), Some(ver)) = (id, agg, ver) else {
            self.report.foreign += 1;
            return;
        };
        if !self.ids.insert(id.clone()) {
            self.report.duplicates += 1;
            return;
        }
        self.report.delivered += 1;
        if let (Some(ts), Some(h)) = (ts, self.latency.as_mut()) {
            let _ = h.record((ferry_core::now_micros() - ts).clamp(1, 3_600_000_000) as u64);
        }
        self.order.observe(&agg, ver, "delivered");
    }
}

impl Drop for Verifier {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_duplicates_and_reordering() {
        let mut s = State::default();
        let mut o = |id: &str, agg: &str, v: i64| {
            s.observe(Some(id.into()), Some(agg.into()), Some(v), None)
        };
        o("a1", "a", 1);
        o("a2", "a", 2);
        o("a2", "a", 2); // duplicate
        o("b2", "b", 2); // b2 before b1
        o("b1", "b", 1);
        assert_eq!(s.report.duplicates, 1);
        assert_eq!(s.order.violations, 1);
        assert_eq!(s.order.examples, ["b: v2 first delivered before v1"]);
        assert_eq!(s.report.delivered, 4);
        assert_eq!(s.report.consumed, 5);
    }

    #[test]
    fn order_check_counts_overtakes_not_resends() {
        let mut c = OrderCheck::default();
        let seen = [
            ("a", 1),
            ("a", 2),
            ("b", 1),
            ("a", 2),
            ("a", 3),
            ("b", 3),
            ("b", 2),
        ];
        for (agg, v) in seen {
            c.observe(agg, v, "sent");
        }
        assert_eq!(c.violations, 1);
        assert_eq!(c.examples, ["b: v3 first sent before v2"]);
    }
}
