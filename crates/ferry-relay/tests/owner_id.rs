//! Owner ids are unique per process: a relay started beside a live one with the same id is
//! refused, also when both start at the same instant; one started with the id of a crashed run
//! (leases held, no longer renewed) runs; a relay whose owner id another process took over
//! stops without touching that process's slots.
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{DispatchMode, MemberHeartbeat, SlotRequest, StoreError, StoreErrorKind};
use ferry_relay::metrics::Metrics;
use ferry_relay::{NullSink, Relay, RelayConfig};
use ferry_testkit::{wait_until, RelayTask, TestDb};
use tokio_util::sync::CancellationToken;

fn relay(db: &TestDb, owner: &str) -> Relay {
    let config = RelayConfig {
        owner: owner.into(),
        dispatch: Some(DispatchMode::Cursor),
        heartbeat: Duration::from_millis(200),
        slot_ttl: Duration::from_secs(2),
        poll_idle: Duration::from_millis(50),
        ..Default::default()
    };
    Relay::new(db.store.clone(), Arc::new(NullSink), config).unwrap()
}

/// Waits until the relay counting into `metrics` owns every slot.
async fn wait_owning_every_slot(metrics: &Metrics) {
    wait_until(
        "the relay to own every slot",
        Duration::from_secs(20),
        || {
            let owned = metrics.slots_owned.load(Relaxed);
            async move { owned == i64::from(ferry_core::SLOT_COUNT) }
        },
    )
    .await;
}

/// The error a relay task that stopped on its own ended with.
async fn run_error(task: RelayTask) -> StoreError {
    task.join(Duration::from_secs(1))
        .await
        .expect("stopped")
        .expect("relay task")
        .expect_err("the relay stopped with an error")
}

/// Starts `r` and waits until it owns every slot.
async fn owning_every_slot(r: Relay) -> RelayTask {
    let metrics = r.metrics();
    let task = RelayTask::spawn(|cancel| r.run(cancel));
    wait_owning_every_slot(&metrics).await;
    task
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_the_same_owner_id_is_refused() {
    let db = TestDb::sqlite().await;
    let first = owning_every_slot(relay(&db, "relay-x")).await;
    let second = relay(&db, "relay-x").run(CancellationToken::new());
    let e = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("refused within the membership ttl and a heartbeat, not left running")
        .expect_err("a second relay-x is refused");
    assert_eq!(e.kind(), StoreErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("\"relay-x\""), "{e}");
    first.stop().await;

    // a crashed run's leases: held under the id, never renewed
    let slots: Vec<_> = (0..8).collect();
    let held = db
        .store
        .acquire_slots(&SlotRequest::new(
            "relay-y",
            &slots,
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert_eq!(held.len(), 8);
    owning_every_slot(relay(&db, "relay-y")).await.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_relays_started_together_with_one_owner_id_one_runs() {
    let db = TestDb::sqlite().await;
    for round in 0..3 {
        let owner = format!("relay-t{round}");
        let (a, b) = (relay(&db, &owner), relay(&db, &owner));
        let (ma, mb) = (a.metrics(), b.metrics());
        let (ta, tb) = (
            RelayTask::spawn(|c| a.run(c)),
            RelayTask::spawn(|c| b.run(c)),
        );
        let refused = |t: &RelayTask| t.stopped_unasked();
        wait_until(
            "one of the two relays to be refused",
            Duration::from_secs(10),
            || {
                let done = refused(&ta) || refused(&tb);
                async move { done }
            },
        )
        .await;
        // the refusal comes once the membership would have expired (2.2 s): give the other a
        // moment to be refused too if the check were broken
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            refused(&ta) != refused(&tb),
            "round {round}: exactly one is refused"
        );
        let (loser, winner, metrics) = if refused(&ta) {
            (ta, tb, mb)
        } else {
            (tb, ta, ma)
        };
        let e = run_error(loser).await;
        assert_eq!(e.kind(), StoreErrorKind::InvalidInput, "{e}");
        wait_owning_every_slot(&metrics).await;
        winner.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_owner_id_was_taken_over_stops_and_leaves_the_slots() {
    let db = TestDb::sqlite().await;
    let task = owning_every_slot(relay(&db, "relay-d")).await;
    // another process takes the owner id's membership (as after this one's lapsed)
    db.store.leave_member("relay-d").await.unwrap();
    db.store
        .heartbeat_member(
            &MemberHeartbeat::new("relay-d", Duration::from_secs(60)).instance("other"),
        )
        .await
        .unwrap();
    wait_until("the relay to stop", Duration::from_secs(10), || {
        let stopped = task.stopped_unasked();
        async move { stopped }
    })
    .await;
    let e = run_error(task).await;
    assert_eq!(e.kind(), StoreErrorKind::OwnerInUse, "{e}");
    // the slot leases under relay-d are the other process's now: not released
    let leases = db.store.slot_leases().await.unwrap();
    assert_eq!(leases.len(), ferry_core::SLOT_COUNT as usize);
    assert!(leases.iter().all(|l| l.owner == "relay-d"));
    let members = db
        .store
        .heartbeat_member(
            &MemberHeartbeat::new("relay-d", Duration::from_secs(60)).instance("other"),
        )
        .await
        .unwrap();
    assert_eq!(members, vec!["relay-d".to_string()]);
}
