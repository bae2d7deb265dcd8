//! The consumer runner against the mock Kafka cluster and a real database (SQLite, PostgreSQL,
//! MariaDB): every event of a topic applied exactly once, in version order per aggregate, with
//! a redelivery skipped and foreign messages left alone.
use std::sync::Arc;
use std::time::Duration;

use ferry_core::BoxFuture;
use ferry_inbox::{
    BoxError, Conn, ConsumerRunner, Delivery, Inbox, InboxConfig, RunnerConfig,
    HEADER_AGGREGATE_ID, HEADER_AGGREGATE_VERSION, HEADER_EVENT_ID,
};
use ferry_testkit::{EmbeddedKafka, TestDb};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;

const AGGREGATES: i64 = 3;
const VERSIONS: i64 = 20;

/// `runner_effects (consumer, event_id)` is the effect's key: a second application fails.
const EFFECTS: &str = "CREATE TABLE runner_effects (consumer VARCHAR(255) NOT NULL, \
    event_id VARCHAR(255) NOT NULL, PRIMARY KEY (consumer, event_id))";

fn effect<'c>(c: Conn<'c>, d: &'c Delivery) -> BoxFuture<'c, Result<(), BoxError>> {
    Box::pin(async move {
        let sql = match c {
            Conn::Postgres(_) => "INSERT INTO runner_effects VALUES ($1, $2)",
            _ => "INSERT INTO runner_effects VALUES (?, ?)",
        };
        ferry_testkit::on_inbox!(Conn, c, c => sqlx::query(sql)
            .bind(&d.consumer)
            .bind(&d.event_id)
            .execute(c)
            .await
            .map(drop))?;
        Ok(())
    })
}

/// Sends one message (with ferry's headers when `event` is given) to `partition`.
fn send(producer: &BaseProducer, partition: i32, event: Option<(&str, &str, i64)>) {
    let mut headers = OwnedHeaders::new();
    if let Some((id, agg, v)) = event {
        let v = v.to_string();
        for (key, value) in [
            (HEADER_EVENT_ID, id),
            (HEADER_AGGREGATE_ID, agg),
            (HEADER_AGGREGATE_VERSION, v.as_str()),
        ] {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
    }
    let record = BaseRecord::<(), str>::to("orders")
        .partition(partition)
        .payload("{}")
        .headers(headers);
    producer.send(record).map_err(|(e, _)| e).unwrap();
}

/// The effect table and the Inbox on `db`, a mock cluster with topic `orders` of `partitions`
/// partitions, and a producer to it.
async fn setup(db: &TestDb, partitions: i32) -> (Inbox, EmbeddedKafka, BaseProducer) {
    db.exec(EFFECTS).await.unwrap();
    let inbox = Inbox::connect(&db.url, InboxConfig::default())
        .await
        .unwrap();
    let cluster = EmbeddedKafka::with_topic(1, "orders", partitions).unwrap();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .create()
        .unwrap();
    (inbox, cluster, producer)
}

async fn applies_a_topic_exactly_once(db: TestDb) {
    let (inbox, cluster, producer) = setup(&db, 2).await;
    let brokers = cluster.bootstrap_servers().to_string();
    // each aggregate in its own partition order; the first event comes again (a redelivery);
    // one message without headers and one of another producer are foreign
    for v in 1..=VERSIONS {
        for a in 0..AGGREGATES {
            let id = format!("e-{a}-{v}");
            send(&producer, (a % 2) as i32, Some((&id, &format!("a{a}"), v)));
        }
    }
    send(&producer, 0, Some(("e-0-1", "a0", 1)));
    send(&producer, 1, None);
    send(&producer, 1, Some(("other-1", "b", 1)));
    producer.flush(Duration::from_secs(10)).unwrap();
    let high: Vec<i64> = ferry_testkit::kafka::watermarks(&brokers, "orders", 2)
        .unwrap()
        .into_iter()
        .map(|(_, h)| h)
        .collect();

    let mut config = RunnerConfig::new(&brokers, "orders", 2, "billing");
    config.workers = 3;
    let runner = ConsumerRunner::start(
        inbox.clone(),
        config,
        Arc::new(effect),
        Some(Box::new(|d: &Delivery| d.event_id.starts_with("e-"))),
    )
    .unwrap();
    // the runner reads the same watermarks, and settles on them: every message below them
    // went through apply_once
    assert_eq!(runner.high_watermarks().await.unwrap(), high);
    let settled = runner.settle(Duration::from_secs(60), |_, _| {}).await;
    assert!(settled.unwrap() && runner.caught_up(&high));
    let stats = runner.stop().await;

    let events = (AGGREGATES * VERSIONS) as u64;
    assert_eq!(stats.consumed, events + 3, "{stats:?}");
    assert_eq!((stats.new, stats.duplicates, stats.foreign), (events, 1, 2));
    assert_eq!(
        (
            stats.gaps,
            stats.early,
            stats.stale,
            stats.effect_failures,
            stats.errors
        ),
        (0, 0, 0, 0, 0),
        "{stats:?}"
    );
    assert_eq!(db.count("runner_effects").await, events as i64);
    assert!(inbox.gaps("billing").await.unwrap().is_empty());
}

ferry_testkit::backend_tests!(applies_a_topic_exactly_once);

/// A delivery whose transaction fails with a retryable error (here the pool timing out, as when
/// the Inbox database is down) is retried until it passes: 60 failures, more than the 50
/// attempts the runner once gave up after, and the event is still applied, once, with its
/// aggregate's later versions after it.
#[tokio::test]
async fn a_retryable_failure_is_retried_until_it_passes() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let db = TestDb::sqlite().await;
    let (inbox, cluster, producer) = setup(&db, 1).await;
    let brokers = cluster.bootstrap_servers().to_string();
    for v in 1..=3 {
        send(&producer, 0, Some((&format!("e-0-{v}"), "a0", v)));
    }
    producer.flush(Duration::from_secs(10)).unwrap();

    let failures = Arc::new(AtomicU32::new(0));
    let flaky = {
        let failures = failures.clone();
        ferry_inbox::runner::effect(move |c, d| {
            let failures = failures.clone();
            Box::pin(async move {
                if d.event_id == "e-0-1" && failures.fetch_add(1, Ordering::Relaxed) < 60 {
                    return Err(Box::new(sqlx::Error::PoolTimedOut) as BoxError);
                }
                effect(c, d).await
            })
        })
    };
    let mut config = RunnerConfig::new(&brokers, "orders", 1, "billing");
    config.retry = ferry_core::Backoff {
        base: Duration::from_millis(1),
        max: Duration::from_millis(2),
    };
    let runner = ConsumerRunner::start(inbox.clone(), config, flaky, None).unwrap();
    let settled = runner.settle(Duration::from_secs(60), |_, _| {}).await;
    assert!(settled.unwrap());
    let stats = runner.stop().await;
    assert_eq!(
        (stats.new, stats.retries, stats.errors, stats.gaps),
        (3, 60, 0, 0),
        "{stats:?}"
    );
    assert_eq!(db.count("runner_effects").await, 3);
    db.cleanup().await;
}
