//! Retention run by the relay (`Relay::with_retention`, `ferry relay --retention`), in both
//! dispatch modes on every backend: the SENT rows older than the window are deleted while the
//! relay dispatches, a young SENT row and a quarantined one stay, and of two relays only the
//! owner of slot 0 purges.
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{BoxFuture, ClaimedEvent, DispatchMode, Outcome};
use ferry_relay::{Metrics, Relay, RetentionConfig, Sink};
use ferry_testkit::{wait_until, RelayTask, TestDb};

mod support;
use support::relay_config;

const TOPIC: &str = "orders";
/// The window: long enough that a row just sent is still young when the test looks at it.
const WINDOW: Duration = Duration::from_secs(2);

/// Acks everything but aggregate `poison`, which it refuses for good (quarantined).
struct PoisonSink;

impl Sink for PoisonSink {
    fn name(&self) -> &'static str {
        "poison"
    }
    fn send_batch<'a>(&'a self, items: &'a [ClaimedEvent]) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(async move {
            items
                .iter()
                .map(|e| match e.aggregate_id.as_str() {
                    "poison" => Outcome::Permanent("refused by the test".into()),
                    _ => Outcome::Acked,
                })
                .collect()
        })
    }
}

fn retention() -> RetentionConfig {
    let mut r = RetentionConfig::new(WINDOW);
    r.every = Duration::from_millis(200);
    r.purge.batch = 3;
    r
}

fn start(db: &TestDb, mode: DispatchMode, owner: &str) -> (RelayTask, Arc<Metrics>) {
    let mut config = relay_config(mode);
    config.owner = owner.into();
    let relay = Relay::new(db.store.clone(), Arc::new(PoisonSink), config)
        .unwrap()
        .with_retention(retention())
        .unwrap();
    let metrics = relay.metrics();
    (RelayTask::spawn(|cancel| relay.run(cancel)), metrics)
}

async fn rows(db: &TestDb, aggregate: &str) -> i64 {
    db.count(&format!("ferry_outbox WHERE aggregate_id = '{aggregate}'"))
        .await
}

async fn old_sent_rows_are_deleted_while_dispatching(db: TestDb, mode: DispatchMode) {
    let (relay, metrics) = start(&db, mode, "retention-a");
    // 12 events to send, and one the sink refuses for good
    for v in 1..=4 {
        let evs: Vec<_> = (0..3)
            .map(|a| ferry_testkit::intent(TOPIC, &format!("old-{a}"), v))
            .collect();
        db.store.enqueue(&evs).await.unwrap();
    }
    db.store
        .enqueue(&[ferry_testkit::intent(TOPIC, "poison", 1)])
        .await
        .unwrap();
    // a run's rows are counted once its last statement returned: wait for the count
    wait_until(
        "the 12 sent rows deleted by the relay's retention",
        Duration::from_secs(30),
        || async { metrics.retention_purged.load(Ordering::Relaxed) >= 12 },
    )
    .await;
    assert_eq!(
        db.count("ferry_outbox WHERE aggregate_id LIKE 'old-%'")
            .await,
        0
    );
    assert_eq!(metrics.retention_purged.load(Ordering::Relaxed), 12);
    assert_eq!(metrics.retention_failed_runs.load(Ordering::Relaxed), 0);
    assert!(metrics.quarantined.load(Ordering::Relaxed) >= 1);

    // a row sent now is younger than the window: the runs meanwhile leave it
    let written = Instant::now();
    db.store
        .enqueue(&[ferry_testkit::intent(TOPIC, "young", 1)])
        .await
        .unwrap();
    let runs = metrics.retention_runs.load(Ordering::Relaxed);
    wait_until(
        "the young row sent and two retention runs after it",
        Duration::from_secs(30),
        || async {
            metrics.sent.load(Ordering::Relaxed) >= 13
                && metrics.retention_runs.load(Ordering::Relaxed) >= runs + 2
        },
    )
    .await;
    let young = rows(&db, "young").await;
    if written.elapsed() < WINDOW {
        assert_eq!(young, 1, "a SENT row younger than the window was deleted");
    }
    // ...until it is old enough
    wait_until(
        "the young row deleted once older than the window",
        Duration::from_secs(30),
        || async { metrics.retention_purged.load(Ordering::Relaxed) >= 13 },
    )
    .await;
    assert_eq!(rows(&db, "young").await, 0);
    assert!(
        written.elapsed() >= WINDOW,
        "deleted before the window passed"
    );
    // a quarantined row is never deleted, however old
    assert_eq!(
        rows(&db, "poison").await,
        1,
        "a quarantined row was deleted"
    );
    assert_eq!(metrics.retention_purged.load(Ordering::Relaxed), 13);
    relay.stop().await;
}

/// Two relays split the slots; only the one that owns slot 0 runs retention.
async fn only_the_owner_of_slot_0_purges(db: TestDb) {
    let (a, ma) = start(&db, DispatchMode::Cursor, "retention-a");
    let (b, mb) = start(&db, DispatchMode::Cursor, "retention-b");
    let owned = |m: &Metrics| m.slots_owned.load(Ordering::Relaxed);
    wait_until("both relays own slots", Duration::from_secs(30), || async {
        owned(&ma) > 0 && owned(&mb) > 0 && owned(&ma) + owned(&mb) == 256
    })
    .await;
    let runs = |m: &Metrics| m.retention_runs.load(Ordering::Relaxed);
    let before = (runs(&ma), runs(&mb));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let grew = (runs(&ma) > before.0, runs(&mb) > before.1);
    assert!(
        grew == (true, false) || grew == (false, true),
        "retention runs of the two relays grew {grew:?} in 1.5 s (from {before:?} to {:?})",
        (runs(&ma), runs(&mb))
    );
    a.stop().await;
    b.stop().await;
}

/// A purge run that cannot finish (another transaction holds the rows it deletes) does not
/// hold the relay's shutdown: it is dropped after the shutdown timeout and counted as failed.
/// PostgreSQL and MariaDB (SQLite has no row locks to hold).
async fn a_blocked_purge_is_dropped_at_shutdown(db: TestDb) {
    let mut config = relay_config(DispatchMode::Cursor);
    config.shutdown_timeout = Duration::from_secs(1);
    let relay = Relay::new(db.store.clone(), Arc::new(PoisonSink), config)
        .unwrap()
        .with_retention(retention())
        .unwrap();
    let metrics = relay.metrics();
    let task = RelayTask::spawn(|cancel| relay.run(cancel));
    let evs: Vec<_> = (1..=3)
        .map(|v| ferry_testkit::intent(TOPIC, "locked", v))
        .collect();
    db.store.enqueue(&evs).await.unwrap();
    wait_until("3 events sent", Duration::from_secs(30), || async {
        metrics.sent.load(Ordering::Relaxed) >= 3
    })
    .await;
    let Some(lock) = db.hold_row_locks("aggregate_id = 'locked'").await else {
        task.stop().await;
        return;
    };
    // the rows are old enough after the window; a run then waits on their locks
    tokio::time::sleep(WINDOW + Duration::from_secs(1)).await;
    let t = Instant::now();
    task.cancel();
    let joined = task.join(Duration::from_secs(20)).await;
    let took = t.elapsed();
    lock.rollback().await;
    assert!(
        matches!(joined, Some(Ok(Ok(())))),
        "the relay did not stop cleanly within 20 s: {joined:?}"
    );
    // the purge gets the shutdown timeout (1 s) from the stop, as the sends do
    assert!(took < Duration::from_secs(5), "stopping took {took:?}");
    assert_eq!(metrics.retention_failed_runs.load(Ordering::Relaxed), 1);
    assert_eq!(rows(&db, "locked").await, 3);
}

ferry_testkit::backend_tests!(modes: old_sent_rows_are_deleted_while_dispatching);
ferry_testkit::backend_tests!(
    only_the_owner_of_slot_0_purges,
    a_blocked_purge_is_dropped_at_shutdown
);
