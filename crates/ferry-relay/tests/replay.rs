//! `ferry replay` end to end, on every backend, with the rows delivered by a relay in each
//! dispatch mode: a time range replayed to a new topic is read back from the mock cluster —
//! exactly the range's events, each aggregate in version order, each marked with the replay id;
//! a dry run counts what is sent; after a purge, the same range is refused.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::replay::{ReplayFilter, ReplayPageRequest, ReplayRefusal, HEADER_REPLAY};
use ferry_core::{ClaimedEvent, DispatchMode, NewEvent, OutboxStore};
use ferry_relay::replay::{run_replay, scan_replay, ReplayError, ReplayPlan};
use ferry_relay::{KafkaConfig, KafkaSink, Relay};
use ferry_testkit::embedded::EmbeddedKafka;
use ferry_testkit::{read_records, RelayTask, TestDb};

mod support;
use support::relay_config;

const TOPIC: &str = "orders";
const TO: &str = "orders-replay";

/// Not UTF-8, with a NUL: only a byte-exact path carries it.
const BYTES: &[u8] = &[0x08, 0x96, 0x01, 0x00, 0xff, 0xfe, 0x12, 0x03];

fn ev(agg: &str, v: i64) -> NewEvent {
    ferry_testkit::intent(TOPIC, agg, v)
}

fn sink(kafka: &EmbeddedKafka, ordered: bool) -> Arc<KafkaSink> {
    Arc::new(
        KafkaSink::new(KafkaConfig {
            brokers: kafka.bootstrap_servers().to_string(),
            message_timeout: Duration::from_secs(15),
            ordered,
            ..Default::default()
        })
        .unwrap(),
    )
}

async fn everything(store: &dyn OutboxStore) -> Vec<ClaimedEvent> {
    let f = ReplayFilter {
        topics: vec![TOPIC.into()],
        ..Default::default()
    };
    store
        .replay_page(&ReplayPageRequest {
            filter: &f,
            after: None,
            limit: 10_000,
        })
        .await
        .unwrap()
}

async fn replay_of_a_range_to_a_new_topic(db: TestDb, mode: DispatchMode) {
    let kafka = EmbeddedKafka::with_topic(1, TOPIC, 3).unwrap();
    kafka.create_topic(TO, 3).unwrap();
    // three producer transactions: before, in and after the range
    db.store.enqueue(&[ev("a", 1), ev("b", 1)]).await.unwrap();
    // c v1 carries bytes (a Protobuf-like payload): the replay sends them unchanged
    let mut c1 = ev("c", 1);
    c1.payload = ferry_core::Payload::Bytes(BYTES.to_vec());
    let mut middle = vec![ev("a", 2), ev("a", 3), ev("b", 2), c1];
    middle.extend((1..=40).map(|v| ev("hot", v)));
    db.store.enqueue(&middle).await.unwrap();
    db.store.enqueue(&[ev("a", 4), ev("c", 2)]).await.unwrap();
    let relay = Relay::new(
        db.store.clone(),
        sink(&kafka, mode == DispatchMode::Cursor),
        relay_config(mode),
    )
    .unwrap();
    let task = RelayTask::spawn(|cancel| relay.run(cancel));
    db.wait_all_sent(Duration::from_secs(60)).await;
    task.stop().await;

    let all = everything(&*db.store).await;
    assert_eq!(all.len(), 2 + middle.len() + 2);
    let middle_ids: BTreeSet<String> = middle
        .iter()
        .map(|e| format!("e-{}-{}", e.aggregate_id, e.aggregate_version))
        .collect();
    let in_middle: Vec<&ClaimedEvent> = all
        .iter()
        .filter(|e| middle_ids.contains(&e.token.event_id))
        .collect();
    let filter = ReplayFilter {
        topics: vec![TOPIC.into()],
        aggregates: vec![],
        from: in_middle.iter().map(|e| e.created_at).min(),
        to: in_middle.iter().map(|e| e.created_at).max(),
    };

    // dry run: the count, nothing sent
    let (scan, total) = scan_replay(&*db.store, &filter).await.unwrap();
    assert_eq!(total, middle.len() as u64);
    assert_eq!(scan[0].matched, total);

    let plan = ReplayPlan {
        filter: filter.clone(),
        to_topic: Some(TO.into()),
        replay_id: "replay-1".into(),
        page_size: 7,
        ack_timeout: ferry_relay::replay::DEFAULT_REPLAY_ACK_TIMEOUT,
    };
    let replay_sink = sink(&kafka, true);
    let mut progress = Vec::new();
    let summary = run_replay(&*db.store, &*replay_sink, &plan, |p| progress.push(p.sent))
        .await
        .unwrap();
    assert_eq!(summary.sent, total, "dry-run count = sent count");
    assert_eq!(
        summary.sent_per_topic,
        BTreeMap::from([(TO.to_string(), total)])
    );
    assert_eq!(progress.last(), Some(&total));

    let records = read_records(
        kafka.bootstrap_servers(),
        TO,
        3,
        total as usize,
        Duration::from_secs(30),
        Duration::from_millis(500),
    )
    .await
    .unwrap();
    let header = |r: &ferry_testkit::verify::Record, k: &str| {
        r.headers
            .iter()
            .find(|(h, _)| h == k)
            .and_then(|(_, v)| v.clone())
            .map(|v| String::from_utf8(v).unwrap())
    };
    let got: Vec<String> = records
        .iter()
        .map(|r| header(r, "ferry-event-id").unwrap())
        .collect();
    assert_eq!(got.len(), middle.len(), "no more, no less: {got:?}");
    assert_eq!(got.iter().cloned().collect::<BTreeSet<_>>(), middle_ids);
    // each aggregate in version order (one partition per key; records in consumption order)
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for r in &records {
        assert_eq!(header(r, HEADER_REPLAY).as_deref(), Some("replay-1"));
        let agg = header(r, "ferry-aggregate-id").unwrap();
        let v: i64 = header(r, "ferry-aggregate-version")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(r.key.as_deref(), Some(agg.as_bytes()), "same message key");
        if (agg.as_str(), v) == ("c", 1) {
            assert_eq!(
                r.payload.as_deref(),
                Some(BYTES),
                "bytes replayed unchanged"
            );
        }
        let prev = last.insert(agg.clone(), v);
        assert!(
            prev.is_none_or(|p| p + 1 == v),
            "{agg}: v{v} after {prev:?}"
        );
    }

    // retention cuts the range: refused, naming the gap
    let purged = db
        .store
        .purge_sent(&ferry_testkit::purge_all(10))
        .await
        .unwrap();
    assert_eq!(purged, all.len() as u64);
    let refused = scan_replay(&*db.store, &filter).await;
    assert!(
        matches!(
            refused,
            Err(ReplayError::Refused(ReplayRefusal::RetentionCut { .. }))
        ),
        "{refused:?}"
    );
    db.cleanup().await;
}

ferry_testkit::backend_tests!(modes: replay_of_a_range_to_a_new_topic);

/// A broker that does not answer: the ordered producer has no local timeout, so the replay
/// reports the wait (how long, the client's last error) and stops after its ack timeout with
/// how far it got; once the brokers are back, the same replay id runs it through.
#[tokio::test]
async fn a_replay_to_a_broker_that_does_not_answer_stops_and_runs_again() {
    let db = TestDb::sqlite().await;
    let kafka = EmbeddedKafka::with_topic(1, TOPIC, 3).unwrap();
    let events: Vec<NewEvent> = (1..=5).map(|v| ev("a", v)).collect();
    db.store.enqueue(&events).await.unwrap();
    let relay = Relay::new(
        db.store.clone(),
        Arc::new(ferry_relay::NullSink),
        relay_config(DispatchMode::Cursor),
    )
    .unwrap();
    let task = RelayTask::spawn(|cancel| relay.run(cancel));
    db.wait_all_sent(Duration::from_secs(60)).await;
    task.stop().await;

    let plan = ReplayPlan {
        filter: ReplayFilter {
            topics: vec![TOPIC.into()],
            ..Default::default()
        },
        to_topic: None,
        replay_id: "replay-down".into(),
        page_size: 100,
        // one wait report (every 10 s), then the stop
        ack_timeout: Duration::from_secs(11),
    };
    kafka.broker_down(1).unwrap();
    let started = std::time::Instant::now();
    let mut waits = Vec::new();
    let stopped = {
        let down = sink(&kafka, true);
        run_replay(&*db.store, &*down, &plan, |p| {
            waits.extend(p.waiting.map(|w| (p.sent, w.events, w.waited)))
        })
        .await
    };
    let took = started.elapsed();
    match &stopped {
        Err(ReplayError::NoAck {
            replay_id,
            sent: 0,
            total: 5,
            events: 5,
            waited_secs: 11,
            ..
        }) if replay_id == "replay-down" => {}
        other => panic!("{other:?}"),
    }
    let text = stopped.unwrap_err().to_string();
    assert!(text.contains("--replay-id replay-down"), "{text}");
    assert!(took < Duration::from_secs(20), "stopped after {took:?}");
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert_eq!((waits[0].0, waits[0].1), (0, 5));
    assert!(waits[0].2 >= Duration::from_secs(10), "{waits:?}");

    kafka.broker_up(1).unwrap();
    let up = sink(&kafka, true);
    let done = run_replay(&*db.store, &*up, &plan, |_| {}).await.unwrap();
    assert_eq!(done.sent, 5);
    let records = read_records(
        kafka.bootstrap_servers(),
        TOPIC,
        3,
        5,
        Duration::from_secs(30),
        Duration::from_millis(500),
    )
    .await
    .unwrap();
    assert!(records.len() >= 5, "{}", records.len());
    db.cleanup().await;
}
