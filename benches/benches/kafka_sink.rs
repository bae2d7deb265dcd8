//! (e) The Kafka sink against librdkafka's in-process mock cluster: one `send_batch` (enqueue
//! every record, then wait for every delivery report) per iteration.
//!
//! `cargo bench -p ferry-benches --bench kafka_sink`
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferry_benches::{payload, quick, runtime, PAYLOAD_BYTES};
use ferry_core::{ClaimedEvent, Outcome};
use ferry_relay::{KafkaConfig, KafkaSink, Sink};
use ferry_testkit::embedded::EmbeddedKafka;

const TOPIC: &str = "ferry-bench";

fn items(n: usize) -> Vec<ClaimedEvent> {
    ferry_testkit::claimed_events(TOPIC, 0, n, &payload(PAYLOAD_BYTES))
}

fn kafka_sink(c: &mut Criterion) {
    let rt = runtime();
    // The mock cluster keeps ~5 MiB per partition and drops older data; a producer-only bench
    // does not read back, so retention cannot show up as loss here.
    let cluster = EmbeddedKafka::with_topic(1, TOPIC, 8).expect("mock Kafka cluster");
    let mut g = c.benchmark_group("kafka_sink");
    for linger_ms in [0u64, 1] {
        let sink = {
            let _guard = rt.enter();
            KafkaSink::new(KafkaConfig {
                brokers: cluster.bootstrap_servers().to_string(),
                linger: Duration::from_millis(linger_ms),
                ..KafkaConfig::default()
            })
            .expect("Kafka producer")
        };
        for n in [100usize, 1000] {
            let batch = items(n);
            // one checked round first: a bench of failing sends would measure nothing
            let out = rt.block_on(sink.send_batch(&batch));
            assert!(
                out.iter().all(|o| *o == Outcome::Acked),
                "mock cluster did not ack: {:?}",
                out.iter().find(|o| **o != Outcome::Acked)
            );
            g.throughput(Throughput::Elements(n as u64));
            g.bench_function(BenchmarkId::new(format!("linger{linger_ms}ms"), n), |b| {
                b.to_async(&rt).iter(|| sink.send_batch(&batch))
            });
        }
        sink.flush(Duration::from_secs(10));
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = quick(Duration::from_secs(3));
    targets = kafka_sink
}
criterion_main!(benches);
