//! The Kafka sink's linger rule (`send_now` in src/sink/kafka.rs): a batch of at most 256
//! records that is the sink's only one outstanding is sent without waiting out `linger.ms`; a
//! larger batch waits it, so its requests stay full. The linger here is 3 s, so both claims hold
//! with seconds of margin on a slow machine.
use std::time::{Duration, Instant};

use ferry_core::{ClaimedEvent, Outcome};
use ferry_relay::{KafkaConfig, KafkaSink, Sink};
use ferry_testkit::embedded::EmbeddedKafka;

const TOPIC: &str = "linger";
const LINGER: Duration = Duration::from_secs(3);

fn items(first: usize, n: usize) -> Vec<ClaimedEvent> {
    ferry_testkit::claimed_events(TOPIC, first, n, "{}")
}

async fn send(sink: &KafkaSink, batch: &[ClaimedEvent]) -> Duration {
    let started = Instant::now();
    let outcomes = sink.send_batch(batch).await;
    assert_eq!(outcomes.len(), batch.len());
    assert!(
        outcomes.iter().all(|o| matches!(o, Outcome::Acked)),
        "{outcomes:?}"
    );
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_small_batch_skips_the_linger_and_a_large_one_waits_it() {
    let cluster = EmbeddedKafka::with_topic(1, TOPIC, 4).expect("mock Kafka cluster");
    let sink = KafkaSink::new(KafkaConfig {
        brokers: cluster.bootstrap_servers().to_string(),
        linger: LINGER,
        message_timeout: Duration::from_secs(60),
        ..KafkaConfig::default()
    })
    .expect("Kafka producer");
    // The first send to the topic also fetches its metadata, and may wait out the linger (one
    // CI run: a first lone batch of 1 acked after 3.001 s); what is measured below is the
    // linger rule, so the topic is known first.
    send(&sink, &items(9000, 1)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (i, n) in [1usize, 256].into_iter().enumerate() {
        let took = send(&sink, &items(i * 1000, n)).await;
        assert!(
            took < LINGER / 2,
            "a lone batch of {n} took {took:?}: it waited out the {LINGER:?} linger"
        );
    }
    // The last lone batch's flush ends on a blocking thread once its records are delivered,
    // just after its send returned; on a loaded machine that thread may run late. Let it end,
    // or its override would still cover the next batch.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let took = send(&sink, &items(5000, 257)).await;
    assert!(
        took >= LINGER * 3 / 4,
        "a batch of 257 was acked after {took:?}, before the {LINGER:?} linger"
    );
}
