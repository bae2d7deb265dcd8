//! The Kafka side of a run: the embedded mock cluster or an external broker, the topic, and
//! the verifier that reads it back concurrently.
use ferry_testkit::embedded::EmbeddedKafka;
use ferry_testkit::kafka;
use ferry_testkit::verify::Verifier;

use crate::error::{Error, Result};

/// Brokers in the embedded mock cluster (the relay's own tests use 3: partition leaders spread
/// over them, as on a real cluster).
const EMBEDDED_BROKERS: i32 = 3;

/// The topic of a run and who serves it.
pub struct KafkaTarget {
    /// `bootstrap.servers`.
    pub brokers: String,
    pub topic: String,
    pub partitions: i32,
    /// Whether this is the in-process mock cluster.
    pub embedded: bool,
    /// Keeps the mock cluster alive for the run; dropped last.
    _cluster: Option<EmbeddedKafka>,
}

impl KafkaTarget {
    /// Starts a mock cluster with `topic` of `partitions` partitions. A fresh cluster per run:
    /// its memory (up to ~5 MiB per partition) goes away with the run.
    pub fn embedded(topic: &str, partitions: i32) -> Result<Self> {
        let cluster = EmbeddedKafka::start(EMBEDDED_BROKERS)
            .map_err(|e| Error::Kafka(format!("cannot start the in-process mock cluster: {e}")))?;
        cluster.create_topic(topic, partitions).map_err(|e| {
            Error::Kafka(format!(
                "cannot create topic {topic} on the mock cluster: {e}"
            ))
        })?;
        Ok(Self {
            brokers: cluster.bootstrap_servers().to_string(),
            topic: topic.to_string(),
            partitions,
            embedded: true,
            _cluster: Some(cluster),
        })
    }

    /// An external broker: creates `topic` with `partitions` partitions through the admin API
    /// unless it exists, then finds its partition count (a metadata request also triggers
    /// auto-creation where the broker allows it). Blocking: call it from a blocking thread of
    /// the runtime.
    pub fn external(brokers: &str, topic: &str, partitions: i32) -> Result<Self> {
        // replication: the broker's default (-1, KIP-464)
        let created = kafka::create_topic(brokers, &[], topic, partitions, -1);
        if let Err(e) = tokio::runtime::Handle::current().block_on(created) {
            tracing::warn!(error = %e, topic, "creating the topic through the admin API failed; relying on an existing topic or auto-creation");
        }
        let partitions = kafka::partition_count(brokers, topic).map_err(|last| {
            Error::Kafka(format!(
                "topic {topic} is not available on {brokers} ({last}); create it first \
                 (e.g. `kafka-topics --create --topic {topic} --partitions 16`) or enable topic \
                 auto-creation on the broker"
            ))
        })?;
        Ok(Self {
            brokers: brokers.to_string(),
            topic: topic.to_string(),
            partitions,
            embedded: false,
            _cluster: None,
        })
    }

    /// Starts the verifier on every partition from the beginning.
    pub fn verifier(&self) -> Result<Verifier> {
        Verifier::start(&self.brokers, &self.topic, self.partitions)
            .map_err(|e| Error::Kafka(e.to_string()))
    }
}

/// Partitions of `topic` whose log no longer starts at offset 0. On the mock cluster that means
/// its ~5 MiB retention dropped old messages: if the verifier lagged that far behind, missing
/// deliveries are retention drops, not relay loss, and the report says so. Blocking.
pub fn truncated_partitions(brokers: &str, topic: &str, partitions: i32) -> Option<u32> {
    let w = kafka::watermarks(brokers, topic, partitions)?;
    Some(w.iter().filter(|(low, _)| *low > 0).count() as u32)
}

/// The high watermark (next offset) of every partition of `topic`. Blocking.
pub fn high_watermarks(brokers: &str, topic: &str, partitions: i32) -> Option<Vec<i64>> {
    let w = kafka::watermarks(brokers, topic, partitions)?;
    Some(w.into_iter().map(|(_, high)| high).collect())
}
