//! End-to-end relay runs against an external Kafka-protocol broker that we did not write (CI
//! starts tansu): outbox (every backend, both dispatch modes) → relay → broker → a real
//! consumer that checks loss, duplicates and per-aggregate first-delivery order.
//!
//! Set `FERRY_TEST_KAFKA_BROKERS` (e.g. `127.0.0.1:39092`) to run them; without it they are
//! skipped with a printed reason, and `FERRY_REQUIRE_KAFKA=1` turns the skip into a failure.
//! Each test creates its own topic through the admin API, so tests run in parallel on one
//! broker. Fault injection needs the mock cluster and stays in `relay_kafka.rs`.
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{DispatchMode, NewEvent};
use ferry_relay::{KafkaConfig, KafkaSink, Relay, RelayConfig};
use ferry_testkit::verify::Verifier;
use ferry_testkit::{RelayTask, TestDb};

const PARTITIONS: i32 = 4;

/// The external broker's address, or `None` (skipped, with the reason printed).
fn brokers() -> Option<String> {
    match std::env::var("FERRY_TEST_KAFKA_BROKERS") {
        Ok(b) if !b.trim().is_empty() => Some(b),
        _ => {
            assert!(
                std::env::var("FERRY_REQUIRE_KAFKA").as_deref() != Ok("1"),
                "FERRY_REQUIRE_KAFKA=1 but FERRY_TEST_KAFKA_BROKERS is not set"
            );
            println!("skipped: FERRY_TEST_KAFKA_BROKERS is not set (no external broker)");
            None
        }
    }
}

/// A fresh topic on the broker, created through the admin API.
async fn create_topic(brokers: &str) -> String {
    create_topic_with(brokers, &[]).await
}

/// [`create_topic`] with extra client properties (TLS).
async fn create_topic_with(brokers: &str, properties: &[(String, String)]) -> String {
    let topic = format!("ferry-ext-{}", uuid::Uuid::new_v4().simple());
    ferry_testkit::kafka::create_topic(brokers, properties, &topic, PARTITIONS, 1)
        .await
        .unwrap_or_else(|e| panic!("creating topic {topic} on {brokers}: {e}"));
    topic
}

/// [`ferry_testkit::intent`] with the topic in its id: the broker keeps every test's topics.
fn ev(topic: &str, agg: &str, v: i64) -> NewEvent {
    ferry_testkit::intent(topic, agg, v).with_id(format!("e-{topic}-{agg}-{v}"))
}

/// Versions 1..=`versions` of `aggs` aggregates `{prefix}-{a}`, one transaction per version.
async fn enqueue_versions(db: &TestDb, topic: &str, prefix: &str, aggs: usize, versions: i64) {
    for v in 1..=versions {
        let evs: Vec<NewEvent> = (0..aggs)
            .map(|a| ev(topic, &format!("{prefix}-{a}"), v))
            .collect();
        db.store.enqueue(&evs).await.unwrap();
    }
}

fn start_relay(db: &TestDb, brokers: &str, mode: DispatchMode) -> RelayTask {
    start_relay_with(db, brokers, mode, &[])
}

/// [`start_relay`] with extra librdkafka properties for the sink (TLS).
fn start_relay_with(
    db: &TestDb,
    brokers: &str,
    mode: DispatchMode,
    properties: &[(String, String)],
) -> RelayTask {
    let sink = KafkaSink::new(KafkaConfig {
        brokers: brokers.to_string(),
        ordered: mode == DispatchMode::Cursor,
        message_timeout: Duration::from_secs(30),
        extra: properties.iter().cloned().collect(),
        ..Default::default()
    })
    .expect("Kafka sink");
    let cfg = RelayConfig {
        dispatch: Some(mode),
        heartbeat: Duration::from_millis(200),
        slot_ttl: Duration::from_secs(2),
        poll_idle: Duration::from_millis(50),
        status_interval: Duration::from_millis(200),
        ..Default::default()
    };
    let relay = Relay::new(db.store.clone(), Arc::new(sink), cfg).expect("relay");
    RelayTask::spawn(|cancel| relay.run(cancel))
}

/// 60 aggregates × 10 versions committed while the relay runs: all delivered, first deliveries
/// in version order, and every intent SENT in the store.
async fn external_broker_gets_every_event_in_order(db: TestDb, mode: DispatchMode) {
    let Some(brokers) = brokers() else { return };
    let topic = create_topic(&brokers).await;
    let verifier = Verifier::start(&brokers, &topic, PARTITIONS).expect("verifier");
    let relay = start_relay(&db, &brokers, mode);
    enqueue_versions(&db, &topic, "order", 60, 10).await;
    let r = verifier
        .wait_until(Duration::from_secs(90), |r| r.delivered >= 600)
        .await;
    assert_eq!(r.delivered, 600, "{r:?}");
    assert_eq!(r.ordering_violations, 0, "{r:?}");
    db.wait_all_sent(Duration::from_secs(30)).await;
    relay.stop().await;
    db.cleanup().await;
}

/// One aggregate with 1,000 versions committed before the relay starts: cursor dispatch sends
/// many versions per batch, row dispatch one per round trip; the broker's log has them in order.
async fn external_broker_hot_aggregate_in_order(db: TestDb, mode: DispatchMode) {
    let Some(brokers) = brokers() else { return };
    let topic = create_topic(&brokers).await;
    let n = if mode == DispatchMode::Cursor {
        1000
    } else {
        100
    };
    for chunk in (1..=n).collect::<Vec<i64>>().chunks(100) {
        let evs: Vec<NewEvent> = chunk.iter().map(|v| ev(&topic, "hot", *v)).collect();
        db.store.enqueue(&evs).await.unwrap();
    }
    let verifier = Verifier::start(&brokers, &topic, PARTITIONS).expect("verifier");
    let relay = start_relay(&db, &brokers, mode);
    let r = verifier
        .wait_until(Duration::from_secs(120), |r| r.delivered >= n as u64)
        .await;
    assert_eq!(r.delivered, n as u64, "{r:?}");
    assert_eq!(r.ordering_violations, 0, "{r:?}");
    relay.stop().await;
    db.cleanup().await;
}

/// TLS: the relay, the admin client and the consumer reach the broker through a TLS endpoint
/// (`FERRY_TEST_KAFKA_TLS_BROKERS`, its CA in `FERRY_TEST_KAFKA_TLS_CA`; in CI a socat
/// TLS terminator in front of tansu, which advertises that endpoint) with nothing but
/// `--kafka-property`-style settings: `security.protocol=SSL`, `ssl.ca.location`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn external_broker_over_tls() {
    let (Ok(brokers), Ok(ca)) = (
        std::env::var("FERRY_TEST_KAFKA_TLS_BROKERS"),
        std::env::var("FERRY_TEST_KAFKA_TLS_CA"),
    ) else {
        assert!(
            std::env::var("FERRY_REQUIRE_KAFKA").as_deref() != Ok("1"),
            "FERRY_REQUIRE_KAFKA=1 but FERRY_TEST_KAFKA_TLS_BROKERS / FERRY_TEST_KAFKA_TLS_CA are not set"
        );
        println!("skipped: FERRY_TEST_KAFKA_TLS_BROKERS is not set (no TLS broker)");
        return;
    };
    let tls = vec![
        ("security.protocol".to_string(), "SSL".to_string()),
        ("ssl.ca.location".to_string(), ca),
    ];
    let db = TestDb::sqlite().await;
    let topic = create_topic_with(&brokers, &tls).await;
    let verifier =
        Verifier::start_with(&brokers, &topic, PARTITIONS, &tls).expect("verifier over TLS");
    let relay = start_relay_with(&db, &brokers, DispatchMode::Cursor, &tls);
    enqueue_versions(&db, &topic, "tls", 20, 5).await;
    let r = verifier
        .wait_until(Duration::from_secs(60), |r| r.delivered >= 100)
        .await;
    assert_eq!((r.delivered, r.ordering_violations), (100, 0), "{r:?}");
    relay.stop().await;
}

/// A producer transaction open while later intents are committed and delivered, then
/// committed; another rolled back: the late one arrives, the rolled-back one never (the
/// late-commit test of `relay_kafka.rs`, shortened, on the external broker).
async fn external_broker_late_commit_and_rollback(db: TestDb, mode: DispatchMode) {
    let Some(brokers) = brokers() else { return };
    // a mode switch takes the outbox's table lock: before the open transactions
    if let Some(cs) = db.store.cursor() {
        cs.set_dispatch_mode(mode, "test").await.unwrap();
    }
    let topic = create_topic(&brokers).await;
    let Some(late) = db.open_producer_tx(&[ev(&topic, "late", 1)]).await else {
        println!("not applicable on SQLite: an open write transaction blocks every other writer");
        return;
    };
    let rolled = db
        .open_producer_tx(&[ev(&topic, "rolled-back", 1)])
        .await
        .unwrap();
    let verifier = Verifier::start(&brokers, &topic, PARTITIONS).expect("verifier");
    let relay = start_relay(&db, &brokers, mode);
    let opened = tokio::time::Instant::now();
    let mut n = 0u64;
    let mut round = 0;
    while opened.elapsed() < Duration::from_secs(3) {
        let evs: Vec<NewEvent> = (0..100)
            .map(|i| ev(&topic, &format!("bulk-{round}-{i}"), 1))
            .collect();
        db.store.enqueue(&evs).await.unwrap();
        n += 100;
        round += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // MariaDB in cursor dispatch holds every later intent behind the open transaction (the
    // commit gate's documented price); elsewhere they go out meanwhile
    let gated = db.backend == ferry_store::Backend::Mysql && mode == DispatchMode::Cursor;
    if !gated {
        let r = verifier
            .wait_until(Duration::from_secs(60), |r| r.delivered >= n)
            .await;
        assert_eq!(r.delivered, n, "{r:?}");
    }
    let late_id = format!("e-{topic}-late-1");
    assert!(!verifier.was_delivered(&late_id), "announced before commit");
    late.commit().await;
    rolled.rollback().await;
    db.store.enqueue(&[ev(&topic, "after", 1)]).await.unwrap();
    let r = verifier
        .wait_until(Duration::from_secs(60), |r| r.delivered >= n + 2)
        .await;
    assert!(verifier.was_delivered(&late_id), "late commit lost: {r:?}");
    assert!(!verifier.was_delivered(&format!("e-{topic}-rolled-back-1")));
    assert_eq!((r.delivered, r.ordering_violations), (n + 2, 0), "{r:?}");
    relay.stop().await;
    db.cleanup().await;
}

ferry_testkit::backend_tests!(modes:
    external_broker_late_commit_and_rollback,
    external_broker_gets_every_event_in_order,
    external_broker_hot_aggregate_in_order,
);
