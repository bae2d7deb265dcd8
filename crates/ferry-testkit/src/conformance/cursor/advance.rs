//! Reads and advances: reading writes nothing, the advance derives SENT, reads are cut at
//! their limit, a stale owner's advance is fenced, a lost advance is found by its id.
use std::time::Duration;

use ferry_core::{
    AdvanceResult, CursorPos, CursorRead, DispatchMode, EventState, ExceptionKind, NewEvent,
    NewException, SlotId,
};

use super::super::slots::all_slots;
use super::relay::{
    advance_all, advance_to, cs, ev, exception, find, own_and_read, owned, read_req, read_until,
    state, LONG,
};
use crate::db::TestDb;

/// Reads everything committed, in per-aggregate order, without writing a row; the advance makes
/// it SENT (derived) and the stored mode reports cursor.
pub async fn read_advance_derives_sent(db: TestDb) {
    let cursors = owned(&db, "a").await;
    assert_eq!(cs(&db).dispatch_mode().await.unwrap(), DispatchMode::Cursor);
    let evs: Vec<NewEvent> = (1..=5).flat_map(|v| [ev("x", v), ev("y", v)]).collect();
    db.store.enqueue(&evs).await.unwrap();
    let b = read_until(&db, &read_req(&cursors, 100), 10).await;
    assert_eq!(b.events.len(), 10);
    assert!(b.events.iter().all(|e| !e.held));
    assert!(b.events.windows(2).all(|w| w[0].pos < w[1].pos));
    let xs: Vec<i64> = b
        .events
        .iter()
        .filter(|e| e.event.aggregate_id == "x")
        .map(|e| e.event.aggregate_version)
        .collect();
    assert_eq!(xs, vec![1, 2, 3, 4, 5]);
    assert!(b.upto >= b.events.last().unwrap().pos);
    // reading is not writing: nothing changed
    assert_eq!(state(&db, "e-x-1").await, Some(EventState::Pending));
    assert_eq!(db.store.status().await.unwrap().pending, 10);
    let r = advance_to(&db, "a", &cursors, b.upto, vec![]).await;
    assert_eq!(r, AdvanceResult::Applied);
    assert_eq!(state(&db, "e-x-1").await, Some(EventState::Sent));
    let st = db.store.status().await.unwrap();
    assert_eq!((st.pending, st.claimed, st.quarantined), (0, 0, 0));
    // a new read past the cursor is empty
    let cursors = cs(&db).load_cursors("a", &all_slots()).await.unwrap();
    assert!(cursors.iter().all(|c| c.version == 2 && c.pos == b.upto));
    let again = cs(&db).read_batch(&read_req(&cursors, 100)).await.unwrap();
    assert!(again.events.is_empty());
    db.cleanup().await;
}

/// A read returning `limit` rows stops at its last row; the next read continues from there.
pub async fn reads_are_cut_at_the_limit_and_resume(db: TestDb) {
    let cursors = owned(&db, "a").await;
    let evs: Vec<NewEvent> = (1..=30).map(|v| ev("hot", v)).collect();
    db.store.enqueue(&evs).await.unwrap();
    let b1 = read_until(&db, &read_req(&cursors, 12), 12).await;
    assert_eq!(b1.events.len(), 12);
    assert_eq!(b1.upto, b1.events.last().unwrap().pos);
    let from: Vec<(SlotId, CursorPos)> = cursors.iter().map(|c| (c.slot, b1.upto)).collect();
    let b2 = read_until(&db, &CursorRead { from, limit: 100 }, 18).await;
    let versions: Vec<i64> = b1
        .events
        .iter()
        .chain(&b2.events)
        .map(|e| e.event.aggregate_version)
        .collect();
    assert_eq!(versions, (1..=30).collect::<Vec<_>>());
    db.cleanup().await;
}

/// The stale-claim case (docs/operations.md) at batch granularity: A reads, loses the slot, B takes over
/// (epoch + 1) and reads the same events; A's advance changes nothing, B's applies.
pub async fn stale_owner_advance_is_fenced(db: TestDb) {
    let c = cs(&db);
    c.set_dispatch_mode(DispatchMode::Cursor, "a")
        .await
        .unwrap();
    db.store.enqueue(&[ev("order-7", 1)]).await.unwrap();
    let slot = ferry_core::slot_for("order-7");
    db.store
        .acquire_slots(&ferry_core::SlotRequest::new(
            "a",
            &[slot],
            Duration::from_millis(300),
        ))
        .await
        .unwrap();
    let a = c.load_cursors("a", &[slot]).await.unwrap();
    let a_read = read_until(&db, &read_req(&a, 10), 1).await;
    assert_eq!(a_read.events.len(), 1);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let leases = db
        .store
        .acquire_slots(&ferry_core::SlotRequest::new("b", &[slot], LONG))
        .await
        .unwrap();
    assert_eq!(leases[0].epoch, a[0].epoch + 1);
    let b = c.load_cursors("b", &[slot]).await.unwrap();
    assert!(c.load_cursors("a", &[slot]).await.unwrap().is_empty());
    let b_read = read_until(&db, &read_req(&b, 10), 1).await;
    assert_eq!(b_read.events.len(), 1, "B reads the same event again");
    let ra = advance_to(&db, "a", &a, a_read.upto, vec![]).await;
    assert_eq!(ra, AdvanceResult::Fenced);
    // a stale advance writes nothing, not even its exceptions
    let ra2 = c
        .advance(&advance_all(
            "a",
            &a,
            a_read.upto,
            vec![NewException {
                attempts: 1,
                ..exception(
                    find(&a_read, "order-7", 1),
                    ExceptionKind::Quarantine("stale".into()),
                )
            }],
        ))
        .await
        .unwrap();
    assert_eq!(ra2, AdvanceResult::Fenced);
    assert_eq!(state(&db, "e-order-7-1").await, Some(EventState::Pending));
    let rb = advance_to(&db, "b", &b, b_read.upto, vec![]).await;
    assert_eq!(rb, AdvanceResult::Applied);
    assert_eq!(state(&db, "e-order-7-1").await, Some(EventState::Sent));
    // B's own token is now stale too (version moved): a replay of its advance is fenced
    let rb2 = advance_to(&db, "b", &b, b_read.upto, vec![]).await;
    assert_eq!(rb2, AdvanceResult::Fenced);
    db.cleanup().await;
}

/// A lost commit response is resolved by the advance's pre-generated id.
pub async fn lookup_advance_finds_a_committed_advance(db: TestDb) {
    let (cursors, b) = own_and_read(&db, &[ev("l", 1)]).await;
    let adv = advance_all("a", &cursors, b.upto, vec![]);
    assert!(!cs(&db).lookup_advance(&adv.claim_id).await.unwrap());
    cs(&db).advance(&adv).await.unwrap();
    assert!(cs(&db).lookup_advance(&adv.claim_id).await.unwrap());
    assert!(!cs(&db).lookup_advance("never-ran").await.unwrap());
    db.cleanup().await;
}

/// Every read carries the message key: the aggregate id when the producer gave none or gave the
/// aggregate id itself (PostgreSQL then stores no key, `msg_key` NULL: migration 16), the
/// producer's own otherwise; so does an exception row claimed after the advance.
pub async fn keys_are_read_back_whether_stored_or_implied(db: TestDb) {
    let keyed = |agg: &str, v, key: &str| NewEvent {
        key: Some(key.into()),
        ..ev(agg, v)
    };
    let evs = [ev("k", 1), keyed("k", 2, "k"), keyed("m", 1, "route-9")];
    let (cursors, b) = own_and_read(&db, &evs).await;
    let key = |agg, v| find(&b, agg, v).event.key.as_str();
    assert_eq!(
        (key("k", 1), key("k", 2), key("m", 1)),
        ("k", "k", "route-9")
    );
    crate::conformance::assert_keys_left_null(&db, 2).await;
    let unknown = |agg, v| exception(find(&b, agg, v), ExceptionKind::Unknown("timeout".into()));
    let r = advance_to(
        &db,
        "a",
        &cursors,
        b.upto,
        vec![unknown("k", 1), unknown("m", 1)],
    )
    .await;
    assert_eq!(r, AdvanceResult::Applied);
    let mut req = crate::fixtures::claim_all(10, LONG);
    req.fence = Some(ferry_core::SlotFence { owner: "a".into() });
    let mut got: Vec<(String, String)> = cs(&db)
        .claim_exceptions(&req)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.aggregate_id, e.key))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [("k".into(), "k".into()), ("m".into(), "route-9".into())]
    );
    db.cleanup().await;
}
