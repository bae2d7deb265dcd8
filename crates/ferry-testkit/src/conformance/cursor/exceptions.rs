//! Exception rows: failed items get row state and hold their successors, under the per-row
//! protocol.
use std::time::Duration;

use ferry_core::{
    AdvanceResult, CasResult, EventState, ExceptionKind, ExceptionOutcomes, NewException, SlotFence,
};

use super::super::slots::all_slots;
use super::relay::{
    advance_to, cs, ev, exception, find, own_and_read, read_req, read_until, state, LONG,
};
use crate::db::TestDb;

/// Failed items get row state in the advance's transaction; later versions of their aggregate
/// are held behind them (the read flags them, the exception claim keeps version order), and
/// the per-row protocol applies to exceptions: fenced tokens, retry, quarantine, operator
/// requeue and skip.
pub async fn exceptions_hold_successors_in_order(db: TestDb) {
    let (cursors, b) = own_and_read(&db, &[ev("p", 1), ev("p", 2), ev("q", 1)]).await;
    // a failed item counts its attempt; a held one (`exception`) failed nothing itself
    let failed = |e, kind| NewException {
        attempts: 1,
        ..exception(e, kind)
    };
    let exceptions = vec![
        failed(find(&b, "p", 1), ExceptionKind::Quarantine("schema".into())),
        exception(find(&b, "p", 2), ExceptionKind::Held),
    ];
    let r = advance_to(&db, "a", &cursors, b.upto, exceptions).await;
    assert_eq!(r, AdvanceResult::Applied);
    assert_eq!(state(&db, "e-q-1").await, Some(EventState::Sent));
    assert_eq!(state(&db, "e-p-1").await, Some(EventState::Quarantined));
    assert_eq!(state(&db, "e-p-2").await, Some(EventState::Pending));
    let st = db.store.status().await.unwrap();
    assert_eq!(
        (st.pending, st.quarantined, st.blocked_aggregates),
        (1, 1, 1)
    );
    let q = db.store.list_quarantined(10).await.unwrap();
    assert_eq!(q.len(), 1);
    assert_eq!(q[0].event_id, "e-p-1");
    assert_eq!(q[0].blocked_successors, 1);
    // a new version of p is read as held
    db.store.enqueue(&[ev("p", 3)]).await.unwrap();
    let cursors = cs(&db).load_cursors("a", &all_slots()).await.unwrap();
    let b3 = read_until(&db, &read_req(&cursors, 10), 1).await;
    assert_eq!(b3.events.len(), 1);
    assert!(b3.events[0].held);
    // the held successor is not claimable while p-1 is quarantined
    let mut req = crate::fixtures::claim_all(10, LONG);
    req.fence = Some(SlotFence { owner: "a".into() });
    assert!(cs(&db).claim_exceptions(&req).await.unwrap().is_empty());
    // operator requeue: p-1 first, then p-2 (one per claim: the predecessor rule)
    db.store
        .requeue(&ferry_core::OperatorAction::new("e-p-1", "op"))
        .await
        .unwrap();
    let c1 = cs(&db).claim_exceptions(&req).await.unwrap();
    assert_eq!(c1.len(), 1);
    assert_eq!(c1[0].token.event_id, "e-p-1");
    assert_eq!(c1[0].payload, r#"{"agg":"p","v":1}"#);
    // a stale token is fenced; the live one applies
    let mut stale = c1[0].token.clone();
    stale.claim_version -= 1;
    let r = cs(&db)
        .settle_exceptions(&ExceptionOutcomes {
            acked: vec![stale, c1[0].token.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        r.items.iter().map(|i| i.1).collect::<Vec<_>>(),
        vec![CasResult::Fenced, CasResult::Applied]
    );
    assert_eq!(state(&db, "e-p-1").await, Some(EventState::Sent));
    let c2 = cs(&db).claim_exceptions(&req).await.unwrap();
    assert_eq!(c2.len(), 1);
    assert_eq!(c2[0].token.event_id, "e-p-2");
    // a retry pushes it back with attempts + 1
    let r = cs(&db)
        .settle_exceptions(&ExceptionOutcomes {
            retry: vec![crate::fixtures::retry_item(
                &c2[0].token,
                Duration::from_millis(200),
                "broker busy",
            )],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(r.applied(), 1);
    let rec = db.store.record("e-p-2").await.unwrap().unwrap();
    assert_eq!((rec.state, rec.attempts), (EventState::Pending, 1));
    assert_eq!(rec.last_error.as_deref(), Some("broker busy"));
    assert!(cs(&db).claim_exceptions(&req).await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c3 = cs(&db).claim_exceptions(&req).await.unwrap();
    assert_eq!(c3[0].token.event_id, "e-p-2");
    assert_eq!(c3[0].attempts, 1);
    // quarantine it, then skip it: successors are released, the skip is recorded
    cs(&db)
        .settle_exceptions(&ExceptionOutcomes {
            quarantine: vec![(c3[0].token.clone(), "too large".into())],
            ..Default::default()
        })
        .await
        .unwrap();
    db.store
        .skip(&ferry_core::OperatorAction::new("e-p-2", "op"))
        .await
        .unwrap();
    let rec = db.store.record("e-p-2").await.unwrap().unwrap();
    assert_eq!(rec.state, EventState::Skipped);
    assert_eq!(rec.resolved_by.as_deref(), Some("op"));
    // skipping something that is not quarantined is a clear error
    assert!(db
        .store
        .skip(&ferry_core::OperatorAction::new("e-q-1", "op"))
        .await
        .is_err());
    db.cleanup().await;
}
