//! Binary payloads end to end: bytes written by a producer's plain `INSERT` (every backend)
//! reach a Kafka consumer byte for byte, in both dispatch modes, next to JSON text that goes
//! out as before.
use std::time::Duration;

use ferry_core::DispatchMode;
use ferry_relay::{KafkaConfig, KafkaSink, Relay, RelayConfig};
use ferry_testkit::embedded::EmbeddedKafka;
use ferry_testkit::{plain_insert_binary, read_records, RelayTask, TestDb, BINARY_PAYLOAD};

const TOPIC: &str = "orders";

async fn plain_insert_bytes_arrive_unchanged(db: TestDb, mode: DispatchMode) {
    let kafka = EmbeddedKafka::with_topic(1, TOPIC, 1).unwrap();
    // v1 and v3 bytes, v2 JSON text, of one aggregate: one partition, in version order
    db.exec(&plain_insert_binary(
        db.backend,
        TOPIC,
        "proto-1",
        1,
        BINARY_PAYLOAD,
    ))
    .await
    .unwrap();
    db.store
        .enqueue(&[ferry_testkit::intent(TOPIC, "proto-1", 2)])
        .await
        .unwrap();
    let v3: Vec<u8> = BINARY_PAYLOAD.iter().rev().copied().collect();
    db.exec(&plain_insert_binary(db.backend, TOPIC, "proto-1", 3, &v3))
        .await
        .unwrap();
    let cfg = RelayConfig {
        dispatch: Some(mode),
        workers: 2,
        heartbeat: Duration::from_millis(200),
        slot_ttl: Duration::from_secs(2),
        poll_idle: Duration::from_millis(50),
        ..Default::default()
    };
    let kc = KafkaConfig {
        brokers: kafka.bootstrap_servers().to_string(),
        ordered: mode == DispatchMode::Cursor,
        ..Default::default()
    };
    let sink = std::sync::Arc::new(KafkaSink::new(kc).unwrap());
    let relay = Relay::new(db.store.clone(), sink, cfg).unwrap();
    let task = RelayTask::spawn(|cancel| relay.run(cancel));
    let wait = Duration::from_secs(60);
    let read = read_records(kafka.bootstrap_servers(), TOPIC, 1, 3, wait, Duration::ZERO);
    let records = read.await.unwrap();
    task.stop().await;
    let got: Vec<(String, Option<Vec<u8>>)> = records
        .iter()
        .map(|r| {
            let id = r
                .header_pairs()
                .find(|(k, _)| *k == "ferry-event-id")
                .and_then(|(_, v)| v.map(|v| String::from_utf8_lossy(v).into_owned()))
                .unwrap_or_default();
            (id, r.payload.clone())
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("e-proto-1-1".to_string(), Some(BINARY_PAYLOAD.to_vec())),
            (
                "e-proto-1-2".to_string(),
                Some(br#"{"agg":"proto-1","v":2}"#.to_vec())
            ),
            ("e-proto-1-3".to_string(), Some(v3)),
        ]
    );
    db.cleanup().await;
}

ferry_testkit::backend_tests!(modes: plain_insert_bytes_arrive_unchanged);
