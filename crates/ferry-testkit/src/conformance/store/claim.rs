//! What a claim may take: never a successor of an unfinished version, never an event twice,
//! and rows another transaction holds locked are passed over (and counted).
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_core::{EventState, NewEvent};

use super::relay::{ev, req, tokens, LONG};
use crate::db::{AnyDb, TestDb};

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
        .retry(&[crate::fixtures::retry_item(
            &c[0].token,
            Duration::ZERO,
            "t",
        )])
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

/// A deep backlog of one aggregate ahead of another aggregate's only event does not hide that
/// event: every store's claim reads a bounded window at the front of the backlog (at least 1,024
/// rows) and then the lowest versions of the aggregates past it (`ferry_store`'s `heads`). B's
/// event is claimed while A's lowest version is in flight, and no later version of A is.
pub async fn heads_past_a_deep_backlog_are_claimed(db: AnyDb) {
    let depth = 5_000;
    let evs: Vec<NewEvent> = (1..=depth).map(|v| ev("A", v)).collect();
    for chunk in evs.chunks(500) {
        db.store.enqueue(chunk).await.unwrap();
    }
    db.store.enqueue(&[ev("B", 1)]).await.unwrap();
    let mut claimed = Vec::new();
    for _ in 0..10 {
        claimed.extend(db.store.claim(&req(10, LONG)).await.unwrap());
        if claimed.iter().any(|e| e.token.event_id == "e-B-1") {
            break;
        }
    }
    let mut ids: Vec<&str> = claimed.iter().map(|e| e.token.event_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        vec!["e-A-1", "e-B-1"],
        "within 10 claims: A's lowest version and B's event, nothing else"
    );
    // once A's lowest version is sent, the next one is claimed
    db.store.ack(&tokens(&claimed)).await.unwrap();
    let next = db.store.claim(&req(10, LONG)).await.unwrap();
    let next: Vec<&str> = next.iter().map(|e| e.token.event_id.as_str()).collect();
    assert_eq!(next, vec!["e-A-2"]);
}

/// Many claimers race over interleaved versions; every claim of v(n) must come after v(n-1)'s
/// ack started.
pub async fn predecessor_rule_under_concurrency(db: AnyDb) {
    let mut evs = Vec::new();
    for v in 1..=40 {
        for a in 0..8 {
            evs.push(ev(&format!("agg-{a}"), v));
        }
    }
    race_claimers(db, &evs).await;
}

/// The same race over 10 aggregates × 150 versions committed aggregate after aggregate, deeper
/// than a claim's window (1,024 rows), so the lowest versions of the last aggregates lie past it
/// and are claimed by the scan for heads (`ferry_store`'s `heads`), under contention.
pub async fn predecessor_rule_past_the_window(db: AnyDb) {
    let mut evs = Vec::new();
    for a in 0..10 {
        for v in 1..=150 {
            evs.push(ev(&format!("deep-{a}"), v));
        }
    }
    race_claimers(db, &evs).await;
}

/// Six claimers claim up to 5 events each, hold them 2 ms and ack them, until `evs` are all
/// SENT; every claim of v(n) must come after v(n-1)'s ack started.
async fn race_claimers(db: AnyDb, evs: &[NewEvent]) {
    for chunk in evs.chunks(500) {
        db.store.enqueue(chunk).await.unwrap();
    }
    let total = evs.len();
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
                    if acked_at.lock().unwrap().len() == total || Instant::now() > deadline {
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
                let tokens = tokens(&got);
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
        total as i64
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
                let tokens = tokens(&got);
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
    // released once the rollback returns (a dropped transaction rolls back later)
    hold.rollback().await;
    let got = store.claim(&req(10, LONG)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].aggregate_id, "lockB");
    // nothing else was due, nothing was locked: the counter stays
    assert!(store.claim(&req(10, LONG)).await.unwrap().is_empty());
    assert_eq!(store.rows_skipped_locked(), Some(before + 1));
}
