//! An intent whose stored `shard_slot` is not its aggregate's slot (a foreign producer that set
//! the slot itself, wrongly) is still delivered, and counted in `ferry_misrouted_events_total`.
use std::sync::Arc;
use std::time::Duration;

use ferry_core::DispatchMode;
use ferry_relay::{NullSink, Relay, RelayConfig};
use ferry_testkit::{RelayTask, TestDb};

mod support;
use support::insert_intent;

async fn misrouted_intent_is_counted(db: TestDb, mode: DispatchMode) {
    let right = ferry_core::slot_for("order-9");
    let wrong = (right + 1) % ferry_core::SLOT_COUNT;
    for (v, slot) in [(1, right), (2, wrong)] {
        insert_intent(&db, &format!("e-order-9-{v}"), "order-9", v, slot, "orders").await;
    }
    let cfg = RelayConfig {
        dispatch: Some(mode),
        poll_idle: Duration::from_millis(50),
        ..Default::default()
    };
    let relay = Relay::new(db.store.clone(), Arc::new(NullSink), cfg).unwrap();
    let metrics = relay.metrics();
    let relay = RelayTask::spawn(|cancel| relay.run(cancel));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while metrics.sent.load(std::sync::atomic::Ordering::Relaxed) < 2 {
        assert!(tokio::time::Instant::now() < deadline, "not delivered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        metrics.misrouted.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert!(metrics.render().contains("ferry_misrouted_events_total 1"));
    relay.stop().await;
    db.cleanup().await;
}

ferry_testkit::backend_tests!(modes: misrouted_intent_is_counted);
