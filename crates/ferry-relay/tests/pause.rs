//! `ferry pause` / `ferry resume` as relays obey them, in both dispatch modes on every backend:
//! a fleet of two relays paused for one topic keeps the other topics flowing (a relay restarted
//! meanwhile keeps the pause), and, resumed, delivers the paused backlog with nothing lost, each
//! aggregate in version order; an aggregate with a paused version holds its later versions on
//! another topic, while other aggregates of the same slot flow past it. And the store's pause
//! records refuse bad requests, changing nothing.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{DispatchMode, PauseControl, PauseRequest, StoreErrorKind, ALL_TOPICS};
use ferry_relay::{Relay, RelayConfig};
use ferry_testkit::{wait_until, RelayTask, TestDb};

mod support;
use support::{insert_intent, RecordingSink};

const PAUSED: &str = "paused";
const LIVE: &str = "live";

fn start(db: &TestDb, sink: &Arc<RecordingSink>, mode: DispatchMode, owner: &str) -> RelayTask {
    let cfg = RelayConfig {
        owner: owner.into(),
        dispatch: Some(mode),
        poll_idle: Duration::from_millis(50),
        heartbeat: Duration::from_millis(200),
        slot_ttl: Duration::from_secs(2),
        read_linger: Duration::ZERO,
        batch_size: 7,
        ..Default::default()
    };
    let relay = Relay::new(db.store.clone(), sink.clone(), cfg).unwrap();
    RelayTask::spawn(|cancel| relay.run(cancel))
}

fn control(db: &TestDb) -> &dyn PauseControl {
    db.store.pause_control().expect("pauses on this store")
}

async fn pause(db: &TestDb, topics: &[&str]) -> Result<Vec<String>, ferry_core::StoreError> {
    let topics: Vec<String> = topics.iter().map(|t| t.to_string()).collect();
    control(db)
        .pause(&PauseRequest {
            topics: &topics,
            reason: "broker maintenance",
            operator: "alice",
            force: false,
        })
        .await
}

async fn resume(db: &TestDb, topics: &[&str]) -> Result<usize, ferry_core::StoreError> {
    let topics: Vec<String> = topics.iter().map(|t| t.to_string()).collect();
    control(db).resume(&topics).await.map(|r| r.len())
}

async fn wait_for(sink: &RecordingSink, what: &str, agg: &str, v: i64) {
    wait_until(what, Duration::from_secs(60), || {
        let got = sink.has(agg, v);
        async move { got }
    })
    .await;
}

/// Each aggregate's versions first handed in order 1, 2, …, n (a resend repeats a version already
/// handed, never one above the next), every version of `expected` handed.
fn assert_complete_and_ordered(sink: &RecordingSink, expected: &BTreeMap<String, i64>) {
    let mut next: BTreeMap<String, i64> = BTreeMap::new();
    for (_, agg, v) in sink.handed() {
        let n = next.entry(agg.clone()).or_insert(1);
        assert!(v <= *n, "{agg}: v{v} handed before v{n}");
        if v == *n {
            *n += 1;
        }
    }
    for (agg, n) in expected {
        assert_eq!(
            next.get(agg).copied(),
            Some(n + 1),
            "{agg}: not all {n} versions"
        );
    }
}

/// Two relays; topic `paused` paused before they start. Live aggregates flow, paused ones
/// and the later versions of a cross-topic aggregate wait; a relay restarted meanwhile keeps the
/// pause; after resume everything arrives, each aggregate in order.
async fn two_relays_hold_a_paused_topic_and_deliver_it_in_order_on_resume(
    db: TestDb,
    mode: DispatchMode,
) {
    let mut expected = BTreeMap::new();
    let mut events = Vec::new();
    for i in 0..6 {
        for v in 1..=3 {
            events.push(ferry_testkit::intent(PAUSED, &format!("p-{i}"), v));
            events.push(ferry_testkit::intent(LIVE, &format!("l-{i}"), v));
        }
        expected.insert(format!("p-{i}"), 3);
        expected.insert(format!("l-{i}"), 3);
        // a cross-topic aggregate: v1 live, v2 paused, v3 live
        let x = format!("x-{i}");
        events.push(ferry_testkit::intent(LIVE, &x, 1));
        events.push(ferry_testkit::intent(PAUSED, &x, 2));
        events.push(ferry_testkit::intent(LIVE, &x, 3));
        expected.insert(x, 3);
    }
    db.store.enqueue(&events).await.unwrap();
    assert_eq!(pause(&db, &[PAUSED]).await.unwrap(), [PAUSED]);
    let sink = Arc::new(RecordingSink::default());
    let a = start(&db, &sink, mode, "relay-a");
    let b = start(&db, &sink, mode, "relay-b");
    db.store
        .enqueue(&[ferry_testkit::intent(LIVE, "marker-1", 1)])
        .await
        .unwrap();
    for i in 0..6 {
        wait_for(&sink, "live aggregates", &format!("l-{i}"), 3).await;
        wait_for(&sink, "cross aggregates' v1", &format!("x-{i}"), 1).await;
    }
    wait_for(&sink, "the marker", "marker-1", 1).await;
    // a relay restarted while paused reads the pause from the database
    a.stop().await;
    let a = start(&db, &sink, mode, "relay-a2");
    db.store
        .enqueue(&[
            ferry_testkit::intent(PAUSED, "p-late", 1),
            ferry_testkit::intent(LIVE, "marker-2", 1),
        ])
        .await
        .unwrap();
    expected.insert("p-late".into(), 1);
    wait_for(&sink, "the marker after the restart", "marker-2", 1).await;
    let handed = sink.handed();
    assert!(
        handed.iter().all(|(t, _, _)| t != PAUSED),
        "a paused topic's event was sent: {handed:?}"
    );
    // v1 may be handed more than once (a slot that moved between the relays is read again from
    // its durable cursor: a legal resend); v3 never, while v2 is paused
    for i in 0..6 {
        let handed = sink.versions_of(&format!("x-{i}"));
        assert!(
            !handed.is_empty() && handed.iter().all(|v| *v == 1),
            "x-{i} v3 overtook its paused v2: {handed:?}"
        );
    }
    let paused = control(&db).paused().await.unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(
        (
            paused[0].topic.as_str(),
            paused[0].reason.as_str(),
            paused[0].operator.as_str()
        ),
        (PAUSED, "broker maintenance", "alice")
    );

    assert_eq!(resume(&db, &[PAUSED]).await.unwrap(), 1);
    wait_until("the paused backlog", Duration::from_secs(60), || {
        let got: BTreeSet<(String, i64)> =
            sink.handed().into_iter().map(|(_, a, v)| (a, v)).collect();
        let done = expected
            .iter()
            .all(|(agg, n)| (1..=*n).all(|v| got.contains(&(agg.clone(), v))));
        async move { done }
    })
    .await;
    a.stop().await;
    b.stop().await;
    assert_complete_and_ordered(&sink, &expected);
    db.cleanup().await;
}

/// One slot: aggregate `held` v1 (live), v2 (paused), v3 and v4 (live), then another aggregate
/// of the same slot on the live topic. The other aggregate is delivered (the slot does not stop
/// at the paused event), `held` stays at v1 until the resume, then v2, v3, v4 in order.
async fn a_paused_version_holds_later_versions_on_other_topics(db: TestDb, mode: DispatchMode) {
    let slot = ferry_core::slot_for("held");
    let other = (0..100_000)
        .map(|i| format!("other-{i}"))
        .find(|a| ferry_core::slot_for(a) == slot)
        .expect("an aggregate of the same slot");
    for (id, agg, v, topic) in [
        ("h1", "held", 1, LIVE),
        ("h2", "held", 2, PAUSED),
        ("h3", "held", 3, LIVE),
        ("h4", "held", 4, LIVE),
        ("o1", other.as_str(), 1, LIVE),
        ("o2", other.as_str(), 2, LIVE),
    ] {
        insert_intent(&db, id, agg, v, slot, topic).await;
    }
    pause(&db, &[PAUSED]).await.unwrap();
    let sink = Arc::new(RecordingSink::default());
    let relay = start(&db, &sink, mode, "relay-a");
    wait_for(&sink, "the other aggregate of the slot", &other, 2).await;
    wait_for(&sink, "held v1", "held", 1).await;
    assert_eq!(sink.versions_of("held"), [1]);
    resume(&db, &[PAUSED]).await.unwrap();
    wait_for(&sink, "held v4 after the resume", "held", 4).await;
    relay.stop().await;
    let expected = BTreeMap::from([("held".to_string(), 4), (other, 2)]);
    assert_complete_and_ordered(&sink, &expected);
    db.cleanup().await;
}

ferry_testkit::backend_tests!(modes:
    two_relays_hold_a_paused_topic_and_deliver_it_in_order_on_resume,
    a_paused_version_holds_later_versions_on_other_topics,
);

/// Bad pause and resume requests are refused with `InvalidInput`, naming what is wrong, and
/// change nothing; pausing twice keeps the first record.
async fn bad_pause_requests_are_refused(db: TestDb) {
    db.store
        .enqueue(&[ferry_testkit::intent(LIVE, "a", 1)])
        .await
        .unwrap();
    let c = control(&db);
    let kind = |r: Result<Vec<String>, ferry_core::StoreError>| r.unwrap_err().kind();
    // an unknown topic (no intent has it) needs --force, and the error names it
    let typo = ["lvie".to_string()];
    let typo = &typo[..];
    let e = c.pause(&req(typo, "x", false)).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::InvalidInput);
    assert!(e.to_string().contains("lvie"), "{e}");
    assert!(c.paused().await.unwrap().is_empty());
    let live = [LIVE.to_string()];
    let live = &live[..];
    assert_eq!(
        kind(c.pause(&req(live, "  ", false)).await),
        StoreErrorKind::InvalidInput
    );
    assert_eq!(
        kind(c.pause(&req(&[], "x", false)).await),
        StoreErrorKind::InvalidInput
    );
    assert!(c.paused().await.unwrap().is_empty());
    // resuming what is not paused
    let e = c.resume(&[LIVE.to_string()]).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::InvalidInput);
    assert!(e.to_string().contains("not paused"), "{e}");
    let e = c.resume(&[ALL_TOPICS.to_string()]).await.unwrap_err();
    assert!(e.to_string().contains("nothing is paused"), "{e}");
    // forced, twice: the first record stays
    assert_eq!(c.pause(&req(typo, "first", true)).await.unwrap(), ["lvie"]);
    assert!(c
        .pause(&req(typo, "second", true))
        .await
        .unwrap()
        .is_empty());
    let p = c.paused().await.unwrap();
    assert_eq!((p.len(), p[0].reason.as_str()), (1, "first"));
    // one of two topics not paused: nothing resumed
    let e = c
        .resume(&["lvie".to_string(), LIVE.to_string()])
        .await
        .unwrap_err();
    assert!(e.to_string().contains(LIVE), "{e}");
    assert_eq!(c.paused().await.unwrap().len(), 1);
    // --all removes every pause
    let all = [ALL_TOPICS.to_string()];
    let all = &all[..];
    c.pause(&req(all, "everything", false)).await.unwrap();
    assert_eq!(c.resume(&[ALL_TOPICS.to_string()]).await.unwrap().len(), 2);
    assert!(c.paused().await.unwrap().is_empty());
    db.cleanup().await;
}

fn req<'a>(topics: &'a [String], reason: &'a str, force: bool) -> PauseRequest<'a> {
    PauseRequest {
        topics,
        reason,
        operator: "alice",
        force,
    }
}

ferry_testkit::backend_tests!(bad_pause_requests_are_refused);
