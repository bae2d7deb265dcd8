//! The Kafka side of a run: the embedded mock cluster or an external broker, the topic, the
//! verifier that reads it back concurrently, and `--broker-stall`.
use std::sync::Arc;
use std::time::Duration;

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
    /// Keeps the mock cluster alive for the run (shared with a `--broker-stall` task).
    cluster: Option<Arc<EmbeddedKafka>>,
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
            cluster: Some(Arc::new(cluster)),
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
            cluster: None,
        })
    }

    /// Starts `--broker-stall`: after `after`, takes every broker of the embedded cluster down
    /// for `length`, then brings them back. The task returns when the brokers are up again, with
    /// the stall's start and end relative to its own start, in seconds. `None` with an external
    /// broker.
    pub fn stall(
        &self,
        after: Duration,
        length: Duration,
    ) -> Option<tokio::task::JoinHandle<Result<(f64, f64)>>> {
        let cluster = self.cluster.clone()?;
        Some(tokio::spawn(async move {
            let t0 = tokio::time::Instant::now();
            tokio::time::sleep(after).await;
            let down_at = t0.elapsed().as_secs_f64();
            set_brokers(&cluster, false).await?;
            tokio::time::sleep(length).await;
            let up_at = t0.elapsed().as_secs_f64();
            set_brokers(&cluster, true).await?;
            Ok((down_at, up_at))
        }))
    }

    /// Starts the verifier on every partition from the beginning.
    pub fn verifier(&self) -> Result<Verifier> {
        Verifier::start(&self.brokers, &self.topic, self.partitions)
            .map_err(|e| Error::Kafka(e.to_string()))
    }
}

/// Takes every broker of `cluster` down (`up` false) or brings it back, off the runtime's
/// workers (each call waits for the mock cluster's thread).
async fn set_brokers(cluster: &Arc<EmbeddedKafka>, up: bool) -> Result<()> {
    let cluster = cluster.clone();
    tokio::task::spawn_blocking(move || {
        for b in 1..=cluster.brokers() {
            let r = if up {
                cluster.broker_up(b)
            } else {
                cluster.broker_down(b)
            };
            r.map_err(|e| {
                let what = if up { "bring back" } else { "take down" };
                Error::Kafka(format!("--broker-stall: cannot {what} broker {b}: {e}"))
            })?;
        }
        Ok(())
    })
    .await
    .map_err(|e| Error::Kafka(format!("--broker-stall task failed: {e}")))?
}

/// Partitions of `topic` whose log no longer starts at offset 0. On the mock cluster that means
/// its ~5 MiB retention dropped old messages: if the verifier lagged that far behind, missing
/// deliveries are retention drops, not relay loss, and the report says so. Blocking.
pub fn truncated_partitions(brokers: &str, topic: &str, partitions: i32) -> Option<u32> {
    let w = kafka::watermarks(brokers, topic, partitions)?;
    Some(w.iter().filter(|(low, _)| *low > 0).count() as u32)
}
