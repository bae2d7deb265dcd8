//! End-to-end relay runs: outbox (every backend) → relay → librdkafka mock cluster → verifier.
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_core::{BoxFuture, ClaimedEvent, DispatchMode, EventState, NewEvent, Outcome};
use ferry_relay::{KafkaConfig, KafkaSink, Relay, RelayConfig, Sink};
use ferry_testkit::embedded::EmbeddedKafka;
use ferry_testkit::verify::Verifier;
use ferry_testkit::{read_records, wait_until, RelayTask, TestDb};
use rdkafka::types::RDKafkaRespErr;

mod support;
use support::relay_config;

const TOPIC: &str = "orders";

fn ev(agg: &str, v: i64) -> NewEvent {
    ferry_testkit::intent(TOPIC, agg, v)
}

/// [`relay_config`] with retries backing off from 50 ms to at most 500 ms.
fn fast_config(mode: DispatchMode) -> RelayConfig {
    RelayConfig {
        backoff: ferry_core::Backoff {
            base: Duration::from_millis(50),
            max: Duration::from_millis(500),
        },
        ..relay_config(mode)
    }
}

/// Commits versions 1 to `versions` of the aggregates `{prefix}-0` to `{prefix}-{aggregates - 1}`,
/// a transaction per version.
async fn enqueue_versions(db: &TestDb, prefix: &str, aggregates: i64, versions: i64) {
    for v in 1..=versions {
        let evs: Vec<NewEvent> = (0..aggregates)
            .map(|a| ev(&format!("{prefix}-{a}"), v))
            .collect();
        db.store.enqueue(&evs).await.unwrap();
    }
}

/// How many versions a case enqueues per aggregate: `cursor` in cursor dispatch, which sends
/// consecutive versions in one batch, `row` in row dispatch (a round trip each).
fn per_mode(mode: DispatchMode, cursor: i64, row: i64) -> i64 {
    match mode {
        DispatchMode::Cursor => cursor,
        DispatchMode::Row => row,
    }
}

struct Running {
    task: RelayTask,
    metrics: Arc<ferry_relay::Metrics>,
    /// Event ids whose delivery report said the broker has them.
    acked: Arc<Mutex<HashSet<String>>>,
}

/// The Kafka sink, noting each event id whose delivery report was a success.
struct Recording {
    inner: KafkaSink,
    acked: Arc<Mutex<HashSet<String>>>,
}

impl Sink for Recording {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn send_batch<'a>(&'a self, items: &'a [ClaimedEvent]) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(async move {
            let out = self.inner.send_batch(items).await;
            let mut acked = self.acked.lock().unwrap();
            for (e, o) in items.iter().zip(&out) {
                if matches!(o, Outcome::Acked) {
                    acked.insert(e.token.event_id.clone());
                }
            }
            out
        })
    }
}

impl Running {
    async fn stop(self) {
        self.task.stop().await
    }
}

fn start_relay(
    db: &TestDb,
    kafka: &EmbeddedKafka,
    cfg: RelayConfig,
    extra: &[(&str, &str)],
) -> Running {
    let mut kc = KafkaConfig {
        brokers: kafka.bootstrap_servers().to_string(),
        ordered: cfg.dispatch == Some(DispatchMode::Cursor),
        ..Default::default()
    };
    kc.message_timeout = Duration::from_secs(15);
    for (k, v) in extra {
        kc.extra.insert(k.to_string(), v.to_string());
    }
    let acked = Arc::new(Mutex::new(HashSet::new()));
    let sink = Arc::new(Recording {
        inner: KafkaSink::new(kc).unwrap(),
        acked: acked.clone(),
    });
    let relay = Relay::new(db.store.clone(), sink, cfg).unwrap();
    Running {
        metrics: relay.metrics(),
        task: RelayTask::spawn(|cancel| relay.run(cancel)),
        acked,
    }
}

fn setup() -> (EmbeddedKafka, Verifier) {
    EmbeddedKafka::verified(3, TOPIC, 4)
}

/// Why `expected` is not what the verifier saw, for a failure message: for each event the
/// verifier has not delivered, its row's state in the store and whether a fresh read of the
/// whole topic finds it (in the log but not seen: the verifier missed it; SENT but not in the
/// log: the relay acked something the broker does not have), plus the relay's counters.
async fn explain(
    db: &TestDb,
    kafka: &EmbeddedKafka,
    verifier: &Verifier,
    relay: &Running,
    expected: impl IntoIterator<Item = String>,
) -> String {
    let seen = verifier.delivered_ids();
    let missing: Vec<String> = expected
        .into_iter()
        .filter(|id| !seen.contains(id))
        .collect();
    let brokers = kafka.bootstrap_servers();
    let (log, in_log) = topic_ids(kafka).await;
    let mut out = format!(
        "verifier {:?}; topic re-read: {} records ({:?}); watermarks {:?}; relay sent {} \
         retried {} quarantined {} fenced {}",
        verifier.report(),
        log.as_ref().map_or(0, Vec::len),
        log.as_ref().err(),
        ferry_testkit::kafka::watermarks(brokers, TOPIC, 4),
        relay.metrics.sent.load(Ordering::Relaxed),
        relay.metrics.retried.load(Ordering::Relaxed),
        relay.metrics.quarantined.load(Ordering::Relaxed),
        relay.metrics.fenced.load(Ordering::Relaxed),
    );
    let acked = relay.acked.lock().unwrap().clone();
    for id in missing.iter().take(20) {
        let row = db.store.record(id).await;
        let row = row.map(|r| r.map(|r| (r.state, r.claim_version, r.attempts, r.last_error)));
        out += &format!(
            "\n  {id}: in the re-read log: {}; acked by a delivery report: {}; row {row:?}",
            in_log.contains(id),
            acked.contains(id)
        );
    }
    out
}

/// A fresh read of the whole topic: the records (or the read's error) and their event ids.
async fn topic_ids(
    kafka: &EmbeddedKafka,
) -> (
    Result<Vec<ferry_testkit::verify::Record>, ferry_testkit::verify::VerifyError>,
    HashSet<String>,
) {
    let brokers = kafka.bootstrap_servers();
    let log = read_records(brokers, TOPIC, 4, 0, Duration::from_secs(5), Duration::ZERO).await;
    let ids = log
        .as_ref()
        .map(|records| {
            records
                .iter()
                .filter_map(|r| {
                    r.header_pairs()
                        .find(|(k, _)| *k == "ferry-event-id")
                        .and_then(|(_, v)| v.map(|v| String::from_utf8_lossy(v).into_owned()))
                })
                .collect()
        })
        .unwrap_or_default();
    (log, ids)
}

/// Fails unless the verifier saw each of `expected` (event ids `e-{aggregate}-{version}`) in
/// order, with one exception the mock broker causes and Apache Kafka cannot ([`FAULT_PRODUCER`]):
/// an event whose delivery report was a success (so the relay rightly marked it `SENT`) and
/// that a fresh read of the whole topic does not find. Such an event is not delivered, and the
/// next version of its aggregate is then "first delivered before" it; a shortfall made only of
/// such events, with only such violations, passes with a note on stderr. Anything else fails:
/// an event missing that the relay had no success report for, a violation between two events
/// that are both in the log.
async fn assert_delivered_in_order(
    db: &TestDb,
    kafka: &EmbeddedKafka,
    verifier: &Verifier,
    relay: &Running,
    expected: Vec<String>,
) {
    let r = verifier.report();
    if (r.delivered, r.ordering_violations) == (expected.len() as u64, 0) {
        return;
    }
    let why = explain(db, kafka, verifier, relay, expected.iter().cloned()).await;
    let seen = verifier.delivered_ids();
    let (_, in_log) = topic_ids(kafka).await;
    let acked = relay.acked.lock().unwrap().clone();
    let missing: Vec<&String> = expected.iter().filter(|id| !seen.contains(*id)).collect();
    let lost_by_mock = |id: &String| acked.contains(id) && !in_log.contains(id);
    // "{aggregate}: v{n+1} first delivered before v{n}" → the event id of v(n)
    let earlier = |example: &str| {
        let (agg, rest) = example.split_once(": ")?;
        let v = rest.rsplit_once("before v")?.1;
        Some(format!("e-{agg}-{v}"))
    };
    let explained = !missing.is_empty()
        && r.delivered + missing.len() as u64 == expected.len() as u64
        && missing.iter().all(|id| lost_by_mock(id))
        && r.ordering_violations <= missing.len() as u64
        && r.examples
            .iter()
            .all(|x| earlier(x).is_some_and(|id| missing.contains(&&id)));
    if !explained {
        panic!("{why}");
    }
    eprintln!(
        "the mock broker lost {} record(s) that librdkafka reported delivered (not a relay fault): {why}",
        missing.len()
    );
}

async fn relays_in_order_with_no_loss(db: TestDb, mode: DispatchMode) {
    let (kafka, verifier) = setup();
    let relay = start_relay(&db, &kafka, fast_config(mode), &[]);
    // producers keep committing while the relay runs
    enqueue_versions(&db, "order", 60, 10).await;
    let r = verifier
        .wait_until(Duration::from_secs(60), |r| r.delivered >= 600)
        .await;
    assert_eq!(r.delivered, 600, "{r:?}");
    assert_eq!(r.ordering_violations, 0, "{r:?}");
    db.wait_all_sent(Duration::from_secs(30)).await;
    // The worker counts a batch after its CAS returned, so the rows can be SENT a moment
    // before the counter is (seen under load: 570 of 600).
    let metrics = relay.metrics.clone();
    wait_until("600 counted as sent", Duration::from_secs(30), move || {
        let n = metrics.sent.load(Ordering::Relaxed);
        Box::pin(async move { n == 600 })
    })
    .await;
    assert_eq!(relay.metrics.fenced.load(Ordering::Relaxed), 0);
    let text = relay.metrics.render();
    assert!(text.contains("ferry_sent_total 600"), "{text}");
    relay.stop().await;
    // clean shutdown gave up every slot
    assert!(db.store.slot_leases().await.unwrap().is_empty());
    db.cleanup().await;
}

/// Librdkafka settings of the relay's producer in the tests that inject produce errors into the
/// mock cluster. One request in flight per connection: when a request fails and a later request
/// of the same partition that was already in flight succeeds, librdkafka takes the earlier
/// messages as written and reports them delivered (`rd_kafka_handle_idempotent_Produce_success`
/// → `rd_kafka_dr_implicit_ack`, whatever the error). Against Apache Kafka that is sound: the
/// broker checks an idempotent producer's sequences and would have refused the later request
/// with `OUT_OF_ORDER_SEQUENCE_NUMBER`. The mock cluster checks them only for a transactional
/// producer and never appends a request it fails on purpose, so there the inference acks
/// messages it does not have: the cause of this file's rare "v(n+1) first delivered before
/// v(n)" failures under load, found by [`explain`] (the missing version `SENT` in the store,
/// absent from a full re-read of the topic; seen with `REQUEST_TIMED_OUT` injected and, after
/// that was taken out, with `NOT_LEADER_FOR_PARTITION` and its kind). With one request in flight
/// the failed messages are the head of the next request, so no later request can succeed
/// before them. The relay's pipelining (several batches in flight per worker) is unchanged.
/// That narrows the window without closing it: the loss was seen again with this setting (row
/// dispatch on SQLite, in one of six runs of this whole file: `e-f-1-36` SENT
/// after one attempt, absent from the topic, no duplicate anywhere). So the fault tests check
/// delivery with [`assert_delivered_in_order`], which tells such a loss from a relay's by the
/// success report the relay had for the event.
const FAULT_PRODUCER: &[(&str, &str)] = &[("max.in.flight.requests.per.connection", "1")];

/// Every Produce request fails a few times with retriable errors first. Not
/// `REQUEST_TIMED_OUT`: the mock never appends a request it fails, and librdkafka reads that
/// error as "possibly persisted". Timeouts are exercised where the mock is faithful: a broker
/// slower than `request.timeout.ms`, which has appended the request when the client gives up on
/// it (`mid_batch_faults_keep_first_delivery_order`). See [`FAULT_PRODUCER`].
async fn transient_produce_errors_are_retried(db: TestDb, mode: DispatchMode) {
    let (kafka, verifier) = setup();
    kafka
        .produce_errors(&[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
        ])
        .unwrap();
    let relay = start_relay(&db, &kafka, fast_config(mode), FAULT_PRODUCER);
    enqueue_versions(&db, "t", 20, 5).await;
    let r = verifier
        .wait_until(Duration::from_secs(60), |r| r.delivered >= 100)
        .await;
    if (r.delivered, r.ordering_violations) != (100, 0) {
        let ids = (1..=5).flat_map(|v| (0..20).map(move |a| format!("e-t-{a}-{v}")));
        assert_delivered_in_order(&db, &kafka, &verifier, &relay, ids.collect()).await;
    }
    assert_eq!(relay.metrics.quarantined.load(Ordering::Relaxed), 0);
    assert_eq!(db.store.status().await.unwrap().quarantined, 0);
    relay.stop().await;
    db.cleanup().await;
}

async fn permanent_error_quarantines_and_blocks_until_requeue(db: TestDb, mode: DispatchMode) {
    let (kafka, verifier) = setup();
    let relay = start_relay(&db, &kafka, fast_config(mode), &[]);
    kafka
        .produce_errors(&[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 1])
        .unwrap();
    db.store.enqueue(&[ev("poison", 1)]).await.unwrap();
    let store = db.store.clone();
    wait_until("quarantine", Duration::from_secs(30), move || {
        let store = store.clone();
        Box::pin(async move {
            store.record("e-poison-1").await.unwrap().unwrap().state == EventState::Quarantined
        })
    })
    .await;
    db.store
        .enqueue(&[ev("poison", 2), ev("poison", 3)])
        .await
        .unwrap();
    // A healthy aggregate still flows, which also proves the relay ran many rounds meanwhile.
    // (librdkafka caches a topic's authorization failure for about a second, so a healthy event
    // sent inside that window is quarantined too; the operator requeues it, as they would.)
    for v in 1..=3 {
        db.store.enqueue(&[ev("healthy", v)]).await.unwrap();
        let id = format!("e-healthy-{v}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !verifier.was_delivered(&id) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{id}: {:?}",
                db.store.record(&id).await.unwrap()
            );
            if db.store.record(&id).await.unwrap().unwrap().state == EventState::Quarantined {
                db.store
                    .requeue(&ferry_core::OperatorAction::new(&id, "test-operator"))
                    .await
                    .unwrap();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // the successors are blocked, visibly
    assert!(!verifier.was_delivered("e-poison-2") && !verifier.was_delivered("e-poison-3"));
    assert_eq!(
        db.store.record("e-poison-2").await.unwrap().unwrap().state,
        EventState::Pending
    );
    let st = db.store.status().await.unwrap();
    assert_eq!((st.quarantined, st.blocked_aggregates), (1, 1));
    let q = db.store.list_quarantined(10).await.unwrap();
    assert_eq!(q[0].blocked_successors, 2);
    assert!(
        q[0].last_error
            .as_deref()
            .unwrap_or("")
            .to_lowercase()
            .contains("authoriz"),
        "{:?}",
        q[0].last_error
    );
    // the operator requeues: same id, delivered, then the successors in order
    db.store
        .requeue(&ferry_core::OperatorAction::new(
            "e-poison-1",
            "test-operator",
        ))
        .await
        .unwrap();
    let r = verifier
        .wait_until(Duration::from_secs(30), |_| {
            verifier.was_delivered("e-poison-3")
        })
        .await;
    assert!(
        verifier.was_delivered("e-poison-1") && verifier.was_delivered("e-poison-3"),
        "{r:?}"
    );
    assert_eq!(r.ordering_violations, 0, "{r:?}");
    // the requeued v1 and the healthy resends are the same versions again: not regressions
    assert_eq!(relay.metrics.order_regressions.load(Ordering::Relaxed), 0);
    relay.stop().await;
    db.cleanup().await;
}

async fn brokers_down_then_back_drains_backlog(db: TestDb, mode: DispatchMode) {
    let (kafka, verifier) = setup();
    let relay = start_relay(&db, &kafka, fast_config(mode), &[]);
    db.store.enqueue(&[ev("warm", 1)]).await.unwrap();
    verifier
        .wait_until(Duration::from_secs(30), |r| r.delivered >= 1)
        .await;
    for b in 1..=kafka.brokers() {
        kafka.broker_down(b).unwrap();
    }
    enqueue_versions(&db, "down", 50, 4).await;
    // the outage itself is the scenario: several seconds with every broker down
    tokio::time::sleep(Duration::from_secs(4)).await;
    for b in 1..=kafka.brokers() {
        kafka.broker_up(b).unwrap();
    }
    let r = verifier
        .wait_until(Duration::from_secs(90), |r| r.delivered >= 201)
        .await;
    assert_eq!((r.delivered, r.ordering_violations), (201, 0), "{r:?}");
    db.wait_all_sent(Duration::from_secs(30)).await;
    assert_eq!(db.store.status().await.unwrap().quarantined, 0);
    relay.stop().await;
    db.cleanup().await;
}

/// A producer transaction that stays open for 10 s while thousands of later intents are
/// delivered (on MySQL/MariaDB in cursor dispatch: held back until it ends) is delivered once it
/// commits; one that rolls back is never announced.
async fn late_commit_is_delivered_and_rollback_never(db: TestDb, mode: DispatchMode) {
    // Switch modes first: a mode switch takes the outbox's table lock, which would wait for the
    // open producer transactions below.
    if let Some(cs) = db.store.cursor() {
        cs.set_dispatch_mode(mode, "test").await.unwrap();
    }
    let Some(late) = db.open_producer_tx(&[ev("late", 1)]).await else {
        eprintln!("not applicable on SQLite: an open write transaction blocks every other writer");
        return;
    };
    let rolled = db.open_producer_tx(&[ev("rolled-back", 1)]).await.unwrap();
    let opened = tokio::time::Instant::now();
    let (kafka, verifier) = setup();
    let relay = start_relay(&db, &kafka, fast_config(mode), &[]);
    // MySQL/MariaDB in cursor dispatch: the commit gate holds back, while "late" and
    // "rolled-back" are open, the slots they wrote (once the ticker has left their gate row to a
    // waiter, docs/architecture.md); elsewhere only their own intents wait.
    let gated = db.backend == ferry_store::Backend::Mysql && mode == DispatchMode::Cursor;
    let held = [
        ferry_core::slot_for("late"),
        ferry_core::slot_for("rolled-back"),
    ];
    let mut n = 0u64;
    let mut behind: Vec<String> = Vec::new();
    let mut round = 0;
    while opened.elapsed() < Duration::from_secs(7) {
        let evs: Vec<NewEvent> = (0..250)
            .map(|i| ev(&format!("bulk-{round}-{i}"), 1))
            .collect();
        behind.extend(
            evs.iter()
                .filter(|e| gated && held.contains(&ferry_core::slot_for(&e.aggregate_id)))
                .map(|e| e.event_id.clone().unwrap_or_default()),
        );
        db.store.enqueue(&evs).await.unwrap();
        n += 250;
        round += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // every producer went on (on MySQL/MariaDB in cursor dispatch too: the commit gate does not
    // make producers wait)
    assert!(n >= 2000, "only {n} later intents");
    let free = n - behind.len() as u64;
    let r = verifier
        .wait_until(Duration::from_secs(60), |r| r.delivered >= free)
        .await;
    assert_eq!(r.delivered, free, "{r:?}");
    if gated {
        assert!(
            !behind.is_empty(),
            "no later intent shares a slot with the open ones"
        );
        // the slots they wrote stay held while they are open
        tokio::time::sleep(Duration::from_millis(500)).await;
        for id in &behind {
            assert!(
                !verifier.was_delivered(id),
                "{id} read past an open transaction of its slot"
            );
        }
    }
    assert!(
        !verifier.was_delivered("e-late-1"),
        "announced before commit"
    );
    tokio::time::sleep_until(opened + Duration::from_secs(10)).await;
    late.commit().await;
    rolled.rollback().await;
    if gated {
        let r = verifier
            .wait_until(Duration::from_secs(60), |r| r.delivered > n)
            .await;
        assert_eq!(r.delivered, n + 1, "{r:?}");
    }
    let r = verifier
        .wait_until(Duration::from_secs(30), |_| {
            verifier.was_delivered("e-late-1")
        })
        .await;
    assert!(
        verifier.was_delivered("e-late-1"),
        "late commit lost: {r:?}"
    );
    // one more intent after the rollback proves the relay read past it
    db.store.enqueue(&[ev("after", 1)]).await.unwrap();
    let r = verifier
        .wait_until(Duration::from_secs(30), |_| {
            verifier.was_delivered("e-after-1")
        })
        .await;
    assert!(verifier.was_delivered("e-after-1"), "{r:?}");
    assert!(!verifier.was_delivered("e-rolled-back-1"));
    assert!(db.store.record("e-rolled-back-1").await.unwrap().is_none());
    assert_eq!((r.delivered, r.ordering_violations), (n + 2, 0), "{r:?}");
    relay.stop().await;
    db.cleanup().await;
}

/// One aggregate, many versions: delivered in order (cursor mode sends consecutive versions in
/// one batch; row mode one per round trip).
async fn hot_aggregate_drains_in_order(db: TestDb, mode: DispatchMode) {
    let (kafka, verifier) = setup();
    let versions = per_mode(mode, 2000, 150);
    for chunk in (1..=versions).collect::<Vec<i64>>().chunks(500) {
        let evs: Vec<NewEvent> = chunk.iter().map(|v| ev("hot", *v)).collect();
        db.store.enqueue(&evs).await.unwrap();
    }
    let relay = start_relay(&db, &kafka, fast_config(mode), &[]);
    let r = verifier
        .wait_until(Duration::from_secs(90), |r| r.delivered >= versions as u64)
        .await;
    assert_eq!(
        (r.delivered, r.ordering_violations),
        (versions as u64, 0),
        "{r:?}"
    );
    relay.stop().await;
    db.cleanup().await;
}

/// Errors and timeouts injected mid-batch while several versions of hot aggregates are in
/// flight: nothing lost, and no later version is ever first-delivered before an earlier one.
async fn mid_batch_faults_keep_first_delivery_order(db: TestDb, mode: DispatchMode) {
    let (kafka, verifier) = setup();
    let per = per_mode(mode, 300, 40);
    let aggs = 6;
    enqueue_versions(&db, "f", aggs, per).await;
    let mut cfg = fast_config(mode);
    cfg.batch_size = 100;
    if mode == DispatchMode::Cursor {
        // the cursor defaults: one worker with four batches in flight, so later batches are
        // read, sent and advanced while earlier ones fail
        let d = ferry_relay::WorkerDefaults::for_mode(mode, ferry_store::Backend::Postgres);
        cfg.workers = d.workers;
        cfg.max_in_flight = d.max_in_flight;
    }
    // requests time out quickly while a broker is slow; messages never do in cursor mode
    let props = [&[("request.timeout.ms", "400")], FAULT_PRODUCER].concat();
    let relay = start_relay(&db, &kafka, cfg, &props);
    use RDKafkaRespErr as E;
    for round in 0..4 {
        // retriable and non-retriable produce errors (not REQUEST_TIMED_OUT: see
        // `transient_produce_errors_are_retried`), then a slow broker
        kafka
            .produce_errors(&[
                E::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                E::RD_KAFKA_RESP_ERR_POLICY_VIOLATION,
                E::RD_KAFKA_RESP_ERR_UNKNOWN,
                E::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            ])
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let b = 1 + round % kafka.brokers();
        kafka.broker_rtt(b, Duration::from_millis(700)).unwrap();
        tokio::time::sleep(Duration::from_millis(900)).await;
        kafka.broker_rtt(b, Duration::ZERO).unwrap();
    }
    kafka.clear_produce_errors().unwrap();
    let total = (per * aggs) as u64;
    let r = verifier
        .wait_until(Duration::from_secs(120), |r| r.delivered >= total)
        .await;
    if (r.delivered, r.ordering_violations) != (total, 0) {
        let ids = (1..=per).flat_map(|v| (0..aggs).map(move |a| format!("e-f-{a}-{v}")));
        assert_delivered_in_order(&db, &kafka, &verifier, &relay, ids.collect()).await;
    }
    assert_eq!(db.store.status().await.unwrap().quarantined, 0);
    // every resend here (retried, unknown and held items, in cursor dispatch from exception
    // rows below versions already sent) is legal: the order net counts none of them
    assert_eq!(relay.metrics.order_regressions.load(Ordering::Relaxed), 0);
    relay.stop().await;
    db.cleanup().await;
}

ferry_testkit::backend_tests!(modes:
    late_commit_is_delivered_and_rollback_never,
    hot_aggregate_drains_in_order,
    mid_batch_faults_keep_first_delivery_order,
    relays_in_order_with_no_loss,
    transient_produce_errors_are_retried,
    permanent_error_quarantines_and_blocks_until_requeue,
    brokers_down_then_back_drains_backlog,
);

/// Message key = aggregate key; headers carry event id, aggregate, version, event type and the
/// stored headers (a W3C traceparent passes through untouched).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_record_carries_key_and_headers() {
    let db = TestDb::sqlite().await;
    let kafka = EmbeddedKafka::with_topic(1, TOPIC, 1).unwrap();
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut e = ev("order-42", 1);
    e.headers.insert("traceparent".into(), tp.into());
    db.store.enqueue(&[e]).await.unwrap();
    let relay = start_relay(&db, &kafka, fast_config(DispatchMode::Cursor), &[]);
    let wait = Duration::from_secs(30);
    let read = read_records(kafka.bootstrap_servers(), TOPIC, 1, 1, wait, Duration::ZERO);
    let msg = read.await.unwrap().into_iter().next().expect("no message");
    assert_eq!(msg.key.as_deref(), Some("order-42".as_bytes()));
    assert_eq!(
        msg.payload.as_deref(),
        Some(r#"{"agg":"order-42","v":1}"#.as_bytes())
    );
    let headers: std::collections::BTreeMap<&str, String> = msg
        .header_pairs()
        .map(|(k, v)| {
            (
                k,
                String::from_utf8_lossy(v.unwrap_or_default()).into_owned(),
            )
        })
        .collect();
    assert_eq!(headers["ferry-event-id"], "e-order-42-1");
    assert_eq!(headers["ferry-aggregate-id"], "order-42");
    assert_eq!(headers["ferry-aggregate-version"], "1");
    assert_eq!(headers["ferry-event-type"], "OrderChanged");
    assert_eq!(headers["traceparent"], tp);
    relay.stop().await;
}

/// An event at every enqueue limit (the default payload limit, identifiers of
/// `MAX_IDENT_LEN` bytes, `MAX_HEADERS_BYTES` of headers) fits a Kafka message with the sink's
/// default settings: it is delivered, not quarantined.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_at_every_enqueue_limit_is_delivered() {
    use ferry_core::{Limits, MAX_HEADERS_BYTES, MAX_IDENT_LEN};
    let db = TestDb::sqlite().await;
    let kafka = EmbeddedKafka::with_topic(1, TOPIC, 1).unwrap();
    let ident = |c: &str| c.repeat(MAX_IDENT_LEN);
    let payload = format!(
        "\"{}\"",
        "p".repeat(Limits::default().max_payload_bytes - 2)
    );
    let mut e = NewEvent::new(ident("a"), 1, TOPIC, ident("t"), payload).with_id(ident("i"));
    e.key = Some(ident("k"));
    // `{"h":"…"}`: the value and 8 bytes
    e.headers
        .insert("h".into(), "h".repeat(MAX_HEADERS_BYTES - 8));
    let v = e
        .validate(&Limits::default())
        .expect("at the limits, not over");
    assert_eq!(v.headers.len(), MAX_HEADERS_BYTES);
    db.store.enqueue(&[e]).await.unwrap();
    let relay = start_relay(&db, &kafka, fast_config(DispatchMode::Cursor), &[]);
    let wait = Duration::from_secs(30);
    let read = read_records(kafka.bootstrap_servers(), TOPIC, 1, 1, wait, Duration::ZERO);
    let msg = read.await.unwrap().into_iter().next();
    let quarantined = relay.metrics.quarantined.load(Ordering::Relaxed);
    relay.stop().await;
    let msg = msg.unwrap_or_else(|| panic!("not delivered ({quarantined} quarantined)"));
    assert_eq!(
        msg.payload.map(|p| p.len()),
        Some(Limits::default().max_payload_bytes)
    );
    assert_eq!(msg.key.as_deref(), Some(ident("k").as_bytes()));
}
