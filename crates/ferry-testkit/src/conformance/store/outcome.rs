//! Outcomes under a claim token: compare-and-set on the token, per item; leases that expire
//! or are extended; a lost claim found again by its id.
use std::time::Duration;

use ferry_core::{CasResult, EventState};

use super::relay::{
    claim_eventually, claim_short, enqueue_and_claim, ev, extend, req, state, LONG,
};
use crate::db::AnyDb;

/// An outcome under a claim token that was superseded (lease expired, row reclaimed) is fenced: it writes nothing.
pub async fn stale_claim_is_fenced(db: AnyDb) {
    db.store.enqueue(&[ev("order-7", 1)]).await.unwrap();
    // Bring claim_version to 11 so A's claim is term 12, as in the documented stale-claim
    // example (docs/operations.md).
    for _ in 0..11 {
        let c = db.store.claim(&req(1, LONG)).await.unwrap();
        assert_eq!(
            db.store
                .release(&[c[0].token.clone()])
                .await
                .unwrap()
                .applied(),
            1
        );
    }
    let a = claim_short(&*db.store, 200).await;
    assert_eq!(a[0].token.claim_version, 12);
    // B cannot take it while A's lease is live...
    assert!(db.store.claim(&req(1, LONG)).await.unwrap().is_empty());
    // ...and takes over once it expires.
    let b = claim_eventually(&*db.store, &req(1, LONG), Duration::from_secs(10)).await;
    assert_eq!(b[0].token.claim_version, 13);
    assert_ne!(a[0].token.claim_id, b[0].token.claim_id);
    // A's stale SENT update affects zero rows.
    let r = db.store.ack(&[a[0].token.clone()]).await.unwrap();
    assert_eq!(r.items, vec![(a[0].token.seq, CasResult::Fenced)]);
    for op in [
        db.store.release(&[a[0].token.clone()]).await.unwrap(),
        extend(&*db.store, &[a[0].token.clone()], LONG).await,
        db.store
            .quarantine(&[(a[0].token.clone(), "x".into())])
            .await
            .unwrap(),
        db.store
            .retry(&[crate::fixtures::retry_item(
                &a[0].token,
                Duration::ZERO,
                "x",
            )])
            .await
            .unwrap(),
    ] {
        assert_eq!(r.fenced(), 1);
        assert_eq!(op.fenced(), 1);
    }
    let rec = db.store.record("e-order-7-1").await.unwrap().unwrap();
    assert_eq!((rec.state, rec.claim_version), (EventState::Claimed, 13));
    assert_eq!(rec.claim_id.as_deref(), Some(b[0].token.claim_id.as_str()));
    // B's ack applies.
    assert_eq!(
        db.store.ack(&[b[0].token.clone()]).await.unwrap().applied(),
        1
    );
    assert_eq!(state(&*db.store, "e-order-7-1").await, EventState::Sent);
    // A second ack of the same token is fenced too (already SENT).
    assert_eq!(
        db.store.ack(&[b[0].token.clone()]).await.unwrap().fenced(),
        1
    );
}

/// A stale token and the live token of the same row in one outcome batch: only the live one
/// applies; the report must not credit the stale one because its row was updated.
pub async fn stale_and_live_token_of_one_row_in_one_batch(db: AnyDb) {
    db.store.enqueue(&[ev("twice", 1)]).await.unwrap();
    let a = claim_short(&*db.store, 200).await;
    let b = claim_eventually(&*db.store, &req(1, LONG), Duration::from_secs(10)).await;
    let (stale, live) = (a[0].token.clone(), b[0].token.clone());
    assert_eq!(stale.seq, live.seq);
    assert_ne!(stale.claim_version, live.claim_version);
    let r = extend(&*db.store, &[stale.clone(), live.clone()], LONG).await;
    let (fenced, applied) = (CasResult::Fenced, CasResult::Applied);
    assert_eq!(
        r.items,
        [(stale.seq, fenced), (live.seq, applied)],
        "extend_lease"
    );
    let r = db
        .store
        .retry(&[
            crate::fixtures::retry_item(&live, LONG, "x"),
            crate::fixtures::retry_item(&stale, LONG, "x"),
        ])
        .await
        .unwrap();
    let per_item = [(live.seq, applied), (stale.seq, fenced)];
    assert_eq!(r.items, per_item, "retry (per-item values)");
    let rec = db.store.record("e-twice-1").await.unwrap().unwrap();
    assert_eq!(rec.state, EventState::Pending);
}

/// A batch with mixed per-item outcomes marks only the acked items SENT; the others keep their own outcome.
pub async fn batch_with_mixed_outcomes_confirms_only_acked(db: AnyDb) {
    let (c, t) = enqueue_and_claim(&*db.store, "agg", 5, 10).await;
    assert_eq!(c.len(), 5);
    // items 0,1 acked; 2 retry; 3 permanent; 4 unknown (left claimed)
    let acked = db.store.ack(&t[0..2]).await.unwrap();
    assert_eq!(acked.applied(), 2);
    let retried = db
        .store
        .retry(&[crate::fixtures::retry_item(
            &t[2],
            Duration::from_secs(3600),
            "broker busy",
        )])
        .await
        .unwrap();
    assert_eq!(retried.applied(), 1);
    assert_eq!(
        db.store
            .quarantine(&[(t[3].clone(), "message too large".into())])
            .await
            .unwrap()
            .applied(),
        1
    );
    let states: Vec<EventState> = {
        let mut v = Vec::new();
        for e in &c {
            v.push(state(&*db.store, &e.token.event_id).await);
        }
        v
    };
    assert_eq!(
        states,
        vec![
            EventState::Sent,
            EventState::Sent,
            EventState::Pending,
            EventState::Quarantined,
            EventState::Claimed
        ]
    );
    let r = db.store.record(&t[2].event_id).await.unwrap().unwrap();
    assert_eq!(
        (r.attempts, r.last_error.as_deref()),
        (1, Some("broker busy"))
    );
    // the retried item is not due for an hour; the unknown one is leased: nothing claimable
    assert!(db.store.claim(&req(10, LONG)).await.unwrap().is_empty());
    let st = db.store.status().await.unwrap();
    assert_eq!(
        (
            st.pending,
            st.claimed,
            st.quarantined,
            st.blocked_aggregates
        ),
        (1, 1, 1, 1)
    );
    // release of the unknown item makes it due again, same id and payload
    assert_eq!(db.store.release(&t[4..5]).await.unwrap().applied(), 1);
    let again = db.store.claim(&req(10, LONG)).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].token.event_id, c[4].token.event_id);
    assert_eq!(again[0].payload, c[4].payload);
}

/// A claim whose lease expired is taken over by another claimer, and the first claimer is fenced.
pub async fn lease_expiry_and_takeover(db: AnyDb) {
    db.store.enqueue(&[ev("X", 1)]).await.unwrap();
    let a = claim_short(&*db.store, 300).await;
    assert!(db.store.claim(&req(1, LONG)).await.unwrap().is_empty());
    // heartbeat extends A's lease; the row stays A's past its first expiry
    assert_eq!(
        extend(&*db.store, &[a[0].token.clone()], Duration::from_secs(2))
            .await
            .applied(),
        1
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        db.store.claim(&req(1, LONG)).await.unwrap().is_empty(),
        "the extended lease did not hold past the first one"
    );
    let b = claim_eventually(&*db.store, &req(1, LONG), Duration::from_secs(10)).await;
    assert_eq!(b[0].token.claim_version, a[0].token.claim_version + 1);
    assert_eq!(b[0].payload, a[0].payload);
    assert_eq!(
        extend(&*db.store, &[a[0].token.clone()], LONG)
            .await
            .fenced(),
        1
    );
    assert_eq!(
        extend(&*db.store, &[b[0].token.clone()], LONG)
            .await
            .applied(),
        1
    );
}

/// A claim whose reply was lost is found again by its claim id, until another claimer takes the
/// rows over.
pub async fn lost_claim_commit_is_recovered_by_claim_id(db: AnyDb) {
    db.store.enqueue(&[ev("L", 1), ev("M", 1)]).await.unwrap();
    let r = req(10, Duration::from_millis(300));
    let claim_id = r.claim_id.clone();
    let lost = db.store.claim(&r).await.unwrap(); // pretend this response never arrived
    let found = db.store.lookup_claim(&claim_id).await.unwrap();
    assert_eq!(found, lost);
    assert!(db
        .store
        .lookup_claim("someone-elses-claim")
        .await
        .unwrap()
        .is_empty());
    // after a takeover, the old claim id no longer confers anything
    let b = claim_eventually(&*db.store, &req(10, LONG), Duration::from_secs(10)).await;
    assert_eq!(b.len(), 2);
    assert!(db.store.lookup_claim(&claim_id).await.unwrap().is_empty());
    assert_eq!(
        db.store
            .lookup_claim(&b[0].token.claim_id)
            .await
            .unwrap()
            .len(),
        2
    );
}
