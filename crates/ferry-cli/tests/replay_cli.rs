//! The `ferry replay` binary against a broker (librdkafka's mock cluster), on every backend with
//! the rows delivered in each dispatch mode: the dry run counts, the replay sends exactly the
//! topic's SENT events to the new topic with their ids and the replay header, each aggregate in
//! version order, and an unknown topic is refused.
use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{DispatchMode, NewEvent};
use ferry_relay::{KafkaConfig, KafkaSink, Relay, RelayConfig};
use ferry_testkit::embedded::EmbeddedKafka;
use ferry_testkit::{read_records, RelayTask, TestDb};

const TOPIC: &str = "orders";
const TO: &str = "orders-rebuilt";

fn ev(agg: &str, v: i64) -> NewEvent {
    ferry_testkit::intent(TOPIC, agg, v)
}

fn replay(url: &str, brokers: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["replay", "--database-url", url, "--kafka-brokers", brokers])
        .args(extra)
        .env_remove("FERRY_LOG")
        .output()
        .expect("run ferry replay")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

async fn replay_command_sends_to_a_broker(db: TestDb, mode: DispatchMode) {
    let kafka = EmbeddedKafka::with_topic(1, TOPIC, 3).unwrap();
    kafka.create_topic(TO, 3).unwrap();
    let mut events: Vec<NewEvent> = (1..=6).map(|v| ev("hot", v)).collect();
    events.extend([ev("a", 1), ev("a", 2), ev("b", 1)]);
    db.store.enqueue(&events).await.unwrap();
    let sink = KafkaSink::new(KafkaConfig {
        brokers: kafka.bootstrap_servers().to_string(),
        message_timeout: Duration::from_secs(15),
        ordered: mode == DispatchMode::Cursor,
        ..Default::default()
    })
    .unwrap();
    let config = RelayConfig {
        dispatch: Some(mode),
        workers: 2,
        poll_idle: Duration::from_millis(50),
        ..Default::default()
    };
    let relay = Relay::new(db.store.clone(), Arc::new(sink), config).unwrap();
    let task = RelayTask::spawn(|cancel| relay.run(cancel));
    db.wait_all_sent(Duration::from_secs(60)).await;
    task.stop().await;
    let brokers = kafka.bootstrap_servers();

    let o = replay(
        &db.url,
        brokers,
        &["--topic", TOPIC, "--to-topic", TO, "--dry-run"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains('9'),
        "the count: {}",
        text(&o.stdout)
    );

    let o = replay(
        &db.url,
        brokers,
        &[
            "--topic",
            TOPIC,
            "--to-topic",
            TO,
            "--replay-id",
            "r-7",
            "--page-size",
            "4",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let records = read_records(
        brokers,
        TO,
        3,
        events.len(),
        Duration::from_secs(30),
        Duration::from_millis(500),
    )
    .await
    .unwrap();
    assert_eq!(records.len(), events.len(), "exactly the topic's events");
    let header = |r: &ferry_testkit::verify::Record, k: &str| {
        r.headers
            .iter()
            .find(|(h, _)| h == k)
            .and_then(|(_, v)| v.as_deref())
            .map(text)
    };
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for r in &records {
        assert_eq!(header(r, "ferry-replay").as_deref(), Some("r-7"));
        let agg = header(r, "ferry-aggregate-id").unwrap();
        let v: i64 = header(r, "ferry-aggregate-version")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            header(r, "ferry-event-id"),
            Some(format!("e-{agg}-{v}")),
            "the original event id"
        );
        let prev = last.insert(agg.clone(), v);
        assert!(
            prev.is_none_or(|p| p + 1 == v),
            "{agg}: v{v} after {prev:?}"
        );
    }
    assert_eq!(last.get("hot"), Some(&6));

    // an unknown topic: refused, named, nothing sent
    let o = replay(&db.url, brokers, &["--topic", "ordres", "--to-topic", TO]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("ordres"), "{}", text(&o.stderr));
    // a destination Kafka would refuse: bad usage, before anything is read or sent
    let o = replay(
        &db.url,
        brokers,
        &["--topic", TOPIC, "--to-topic", "bad topic!"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("--to-topic"),
        "{}",
        text(&o.stderr)
    );
    db.cleanup().await;
}

ferry_testkit::backend_tests!(modes: replay_command_sends_to_a_broker);
