use ferry_core::store::prelude::*;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use super::*;
use crate::fixtures::token_of;

fn ev(agg: &str, v: i64) -> NewEvent {
    NewEvent::new(agg, v, "t", "T", format!(r#"{{"v":{v}}}"#)).with_id(format!("{agg}-{v}"))
}

fn all(limit: usize) -> ClaimRequest {
    ClaimRequest::new((0..SLOT_COUNT).collect(), limit, Duration::from_secs(60))
}

fn tokens(c: &[ClaimedEvent]) -> Vec<ClaimToken> {
    c.iter().map(|e| e.token.clone()).collect()
}

#[tokio::test]
async fn seq_addresses_the_slot_and_grows_with_insertion() {
    let s = MemoryStore::new();
    s.enqueue(&[ev("a", 1), ev("b", 1), ev("c", 1)])
        .await
        .unwrap();
    let c = s.claim(&all(10)).await.unwrap();
    let seqs: Vec<i64> = c.iter().map(|e| e.token.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    for e in &c {
        assert_eq!(slot_of(e.token.seq), e.shard_slot as usize);
        assert_eq!(e.shard_slot, ferry_core::slot_for(&e.aggregate_id));
    }
}

/// A lower version enqueued after a higher one was claimed blocks the higher one's
/// takeover, as the SQL `NOT EXISTS (lower unfinished version)` does.
#[tokio::test]
async fn out_of_order_versions_follow_the_predecessor_rule() {
    let s = MemoryStore::new();
    s.enqueue(&[ev("a", 2)]).await.unwrap();
    let mut r = all(10);
    r.lease = Duration::from_millis(1);
    let v2 = s.claim(&r).await.unwrap();
    assert_eq!(v2.len(), 1);
    s.enqueue(&[ev("a", 1)]).await.unwrap();
    std::thread::sleep(Duration::from_millis(5));
    let c = s.claim(&all(10)).await.unwrap();
    assert_eq!(c.len(), 1, "only v1; v2's expired lease is blocked by v1");
    assert_eq!(c[0].aggregate_version, 1);
    assert_eq!(s.ack(&tokens(&c)).await.unwrap().applied(), 1);
    let c = s.claim(&all(10)).await.unwrap();
    assert_eq!(c[0].aggregate_version, 2);
    assert_eq!(c[0].token.claim_version, 2);
    // the first claimer's token is stale now
    assert_eq!(s.ack(&tokens(&v2)).await.unwrap().fenced(), 1);
}

/// The same token twice in one batch is applied for both (as the SQL backends report it);
/// a stale token for the same row is fenced even when a live one is in the batch.
#[tokio::test]
async fn duplicate_tokens_in_one_batch() {
    let s = MemoryStore::new();
    s.enqueue(&[ev("a", 1)]).await.unwrap();
    let c = s.claim(&all(1)).await.unwrap();
    let t = c[0].token.clone();
    let mut stale = t.clone();
    stale.claim_version -= 1;
    let r = s.ack(&[stale, t.clone(), t]).await.unwrap();
    assert_eq!(
        r.items.iter().map(|(_, r)| *r).collect::<Vec<_>>(),
        vec![CasResult::Fenced, CasResult::Applied, CasResult::Applied]
    );
}

#[tokio::test]
async fn a_refused_batch_writes_nothing() {
    let s = MemoryStore::new();
    s.enqueue(&[ev("a", 1)]).await.unwrap();
    // 100 ids reserved before the duplicate: undoing them touches every DashMap shard,
    // including the one whose entry found the duplicate (a deadlock before it was dropped).
    let mut batch: Vec<NewEvent> = (0..100).map(|i| ev(&format!("b{i}"), 1)).collect();
    batch.push(ev("c", 1).with_id("a-1"));
    let e = s.enqueue(&batch).await.unwrap_err();
    assert_eq!(
        e,
        EnqueueError::DuplicateEventId {
            event_id: "a-1".into()
        }
    );
    assert_eq!(s.len(), 1);
    batch.pop();
    s.enqueue(&batch).await.unwrap();
    assert_eq!(s.len(), 101);
    let e = s.enqueue(&[ev("b7", 1).with_id("new")]).await.unwrap_err();
    assert!(matches!(
        e,
        EnqueueError::DuplicateVersion { version: 1, .. }
    ));
    assert_eq!(s.len(), 101);
}

#[tokio::test]
async fn enqueue_wakes_listeners() {
    let s = MemoryStore::new();
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    assert!(s
        .listen_commits(Arc::new(move || {
            n2.fetch_add(1, Ordering::SeqCst);
        }))
        .await
        .unwrap());
    s.enqueue(&[ev("a", 1)]).await.unwrap();
    assert_eq!(n.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn reconcile_classifies_every_intent_under_the_watermark() {
    let s = MemoryStore::new();
    s.enqueue(&[ev("a", 1), ev("a", 2), ev("b", 1), ev("c", 1)])
        .await
        .unwrap();
    let c = s.claim(&all(10)).await.unwrap(); // a-1, b-1, c-1
    let by = |agg: &str| token_of(&c, agg);
    s.ack(&[by("a")]).await.unwrap();
    s.quarantine(&[(by("c"), "schema".into())]).await.unwrap();
    let late = s.enqueue(&[ev("d", 1)]).await.unwrap();
    let d_seq = s.claim(&all(10)).await.unwrap()[1].token.seq; // a-2 then d-1
    let req = |wm| ReconcileRequest {
        watermark: wm,
        consumer: None,
        business: None,
        list_limit: 10,
    };
    let r = s.reconcile(&req(Watermark::Seq(d_seq - 1))).await.unwrap();
    assert_eq!(
        (
            r.total,
            r.published_awaiting_consumption,
            r.outcome_unknown,
            r.quarantined
        ),
        (4, 1, 2, 1),
        "{r:?}"
    );
    assert!(r.classes_sum_to_total());
    assert_eq!(r.quarantined_ids, vec!["c-1".to_string()]);
    assert!(!r.unknown_ids.contains(&late[0]));
    let mut with_inbox = req(Watermark::Seq(i64::MAX));
    with_inbox.consumer = Some("billing".into());
    let e = s.reconcile(&with_inbox).await.unwrap_err().to_string();
    assert!(e.contains("in-memory store has none"), "{e}");
}

/// The status counters are kept incrementally; after any mix of transitions they must
/// equal a recount of the rows, and claims must still honour the predecessor rule.
#[tokio::test]
async fn counters_match_a_recount_after_random_transitions() {
    let s = MemoryStore::new();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut version = [0i64; 12];
    let mut held: Vec<ClaimToken> = Vec::new();
    for _ in 0..3000 {
        match next() % 8 {
            0 | 1 => {
                let a = (next() % 12) as usize;
                version[a] += 1;
                s.enqueue(&[ev(&format!("g{a}"), version[a])])
                    .await
                    .unwrap();
            }
            2 => {
                for e in s.claim(&all((next() % 4) as usize)).await.unwrap() {
                    // nothing lower of the aggregate is unfinished
                    for v in 1..e.aggregate_version {
                        let id = format!("{}-{v}", e.aggregate_id);
                        let st = s.record(&id).await.unwrap().unwrap().state;
                        assert!(
                            !is_open(st),
                            "{} claimed before {id} ({st})",
                            e.token.event_id
                        );
                    }
                    held.push(e.token);
                }
            }
            op if !held.is_empty() => {
                let t = held.swap_remove((next() as usize) % held.len());
                match op {
                    3 | 4 => drop(s.ack(&[t]).await.unwrap()),
                    5 => drop(
                        s.retry(&[RetryItem {
                            token: t,
                            delay: Duration::ZERO,
                            error: "x".into(),
                        }])
                        .await
                        .unwrap(),
                    ),
                    6 => drop(s.quarantine(&[(t, "bad".into())]).await.unwrap()),
                    _ => drop(s.release(&[t]).await.unwrap()),
                }
            }
            _ => {
                if let Some(q) = s.list_quarantined(1).await.unwrap().pop() {
                    if next() % 2 == 0 {
                        s.requeue(&ferry_core::OperatorAction::new(&q.event_id, "op"))
                            .await
                            .unwrap();
                    } else {
                        s.skip(&ferry_core::OperatorAction::new(&q.event_id, "op"))
                            .await
                            .unwrap();
                    }
                }
            }
        }
        let st = s.status().await.unwrap();
        let recs = s.records();
        let n = |want: EventState| recs.iter().filter(|r| r.state == want).count() as i64;
        assert_eq!(
            (st.pending, st.claimed, st.quarantined),
            (
                n(EventState::Pending),
                n(EventState::Claimed),
                n(EventState::Quarantined)
            )
        );
        let blocked: std::collections::HashSet<&str> = recs
            .iter()
            .filter(|r| r.state == EventState::Quarantined)
            .map(|r| r.event_id.split('-').next().unwrap_or(""))
            .collect();
        assert_eq!(st.blocked_aggregates, blocked.len() as i64);
        assert_eq!(
            st.oldest_unfinished_age_us.is_some(),
            recs.iter().any(|r| is_open(r.state))
        );
    }
}

#[tokio::test]
async fn purge_drops_only_old_sent_rows_and_forgets_their_keys() {
    let s = MemoryStore::new();
    s.enqueue(&[ev("a", 1), ev("a", 2), ev("b", 1)])
        .await
        .unwrap();
    let c = s.claim(&all(10)).await.unwrap();
    assert_eq!(c.len(), 2);
    s.ack(&tokens(&c[..1])).await.unwrap();
    let purge = |dry_run| ferry_core::PurgeRequest {
        older_than: Duration::ZERO,
        batch: 1,
        consumer: None,
        dry_run,
        vacuum: false,
    };
    assert_eq!(s.purge_sent(&purge(true)).await.unwrap(), 1);
    assert_eq!(s.len(), 3);
    assert_eq!(s.purge_sent(&purge(false)).await.unwrap(), 1);
    assert_eq!(s.len(), 2);
    assert!(s
        .purge_sent(&ferry_core::PurgeRequest {
            older_than: Duration::ZERO,
            batch: 1,
            consumer: Some("billing"),
            dry_run: false,
            vacuum: false,
        })
        .await
        .is_err());
    assert!(s.record(&c[0].token.event_id).await.unwrap().is_none());
    let st = s.status().await.unwrap();
    assert_eq!((st.pending, st.claimed), (1, 1));
    let rest = s.claim(&all(10)).await.unwrap();
    assert_eq!(rest.len(), 1);
}
