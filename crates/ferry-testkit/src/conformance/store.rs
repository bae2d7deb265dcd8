//! The store conformance suite (row dispatch): every case runs against SQLite, PostgreSQL and
//! MariaDB, and every case that needs no SQL also against the in-memory store. A case takes an
//! [`AnyDb`] (any store) or a [`TestDb`] (SQL only); see [`CASES`].
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_core::{
    CasResult, ClaimRequest, ClaimToken, EnqueueError, EventState, NewEvent, OutboxStore,
    SlotFence, StoreErrorKind,
};

use super::Case;
use crate::{AnyDb, TestDb};

fn ev(agg: &str, v: i64) -> NewEvent {
    crate::intent("orders", agg, v)
}

use crate::claim_all as req;

const LONG: Duration = Duration::from_secs(60);

async fn state(store: &dyn OutboxStore, id: &str) -> EventState {
    store
        .record(id)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no row {id}"))
        .state
}

/// Extends the leases of `tokens` by `lease`; the per-item outcomes.
async fn extend(
    store: &dyn OutboxStore,
    tokens: &[ClaimToken],
    lease: Duration,
) -> ferry_core::CasReport {
    let ext = ferry_core::LeaseExtension::new(tokens, lease);
    store.extend_lease(&ext).await.unwrap()
}

/// One claim of a single event with a lease of `lease_ms` (so another claimer takes it over soon).
async fn claim_short(store: &dyn OutboxStore, lease_ms: u64) -> Vec<ferry_core::ClaimedEvent> {
    let lease = Duration::from_millis(lease_ms);
    store.claim(&req(1, lease)).await.unwrap()
}

/// Claims until something is returned (a lease must expire first), bounded by `max`.
async fn claim_eventually(
    store: &dyn OutboxStore,
    r: &ClaimRequest,
    max: Duration,
) -> Vec<ferry_core::ClaimedEvent> {
    let start = Instant::now();
    loop {
        let got = store.claim(r).await.unwrap();
        if !got.is_empty() {
            return got;
        }
        assert!(
            start.elapsed() < max,
            "nothing became claimable within {max:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------- the basic contract

/// Order 7 and its one intent `e-7-1`, committed or rolled back.
async fn place_order_7(db: &TestDb, commit: bool) {
    db.place_order(
        7,
        &[
            NewEvent::new("order-7", 1, "orders", "OrderCreated", r#"{"orderId":7}"#)
                .with_id("e-7-1"),
        ],
        commit,
    )
    .await
    .unwrap();
}

/// A business transaction rolled back after its enqueue leaves neither the order nor the intent.
pub async fn rollback_leaves_neither_order_nor_intent(db: TestDb) {
    place_order_7(&db, false).await;
    assert_eq!(db.count("orders").await, 0);
    assert_eq!(db.count("ferry_outbox").await, 0);
    assert!(db.store.record("e-7-1").await.unwrap().is_none());
    assert!(db.store.claim(&req(10, LONG)).await.unwrap().is_empty());
}

/// A committed intent is visible, and claimable, through a new connection pool.
pub async fn committed_intent_visible_after_reconnect(db: TestDb) {
    place_order_7(&db, true).await;
    let fresh = db.reopen().await;
    let rec = fresh
        .record("e-7-1")
        .await
        .unwrap()
        .expect("intent visible");
    assert_eq!(rec.state, EventState::Pending);
    assert_eq!(rec.payload, r#"{"orderId":7}"#);
    assert_eq!(db.count("orders WHERE id = 7").await, 1);
    let got = fresh.claim(&req(10, LONG)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].token.event_id, "e-7-1");
}

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
            .retry(&[crate::retry_item(&a[0].token, Duration::ZERO, "x")])
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
            crate::retry_item(&live, LONG, "x"),
            crate::retry_item(&stale, LONG, "x"),
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
    let evs: Vec<NewEvent> = (0..5).map(|i| ev(&format!("agg-{i}"), 1)).collect();
    db.store.enqueue(&evs).await.unwrap();
    let c = db.store.claim(&req(10, LONG)).await.unwrap();
    assert_eq!(c.len(), 5);
    let t: Vec<ClaimToken> = c.iter().map(|e| e.token.clone()).collect();
    // items 0,1 acked; 2 retry; 3 permanent; 4 unknown (left claimed)
    let acked = db.store.ack(&t[0..2]).await.unwrap();
    assert_eq!(acked.applied(), 2);
    let retried = db
        .store
        .retry(&[crate::retry_item(
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

// ---------------------------------------------------------------- ordering

/// An unfinished version of an aggregate keeps every later version of it from being claimed.
pub async fn predecessor_blocks_successors(db: AnyDb) {
    db.store
        .enqueue(&[ev("A", 1), ev("A", 2), ev("A", 3), ev("B", 1)])
        .await
        .unwrap();
    let ids = |c: &[ferry_core::ClaimedEvent]| {
        c.iter()
            .map(|e| e.token.event_id.clone())
            .collect::<Vec<_>>()
    };
    let c = db.store.claim(&req(10, LONG)).await.unwrap();
    assert_eq!(ids(&c), vec!["e-A-1", "e-B-1"]);
    // retry of v1 keeps v2 blocked
    db.store
        .retry(&[crate::retry_item(&c[0].token, Duration::ZERO, "t")])
        .await
        .unwrap();
    db.store.ack(&[c[1].token.clone()]).await.unwrap();
    let c = db.store.claim(&req(10, LONG)).await.unwrap();
    assert_eq!(ids(&c), vec!["e-A-1"]);
    db.store.ack(&[c[0].token.clone()]).await.unwrap();
    let c = db.store.claim(&req(10, LONG)).await.unwrap();
    assert_eq!(ids(&c), vec!["e-A-2"]);
    // a quarantined v2 blocks v3 until an operator acts
    db.store
        .quarantine(&[(c[0].token.clone(), "schema error".into())])
        .await
        .unwrap();
    assert!(db.store.claim(&req(10, LONG)).await.unwrap().is_empty());
    let q = db.store.list_quarantined(10).await.unwrap();
    assert_eq!(q.len(), 1);
    assert_eq!(
        (q[0].event_id.as_str(), q[0].blocked_successors),
        ("e-A-2", 1)
    );
    assert_eq!(q[0].last_error.as_deref(), Some("schema error"));
    // requeue keeps id and payload
    let alice = ferry_core::OperatorAction::new("e-A-2", "alice");
    db.store.requeue(&alice).await.unwrap();
    let rec = db.store.record("e-A-2").await.unwrap().unwrap();
    let resolved = |r: &ferry_core::EventRecord| (r.state, r.resolved_by.clone());
    assert_eq!(resolved(&rec), (EventState::Pending, Some("alice".into())));
    assert_eq!(rec.payload, r#"{"agg":"A","v":2}"#);
    let c = db.store.claim(&req(10, LONG)).await.unwrap();
    assert_eq!(ids(&c), vec!["e-A-2"]);
    db.store
        .quarantine(&[(c[0].token.clone(), "schema error".into())])
        .await
        .unwrap();
    // skip releases the successor and records who skipped
    let bob = ferry_core::OperatorAction::new("e-A-2", "bob");
    db.store.skip(&bob).await.unwrap();
    let rec = db.store.record("e-A-2").await.unwrap().unwrap();
    assert_eq!(resolved(&rec), (EventState::Skipped, Some("bob".into())));
    let c = db.store.claim(&req(10, LONG)).await.unwrap();
    assert_eq!(ids(&c), vec!["e-A-3"]);
    // operator actions on a non-quarantined event are refused with a clear message
    let err = db
        .store
        .requeue(&ferry_core::OperatorAction::new("e-A-3", "carol"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("e-A-3") && err.contains("CLAIMED"), "{err}");
    let err = db
        .store
        .skip(&ferry_core::OperatorAction::new("nope", "carol"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no outbox event"), "{err}");
}

/// Many claimers race over interleaved versions; every claim of v(n) must come after v(n-1)'s
/// ack started.
pub async fn predecessor_rule_under_concurrency(db: AnyDb) {
    let aggs = 8;
    let versions = 40;
    let mut evs = Vec::new();
    for v in 1..=versions {
        for a in 0..aggs {
            evs.push(ev(&format!("agg-{a}"), v));
        }
    }
    db.store.enqueue(&evs).await.unwrap();
    let clock = Arc::new(AtomicU64::new(0));
    let acked_at: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let store = db.store.clone();
        let (clock, acked_at, violations) = (clock.clone(), acked_at.clone(), violations.clone());
        tasks.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let got = match store.claim(&req(5, LONG)).await {
                    Ok(g) => g,
                    Err(e) if e.is_transient() => continue,
                    Err(e) => panic!("claim: {e}"),
                };
                let claimed_at = clock.fetch_add(1, Ordering::SeqCst);
                if got.is_empty() {
                    if acked_at.lock().unwrap().len() == (aggs * versions as usize)
                        || Instant::now() > deadline
                    {
                        return;
                    }
                    tokio::task::yield_now().await;
                    continue;
                }
                for e in &got {
                    if e.aggregate_version > 1 {
                        let pred = format!("e-{}-{}", e.aggregate_id, e.aggregate_version - 1);
                        match acked_at.lock().unwrap().get(&pred) {
                            Some(t) if *t < claimed_at => {}
                            other => violations.lock().unwrap().push(format!(
                                "{} claimed at {claimed_at}, predecessor ack {other:?}",
                                e.token.event_id
                            )),
                        }
                    }
                }
                let tokens: Vec<ClaimToken> = got.iter().map(|e| e.token.clone()).collect();
                // hold the claim briefly, as a real send would: successors must stay blocked
                tokio::time::sleep(Duration::from_millis(2)).await;
                {
                    let t = clock.fetch_add(1, Ordering::SeqCst);
                    let mut m = acked_at.lock().unwrap();
                    for e in &got {
                        m.insert(e.token.event_id.clone(), t);
                    }
                }
                let r = store.ack(&tokens).await.unwrap();
                assert_eq!(r.applied(), tokens.len());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        violations.lock().unwrap().is_empty(),
        "{:?}",
        violations.lock().unwrap()
    );
    assert_eq!(
        db.count("ferry_outbox WHERE state = 'SENT'", |r| r.state
            == EventState::Sent)
            .await,
        (aggs * versions as usize) as i64
    );
}

/// 8 claimers over 20,000 events on many aggregates: no event held by two live tokens, none
/// lost, every event SENT exactly once under a valid token.
pub async fn concurrent_claimers_deliver_each_event_once(db: AnyDb) {
    let aggs = 2000;
    let versions = 10;
    let total = aggs * versions;
    for v in 1..=versions {
        let evs: Vec<NewEvent> = (0..aggs)
            .map(|a| ev(&format!("agg-{a}"), v as i64))
            .collect();
        db.store.enqueue(&evs).await.unwrap();
    }
    // event id → every (claim_id, claim_version) it was claimed under
    type Claims = Arc<Mutex<HashMap<String, Vec<(String, i64)>>>>;
    let claims: Claims = Arc::default();
    let fenced = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = db.store.clone();
        let (claims, fenced, sent) = (claims.clone(), fenced.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(300);
            while (sent.load(Ordering::SeqCst) as usize) < total {
                assert!(Instant::now() < deadline, "claimers did not finish");
                let got = match store.claim(&req(100, LONG)).await {
                    Ok(g) => g,
                    Err(e) if e.is_transient() => continue,
                    Err(e) => panic!("claim: {e}"),
                };
                if got.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                {
                    let mut m = claims.lock().unwrap();
                    for e in &got {
                        m.entry(e.token.event_id.clone())
                            .or_default()
                            .push((e.token.claim_id.clone(), e.token.claim_version));
                    }
                }
                let tokens: Vec<ClaimToken> = got.iter().map(|e| e.token.clone()).collect();
                let r = loop {
                    match store.ack(&tokens).await {
                        Ok(r) => break r,
                        Err(e) if e.is_transient() => continue,
                        Err(e) => panic!("ack: {e}"),
                    }
                };
                fenced.fetch_add(r.fenced() as u64, Ordering::SeqCst);
                sent.fetch_add(r.applied() as u64, Ordering::SeqCst);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    {
        let claims = claims.lock().unwrap();
        assert_eq!(claims.len(), total, "every event claimed");
        let doubles: Vec<_> = claims
            .iter()
            .filter(|(_, v)| v.len() != 1)
            .take(5)
            .collect();
        assert!(
            doubles.is_empty(),
            "events claimed twice under a 60 s lease: {doubles:?}"
        );
    }
    assert_eq!(fenced.load(Ordering::SeqCst), 0);
    assert_eq!(sent.load(Ordering::SeqCst) as usize, total);
    assert_eq!(
        db.count(
            "ferry_outbox WHERE state = 'SENT' AND claim_version = 1",
            |r| r.state == EventState::Sent && r.claim_version == 1
        )
        .await,
        total as i64
    );
    let st = db.store.status().await.unwrap();
    assert_eq!((st.pending, st.claimed), (0, 0));
}

/// The contention statistic: a claim that passes over a row another transaction holds locked
/// counts it in `rows_skipped_locked`; the row is claimed once the lock is gone.
pub async fn claims_count_rows_skipped_as_locked(db: TestDb) {
    db.store
        .enqueue(&[ev("lockA", 1), ev("lockB", 1), ev("lockC", 1)])
        .await
        .unwrap();
    // measuring is opt-in where it costs (PostgreSQL); MariaDB and SQLite always report
    let plain = db.reopen().await;
    if db.backend == ferry_store::Backend::Postgres {
        assert_eq!(plain.rows_skipped_locked(), None);
    } else {
        assert!(plain.rows_skipped_locked().is_some());
    }
    let measuring = ferry_store::connect(
        &db.url,
        &ferry_store::ConnectOptions {
            migrate: false,
            measure_contention: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let store = &*measuring;
    let before = store.rows_skipped_locked().expect("measured");
    let Some(hold) = db.hold_row_locks("aggregate_id = 'lockB'").await else {
        // SQLite: one writer, no row locks, nothing is ever skipped
        assert_eq!(store.claim(&req(10, LONG)).await.unwrap().len(), 3);
        assert_eq!(store.rows_skipped_locked(), Some(0));
        return;
    };
    let got = store.claim(&req(10, LONG)).await.unwrap();
    let aggs: Vec<&str> = got.iter().map(|e| e.aggregate_id.as_str()).collect();
    assert_eq!(aggs, ["lockA", "lockC"], "the locked row is passed over");
    assert_eq!(store.rows_skipped_locked(), Some(before + 1));
    drop(hold);
    let got = store.claim(&req(10, LONG)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].aggregate_id, "lockB");
    // nothing else was due, nothing was locked: the counter stays
    assert!(store.claim(&req(10, LONG)).await.unwrap().is_empty());
    assert_eq!(store.rows_skipped_locked(), Some(before + 1));
}

// ---------------------------------------------------------------- leases and lost commits

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

// ---------------------------------------------------------------- bad input

/// Invalid events and requests are refused with a clear error and write nothing.
pub async fn bad_inputs_are_refused_and_write_nothing(db: AnyDb) {
    db.store.enqueue(&[ev("order-1", 1)]).await.unwrap();
    let before = db.count("ferry_outbox", |_| true).await;
    // duplicate (aggregate, version), against the database, names both
    let e = db
        .store
        .enqueue(&[ev("order-1", 1).with_id("other-id")])
        .await
        .unwrap_err();
    let order_1_v1 = EnqueueError::DuplicateVersion {
        aggregate_id: "order-1".into(),
        version: 1,
    };
    assert_eq!(e, order_1_v1);
    // ... also inside a multi-row insert, and the rest of the batch is not written
    let e = db
        .store
        .enqueue(&[ev("order-2", 1), ev("order-1", 1).with_id("x2")])
        .await
        .unwrap_err();
    assert_eq!(e, order_1_v1);
    // ... and inside the caller's business transaction, which rolls back
    if let Some(sql) = db.sql() {
        let e = sql
            .place_order(99, &[ev("order-1", 1).with_id("x3")], true)
            .await
            .unwrap_err();
        assert!(
            matches!(e, EnqueueError::DuplicateVersion { ref aggregate_id, version: 1 } if aggregate_id == "order-1"),
            "{e}"
        );
    }
    let e = db
        .store
        .enqueue(&[ev("order-9", 1).with_id("e-order-1-1")])
        .await
        .unwrap_err();
    assert_eq!(
        e,
        EnqueueError::DuplicateEventId {
            event_id: "e-order-1-1".into()
        }
    );
    let mut bad = ev("order-3", 1);
    bad.payload = "{\"unterminated\": ".into();
    assert!(matches!(
        db.store.enqueue(&[bad]).await,
        Err(EnqueueError::InvalidJson { .. })
    ));
    let mut big = ev("order-3", 1);
    big.payload = format!("\"{}\"", "x".repeat(2 * 1024 * 1024));
    assert!(matches!(
        db.store.enqueue(&[big]).await,
        Err(EnqueueError::PayloadTooLarge { .. })
    ));
    let mut e1 = ev("order-3", 1);
    e1.topic = String::new();
    assert_eq!(
        db.store.enqueue(&[e1]).await.unwrap_err(),
        EnqueueError::Empty { field: "topic" }
    );
    // the same refusals on every backend: PostgreSQL cannot store a NUL, the others could
    let mut nul = ev("order-3", 1);
    nul.aggregate_id = "order\0-3".into();
    assert!(matches!(
        db.store.enqueue(&[nul]).await,
        Err(EnqueueError::InvalidText {
            field: "aggregate_id",
            ..
        })
    ));
    let mut topic = ev("order-3", 1);
    topic.topic = "orders v1".into();
    assert!(matches!(
        db.store.enqueue(&[topic]).await,
        Err(EnqueueError::InvalidText { field: "topic", .. })
    ));
    let mut e2 = ev("order-3", 1);
    e2.key = Some("  ".into());
    assert_eq!(
        db.store.enqueue(&[e2]).await.unwrap_err(),
        EnqueueError::Empty { field: "key" }
    );
    let e3 = ev("order-3", 0);
    assert!(matches!(
        db.store.enqueue(&[e3]).await,
        Err(EnqueueError::BadVersion { version: 0, .. })
    ));
    let e4 = ev("order-3", -5);
    let msg = db.store.enqueue(&[e4]).await.unwrap_err().to_string();
    assert!(msg.contains("order-3") && msg.contains("-5"), "{msg}");
    assert_eq!(
        db.count("ferry_outbox", |_| true).await,
        before,
        "a refused enqueue wrote something"
    );
    if let Some(sql) = db.sql() {
        assert_eq!(
            sql.count("orders").await,
            0,
            "the rolled-back business row is gone"
        );
    }
}

/// A SQL `UPDATE` of an intent column is refused by the immutability trigger.
pub async fn intent_columns_are_immutable(db: TestDb) {
    db.store.enqueue(&[ev("I", 1)]).await.unwrap();
    let err = db
        .exec("UPDATE ferry_outbox SET payload = '{}' WHERE event_id = 'e-I-1'")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("immutable"), "{err}");
    let err = db
        .exec("UPDATE ferry_outbox SET aggregate_version = 2 WHERE event_id = 'e-I-1'")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("immutable"), "{err}");
    assert_eq!(
        db.store.record("e-I-1").await.unwrap().unwrap().payload,
        r#"{"agg":"I","v":1}"#
    );
}

/// A producer in any language: one plain INSERT that leaves out shard_slot, msg_key, event_id,
/// headers and the timestamps (SQLite: into the `ferry_outbox_insert` view). The database fills
/// them as the Rust API does (the slot is `ferry_core::slot_for`, also for non-ASCII ids), and
/// the rows are claimed and delivered like any other.
pub async fn plain_insert_fills_what_the_rust_api_fills(db: TestDb) {
    let keys = [
        "order-7",
        "a",
        "customer:81f3",
        "ünïcødé-ägg",
        "注文-42",
        &"x".repeat(255),
    ];
    let table = match db.backend {
        ferry_store::Backend::Sqlite => "ferry_outbox_insert",
        _ => "ferry_outbox",
    };
    for (i, k) in keys.iter().enumerate() {
        // the ids come from this test, not the outside world: quoting is safe here
        db.exec(&format!(
            "INSERT INTO {table} (aggregate_id, aggregate_version, topic, event_type, payload) \
             VALUES ('{k}', 1, 'orders', 'OrderPlaced', '{{\"n\":{i}}}')"
        ))
        .await
        .unwrap();
    }
    // a producer that fills everything itself is untouched, even a slot that is not the
    // aggregate's (the database does not check a slot it is given: schema.md §2.1)
    let given = (ferry_core::slot_for("order-7") + 1) % ferry_core::SLOT_COUNT;
    db.exec(&format!(
        "INSERT INTO {table} (event_id, aggregate_id, aggregate_version, shard_slot, topic, msg_key, event_type, headers, payload) \
         VALUES ('mine-1', 'order-7', 2, {given}, 'orders', 'k-7', 'OrderPaid', '{{\"h\":\"v\"}}', '{{}}')"
    ))
    .await
    .unwrap();
    let claimed = db.store.claim(&req(100, LONG)).await.unwrap();
    assert_eq!(claimed.len(), keys.len(), "v2 of order-7 waits for v1");
    for c in &claimed {
        assert_eq!(
            c.shard_slot,
            ferry_core::slot_for(&c.aggregate_id),
            "{}",
            c.aggregate_id
        );
        assert_eq!(c.key, c.aggregate_id);
        assert_eq!(c.token.event_id.len(), 36, "a UUID: {}", c.token.event_id);
        assert!(
            c.created_at > 1_700_000_000_000_000,
            "µs since the epoch: {}",
            c.created_at
        );
        assert_eq!(c.headers, "{}");
    }
    let ids: HashSet<&str> = claimed.iter().map(|c| c.token.event_id.as_str()).collect();
    assert_eq!(ids.len(), keys.len(), "distinct event ids");
    let tokens: Vec<ClaimToken> = claimed.iter().map(|c| c.token.clone()).collect();
    assert_eq!(db.store.ack(&tokens).await.unwrap().applied(), keys.len());
    let mine = db.store.claim(&req(100, LONG)).await.unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!(
        (
            mine[0].token.event_id.as_str(),
            mine[0].key.as_str(),
            mine[0].shard_slot
        ),
        ("mine-1", "k-7", given)
    );
    assert_eq!(mine[0].headers, r#"{"h":"v"}"#);
}

/// The versions of the backend's embedded migrations.
fn embedded_versions(db: &TestDb) -> Vec<i64> {
    let all = match db.backend {
        ferry_store::Backend::Postgres => ferry_store::MIGRATIONS_POSTGRES,
        ferry_store::Backend::Mysql => ferry_store::MIGRATIONS_MYSQL,
        _ => ferry_store::MIGRATIONS_SQLITE,
    };
    all.iter().map(|m| m.version).collect()
}

/// Two concurrent migrations of a migrated database apply nothing twice.
pub async fn concurrent_migrations_apply_once(db: TestDb) {
    // The TestDb is migrated already; two more concurrent runs must wait for the lock and do nothing.
    let (a, b) = tokio::join!(
        ferry_store::migrate_url(&db.url),
        ferry_store::migrate_url(&db.url)
    );
    assert_eq!(a.unwrap(), Vec::<i64>::new());
    assert_eq!(b.unwrap(), Vec::<i64>::new());
    assert_eq!(
        db.count("ferry_schema_migrations").await,
        embedded_versions(&db).len() as i64
    );
    assert_eq!(db.count("ferry_slot_lease").await, 256);
}

/// Two concurrent migrations of a fresh database apply every version exactly once between them.
pub async fn fresh_concurrent_migrations(db: TestDb) {
    // Drop the schema and migrate twice at once from scratch.
    db.exec("DROP VIEW IF EXISTS ferry_outbox_cursor_view")
        .await
        .unwrap();
    for t in ["ferry_outbox_exception", "ferry_dispatch"] {
        db.exec(&format!("DROP TABLE IF EXISTS {t}")).await.unwrap();
    }
    for t in [
        "ferry_outbox",
        "ferry_slot_lease",
        "ferry_relay_member",
        "ferry_schema_migrations",
    ] {
        db.exec(&format!("DROP TABLE {t}")).await.unwrap();
    }
    let (a, b) = tokio::join!(
        ferry_store::migrate_url(&db.url),
        ferry_store::migrate_url(&db.url)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let mut all = a.clone();
    all.extend(b.clone());
    all.sort_unstable();
    assert_eq!(
        all,
        embedded_versions(&db),
        "each version applied by exactly one migrate (got {a:?} and {b:?})"
    );
    assert!(
        a.is_empty() || b.is_empty(),
        "one migrate applied everything, the other waited for its lock (got {a:?} and {b:?})"
    );
    assert_eq!(db.count("ferry_slot_lease").await, 256);
}

/// A database migrated by a newer ferry (a version this build does not know) is refused with a
/// message naming both versions, and nothing is applied.
pub async fn a_newer_schema_is_refused(db: TestDb) {
    let newer = embedded_versions(&db).into_iter().max().unwrap() + 1;
    db.exec(&format!(
        "INSERT INTO ferry_schema_migrations (version, name{}) VALUES ({newer}, 'from_the_future'{})",
        if db.backend == ferry_store::Backend::Sqlite { ", applied_at" } else { "" },
        if db.backend == ferry_store::Backend::Sqlite { ", 0" } else { "" },
    ))
    .await
    .unwrap();
    let e = ferry_store::migrate_url(&db.url).await.unwrap_err();
    assert_eq!(e.kind(), ferry_core::StoreErrorKind::Schema, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("migration {newer}"))
            && msg.contains(&format!("up to {}", newer - 1)),
        "{msg}"
    );
    db.exec(&format!(
        "DELETE FROM ferry_schema_migrations WHERE version = {newer}"
    ))
    .await
    .unwrap();
    assert_eq!(
        ferry_store::migrate_url(&db.url).await.unwrap(),
        Vec::<i64>::new()
    );
}

// ---------------------------------------------------------------- slot leases

/// Slot leases fence claims: a relay claims only in the slots it holds, and loses them to a takeover.
pub async fn slot_leases_fence_claims(db: AnyDb) {
    db.store.enqueue(&[ev("S", 1)]).await.unwrap();
    let slot = ferry_core::slot_for("S");
    let a = db
        .store
        .acquire_slots(&ferry_core::SlotRequest::new(
            "relay-a",
            &[slot],
            Duration::from_millis(300),
        ))
        .await
        .unwrap();
    assert_eq!(a.len(), 1);
    let epoch_a = a[0].epoch;
    // B cannot take a live slot
    assert!(db
        .store
        .acquire_slots(&ferry_core::SlotRequest::new("relay-b", &[slot], LONG))
        .await
        .unwrap()
        .is_empty());
    // B's fenced claim gets nothing; A's gets the event
    let mut rb = ClaimRequest::new(vec![slot], 10, LONG);
    rb.fence = Some(SlotFence {
        owner: "relay-b".into(),
    });
    assert!(db.store.claim(&rb).await.unwrap().is_empty());
    // after A's lease expires B takes the slot over (epoch + 1); A's fenced claims then get
    // nothing, B's get the event
    let deadline = Instant::now() + Duration::from_secs(10);
    let b = loop {
        let got = db
            .store
            .acquire_slots(&ferry_core::SlotRequest::new("relay-b", &[slot], LONG))
            .await
            .unwrap();
        if !got.is_empty() {
            break got;
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(b[0].epoch, epoch_a + 1);
    let mut ra = ClaimRequest::new(vec![slot], 10, LONG);
    ra.fence = Some(SlotFence {
        owner: "relay-a".into(),
    });
    assert!(
        db.store.claim(&ra).await.unwrap().is_empty(),
        "stale owner must not claim"
    );
    assert_eq!(db.store.claim(&rb).await.unwrap().len(), 1);
    // renewal by the owner keeps the epoch; release frees it
    let again = db
        .store
        .acquire_slots(&ferry_core::SlotRequest::new("relay-b", &[slot], LONG))
        .await
        .unwrap();
    assert_eq!(again[0].epoch, b[0].epoch);
    db.store
        .release_slots(&ferry_core::SlotRelease::new("relay-b", &[slot]))
        .await
        .unwrap();
    let c = db
        .store
        .acquire_slots(&ferry_core::SlotRequest::new("relay-c", &[slot], LONG))
        .await
        .unwrap();
    assert_eq!(c[0].epoch, b[0].epoch + 1);
    assert_eq!(db.store.slot_leases().await.unwrap().len(), 1);
    // membership
    let m = db
        .store
        .heartbeat_member(&ferry_core::MemberHeartbeat::new("relay-c", LONG))
        .await
        .unwrap();
    assert_eq!(m, vec!["relay-c".to_string()]);
    let m = db
        .store
        .heartbeat_member(&ferry_core::MemberHeartbeat::new("relay-a", LONG))
        .await
        .unwrap();
    assert_eq!(m, vec!["relay-a".to_string(), "relay-c".to_string()]);
    db.store.leave_member("relay-a").await.unwrap();
    assert_eq!(
        db.store
            .heartbeat_member(&ferry_core::MemberHeartbeat::new("relay-c", LONG))
            .await
            .unwrap(),
        vec!["relay-c".to_string()]
    );
}

/// An owner id's membership row is held by one instance at a time: another instance's heartbeat
/// is refused with `OwnerInUse` and changes nothing while the row is live, and takes the row
/// once it has expired; of two instances racing for one row, exactly one gets it.
pub async fn one_instance_holds_an_owner_id(db: AnyDb) {
    use ferry_core::{MemberHeartbeat, StoreErrorKind};
    let store = &db.store;
    let beat = |owner: &str, instance: &str, ttl| {
        let (owner, instance) = (owner.to_string(), instance.to_string());
        async move {
            store
                .heartbeat_member(&MemberHeartbeat::new(&owner, ttl).instance(&instance))
                .await
        }
    };
    let members = beat("relay-o", "i-1", LONG).await.unwrap();
    assert_eq!(members, vec!["relay-o".to_string()]);
    let e = beat("relay-o", "i-2", LONG).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::OwnerInUse, "{e}");
    assert!(e.to_string().contains("\"relay-o\""), "{e}");
    // the refused heartbeat changed nothing: i-1 still holds (and renews) the row
    assert_eq!(beat("relay-o", "i-1", LONG).await.unwrap().len(), 1);
    assert!(beat("relay-o", "i-2", LONG).await.is_err());
    // an expired row is taken over, and its old instance is then refused
    beat("relay-p", "i-1", Duration::from_millis(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let members = beat("relay-p", "i-2", LONG).await.unwrap();
    assert_eq!(members, vec!["relay-o".to_string(), "relay-p".to_string()]);
    let e = beat("relay-p", "i-1", LONG).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::OwnerInUse, "{e}");
    // a race for one free row: one instance wins, the other is refused
    for round in 0..5 {
        let owner = format!("relay-race-{round}");
        let (a, b) = tokio::join!(beat(&owner, "i-a", LONG), beat(&owner, "i-b", LONG));
        assert!(a.is_ok() != b.is_ok(), "round {round}: {a:?} / {b:?}");
        let loser = if a.is_ok() { b } else { a };
        assert_eq!(loser.unwrap_err().kind(), StoreErrorKind::OwnerInUse);
    }
    // a clean shutdown deletes the row: any instance may take it at once
    db.store.leave_member("relay-o").await.unwrap();
    beat("relay-o", "i-3", LONG).await.unwrap();
}

/// Several intents enqueued in the caller's own transaction commit together with its business row.
pub async fn multi_row_enqueue_in_caller_transaction(db: TestDb) {
    let evs: Vec<NewEvent> = (1..=250).map(|v| ev("bulk", v)).collect();
    let ids = db.place_order(1, &evs, true).await.unwrap();
    assert_eq!(ids.len(), 250);
    assert_eq!(db.count("ferry_outbox").await, 250);
    assert_eq!(
        db.count("orders").await,
        1,
        "the business row committed with them"
    );
    let generated = db
        .store
        .enqueue(&[NewEvent::new("gen", 1, "t", "T", "{}")])
        .await
        .unwrap();
    assert_eq!(uuid_version(&generated[0]), Some(7));
    let seen: HashSet<_> = ids.into_iter().collect();
    assert_eq!(seen.len(), 250);
}

fn uuid_version(s: &str) -> Option<u8> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    (hex.len() == 32)
        .then(|| u8::from_str_radix(&hex[12..13], 16).ok())
        .flatten()
}

// ---------------------------------------------------------------- retention and reconciliation

/// The Inbox columns purge and reconcile read: the dedupe rows, and each aggregate's contiguous
/// mark (a version it covers counts as consumed even when its row was pruned).
const INBOX_DDL: [&str; 2] = [
    "CREATE TABLE ferry_inbox (consumer VARCHAR(255) NOT NULL, event_id VARCHAR(255) NOT NULL, PRIMARY KEY (consumer, event_id))",
    "CREATE TABLE ferry_inbox_aggregate (consumer VARCHAR(255) NOT NULL, aggregate_id VARCHAR(255) NOT NULL, applied_upto BIGINT NOT NULL, PRIMARY KEY (consumer, aggregate_id))",
];

/// Purge deletes only SENT rows older than the cut-off (with a consumer named, only the ones its
/// Inbox recorded).
pub async fn purge_deletes_only_old_sent_rows(db: AnyDb) {
    let evs: Vec<NewEvent> = (0..5).map(|i| ev(&format!("p-{i}"), 1)).collect();
    db.store.enqueue(&evs).await.unwrap();
    let c = db.store.claim(&req(4, LONG)).await.unwrap();
    assert_eq!(c.len(), 4);
    let t: Vec<ClaimToken> = c.iter().map(|e| e.token.clone()).collect();
    db.store.ack(&t[0..3]).await.unwrap();
    // t[3] stays CLAIMED; p-4 stays PENDING; one more quarantined
    db.store.enqueue(&[ev("q", 1)]).await.unwrap();
    let qc = claim_eventually(
        &*db.store,
        &ClaimRequest::new(vec![ferry_core::slot_for("q")], 1, LONG),
        Duration::from_secs(5),
    )
    .await;
    db.store
        .quarantine(&[(qc[0].token.clone(), "bad".into())])
        .await
        .unwrap();
    assert_eq!(
        db.store
            .purge_sent(&ferry_core::PurgeRequest {
                older_than: Duration::from_secs(3600),
                ..crate::purge_all(100)
            })
            .await
            .unwrap(),
        0,
        "nothing old enough"
    );
    assert_eq!(
        db.store
            .purge_sent(&ferry_core::PurgeRequest {
                dry_run: true,
                ..crate::purge_all(100)
            })
            .await
            .unwrap(),
        3,
        "dry run counts"
    );
    assert_eq!(
        db.count("ferry_outbox", |_| true).await,
        6,
        "dry run deletes nothing"
    );
    assert_eq!(
        db.store.purge_sent(&crate::purge_all(2)).await.unwrap(),
        3,
        "two bounded batches"
    );
    assert_eq!(db.count("ferry_outbox", |_| true).await, 3);
    assert_eq!(
        db.count("ferry_outbox WHERE state = 'SENT'", |r| r.state
            == EventState::Sent)
            .await,
        0
    );
    assert_eq!(
        db.count(
            "ferry_outbox WHERE state IN ('PENDING', 'CLAIMED', 'QUARANTINED')",
            |r| matches!(
                r.state,
                EventState::Pending | EventState::Claimed | EventState::Quarantined
            )
        )
        .await,
        3
    );
    // with a consumer, only rows its Inbox recorded go (the Inbox is a SQL table: a store
    // without one refuses rather than guessing)
    let Some(sql) = db.sql() else {
        assert!(db
            .store
            .purge_sent(&ferry_core::PurgeRequest {
                consumer: Some("billing"),
                ..crate::purge_all(10)
            })
            .await
            .is_err());
        return;
    };
    for ddl in INBOX_DDL {
        sql.exec(ddl).await.unwrap();
    }
    db.store.enqueue(&[ev("r", 1), ev("s", 1)]).await.unwrap();
    let slots = vec![ferry_core::slot_for("r"), ferry_core::slot_for("s")];
    let got = db
        .store
        .claim(&ClaimRequest::new(slots, 10, LONG))
        .await
        .unwrap();
    let toks: Vec<ClaimToken> = got
        .iter()
        .filter(|e| e.aggregate_id == "r" || e.aggregate_id == "s")
        .map(|e| e.token.clone())
        .collect();
    assert_eq!(db.store.ack(&toks).await.unwrap().applied(), 2);
    sql.exec("INSERT INTO ferry_inbox (consumer, event_id) VALUES ('billing', 'e-r-1')")
        .await
        .unwrap();
    let purge_consumed = || async {
        let req = ferry_core::PurgeRequest {
            consumer: Some("billing"),
            ..crate::purge_all(10)
        };
        db.store.purge_sent(&req).await
    };
    assert_eq!(purge_consumed().await.unwrap(), 1);
    assert!(db.store.record("e-r-1").await.unwrap().is_none());
    assert!(
        db.store.record("e-s-1").await.unwrap().is_some(),
        "unconsumed SENT row kept"
    );
    // an Inbox row pruned behind the consumer's mark: consumed all the same
    sql.exec("INSERT INTO ferry_inbox_aggregate VALUES ('billing', 's', 1)")
        .await
        .unwrap();
    assert_eq!(purge_consumed().await.unwrap(), 1);
    assert!(db.store.record("e-s-1").await.unwrap().is_none());
}

/// Reconcile classifies every intent of the business table exactly once.
pub async fn reconcile_classifies_every_intent_once(db: TestDb) {
    for ddl in INBOX_DDL {
        db.exec(ddl).await.unwrap();
    }
    // orders 1..4 exist; intents for orders 1..3 and 5 (6 intents under the watermark)
    for id in 1..=4 {
        db.exec(&format!("INSERT INTO orders VALUES ({id}, 'CREATED', 1)"))
            .await
            .unwrap();
    }
    let evs = vec![
        ev("order-1", 1),
        ev("order-2", 1),
        ev("order-3", 1),
        ev("order-3", 2),
        ev("order-5", 1),
        ev("order-5", 2),
    ];
    db.store.enqueue(&evs).await.unwrap();
    db.store.enqueue(&[ev("order-9", 1)]).await.unwrap(); // above the watermark
    let wm = ferry_core::Watermark::Seq(6);
    let c = db.store.claim(&req(10, LONG)).await.unwrap();
    let by = |agg: &str| {
        c.iter()
            .find(|e| e.aggregate_id == agg)
            .unwrap()
            .token
            .clone()
    };
    db.store.ack(&[by("order-1"), by("order-2")]).await.unwrap();
    db.exec("INSERT INTO ferry_inbox (consumer, event_id) VALUES ('billing', 'e-order-1-1')")
        .await
        .unwrap();
    db.store
        .quarantine(&[(by("order-5"), "schema".into())])
        .await
        .unwrap();
    // order-3 v1 stays CLAIMED (unknown), v2 PENDING behind it; order-5 v2 PENDING behind quarantine
    let r = db
        .store
        .reconcile(&ferry_core::ReconcileRequest {
            watermark: wm,
            consumer: Some("billing".into()),
            business: Some(ferry_core::BusinessTable {
                table: "orders".into(),
                id_column: "id".into(),
                aggregate_prefix: "order-".into(),
                max_id: None,
            }),
            list_limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(r.total, 6, "{r:?}");
    // (consumed, published awaiting consumption, unknown, not yet published, quarantined, skipped)
    let classes = |r: &ferry_core::ReconcileReport| {
        (
            r.consumed,
            r.published_awaiting_consumption,
            r.outcome_unknown,
            r.not_yet_published,
            r.quarantined,
            r.skipped,
        )
    };
    assert_eq!(classes(&r), (1, 1, 1, 2, 1, 0), "{r:?}");
    assert!(r.classes_sum_to_total());
    assert_eq!(r.unknown_ids, vec!["e-order-3-1".to_string()]);
    assert_eq!(r.quarantined_ids, vec!["e-order-5-1".to_string()]);
    assert!(r.oldest_not_published_age_us.unwrap_or(-1) >= 0);
    assert_eq!(
        (r.business_rows, r.business_without_intent),
        (Some(4), Some(1))
    );
    assert_eq!(r.business_without_intent_ids, vec![4]);
    // order-2 v1's Inbox row pruned behind the consumer's mark, and a mark over the CLAIMED
    // order-3 v1 (the consumer got it before the relay recorded the ack): both consumed
    db.exec("INSERT INTO ferry_inbox_aggregate VALUES ('billing', 'order-2', 1), ('billing', 'order-3', 1)")
        .await
        .unwrap();
    let r = db
        .store
        .reconcile(&ferry_core::ReconcileRequest {
            watermark: wm,
            consumer: Some("billing".into()),
            business: None,
            list_limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(classes(&r), (3, 0, 0, 2, 1, 0), "{r:?}");
    assert!(r.unknown_ids.is_empty(), "{r:?}");
    // without an Inbox, consumption is not claimed: SENT rows are "published, awaiting"
    let r = db
        .store
        .reconcile(&ferry_core::ReconcileRequest {
            watermark: wm,
            consumer: None,
            business: None,
            list_limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(
        (r.total, r.consumed, r.published_awaiting_consumption),
        (6, 0, 2)
    );
    // identifiers are validated, never interpolated as given
    let bad = ferry_core::ReconcileRequest {
        watermark: wm,
        consumer: None,
        business: Some(ferry_core::BusinessTable {
            table: "orders; DROP TABLE orders".into(),
            id_column: "id".into(),
            aggregate_prefix: "order-".into(),
            max_id: None,
        }),
        list_limit: 10,
    };
    let e = db.store.reconcile(&bad).await.unwrap_err().to_string();
    assert!(e.contains("invalid business table"), "{e}");
    assert_eq!(db.count("orders").await, 4);
}

/// The relays' status poll: a store that shares its counts between relays (PostgreSQL, MariaDB) returns
/// the stored count while it is fresher than `max_age`; every store counts afresh with
/// `max_age` zero, and agrees with `status()`.
pub async fn shared_status_is_counted_once_per_max_age(db: AnyDb) {
    db.store
        .enqueue(&[ev("s-1", 1), ev("s-2", 1)])
        .await
        .unwrap();
    let hour = Duration::from_secs(3600);
    assert_eq!(db.store.shared_status(hour).await.unwrap().pending, 2);
    db.store.enqueue(&[ev("s-3", 1)]).await.unwrap();
    let shared = matches!(db.store.backend(), "postgres" | "mysql");
    let again = db.store.shared_status(hour).await.unwrap();
    assert_eq!(again.pending, if shared { 2 } else { 3 });
    assert!(again.oldest_unfinished_age_us.is_some_and(|a| a >= 0));
    let fresh = db.store.shared_status(Duration::ZERO).await.unwrap();
    assert_eq!(fresh.pending, 3);
    assert_eq!(fresh.pending, db.store.status().await.unwrap().pending);
    // the stored count moved on: a long max_age now returns 3
    assert_eq!(db.store.shared_status(hour).await.unwrap().pending, 3);
    if !shared {
        return;
    }
    // Another relay holds the counting lease. With a count stored, the stored count comes
    // back, even an old one; with none stored yet, a Conflict to ask again later, not a
    // second walk of the backlog.
    let sql = db.sql().expect("a SQL database");
    let lease = if db.store.backend() == "postgres" {
        "UPDATE ferry_status_cache SET computing_until = now() + interval '1 minute'"
    } else {
        "UPDATE ferry_status_cache SET computing_until = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE"
    };
    sql.exec(lease).await.unwrap();
    db.store.enqueue(&[ev("s-4", 1)]).await.unwrap();
    let stored = db.store.shared_status(Duration::ZERO).await.unwrap();
    assert_eq!(
        stored.pending, 3,
        "the stored count while another relay counts"
    );
    sql.exec("UPDATE ferry_status_cache SET computed_at = NULL")
        .await
        .unwrap();
    let busy = db.store.shared_status(Duration::ZERO).await.unwrap_err();
    assert_eq!(busy.kind(), StoreErrorKind::Conflict, "{busy}");
    assert_eq!(db.store.status().await.unwrap().pending, 4);
}

/// Every case, in order: the [`AnyDb`] cases first (they run on the in-memory store too), then
/// the SQL-only ones.
pub const CASES: &[Case<AnyDb>] = &[
    Case {
        name: "stale_claim_is_fenced",
        sql_only: false,
        run: |db| Box::pin(stale_claim_is_fenced(db)),
    },
    Case {
        name: "batch_with_mixed_outcomes_confirms_only_acked",
        sql_only: false,
        run: |db| Box::pin(batch_with_mixed_outcomes_confirms_only_acked(db)),
    },
    Case {
        name: "stale_and_live_token_of_one_row_in_one_batch",
        sql_only: false,
        run: |db| Box::pin(stale_and_live_token_of_one_row_in_one_batch(db)),
    },
    Case {
        name: "predecessor_blocks_successors",
        sql_only: false,
        run: |db| Box::pin(predecessor_blocks_successors(db)),
    },
    Case {
        name: "predecessor_rule_under_concurrency",
        sql_only: false,
        run: |db| Box::pin(predecessor_rule_under_concurrency(db)),
    },
    Case {
        name: "concurrent_claimers_deliver_each_event_once",
        sql_only: false,
        run: |db| Box::pin(concurrent_claimers_deliver_each_event_once(db)),
    },
    Case {
        name: "lease_expiry_and_takeover",
        sql_only: false,
        run: |db| Box::pin(lease_expiry_and_takeover(db)),
    },
    Case {
        name: "lost_claim_commit_is_recovered_by_claim_id",
        sql_only: false,
        run: |db| Box::pin(lost_claim_commit_is_recovered_by_claim_id(db)),
    },
    Case {
        name: "bad_inputs_are_refused_and_write_nothing",
        sql_only: false,
        run: |db| Box::pin(bad_inputs_are_refused_and_write_nothing(db)),
    },
    Case {
        name: "slot_leases_fence_claims",
        sql_only: false,
        run: |db| Box::pin(slot_leases_fence_claims(db)),
    },
    Case {
        name: "one_instance_holds_an_owner_id",
        sql_only: false,
        run: |db| Box::pin(one_instance_holds_an_owner_id(db)),
    },
    Case {
        name: "purge_deletes_only_old_sent_rows",
        sql_only: false,
        run: |db| Box::pin(purge_deletes_only_old_sent_rows(db)),
    },
    Case {
        name: "shared_status_is_counted_once_per_max_age",
        sql_only: false,
        run: |db| Box::pin(shared_status_is_counted_once_per_max_age(db)),
    },
    Case {
        name: "rollback_leaves_neither_order_nor_intent",
        sql_only: true,
        run: |db| {
            Box::pin(rollback_leaves_neither_order_nor_intent(
                db.into_sql().expect("a SQL database"),
            ))
        },
    },
    Case {
        name: "committed_intent_visible_after_reconnect",
        sql_only: true,
        run: |db| {
            Box::pin(committed_intent_visible_after_reconnect(
                db.into_sql().expect("a SQL database"),
            ))
        },
    },
    Case {
        name: "intent_columns_are_immutable",
        sql_only: true,
        run: |db| {
            Box::pin(intent_columns_are_immutable(
                db.into_sql().expect("a SQL database"),
            ))
        },
    },
    Case {
        name: "concurrent_migrations_apply_once",
        sql_only: true,
        run: |db| {
            Box::pin(concurrent_migrations_apply_once(
                db.into_sql().expect("a SQL database"),
            ))
        },
    },
    Case {
        name: "fresh_concurrent_migrations",
        sql_only: true,
        run: |db| {
            Box::pin(fresh_concurrent_migrations(
                db.into_sql().expect("a SQL database"),
            ))
        },
    },
    Case {
        name: "a_newer_schema_is_refused",
        sql_only: true,
        run: |db| {
            Box::pin(a_newer_schema_is_refused(
                db.into_sql().expect("a SQL database"),
            ))
        },
    },
    Case {
        name: "multi_row_enqueue_in_caller_transaction",
        sql_only: true,
        run: |db| {
            Box::pin(multi_row_enqueue_in_caller_transaction(
                db.into_sql().expect("a SQL database"),
            ))
        },
    },
    Case {
        name: "reconcile_classifies_every_intent_once",
        sql_only: true,
        run: |db| {
            Box::pin(reconcile_classifies_every_intent_once(
                db.into_sql().expect("a SQL database"),
            ))
        },
    },
    Case {
        name: "claims_count_rows_skipped_as_locked",
        sql_only: true,
        run: |db| {
            Box::pin(claims_count_rows_skipped_as_locked(
                db.into_sql().expect("a SQL database"),
            ))
        },
    },
    Case {
        name: "plain_insert_fills_what_the_rust_api_fills",
        sql_only: true,
        run: |db| {
            Box::pin(plain_insert_fills_what_the_rust_api_fills(
                db.into_sql().expect("a SQL database"),
            ))
        },
    },
];

/// Runs every case, in order, each on a fresh database from `factory`; the SQL-only cases only
/// when the factory's databases are SQL ([`AnyDb::sql`]). Panics at the first failing case.
pub async fn exercise<F, Fut>(mut factory: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = AnyDb>,
{
    for case in CASES {
        let db = factory().await;
        if case.sql_only && db.sql().is_none() {
            continue;
        }
        let cleanup = db.sql().map(TestDb::cleanup_handle);
        (case.run)(db).await;
        if let Some(c) = cleanup {
            c.run().await;
        }
    }
}
