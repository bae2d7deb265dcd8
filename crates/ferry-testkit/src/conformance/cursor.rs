//! The cursor-dispatch conformance suite: every case runs on each SQL store with cursor
//! dispatch (SQLite, PostgreSQL and MariaDB); see [`CASES`].
use std::future::Future;
use std::time::Duration;

use ferry_core::{
    AdvanceResult, CasResult, CursorAdvance, CursorPos, CursorRead, CursorStore, DispatchMode,
    EventState, ExceptionKind, ExceptionOutcomes, NewEvent, NewException, SlotAdvance, SlotCursor,
    SlotFence, SlotId, Watermark, SLOT_COUNT,
};

use super::Case;
use crate::TestDb;

const LONG: Duration = Duration::from_secs(60);

use super::all_slots;

fn ev(agg: &str, v: i64) -> NewEvent {
    crate::intent("orders", agg, v)
}

fn cs(db: &TestDb) -> &dyn CursorStore {
    db.store.cursor().expect("cursor dispatch on this store")
}

/// Switches to cursor mode and takes every slot for `owner`.
async fn owned(db: &TestDb, owner: &str) -> Vec<SlotCursor> {
    let c = cs(db);
    c.set_dispatch_mode(DispatchMode::Cursor, owner)
        .await
        .unwrap();
    let leases = db
        .store
        .acquire_slots(&ferry_core::SlotRequest::new(owner, &all_slots(), LONG))
        .await
        .unwrap();
    assert_eq!(leases.len(), SLOT_COUNT as usize);
    let cursors = c.load_cursors(owner, &all_slots()).await.unwrap();
    assert_eq!(cursors.len(), SLOT_COUNT as usize);
    cursors
}

fn read_req(cursors: &[SlotCursor], limit: usize) -> CursorRead {
    CursorRead {
        from: cursors.iter().map(|c| (c.slot, c.pos)).collect(),
        limit,
    }
}

/// Advances every slot to `to`, with `exceptions`.
fn advance_all(
    owner: &str,
    cursors: &[SlotCursor],
    to: CursorPos,
    exceptions: Vec<NewException>,
) -> CursorAdvance {
    CursorAdvance {
        owner: owner.into(),
        claim_id: ferry_core::new_event_id(),
        slots: cursors
            .iter()
            .map(|c| SlotAdvance {
                slot: c.slot,
                epoch: c.epoch,
                version: c.version,
                to,
            })
            .collect(),
        exceptions,
    }
}

/// Reads until at least `want` events come back. On PostgreSQL any open write transaction in
/// the cluster (another test's) holds the read horizon back for a while: wait it out.
async fn read_until(db: &TestDb, req: &CursorRead, want: usize) -> ferry_core::CursorBatch {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let b = cs(db).read_batch(req).await.unwrap();
        if b.events.len() >= want || tokio::time::Instant::now() > deadline {
            return b;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn state(db: &TestDb, id: &str) -> Option<EventState> {
    db.store.record(id).await.unwrap().map(|r| r.state)
}

/// The event of `agg` at version `v` in a read.
fn find<'b>(b: &'b ferry_core::CursorBatch, agg: &str, v: i64) -> &'b ferry_core::CursorEvent {
    b.events
        .iter()
        .find(|e| e.event.aggregate_id == agg && e.event.aggregate_version == v)
        .unwrap_or_else(|| panic!("{agg} v{v} in the read"))
}

/// An exception row for a read event.
fn exception(e: &ferry_core::CursorEvent, kind: ExceptionKind) -> NewException {
    NewException {
        seq: e.event.token.seq,
        slot: e.event.shard_slot,
        aggregate_id: e.event.aggregate_id.clone(),
        aggregate_version: e.event.aggregate_version,
        attempts: 0,
        kind,
    }
}

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
    let r = cs(&db)
        .advance(&advance_all("a", &cursors, b.upto, vec![]))
        .await
        .unwrap();
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
    let ra = c
        .advance(&advance_all("a", &a, a_read.upto, vec![]))
        .await
        .unwrap();
    assert_eq!(ra, AdvanceResult::Fenced);
    // a stale advance writes nothing, not even its exceptions
    let ra2 = c
        .advance(&advance_all(
            "a",
            &a,
            a_read.upto,
            vec![NewException {
                seq: a_read.events[0].event.token.seq,
                slot,
                aggregate_id: "order-7".into(),
                aggregate_version: 1,
                attempts: 1,
                kind: ExceptionKind::Quarantine("stale".into()),
            }],
        ))
        .await
        .unwrap();
    assert_eq!(ra2, AdvanceResult::Fenced);
    assert_eq!(state(&db, "e-order-7-1").await, Some(EventState::Pending));
    let rb = c
        .advance(&advance_all("b", &b, b_read.upto, vec![]))
        .await
        .unwrap();
    assert_eq!(rb, AdvanceResult::Applied);
    assert_eq!(state(&db, "e-order-7-1").await, Some(EventState::Sent));
    // B's own token is now stale too (version moved): a replay of its advance is fenced
    let rb2 = c
        .advance(&advance_all("b", &b, b_read.upto, vec![]))
        .await
        .unwrap();
    assert_eq!(rb2, AdvanceResult::Fenced);
    db.cleanup().await;
}

/// A lost commit response is resolved by the advance's pre-generated id.
pub async fn lookup_advance_finds_a_committed_advance(db: TestDb) {
    let cursors = owned(&db, "a").await;
    db.store.enqueue(&[ev("l", 1)]).await.unwrap();
    let b = read_until(&db, &read_req(&cursors, 10), 1).await;
    let adv = advance_all("a", &cursors, b.upto, vec![]);
    assert!(!cs(&db).lookup_advance(&adv.claim_id).await.unwrap());
    cs(&db).advance(&adv).await.unwrap();
    assert!(cs(&db).lookup_advance(&adv.claim_id).await.unwrap());
    assert!(!cs(&db).lookup_advance("never-ran").await.unwrap());
    db.cleanup().await;
}

/// Failed items get row state in the advance's transaction; later versions of their aggregate
/// are held behind them (the read flags them, the exception claim keeps version order), and
/// the per-row protocol applies to exceptions: fenced tokens, retry, quarantine, operator
/// requeue and skip.
pub async fn exceptions_hold_successors_in_order(db: TestDb) {
    let cursors = owned(&db, "a").await;
    db.store
        .enqueue(&[ev("p", 1), ev("p", 2), ev("q", 1)])
        .await
        .unwrap();
    let b = read_until(&db, &read_req(&cursors, 10), 3).await;
    let find = |agg: &str, v: i64| {
        b.events
            .iter()
            .find(|e| e.event.aggregate_id == agg && e.event.aggregate_version == v)
            .unwrap()
            .event
            .clone()
    };
    let (p1, p2) = (find("p", 1), find("p", 2));
    let exc = |e: &ferry_core::ClaimedEvent, kind: ExceptionKind| NewException {
        seq: e.token.seq,
        slot: e.shard_slot,
        aggregate_id: e.aggregate_id.clone(),
        aggregate_version: e.aggregate_version,
        // a held item failed nothing itself
        attempts: if kind == ExceptionKind::Held { 0 } else { 1 },
        kind,
    };
    let adv = advance_all(
        "a",
        &cursors,
        b.upto,
        vec![
            exc(&p1, ExceptionKind::Quarantine("schema".into())),
            exc(&p2, ExceptionKind::Held),
        ],
    );
    assert_eq!(cs(&db).advance(&adv).await.unwrap(), AdvanceResult::Applied);
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
    let mut req = crate::claim_all(10, LONG);
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
            retry: vec![crate::retry_item(
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

/// Reconciliation and retention see the derived states: SENT behind the cursor, PENDING ahead,
/// exception states as written; purge deletes only SENT rows behind the cursors.
pub async fn reconcile_and_purge_use_derived_states(db: TestDb) {
    let cursors = owned(&db, "a").await;
    db.store
        .enqueue(&[ev("r", 1), ev("r", 2), ev("s", 1)])
        .await
        .unwrap();
    let b = read_until(&db, &read_req(&cursors, 10), 3).await;
    let adv = advance_all(
        "a",
        &cursors,
        b.upto,
        vec![exception(
            find(&b, "r", 2),
            ExceptionKind::Unknown("no answer".into()),
        )],
    );
    cs(&db).advance(&adv).await.unwrap();
    db.store.enqueue(&[ev("t", 1)]).await.unwrap(); // ahead of the cursor
    let rep = db
        .store
        .reconcile(&ferry_core::ReconcileRequest {
            watermark: Watermark::Seq(i64::MAX),
            consumer: None,
            business: None,
            list_limit: 10,
        })
        .await
        .unwrap();
    assert!(rep.classes_sum_to_total(), "{rep:?}");
    assert_eq!(rep.total, 4);
    assert_eq!(rep.published_awaiting_consumption, 2, "{rep:?}");
    assert_eq!(rep.not_yet_published, 2, "{rep:?}");
    let dry = db
        .store
        .purge_sent(&ferry_core::PurgeRequest {
            dry_run: true,
            ..crate::purge_all(10)
        })
        .await
        .unwrap();
    assert_eq!(dry, 2);
    let n = db.store.purge_sent(&crate::purge_all(1)).await.unwrap();
    assert_eq!(n, 2);
    assert!(db.store.record("e-r-1").await.unwrap().is_none());
    assert_eq!(state(&db, "e-r-2").await, Some(EventState::Pending));
    assert_eq!(state(&db, "e-t-1").await, Some(EventState::Pending));
    db.cleanup().await;
}

/// Retention by age in cursor dispatch walks the rows once, in seq order, up to the first row
/// not old enough: old SENT rows go, in batches, across an undelivered one between them; a
/// young SENT row stays until it is old enough; `vacuum` runs (PostgreSQL) or is ignored.
pub async fn purge_by_age_stops_at_young_rows(db: TestDb) {
    let cursors = owned(&db, "a").await;
    db.store
        .enqueue(&[ev("o", 1), ev("p", 1), ev("o", 2), ev("o", 3)])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    db.store.enqueue(&[ev("y", 1)]).await.unwrap();
    let b = read_until(&db, &read_req(&cursors, 10), 5).await;
    // p-1 is not acked: an exception, PENDING, between old SENT rows
    let adv = advance_all(
        "a",
        &cursors,
        b.upto,
        vec![exception(
            find(&b, "p", 1),
            ExceptionKind::Unknown("no answer".into()),
        )],
    );
    cs(&db).advance(&adv).await.unwrap();
    let by_age = |dry_run, vacuum| ferry_core::PurgeRequest {
        older_than: Duration::from_secs(1),
        dry_run,
        vacuum,
        ..crate::purge_all(1)
    };
    assert_eq!(db.store.purge_sent(&by_age(true, false)).await.unwrap(), 3);
    assert_eq!(
        db.store.purge_sent(&by_age(false, true)).await.unwrap(),
        3,
        "o-1, o-2, o-3 (one per statement), across p-1"
    );
    for id in ["e-o-1", "e-o-2", "e-o-3"] {
        assert!(db.store.record(id).await.unwrap().is_none(), "{id} purged");
    }
    assert_eq!(state(&db, "e-p-1").await, Some(EventState::Pending));
    assert_eq!(
        state(&db, "e-y-1").await,
        Some(EventState::Sent),
        "too young"
    );
    assert_eq!(db.store.purge_sent(&by_age(false, true)).await.unwrap(), 0);
    assert_eq!(db.store.purge_sent(&crate::purge_all(10)).await.unwrap(), 1);
    assert!(db.store.record("e-y-1").await.unwrap().is_none());
    assert_eq!(state(&db, "e-p-1").await, Some(EventState::Pending));
    db.cleanup().await;
}

/// A producer transaction that is still open delays only its own intents: a later commit is
/// read meanwhile, the open one once it commits (whatever order the two commit in, nothing is
/// skipped), and a rolled-back one never appears (PostgreSQL; on SQLite an open write
/// transaction blocks every other writer).
pub async fn open_transactions_delay_only_their_own_rows(db: TestDb) {
    let cursors = owned(&db, "a").await;
    let Some(open) = db.open_producer_tx(&[ev("late", 1)]).await else {
        eprintln!("not applicable on SQLite: an open write transaction blocks every writer");
        db.cleanup().await;
        return;
    };
    let rolled = db.open_producer_tx(&[ev("gone", 1)]).await.unwrap();
    db.store.enqueue(&[ev("early", 1)]).await.unwrap();
    if db.backend == ferry_store::Backend::Mysql {
        return open_transactions_hold_the_mysql_horizon(db, cursors, open, rolled).await;
    }
    let b = read_until(&db, &read_req(&cursors, 10), 1).await;
    let ids: Vec<&str> = b
        .events
        .iter()
        .map(|e| e.event.token.event_id.as_str())
        .collect();
    assert_eq!(ids, vec!["e-early-1"], "only the committed intent");
    let h = cs(&db).horizon().await.unwrap();
    assert!(
        h.oldest_xact_pid.is_some(),
        "the open transaction is reported: {h:?}"
    );
    cs(&db)
        .advance(&advance_all("a", &cursors, b.upto, vec![]))
        .await
        .unwrap();
    assert_eq!(state(&db, "e-early-1").await, Some(EventState::Sent));
    // the cursor is past "early", whose transaction began after "late"'s: "late" still comes
    open.commit().await;
    rolled.rollback().await;
    let cursors = cs(&db).load_cursors("a", &all_slots()).await.unwrap();
    let mut seen = Vec::new();
    let mut cursors = cursors;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.is_empty() && tokio::time::Instant::now() < deadline {
        let b = cs(&db).read_batch(&read_req(&cursors, 10)).await.unwrap();
        seen.extend(b.events.iter().map(|e| e.event.token.event_id.clone()));
        cs(&db)
            .advance(&advance_all("a", &cursors, b.upto, vec![]))
            .await
            .unwrap();
        cursors = cs(&db).load_cursors("a", &all_slots()).await.unwrap();
    }
    assert_eq!(seen, vec!["e-late-1".to_string()]);
    assert_eq!(state(&db, "e-late-1").await, Some(EventState::Sent));
    assert!(db.store.record("e-gone-1").await.unwrap().is_none());
    db.cleanup().await;
}

/// An aggregate id other than `taken` whose slot is `slot`'s (`prefix-<n>`).
fn agg_in_slot(prefix: &str, slot: ferry_core::SlotId, taken: &[&str]) -> String {
    (0..100_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|a| ferry_core::slot_for(a) == slot && !taken.contains(&a.as_str()))
        .expect("an aggregate id in the slot")
}

/// Reads and advances `owner`'s cursors until `stop` holds for the ids read so far (or
/// `within` passes); returns every id read, in read order.
async fn drain(
    db: &TestDb,
    owner: &str,
    within: Duration,
    stop: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let cursors = cs(db).load_cursors(owner, &all_slots()).await.unwrap();
        let b = cs(db).read_batch(&read_req(&cursors, 50)).await.unwrap();
        seen.extend(b.events.iter().map(|e| e.event.token.event_id.clone()));
        let slots: Vec<SlotAdvance> = cursors
            .iter()
            .map(|c| SlotAdvance {
                slot: c.slot,
                epoch: c.epoch,
                version: c.version,
                to: b.upto_of(c.slot),
            })
            .collect();
        cs(db)
            .advance(&CursorAdvance {
                owner: owner.to_string(),
                claim_id: ferry_core::new_event_id(),
                slots,
                exceptions: vec![],
            })
            .await
            .unwrap();
        if stop(&seen) || tokio::time::Instant::now() >= deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// MySQL/MariaDB (the commit gate): an open producer transaction holds back the slots it wrote
/// once it is idle: intents committed after it began are read in every other slot, not in its
/// own; once it ends, its intents and the later ones of its slots are read in `seq` order, and
/// a rolled-back one never appears.
async fn open_transactions_hold_the_mysql_horizon(
    db: TestDb,
    cursors: Vec<SlotCursor>,
    open: crate::OpenTx,
    rolled: crate::OpenTx,
) {
    drop(cursors);
    let held = [ferry_core::slot_for("late"), ferry_core::slot_for("gone")];
    for a in ["early", "multi", "other"] {
        assert!(
            !held.contains(&ferry_core::slot_for(a)),
            "{a} shares a slot with an open transaction"
        );
    }
    // a later intent in the open transaction's slot: it waits for it
    let twin = agg_in_slot("twin", held[0], &["late"]);
    db.store.enqueue(&[ev(&twin, 1)]).await.unwrap();
    // Other producers do not wait for it, multi-row inserts included (MariaDB ignores SKIP
    // LOCKED from a statement's second row on, which the trigger works around).
    tokio::time::timeout(
        Duration::from_secs(3),
        db.store
            .enqueue(&[ev("multi", 1), ev("multi", 2), ev("other", 1)]),
    )
    .await
    .expect("a multi-row insert waited for the open transaction")
    .unwrap();
    let seen = drain(&db, "a", Duration::from_secs(30), |s| s.len() >= 4).await;
    assert_eq!(
        seen,
        vec!["e-early-1", "e-multi-1", "e-multi-2", "e-other-1"],
        "the slots the open transactions did not write, in seq order"
    );
    let h = cs(&db).horizon().await.unwrap();
    assert!(
        h.oldest_xact_pid.is_some(),
        "the open transaction is reported: {h:?}"
    );
    assert_eq!(h.held_slots, Some(2), "the slots it holds: {h:?}");
    // its slot's later intent stays behind it
    let more = drain(&db, "a", Duration::from_millis(800), |_| false).await;
    assert!(
        more.is_empty(),
        "read past an open transaction of its slot: {more:?}"
    );
    open.commit().await;
    rolled.rollback().await;
    let twin_id = format!("e-{twin}-1");
    let seen = drain(&db, "a", Duration::from_secs(30), |s| s.len() >= 2).await;
    assert_eq!(seen, vec!["e-late-1".to_string(), twin_id.clone()]);
    for id in ["e-late-1", "e-early-1", "e-other-1", twin_id.as_str()] {
        assert_eq!(state(&db, id).await, Some(EventState::Sent), "{id}");
    }
    assert!(db.store.record("e-gone-1").await.unwrap().is_none());
    let h = cs(&db).horizon().await.unwrap();
    assert_eq!(h.held_slots, None, "{h:?}");
    db.cleanup().await;
}

/// MySQL/MariaDB: a transaction that holds a gate row for long and then runs a statement that
/// has drawn `seq` values it has not inserted yet (a multi-row insert waiting on a row lock
/// half-way) holds every slot until the statement is done: reads that went on past it would
/// move a slot's cursor over a `seq` that is committed later. Every intent is read once.
pub async fn a_running_statement_of_a_long_transaction_is_waited_for(db: TestDb) {
    if db.backend != ferry_store::Backend::Mysql {
        eprintln!("MySQL/MariaDB only: the commit gate");
        db.cleanup().await;
        return;
    }
    let _cursors = owned(&db, "a").await;
    let mut long = db.open_producer_tx(&[ev("long", 1)]).await.unwrap();
    // a second open transaction holds "blocker" v1 uncommitted: inserting it again waits
    let blocker = db.open_producer_tx(&[ev("blocker", 1)]).await.unwrap();
    db.store.enqueue(&[ev("early", 1)]).await.unwrap();
    let seen = drain(&db, "a", Duration::from_secs(30), |s| !s.is_empty()).await;
    assert_eq!(
        seen,
        vec!["e-early-1"],
        "the long transactions are left to waiters"
    );
    // the long transaction's multi-row insert: its first row goes in, the second waits for
    // "blocker", the third's seq is drawn but its row is not in the table yet
    let tail = agg_in_slot("tail", ferry_core::slot_for("early"), &["early"]);
    let rows = vec![ev("head", 1), ev("blocker", 1), ev(&tail, 1)];
    let stmt = tokio::spawn(async move {
        let r = long.enqueue(&rows).await;
        (long, r)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !stmt.is_finished(),
        "the insert did not wait for the blocker"
    );
    // later intents of the third row's slot commit above its seq
    let later = agg_in_slot(
        "later",
        ferry_core::slot_for(&tail),
        &["early", tail.as_str()],
    );
    db.store.enqueue(&[ev(&later, 1)]).await.unwrap();
    let during = drain(&db, "a", Duration::from_secs(2), |_| false).await;
    assert!(
        during.is_empty(),
        "read while a statement of a transaction holding a gate row runs: {during:?}"
    );
    // the blocker gives way; the statement finishes; everything commits
    blocker.rollback().await;
    let (long, r) = stmt.await.unwrap();
    r.unwrap();
    long.commit().await;
    let want = [
        "e-long-1".to_string(),
        "e-head-1".to_string(),
        "e-blocker-1".to_string(),
        format!("e-{tail}-1"),
        format!("e-{later}-1"),
    ];
    let seen = drain(&db, "a", Duration::from_secs(30), |s| s.len() >= want.len()).await;
    let mut sorted = seen.clone();
    sorted.sort();
    let mut expect = want.to_vec();
    expect.sort();
    assert_eq!(sorted, expect, "every intent read once: {seen:?}");
    let tail_at = seen
        .iter()
        .position(|s| *s == format!("e-{tail}-1"))
        .unwrap();
    let later_at = seen
        .iter()
        .position(|s| *s == format!("e-{later}-1"))
        .unwrap();
    assert!(tail_at < later_at, "seq order in the slot: {seen:?}");
    db.cleanup().await;
}

/// How many of the row-dispatch indexes of `ferry_outbox` exist on `db`, and how many row
/// dispatch has: the ones that would take an entry per intent in cursor dispatch, which reads
/// none of them (PostgreSQL's and SQLite's other indexes are partial on states cursor dispatch
/// never writes; MariaDB has no partial indexes).
async fn row_indexes(db: &TestDb) -> (i64, i64) {
    let (sql, all) = match db.backend {
        ferry_store::Backend::Postgres => (
            "SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema() \
               AND tablename = 'ferry_outbox' \
               AND indexname IN ('ferry_outbox_dispatch', 'ferry_outbox_unfinished')",
            2,
        ),
        ferry_store::Backend::Sqlite => (
            "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'ferry_outbox' \
               AND name IN ('ferry_outbox_dispatch', 'ferry_outbox_unfinished')",
            2,
        ),
        ferry_store::Backend::Mysql => (
            "SELECT count(DISTINCT index_name) FROM information_schema.STATISTICS \
             WHERE table_schema = DATABASE() AND table_name = 'ferry_outbox' \
               AND index_name IN ('ferry_outbox_due', 'ferry_outbox_predecessor', \
                                  'ferry_outbox_claim_id', 'ferry_outbox_sent_at')",
            4,
        ),
    };
    (db.scalar(sql).await.unwrap(), all)
}

/// Switching modes converts delivery state both ways: row-mode work becomes exception rows,
/// cursor-mode derived states become row states. The row-dispatch indexes exist only in row
/// dispatch.
pub async fn mode_switch_converts_state(db: TestDb) {
    let c = cs(&db);
    assert_eq!(c.dispatch_mode().await.unwrap(), DispatchMode::Row);
    let (n, all) = row_indexes(&db).await;
    assert_eq!(n, all, "row dispatch has its indexes");
    db.store
        .enqueue(&[ev("m", 1), ev("m", 2), ev("n", 1)])
        .await
        .unwrap();
    // row mode: n-1 sent, m-1 quarantined, m-2 pending
    let claimed = db.store.claim(&crate::claim_all(10, LONG)).await.unwrap();
    let tok = |id: &str| {
        claimed
            .iter()
            .find(|e| e.token.event_id == id)
            .unwrap()
            .token
            .clone()
    };
    db.store.ack(&[tok("e-n-1")]).await.unwrap();
    db.store
        .quarantine(&[(tok("e-m-1"), "bad".into())])
        .await
        .unwrap();
    // another live relay blocks the switch
    db.store
        .heartbeat_member(&ferry_core::MemberHeartbeat::new("other", LONG))
        .await
        .unwrap();
    let err = c
        .set_dispatch_mode(DispatchMode::Cursor, "me")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("live relay"), "{err}");
    db.store.leave_member("other").await.unwrap();
    assert!(c
        .set_dispatch_mode(DispatchMode::Cursor, "me")
        .await
        .unwrap());
    assert!(!c
        .set_dispatch_mode(DispatchMode::Cursor, "me")
        .await
        .unwrap());
    assert_eq!(
        row_indexes(&db).await.0,
        0,
        "cursor dispatch keeps no row-dispatch index"
    );
    assert_eq!(state(&db, "e-n-1").await, Some(EventState::Sent));
    assert_eq!(state(&db, "e-m-1").await, Some(EventState::Quarantined));
    assert_eq!(state(&db, "e-m-2").await, Some(EventState::Pending));
    assert_eq!(db.store.list_quarantined(10).await.unwrap().len(), 1);
    // cursor mode: the row-mode backlog (m-2, held behind quarantined m-1) and a new event are
    // read by the cursor; the row already SENT (n-1) is passed over
    db.store.enqueue(&[ev("o", 1)]).await.unwrap();
    db.store
        .acquire_slots(&ferry_core::SlotRequest::new("me", &all_slots(), LONG))
        .await
        .unwrap();
    let cursors = c.load_cursors("me", &all_slots()).await.unwrap();
    let b = read_until(&db, &read_req(&cursors, 10), 2).await;
    let got: Vec<(&str, bool)> = b
        .events
        .iter()
        .map(|e| (e.event.token.event_id.as_str(), e.held))
        .collect();
    assert_eq!(got, vec![("e-m-2", true), ("e-o-1", false)]);
    let m2 = &b.events[0].event;
    let held = NewException {
        seq: m2.token.seq,
        slot: m2.shard_slot,
        aggregate_id: "m".into(),
        aggregate_version: 2,
        attempts: 0,
        kind: ExceptionKind::Held,
    };
    c.advance(&advance_all("me", &cursors, b.upto, vec![held]))
        .await
        .unwrap();
    assert_eq!(state(&db, "e-m-2").await, Some(EventState::Pending));
    // back to row mode: every state carries over
    db.store
        .release_slots(&ferry_core::SlotRelease::new("me", &all_slots()))
        .await
        .unwrap();
    assert!(c.set_dispatch_mode(DispatchMode::Row, "me").await.unwrap());
    assert_eq!(
        row_indexes(&db).await.0,
        all,
        "row dispatch has its indexes again"
    );
    assert_eq!(state(&db, "e-o-1").await, Some(EventState::Sent));
    assert_eq!(state(&db, "e-n-1").await, Some(EventState::Sent));
    assert_eq!(state(&db, "e-m-1").await, Some(EventState::Quarantined));
    assert_eq!(state(&db, "e-m-2").await, Some(EventState::Pending));
    // and the row protocol continues: requeue m-1, claim it (m-2 waits behind it)
    db.store
        .requeue(&ferry_core::OperatorAction::new("e-m-1", "op"))
        .await
        .unwrap();
    let again = db.store.claim(&crate::claim_all(10, LONG)).await.unwrap();
    let ids: Vec<&str> = again.iter().map(|e| e.token.event_id.as_str()).collect();
    assert_eq!(ids, vec!["e-m-1"]);
    db.cleanup().await;
}

/// Reads past `from` and moves every position in it to how far the read went (a reader that keeps
/// its positions in memory, as a relay worker does between advances).
async fn read_on(
    db: &TestDb,
    from: &mut [(SlotId, CursorPos)],
    limit: usize,
) -> ferry_core::CursorBatch {
    let b = cs(db)
        .read_batch(&CursorRead {
            from: from.to_vec(),
            limit,
        })
        .await
        .unwrap();
    for (slot, p) in from.iter_mut() {
        *p = (*p).max(b.upto_of(*slot));
    }
    b
}

/// Readers of slot subsets, as relays own them (contiguous ranges, `desired_slots`; a single
/// slot; a set with gaps, as workers of one relay split it): each gets exactly the intents of
/// its own slots, every one of them once, in per-aggregate order.
pub async fn slot_subset_readers_get_exactly_their_slots(db: TestDb) {
    let cursors = owned(&db, "a").await;
    let evs: Vec<NewEvent> = (0..300)
        .map(|n| ev(&format!("s{}", n % 97), n / 97 + 1))
        .collect();
    db.store.enqueue(&evs).await.unwrap();
    let slot = |e: &NewEvent| ferry_core::slot_for(&e.aggregate_id);
    let one = slot(&evs[0]);
    let readers: Vec<Vec<SlotId>> = vec![
        (0..128).collect(),
        (128..256).collect(),
        vec![one],
        (0..256).filter(|s| s % 3 == 1).collect(),
    ];
    for slots in readers {
        let mine: Vec<&NewEvent> = evs.iter().filter(|e| slots.contains(&slot(e))).collect();
        let from: Vec<(SlotId, CursorPos)> = cursors
            .iter()
            .filter(|c| slots.contains(&c.slot))
            .map(|c| (c.slot, c.pos))
            .collect();
        let b = read_until(&db, &CursorRead { from, limit: 1000 }, mine.len()).await;
        assert!(
            b.events.iter().all(|e| slots.contains(&e.event.shard_slot)),
            "a read returned another reader's slot"
        );
        let mut got: Vec<(String, i64)> = b
            .events
            .iter()
            .map(|e| (e.event.aggregate_id.clone(), e.event.aggregate_version))
            .collect();
        let mut sorted = got.clone();
        sorted.sort();
        // per aggregate in version order: a stable sort by aggregate leaves versions ascending
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got, sorted, "versions of an aggregate out of order");
        let mut want: Vec<(String, i64)> = mine
            .iter()
            .map(|e| (e.aggregate_id.clone(), e.aggregate_version))
            .collect();
        want.sort();
        assert_eq!(
            sorted,
            want,
            "{} slots: every intent of the reader's slots once",
            slots.len()
        );
    }
    db.cleanup().await;
}

/// A slot far behind the others (its read was cut before an aggregate still in flight while
/// the others went on) holds nobody back: the next read returns the others' new intents too,
/// not only rows of the lagging slot's range, and reading on delivers every intent of every
/// slot once, in per-aggregate order.
pub async fn a_lagging_slot_holds_the_others_back_no_longer(db: TestDb) {
    let cursors = owned(&db, "a").await;
    let lag_slot = ferry_core::slot_for("lag");
    // other aggregates, none on the lagging slot
    let others: Vec<String> = (0..400)
        .map(|n| format!("o{n}"))
        .filter(|a| ferry_core::slot_for(a) != lag_slot)
        .take(50)
        .collect();
    let mut first: Vec<NewEvent> = (1..=5).map(|v| ev("lag", v)).collect();
    first.extend((0..195).map(|n| ev(&others[n % 50], (n / 50) as i64 + 1)));
    db.store.enqueue(&first).await.unwrap();
    let all = read_req(&cursors, 1000);
    let b = read_until(&db, &all, first.len()).await;
    assert_eq!(b.events.len(), first.len());
    // every slot read through the first enqueue except the lagging one, which stays put
    let mut from: Vec<(SlotId, CursorPos)> = cursors
        .iter()
        .map(|c| {
            let to = if c.slot == lag_slot {
                c.pos
            } else {
                b.upto_of(c.slot)
            };
            (c.slot, to)
        })
        .collect();
    let second: Vec<NewEvent> = (0..20).map(|n| ev(&others[n], 5)).collect();
    db.store.enqueue(&second).await.unwrap();
    // wait until the second enqueue is readable at all (behind the horizon or tick)
    let leaders: Vec<(SlotId, CursorPos)> = from
        .iter()
        .copied()
        .filter(|(s, _)| *s != lag_slot)
        .collect();
    let seen = read_until(
        &db,
        &CursorRead {
            from: leaders,
            limit: 1000,
        },
        second.len(),
    )
    .await;
    assert_eq!(seen.events.len(), second.len());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut got: Vec<(String, i64)> = Vec::new();
    let mut first_read = true;
    while got.len() < 5 + second.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "read {} of {} intents",
            got.len(),
            5 + second.len()
        );
        let b = read_on(&db, &mut from, 10).await;
        if first_read && !b.events.is_empty() {
            first_read = false;
            assert!(
                b.events.iter().any(|e| e.event.aggregate_id != "lag"),
                "the first read behind a lagging slot returned only that slot's rows: {:?}",
                b.events
                    .iter()
                    .map(|e| (&e.event.aggregate_id, e.event.aggregate_version))
                    .collect::<Vec<_>>()
            );
        }
        if b.events.is_empty() && !b.more {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        got.extend(
            b.events
                .iter()
                .map(|e| (e.event.aggregate_id.clone(), e.event.aggregate_version)),
        );
    }
    let mut by_agg = got.clone();
    by_agg.sort_by(|a, b| a.0.cmp(&b.0));
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(by_agg, sorted, "versions of an aggregate out of order");
    let mut want: Vec<(String, i64)> = (1..=5).map(|v| ("lag".to_string(), v)).collect();
    want.extend(
        second
            .iter()
            .map(|e| (e.aggregate_id.clone(), e.aggregate_version)),
    );
    want.sort();
    assert_eq!(
        sorted, want,
        "every intent behind the positions once, nothing else"
    );
    db.cleanup().await;
}

/// Reads by several readers take many ticks (PostgreSQL: one per caught-up read); a reader
/// behind them reads all of them, in pieces cut at a small limit or in one call, and gets every
/// intent of its slots exactly once, in position and per-aggregate order, including one whose
/// transaction stayed open across many ticks and committed late (and never a rolled-back one).
pub async fn a_reader_behind_many_ticks_misses_nothing(db: TestDb) {
    let cursors = owned(&db, "a").await;
    let even = |slot: SlotId| slot.is_multiple_of(2);
    let (evens, odds): (Vec<SlotCursor>, Vec<SlotCursor>) =
        cursors.iter().partition(|c| even(c.slot));
    let late = db
        .open_producer_tx(&[ev("late-even", 1), ev("late-odd", 1)])
        .await;
    let rolled = db
        .open_producer_tx(&[ev("gone-even", 1), ev("gone-odd", 1)])
        .await;
    let mut odd_from: Vec<(SlotId, CursorPos)> = odds.iter().map(|c| (c.slot, c.pos)).collect();
    let mut odd_seen = Vec::new();
    let mut expected = 0;
    let mut late = late;
    let mut rolled = rolled;
    for i in 0..40 {
        let evs: Vec<NewEvent> = (0..3)
            .map(|k| {
                let n = i * 3 + k;
                ev(&format!("a{}", n % 11), n + 1)
            })
            .collect();
        db.store.enqueue(&evs).await.unwrap();
        expected += evs.len();
        // the odd reader, caught up, takes a tick on every read
        let b = read_on(&db, &mut odd_from, 1000).await;
        odd_seen.extend(b.events.iter().map(|e| e.event.token.event_id.clone()));
        if i == 20 {
            if let Some(tx) = late.take() {
                tx.commit().await;
                expected += 2;
            }
            if let Some(tx) = rolled.take() {
                tx.rollback().await;
            }
        }
    }
    let slot_of = |e: &ferry_core::CursorEvent| e.event.shard_slot;
    // the even reader, behind every tick, in pieces of 4
    let mut from: Vec<(SlotId, CursorPos)> = evens.iter().map(|c| (c.slot, c.pos)).collect();
    let mut pieces = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let b = read_on(&db, &mut from, 4).await;
        assert!(b.events.len() <= 4);
        assert!(b.events.iter().all(|e| even(slot_of(e))));
        pieces.extend(b.events.iter().cloned());
        let odd_total = odd_seen.len();
        let have = pieces.len() + odd_total;
        if (have >= expected && !b.more) || tokio::time::Instant::now() > deadline {
            break;
        }
        if !b.more {
            // the odd reader keeps reading too (another test's open transaction may hold rows
            // in a later window for a while)
            let b = read_on(&db, &mut odd_from, 1000).await;
            odd_seen.extend(b.events.iter().map(|e| e.event.token.event_id.clone()));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(
        pieces.windows(2).all(|w| w[0].pos < w[1].pos),
        "positions ascend"
    );
    let ids: Vec<String> = pieces
        .iter()
        .map(|e| e.event.token.event_id.clone())
        .collect();
    let mut all: Vec<String> = ids.iter().chain(&odd_seen).cloned().collect();
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "no intent read twice");
    assert_eq!(n, expected, "every committed intent read once");
    assert!(
        !all.iter().any(|id| id.starts_with("e-gone")),
        "a rolled-back intent"
    );
    for agg in (0..11).map(|a| format!("a{a}")) {
        let vs: Vec<i64> = pieces
            .iter()
            .filter(|e| e.event.aggregate_id == agg)
            .map(|e| e.event.aggregate_version)
            .collect();
        assert!(vs.windows(2).all(|w| w[0] < w[1]), "{agg}: {vs:?}");
    }
    // one call from the start reads every span there is
    let all_even = evens.iter().map(|c| (c.slot, c.pos)).collect();
    let one = cs(&db)
        .read_batch(&CursorRead {
            from: all_even,
            limit: 100_000,
        })
        .await
        .unwrap();
    let one_ids: Vec<String> = one
        .events
        .iter()
        .map(|e| e.event.token.event_id.clone())
        .collect();
    assert_eq!(
        one_ids, ids,
        "one call reads what the pieces read, in the same order"
    );
    // slots at different positions: half of them from the start, half from the middle
    let mid = pieces[pieces.len() / 2].pos;
    let staggered: Vec<(SlotId, CursorPos)> = evens
        .iter()
        .map(|c| (c.slot, if c.slot.is_multiple_of(4) { c.pos } else { mid }))
        .collect();
    let want: Vec<String> = pieces
        .iter()
        .filter(|e| slot_of(e).is_multiple_of(4) || e.pos > mid)
        .map(|e| e.event.token.event_id.clone())
        .collect();
    let got = cs(&db)
        .read_batch(&CursorRead {
            from: staggered.clone(),
            limit: 100_000,
        })
        .await
        .unwrap();
    let got: Vec<String> = got
        .events
        .iter()
        .map(|e| e.event.token.event_id.clone())
        .collect();
    assert_eq!(got, want, "per-slot positions");
    // and cut at a small limit: each slot's intents once, in order (slots far behind the
    // others may be read beside them, so the order across slots can differ)
    let per_slot = |v: Vec<(SlotId, String)>| {
        let mut m: std::collections::BTreeMap<SlotId, Vec<String>> = Default::default();
        for (s, id) in v {
            m.entry(s).or_default().push(id);
        }
        m
    };
    let want = per_slot(
        pieces
            .iter()
            .filter(|e| slot_of(e).is_multiple_of(4) || e.pos > mid)
            .map(|e| (slot_of(e), e.event.token.event_id.clone()))
            .collect(),
    );
    let mut from = staggered;
    let mut got = Vec::new();
    for _ in 0..1000 {
        let b = read_on(&db, &mut from, 3).await;
        got.extend(
            b.events
                .iter()
                .map(|e| (slot_of(e), e.event.token.event_id.clone())),
        );
        if !b.more && b.events.is_empty() {
            break;
        }
    }
    assert_eq!(per_slot(got), want, "per-slot positions, in pieces");
    if db.backend == ferry_store::Backend::Postgres {
        assert!(
            pieces.last().unwrap().pos.tick > 20,
            "the odd reader took many ticks: {:?}",
            pieces.last().unwrap().pos
        );
    }
    db.cleanup().await;
}

/// A database restored on a server whose transaction ids are lower than the ones its ticks
/// and rows hold (a logical dump restored elsewhere, a logical-replication switchover) must not
/// make new intents look dispatched (PostgreSQL; the other stores keep no transaction ids). The
/// restore is simulated by moving every stored xid up by 10^9. Reads, status and purge then
/// refuse; a starting relay's `set_dispatch_mode` re-bases the cursors, after which the
/// restored undispatched intents (an unknown outcome among them) and every intent written
/// since come back once, in per-aggregate order, and the dispatched ones stay SENT.
pub async fn restored_elsewhere_rebases_cursors(db: TestDb) {
    if db.backend != ferry_store::Backend::Postgres {
        eprintln!("not applicable: only PostgreSQL cursors hold transaction ids");
        db.cleanup().await;
        return;
    }
    let cursors = owned(&db, "a").await;
    db.store
        .enqueue(&[ev("s", 1), ev("s", 2), ev("u", 1), ev("u", 2)])
        .await
        .unwrap();
    let b = read_until(&db, &read_req(&cursors, 10), 4).await;
    let adv = advance_all(
        "a",
        &cursors,
        b.upto,
        vec![
            exception(find(&b, "u", 1), ExceptionKind::Unknown("no answer".into())),
            exception(find(&b, "u", 2), ExceptionKind::Held),
        ],
    );
    assert_eq!(cs(&db).advance(&adv).await.unwrap(), AdvanceResult::Applied);
    db.store.enqueue(&[ev("p", 1), ev("p", 2)]).await.unwrap(); // not yet dispatched
    assert_eq!(state(&db, "e-s-2").await, Some(EventState::Sent));

    // the "restore": every stored transaction id is 10^9 ahead of this server's
    const D: &str = "1000000000";
    db.exec(&format!(
        "UPDATE ferry_outbox SET xid = xid + {D} WHERE xid IS NOT NULL"
    ))
    .await
    .unwrap();
    db.exec(&format!(
        "UPDATE ferry_slot_lease SET cursor_xid = cursor_xid + {D} WHERE cursor_xid > 0"
    ))
    .await
    .unwrap();
    db.exec(&format!(
        "UPDATE ferry_tick SET snap = ((pg_snapshot_xmin(snap)::text::int8 + {D})::text || ':' || \
           (pg_snapshot_xmax(snap)::text::int8 + {D})::text || ':' || \
           coalesce((SELECT string_agg((x::text::int8 + {D})::text, ',') FROM pg_snapshot_xip(snap) x), ''))::pg_snapshot"
    ))
    .await
    .unwrap();
    db.store.enqueue(&[ev("n", 1), ev("n", 2)]).await.unwrap(); // written after the restore

    // before the re-base: nothing reads past the restored ticks, nothing is counted or purged
    let backwards = |e: ferry_core::StoreError| {
        assert!(
            e.to_string().contains("went backwards"),
            "the error says why: {e}"
        )
    };
    backwards(db.store.status().await.unwrap_err());
    backwards(
        db.store
            .purge_sent(&crate::purge_all(10))
            .await
            .unwrap_err(),
    );
    let mut refused = false;
    for _ in 0..10 {
        let cursors = cs(&db).load_cursors("a", &all_slots()).await.unwrap();
        match cs(&db).read_batch(&read_req(&cursors, 100)).await {
            Err(e) => {
                backwards(e);
                refused = true;
                break;
            }
            // windows cut before the restore may still be read: they hold none of these rows
            Ok(b) => {
                assert!(
                    b.events.is_empty(),
                    "nothing past the restored ticks: {:?}",
                    b.events
                );
                cs(&db)
                    .advance(&advance_all("a", &cursors, b.upto, vec![]))
                    .await
                    .unwrap();
            }
        }
    }
    assert!(refused, "a read needing a new tick is refused");

    // a starting relay re-bases the cursors
    assert!(cs(&db)
        .set_dispatch_mode(DispatchMode::Cursor, "a")
        .await
        .unwrap());
    let cursors = owned(&db, "a").await;
    let b = read_until(&db, &read_req(&cursors, 100), 6).await;
    let ids: Vec<&str> = b
        .events
        .iter()
        .map(|e| e.event.token.event_id.as_str())
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        vec!["e-n-1", "e-n-2", "e-p-1", "e-p-2", "e-u-1", "e-u-2"],
        "undispatched and new intents, once; the dispatched ones not again: {ids:?}"
    );
    for agg in ["n", "p", "u"] {
        let vs: Vec<i64> = b
            .events
            .iter()
            .filter(|e| e.event.aggregate_id == agg)
            .map(|e| e.event.aggregate_version)
            .collect();
        assert_eq!(vs, vec![1, 2], "{agg} in order");
    }
    assert!(b.events.iter().all(|e| !e.held));
    assert_eq!(state(&db, "e-s-1").await, Some(EventState::Sent));
    assert_eq!(db.store.status().await.unwrap().pending, 6);
    cs(&db)
        .advance(&advance_all("a", &cursors, b.upto, vec![]))
        .await
        .unwrap();
    assert_eq!(db.store.status().await.unwrap().pending, 0);
    // and later intents flow as before
    db.store.enqueue(&[ev("n", 3)]).await.unwrap();
    let cursors = cs(&db).load_cursors("a", &all_slots()).await.unwrap();
    let b = read_until(&db, &read_req(&cursors, 100), 1).await;
    let ids: Vec<&str> = b
        .events
        .iter()
        .map(|e| e.event.token.event_id.as_str())
        .collect();
    assert_eq!(ids, vec!["e-n-3"]);
    db.cleanup().await;
}

/// Every case, in order.
pub const CASES: &[Case<TestDb>] = &[
    Case {
        name: "read_advance_derives_sent",
        sql_only: true,
        run: |db| Box::pin(read_advance_derives_sent(db)),
    },
    Case {
        name: "reads_are_cut_at_the_limit_and_resume",
        sql_only: true,
        run: |db| Box::pin(reads_are_cut_at_the_limit_and_resume(db)),
    },
    Case {
        name: "stale_owner_advance_is_fenced",
        sql_only: true,
        run: |db| Box::pin(stale_owner_advance_is_fenced(db)),
    },
    Case {
        name: "lookup_advance_finds_a_committed_advance",
        sql_only: true,
        run: |db| Box::pin(lookup_advance_finds_a_committed_advance(db)),
    },
    Case {
        name: "exceptions_hold_successors_in_order",
        sql_only: true,
        run: |db| Box::pin(exceptions_hold_successors_in_order(db)),
    },
    Case {
        name: "reconcile_and_purge_use_derived_states",
        sql_only: true,
        run: |db| Box::pin(reconcile_and_purge_use_derived_states(db)),
    },
    Case {
        name: "purge_by_age_stops_at_young_rows",
        sql_only: true,
        run: |db| Box::pin(purge_by_age_stops_at_young_rows(db)),
    },
    Case {
        name: "open_transactions_delay_only_their_own_rows",
        sql_only: true,
        run: |db| Box::pin(open_transactions_delay_only_their_own_rows(db)),
    },
    Case {
        name: "a_running_statement_of_a_long_transaction_is_waited_for",
        sql_only: true,
        run: |db| Box::pin(a_running_statement_of_a_long_transaction_is_waited_for(db)),
    },
    Case {
        name: "mode_switch_converts_state",
        sql_only: true,
        run: |db| Box::pin(mode_switch_converts_state(db)),
    },
    Case {
        name: "slot_subset_readers_get_exactly_their_slots",
        sql_only: true,
        run: |db| Box::pin(slot_subset_readers_get_exactly_their_slots(db)),
    },
    Case {
        name: "a_lagging_slot_holds_the_others_back_no_longer",
        sql_only: true,
        run: |db| Box::pin(a_lagging_slot_holds_the_others_back_no_longer(db)),
    },
    Case {
        name: "a_reader_behind_many_ticks_misses_nothing",
        sql_only: true,
        run: |db| Box::pin(a_reader_behind_many_ticks_misses_nothing(db)),
    },
    Case {
        name: "restored_elsewhere_rebases_cursors",
        sql_only: true,
        run: |db| Box::pin(restored_elsewhere_rebases_cursors(db)),
    },
];

/// Runs every case, in order, each on a fresh database from `factory`. Panics at the first
/// failing case.
pub async fn exercise<F, Fut>(mut factory: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = TestDb>,
{
    for case in CASES {
        let db = factory().await;
        let cleanup = db.cleanup_handle();
        (case.run)(db).await;
        cleanup.run().await;
    }
}
