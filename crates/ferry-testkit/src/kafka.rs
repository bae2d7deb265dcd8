//! A Kafka broker's topics through its admin API and metadata: creating a topic, learning its
//! partition count, reading its watermarks. For an external broker (the mock cluster creates
//! topics through [`EmbeddedKafka::create_topic`](crate::EmbeddedKafka::create_topic)); used by
//! the external-broker tests and loadgen.
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

/// A failed admin or metadata request.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct KafkaAdminError(String);

fn client_config(brokers: &str, properties: &[(String, String)]) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (k, v) in properties {
        config.set(k, v);
    }
    config.set("bootstrap.servers", brokers);
    config
}

/// `CreateTopics` for `topic` with `partitions` partitions and `replication` replicas (`-1`:
/// the broker's default, KIP-464), with extra client `properties` (TLS); an existing topic is
/// not an error (its partition count is what it is).
pub async fn create_topic(
    brokers: &str,
    properties: &[(String, String)],
    topic: &str,
    partitions: i32,
    replication: i32,
) -> Result<(), KafkaAdminError> {
    let admin: AdminClient<DefaultClientContext> =
        client_config(brokers, properties).create().map_err(|e| {
            KafkaAdminError(format!("cannot create an admin client for {brokers}: {e}"))
        })?;
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(10)))
        .request_timeout(Some(Duration::from_secs(15)));
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
    let results = admin
        .create_topics(&[new], &opts)
        .await
        .map_err(|e| KafkaAdminError(format!("CreateTopics on {brokers}: {e}")))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => {
                return Err(KafkaAdminError(format!(
                    "CreateTopics {t} on {brokers}: {e}"
                )))
            }
        }
    }
    Ok(())
}

/// A client for metadata requests (which also trigger topic auto-creation where the broker
/// allows it).
fn metadata_client(brokers: &str) -> Result<BaseConsumer, KafkaAdminError> {
    client_config(brokers, &[])
        .set("allow.auto.create.topics", "true")
        .create()
        .map_err(|e| KafkaAdminError(format!("cannot create a Kafka client for {brokers}: {e}")))
}

/// The partition count of `topic`, asking up to ten times, 500 ms apart, until the broker
/// reports the topic with partitions. Blocking.
pub fn partition_count(brokers: &str, topic: &str) -> Result<i32, KafkaAdminError> {
    let consumer = metadata_client(brokers)?;
    let mut last = String::from("no answer");
    for _ in 0..10 {
        match consumer.fetch_metadata(Some(topic), Duration::from_secs(5)) {
            Ok(md) => {
                if let Some(t) = md.topics().iter().find(|t| t.name() == topic) {
                    if t.error().is_none() && !t.partitions().is_empty() {
                        return Ok(t.partitions().len() as i32);
                    }
                    last = format!("{:?}", t.error());
                }
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(KafkaAdminError(last))
}

/// `(low, high)` watermarks of every partition of `topic`; `None` if one could not be read.
/// Blocking.
pub fn watermarks(brokers: &str, topic: &str, partitions: i32) -> Option<Vec<(i64, i64)>> {
    let consumer = metadata_client(brokers).ok()?;
    (0..partitions)
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p, Duration::from_secs(5))
                .ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The metadata helpers on the mock cluster (which has no admin API): its topic's partition
    /// count and watermarks.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_a_topics_partitions_and_watermarks() {
        let cluster = crate::embedded::EmbeddedKafka::with_topic(1, "meta", 3).unwrap();
        let brokers = cluster.bootstrap_servers().to_string();
        let (partitions, marks) = tokio::task::spawn_blocking(move || {
            (
                partition_count(&brokers, "meta").unwrap(),
                watermarks(&brokers, "meta", 3),
            )
        })
        .await
        .unwrap();
        assert_eq!(partitions, 3);
        assert_eq!(marks, Some(vec![(0, 0); 3]));
    }
}
