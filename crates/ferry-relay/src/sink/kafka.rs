//! Kafka sink over rdkafka: idempotent producer, per-item delivery reports.
//!
//! Delivery reports map to outcomes by this table (`classify`):
//!
//! | delivery report | outcome | why |
//! | --- | --- | --- |
//! | delivered (offset known) | `Acked` | `acks=all` + idempotence: the broker has it |
//! | `MessageTimedOut` | `Unknown` | librdkafka gave up after `message.timeout.ms`; it may or may not be in the log |
//! | producer dropped / purged (`Canceled`, `PurgeQueue`, `PurgeInflight`) | `Unknown` | same |
//! | `MessageSizeTooLarge`, `InvalidMessageSize`, `InvalidMessage` (corrupt), `InvalidRecord`, `InvalidTopic`, `UnknownTopic`, `UnknownTopicOrPartition`, `TopicAuthorizationFailed` | `Permanent` | resending the same bytes cannot succeed: quarantine |
//! | fatal producer error (e.g. `OUT_OF_ORDER_SEQUENCE_NUMBER` under idempotence) | `Retry` | the producer is recreated before the next batch |
//! | anything else (retriable broker errors that outlived librdkafka's own retries) | `Retry` | backoff and resend the same event |
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use ferry_core::{BoxFuture, ClaimedEvent, Outcome};
use futures::future::join_all;
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer, PurgeConfig};

use super::Sink;

/// The longest [`KafkaConfig::linger`] librdkafka takes (`linger.ms` at most 900,000): 15 min.
pub const MAX_KAFKA_LINGER: Duration = Duration::from_secs(900);

/// Kafka producer settings. `Debug` redacts the values of secret properties (`sasl.password`,
/// `ssl.key.password`, `…secret…`), so a logged config never carries a credential.
#[derive(Clone)]
pub struct KafkaConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// `message.timeout.ms` (default 30 s): after it a record's outcome is `Unknown`. Keep it
    /// below the claim lease so an unknown item is released before another relay's takeover.
    pub message_timeout: Duration,
    /// `linger.ms` (default 1 ms): batches records per partition; the relay pipelines claims, so a
    /// small linger costs little latency, and a small batch that is the sink's only one
    /// outstanding does not wait it out (`send_now`; docs/tuning.md).
    pub linger: Duration,
    /// Extra librdkafka properties (e.g. `compression.type`, security settings).
    pub extra: BTreeMap<String, String>,
    /// Several versions of one key may be in flight at once (cursor dispatch): the producer must
    /// never append a later message of a partition after an earlier one failed. Sets
    /// `enable.gapless.guarantee=true` (an error that could leave a gap becomes fatal: nothing
    /// after it is appended, the producer is recreated) and `message.timeout.ms=0` (no local
    /// timeouts, which would be gaps `gapless` does not cover; a dead broker stalls the relay
    /// instead, visible as the oldest-intent age). `message_timeout` is then not used.
    pub ordered: bool,
}

/// Whether a librdkafka property holds a credential.
fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("password") || k.contains("secret") || k.ends_with(".pem") || k.contains("token")
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let extra: BTreeMap<&str, &str> = self
            .extra
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str(),
                    if is_secret(k) {
                        "<redacted>"
                    } else {
                        v.as_str()
                    },
                )
            })
            .collect();
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("message_timeout", &self.message_timeout)
            .field("linger", &self.linger)
            .field("extra", &extra)
            .field("ordered", &self.ordered)
            .finish()
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            message_timeout: Duration::from_secs(30),
            linger: Duration::from_millis(1),
            extra: BTreeMap::new(),
            ordered: false,
        }
    }
}

impl KafkaConfig {
    fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set(
                "message.timeout.ms",
                self.message_timeout.as_millis().to_string(),
            )
            // librdkafka takes a fractional linger.ms: keep sub-millisecond settings
            .set(
                "linger.ms",
                (self.linger.as_secs_f64() * 1000.0).to_string(),
            )
            .set("queue.buffering.max.messages", "1000000")
            .set("batch.num.messages", "10000");
        if self.ordered {
            c.set("enable.gapless.guarantee", "true")
                .set("message.timeout.ms", "0");
        }
        for (k, v) in &self.extra {
            c.set(k, v);
        }
        c
    }
}

/// The Kafka sink: one idempotent producer (`acks=all`) whose per-record delivery reports
/// become per-item [`Outcome`]s (table above); recreated after a fatal producer error.
pub struct KafkaSink {
    config: KafkaConfig,
    context: SinkContext,
    producer: RwLock<Arc<FutureProducer<SinkContext>>>,
    /// Batches between their first enqueue and their last delivery report.
    sending: AtomicUsize,
}

/// Counts a batch in [`KafkaSink::sending`] while it lives (also when its future is dropped).
struct Sending<'a>(&'a AtomicUsize);

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A sink construction error (bad producer configuration).
#[derive(Debug, thiserror::Error)]
#[error("cannot create the Kafka producer: {0}")]
pub struct KafkaSinkError(#[source] KafkaError);

impl KafkaSink {
    /// Creates the producer (connections are made lazily by librdkafka).
    pub fn new(config: KafkaConfig) -> Result<Self, KafkaSinkError> {
        let context = SinkContext::default();
        let producer = config
            .client_config()
            .create_with_context(context.clone())
            .map_err(KafkaSinkError)?;
        Ok(Self {
            config,
            context,
            producer: RwLock::new(Arc::new(producer)),
            sending: AtomicUsize::new(0),
        })
    }

    fn producer(&self) -> Arc<FutureProducer<SinkContext>> {
        self.producer.read().expect("producer lock").clone()
    }

    /// Replaces a producer that hit a fatal error (its later sends would all fail).
    fn recreate(&self, failed: &Arc<FutureProducer<SinkContext>>) {
        let mut guard = self.producer.write().expect("producer lock");
        if Arc::ptr_eq(&guard, failed) {
            match self
                .config
                .client_config()
                .create_with_context::<_, FutureProducer<SinkContext>>(self.context.clone())
            {
                Ok(p) => {
                    tracing::warn!("recreated the Kafka producer after a fatal error");
                    *guard = Arc::new(p);
                }
                Err(e) => tracing::error!(error = %e, "cannot recreate the Kafka producer"),
            }
        }
    }

    /// Flushes outstanding records (shutdown).
    pub fn flush(&self, timeout: Duration) {
        let _ = self.producer().flush(timeout);
    }
}

/// The extra librdkafka properties among `extra` that weaken delivery or order, each with why:
/// the relay refuses to start with one unless the operator allows it by name (and then warns on
/// every start). `lease` is the claim lease: a record the producer may still deliver after it
/// can be resent by another relay meanwhile.
pub fn weakening_properties(
    extra: &BTreeMap<String, String>,
    lease: Duration,
) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut flag = |k: &str, why: String| found.push((k.to_string(), why));
    let get = |k: &str| extra.get(k).map(|v| v.trim().to_ascii_lowercase());
    let falsy = |v: &str| matches!(v, "false" | "0" | "no" | "off");
    if let Some(v) = get("acks").or_else(|| get("request.required.acks")) {
        if v != "all" && v != "-1" {
            flag(
                if extra.contains_key("acks") { "acks" } else { "request.required.acks" },
                format!("acks={v}: the leader acks before the in-sync replicas have the record, so a leader failover can lose an event ferry has marked sent"),
            );
        }
    }
    if get("enable.idempotence").is_some_and(|v| falsy(&v)) {
        flag(
            "enable.idempotence",
            "without idempotence the producer's own retries can duplicate records and reorder them within a partition".into(),
        );
    }
    if get("enable.gapless.guarantee").is_some_and(|v| falsy(&v)) {
        flag(
            "enable.gapless.guarantee",
            "without it a failed record can leave a gap: later versions of an aggregate delivered while an earlier one is not".into(),
        );
    }
    for k in ["max.in.flight.requests.per.connection", "max.in.flight"] {
        if let Some(n) = get(k).and_then(|v| v.parse::<u64>().ok()) {
            if n > 5 {
                flag(
                    k,
                    format!("{k}={n}: the idempotent producer keeps order only with at most 5 requests in flight"),
                );
            }
        }
    }
    for k in ["message.timeout.ms", "delivery.timeout.ms"] {
        if let Some(ms) = get(k).and_then(|v| v.parse::<u64>().ok()) {
            let d = Duration::from_millis(ms);
            if ms == 0 || d >= lease {
                flag(
                    k,
                    format!(
                        "{k}={ms}: {} the claim lease ({} s), so a record can still be delivered after its claim expired and another relay sent it again",
                        if ms == 0 { "no timeout outlasts" } else { "at least" },
                        lease.as_secs()
                    ),
                );
            }
        }
    }
    for k in ["retries", "message.send.max.retries"] {
        if get(k).as_deref() == Some("0") {
            flag(
                k,
                format!("{k}=0: a transient broker error (a leader election) fails the record at once instead of being retried by the producer"),
            );
        }
    }
    found
}

/// The producer's client context: keeps the last error librdkafka reported on its own (a
/// broker connection refused or reset, all brokers down), which no delivery report carries,
/// for the sink-stall WARN ([`super::health`]).
#[derive(Debug, Default, Clone)]
pub struct SinkContext {
    last_error: Arc<Mutex<Option<String>>>,
}

impl ClientContext for SinkContext {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(error = %error, reason, "kafka client error");
        *self.last_error.lock().expect("kafka error lock") = Some(format!("{error}: {reason}"));
    }
}

/// The largest batch [`send_now`] is used for.
const SEND_NOW_MAX: usize = 256;

/// Lets the records a batch has just enqueued go out without waiting out `linger.ms`. Called
/// only for a batch of at most [`SEND_NOW_MAX`] records that is the sink's only one outstanding:
/// no other batch will add to its requests, and the linger is pure latency (a millisecond on
/// every low-rate batch). Used on every batch, the override cost the PostgreSQL burn-down (2,000-
/// record batches, rarely overlapping) about 13 %, for a reason not found; limited to small lone
/// batches it costs nothing measurable there.
///
/// librdkafka treats the linger as elapsed while a `rd_kafka_flush()` is in progress, and the
/// call wakes every broker thread (librdkafka ≥ 1.8.0, issue #3489). The whole batch is enqueued
/// before this call, so it still leaves in full requests. The flush is called with the linger as
/// its timeout on a blocking thread and not awaited: the override lasts at most one linger (less
/// once every outstanding record is delivered). It changes when a request is sent, never what is
/// in it or in which order: the idempotent producer keeps each partition's order as before.
/// rust-rdkafka's own `flush` calls `rd_kafka_flush` with a zero timeout in a loop, which drops
/// the override before a broker thread can see it; hence the direct call.
fn send_now(producer: &Arc<FutureProducer<SinkContext>>, linger: Duration) {
    if linger.is_zero() {
        return;
    }
    let producer = Arc::clone(producer);
    let ms = linger.as_millis().clamp(1, 1_000) as i32;
    tokio::task::spawn_blocking(move || {
        // SAFETY: `producer` keeps the client (and its `rd_kafka_t`) alive for the whole call,
        // and `rd_kafka_flush` may be called from any thread.
        unsafe { rdkafka::bindings::rd_kafka_flush(producer.client().native_ptr(), ms) };
    });
}

fn headers(e: &ClaimedEvent) -> OwnedHeaders {
    let version = e.aggregate_version.to_string();
    let mut h = OwnedHeaders::new_with_capacity(8)
        .insert(Header {
            key: "ferry-event-id",
            value: Some(e.token.event_id.as_bytes()),
        })
        .insert(Header {
            key: "ferry-aggregate-id",
            value: Some(e.aggregate_id.as_bytes()),
        })
        .insert(Header {
            key: "ferry-aggregate-version",
            value: Some(version.as_bytes()),
        })
        .insert(Header {
            key: "ferry-event-type",
            value: Some(e.event_type.as_bytes()),
        });
    if e.headers != "{}" {
        if let Ok(map) = serde_json::from_str::<BTreeMap<String, String>>(&e.headers) {
            for (k, v) in &map {
                h = h.insert(Header {
                    key: k.as_str(),
                    value: Some(v.as_bytes()),
                });
            }
        }
    }
    h
}

/// Maps a librdkafka error code to an outcome (the table in the module docs).
pub fn classify(code: Option<RDKafkaErrorCode>, text: String) -> Outcome {
    use RDKafkaErrorCode as C;
    match code {
        Some(C::MessageTimedOut | C::PurgeQueue | C::PurgeInflight) => Outcome::Unknown(text),
        Some(
            C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::InvalidMessage
            | C::InvalidRecord
            | C::InvalidTopic
            | C::UnknownTopic
            | C::UnknownTopicOrPartition
            | C::TopicAuthorizationFailed,
        ) => Outcome::Permanent(text),
        _ => Outcome::Retry(text),
    }
}

impl Sink for KafkaSink {
    fn name(&self) -> &'static str {
        "kafka"
    }

    fn describe(&self) -> String {
        format!("kafka (bootstrap servers {})", self.config.brokers)
    }

    fn last_error(&self) -> Option<String> {
        self.context
            .last_error
            .lock()
            .expect("kafka error lock")
            .clone()
    }

    fn send_batch<'a>(&'a self, items: &'a [ClaimedEvent]) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(async move {
            let producer = self.producer();
            let alone = self.sending.fetch_add(1, Ordering::Relaxed) == 0;
            let _sending = Sending(&self.sending);
            let mut pending = Vec::with_capacity(items.len());
            // A record that could not even be enqueued stops its key: later records of the same
            // key in this batch are not produced (they would overtake it).
            let mut stopped: std::collections::HashSet<(&str, &str)> = Default::default();
            for e in items {
                if stopped.contains(&(e.topic.as_str(), e.key.as_str())) {
                    pending.push(Err(KafkaError::MessageProduction(RDKafkaErrorCode::Fail)));
                    continue;
                }
                let mut record = FutureRecord::to(&e.topic)
                    .key(&e.key)
                    .payload(e.payload.as_bytes())
                    .headers(headers(e));
                let fut = loop {
                    match producer.send_result(record) {
                        Ok(f) => break Ok(f),
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                            // librdkafka's local queue is full: let it drain, then enqueue again.
                            record = r;
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        Err((err, _)) => break Err(err),
                    }
                };
                if fut.is_err() {
                    stopped.insert((e.topic.as_str(), e.key.as_str()));
                }
                pending.push(fut);
            }
            if alone && items.len() <= SEND_NOW_MAX && pending.iter().any(Result::is_ok) {
                send_now(&producer, self.config.linger);
            }
            let mut fatal = false;
            let all = join_all(pending.into_iter().map(|f| async move {
                match f {
                    Err(err) => Err(err),
                    Ok(delivery) => match delivery.await {
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err((err, _msg))) => Err(err),
                        Err(_canceled) => Err(KafkaError::Canceled),
                    },
                }
            }));
            // With an infinite message timeout (ordered mode) nothing would ever fail a record
            // stuck in a producer that hit a fatal error: watch for one and purge its queues,
            // which fails the rest (outcome unknown: resent after the hold rule).
            tokio::pin!(all);
            let results = loop {
                tokio::select! {
                    r = &mut all => break r,
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {
                        if producer.client().fatal_error().is_some() {
                            producer.purge(PurgeConfig::default().queue().inflight());
                        }
                    }
                }
            };
            let outcomes = results
                .into_iter()
                .map(|r| match r {
                    Ok(()) => Outcome::Acked,
                    Err(KafkaError::Canceled) => {
                        Outcome::Unknown("producer dropped before the delivery report".into())
                    }
                    Err(err) => {
                        let code = err.rdkafka_error_code();
                        if code == Some(RDKafkaErrorCode::Fatal) {
                            fatal = true;
                        }
                        classify(code, err.to_string())
                    }
                })
                .collect();
            if fatal || producer.client().fatal_error().is_some() {
                self.recreate(&producer);
            }
            outcomes
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TLS and SASL reach librdkafka through `extra` (`--kafka-property`); a build without
    /// OpenSSL refuses `security.protocol=SSL` ("not supported by this build") when the producer
    /// is created, which these would catch.
    #[test]
    fn tls_and_sasl_properties_are_supported_by_this_build() {
        for props in [
            vec![("security.protocol", "SSL")],
            vec![
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanisms", "SCRAM-SHA-512"),
                ("sasl.username", "ferry"),
                ("sasl.password", "secret"),
            ],
            vec![
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanisms", "PLAIN"),
                ("sasl.username", "ferry"),
                ("sasl.password", "secret"),
            ],
        ] {
            let config = KafkaConfig {
                brokers: "127.0.0.1:1".into(),
                extra: props
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            };
            let shown = format!("{config:?}");
            assert!(!shown.contains("secret"), "{shown}");
            if let Err(e) = KafkaSink::new(config) {
                panic!("{props:?}: {e}");
            }
        }
    }

    #[test]
    fn classification_table() {
        use std::mem::discriminant;
        use RDKafkaErrorCode as C;
        let like = |kind: fn(String) -> Outcome| kind(String::new());
        for (code, want) in [
            (Some(C::MessageTimedOut), like(Outcome::Unknown)),
            (Some(C::MessageSizeTooLarge), like(Outcome::Permanent)),
            (Some(C::TopicAuthorizationFailed), like(Outcome::Permanent)),
            (Some(C::UnknownTopicOrPartition), like(Outcome::Permanent)),
            (Some(C::NotLeaderForPartition), like(Outcome::Retry)),
            (Some(C::RequestTimedOut), like(Outcome::Retry)),
            (None, like(Outcome::Retry)),
        ] {
            let got = classify(code, String::new());
            assert_eq!(discriminant(&got), discriminant(&want), "{code:?}: {got:?}");
        }
    }
}
