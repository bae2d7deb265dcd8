//! Owner ids are unique per process: a relay started beside a live one with the same id is
//! refused; one started with the id of a crashed run (leases held, no longer renewed) runs.
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{DispatchMode, SlotRequest, StoreErrorKind};
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

/// Starts `r` and waits until it owns every slot.
async fn owning_every_slot(r: Relay) -> RelayTask {
    let metrics = r.metrics();
    let task = RelayTask::spawn(|cancel| r.run(cancel));
    wait_until(
        "the relay to own every slot",
        Duration::from_secs(20),
        || {
            let owned = metrics.slots_owned.load(Relaxed);
            async move { owned == i64::from(ferry_core::SLOT_COUNT) }
        },
    )
    .await;
    task
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_the_same_owner_id_is_refused() {
    let db = TestDb::sqlite().await;
    let first = owning_every_slot(relay(&db, "relay-x")).await;
    let second = relay(&db, "relay-x").run(CancellationToken::new());
    let e = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("refused within 1.5 heartbeats, not left running")
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
