//! The Kafka side of a run: the embedded mock cluster or an external broker, the topic, and
//! the verifier that reads it back concurrently.
use std::time::Duration;

use ferry_testkit::embedded::EmbeddedKafka;
use ferry_testkit::verify::Verifier;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

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
        if let Err(e) = create_topic(brokers, topic, partitions) {
            tracing::warn!(error = %e, topic, "creating the topic through the admin API failed; relying on an existing topic or auto-creation");
        }
        let consumer = metadata_client(brokers)?;
        let mut last = String::from("no answer");
        for _ in 0..10 {
            match consumer.fetch_metadata(Some(topic), Duration::from_secs(5)) {
                Ok(md) => {
                    if let Some(t) = md.topics().iter().find(|t| t.name() == topic) {
                        if t.error().is_none() && !t.partitions().is_empty() {
                            return Ok(Self {
                                brokers: brokers.to_string(),
                                topic: topic.to_string(),
                                partitions: t.partitions().len() as i32,
                                embedded: false,
                                _cluster: None,
                            });
                        }
                        last = format!("{:?}", t.error());
                    }
                }
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Err(Error::Kafka(format!(
            "topic {topic} is not available on {brokers} ({last}); create it first \
             (e.g. `kafka-topics --create --topic {topic} --partitions 16`) or enable topic \
             auto-creation on the broker"
        )))
    }

    /// Starts the verifier on every partition from the beginning.
    pub fn verifier(&self) -> Result<Verifier> {
        Verifier::start(&self.brokers, &self.topic, self.partitions)
            .map_err(|e| Error::Kafka(e.to_string()))
    }
}

/// `(low, high)` watermarks of every partition of `topic`; `None` if one could not be read.
/// Blocking.
fn watermarks(brokers: &str, topic: &str, partitions: i32) -> Option<Vec<(i64, i64)>> {
    let consumer = metadata_client(brokers).ok()?;
    (0..partitions)
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p, Duration::from_secs(5))
                .ok()
        })
        .collect()
}

/// Partitions of `topic` whose log no longer starts at offset 0. On the mock cluster that means
/// its ~5 MiB retention dropped old messages: if the verifier lagged that far behind, missing
/// deliveries are retention drops, not relay loss, and the report says so. Blocking.
pub fn truncated_partitions(brokers: &str, topic: &str, partitions: i32) -> Option<u32> {
    let w = watermarks(brokers, topic, partitions)?;
    Some(w.iter().filter(|(low, _)| *low > 0).count() as u32)
}

/// The high watermark (next offset) of every partition of `topic`. Blocking.
pub fn high_watermarks(brokers: &str, topic: &str, partitions: i32) -> Option<Vec<i64>> {
    let w = watermarks(brokers, topic, partitions)?;
    Some(w.into_iter().map(|(_, high)| high).collect())
}

/// `CreateTopics` through the admin API; an existing topic is not an error (its partition count
/// is what it is). Replication is the broker's default (`-1`, KIP-464).
fn create_topic(brokers: &str, topic: &str, partitions: i32) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|e| Error::Kafka(format!("cannot create an admin client for {brokers}: {e}")))?;
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(10)))
        .request_timeout(Some(Duration::from_secs(15)));
    let results = tokio::runtime::Handle::current()
        .block_on(admin.create_topics(
            &[NewTopic::new(
                topic,
                partitions,
                TopicReplication::Fixed(-1),
            )],
            &opts,
        ))
        .map_err(|e| Error::Kafka(format!("CreateTopics on {brokers}: {e}")))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => return Err(Error::Kafka(format!("CreateTopics {t} on {brokers}: {e}"))),
        }
    }
    Ok(())
}

fn metadata_client(brokers: &str) -> Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("allow.auto.create.topics", "true")
        .create()
        .map_err(|e| Error::Kafka(format!("cannot create a Kafka client for {brokers}: {e}")))
}
