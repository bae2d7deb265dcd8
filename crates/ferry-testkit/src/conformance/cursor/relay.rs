//! What the cases do as a cursor relay: take the slots, read, advance (and the intents they
//! enqueue).
use std::time::Duration;

use ferry_core::{
    CursorAdvance, CursorPos, CursorRead, CursorStore, DispatchMode, EventState, ExceptionKind,
    NewEvent, NewException, SlotAdvance, SlotCursor, SlotId, SLOT_COUNT,
};

use super::super::slots::all_slots;
use crate::db::TestDb;

pub(super) const LONG: Duration = Duration::from_secs(60);

pub(super) fn ev(agg: &str, v: i64) -> NewEvent {
    crate::fixtures::intent("orders", agg, v)
}

pub(in crate::conformance) fn cs(db: &TestDb) -> &dyn CursorStore {
    db.store.cursor().expect("cursor dispatch on this store")
}

/// Switches to cursor mode and takes every slot for `owner`.
pub(in crate::conformance) async fn owned(db: &TestDb, owner: &str) -> Vec<SlotCursor> {
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

pub(in crate::conformance) fn read_req(cursors: &[SlotCursor], limit: usize) -> CursorRead {
    CursorRead {
        from: cursors.iter().map(|c| (c.slot, c.pos)).collect(),
        limit,
    }
}

/// Advances every slot to `to`, with `exceptions`.
pub(super) fn advance_all(
    owner: &str,
    cursors: &[SlotCursor],
    to: CursorPos,
    exceptions: Vec<NewException>,
) -> CursorAdvance {
    advance_each(owner, cursors, |_| to, exceptions)
}

/// Advances each slot to `to(slot)`, with `exceptions`.
pub(in crate::conformance) fn advance_each(
    owner: &str,
    cursors: &[SlotCursor],
    to: impl Fn(SlotId) -> CursorPos,
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
                to: to(c.slot),
            })
            .collect(),
        exceptions,
    }
}

/// Reads until at least `want` events come back. On PostgreSQL any open write transaction in
/// the cluster (another test's) holds the read horizon back for a while: wait it out.
pub(in crate::conformance) async fn read_until(
    db: &TestDb,
    req: &CursorRead,
    want: usize,
) -> ferry_core::CursorBatch {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let b = cs(db).read_batch(req).await.unwrap();
        if b.events.len() >= want || tokio::time::Instant::now() > deadline {
            return b;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads past `from` and moves every position in it to how far the read went (a reader that keeps
/// its positions in memory, as a relay worker does between advances).
pub(super) async fn read_on(
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

/// Reads and advances `owner`'s cursors until `stop` holds for the ids read so far (or
/// `within` passes); returns every id read, in read order.
pub(super) async fn drain(
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

pub(super) async fn state(db: &TestDb, id: &str) -> Option<EventState> {
    db.store.record(id).await.unwrap().map(|r| r.state)
}

/// The event of `agg` at version `v` in a read.
pub(super) fn find<'b>(
    b: &'b ferry_core::CursorBatch,
    agg: &str,
    v: i64,
) -> &'b ferry_core::CursorEvent {
    b.events
        .iter()
        .find(|e| e.event.aggregate_id == agg && e.event.aggregate_version == v)
        .unwrap_or_else(|| panic!("{agg} v{v} in the read"))
}

/// An exception row for a read event.
pub(super) fn exception(e: &ferry_core::CursorEvent, kind: ExceptionKind) -> NewException {
    NewException {
        seq: e.event.token.seq,
        slot: e.event.shard_slot,
        aggregate_id: e.event.aggregate_id.clone(),
        aggregate_version: e.event.aggregate_version,
        attempts: 0,
        kind,
    }
}

/// An aggregate id other than `taken` whose slot is `slot`'s (`prefix-<n>`).
pub(super) fn agg_in_slot(prefix: &str, slot: ferry_core::SlotId, taken: &[&str]) -> String {
    (0..100_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|a| ferry_core::slot_for(a) == slot && !taken.contains(&a.as_str()))
        .expect("an aggregate id in the slot")
}

/// Takes every slot for `a`, enqueues `evs` and reads until they all came back (10 at most):
/// `a`'s cursors and the read.
pub(super) async fn own_and_read(
    db: &TestDb,
    evs: &[NewEvent],
) -> (Vec<SlotCursor>, ferry_core::CursorBatch) {
    let cursors = owned(db, "a").await;
    db.store.enqueue(evs).await.unwrap();
    let b = read_until(db, &read_req(&cursors, 10), evs.len()).await;
    (cursors, b)
}

/// Advances every slot of `owner`'s `cursors` to `to`, with `exceptions`.
pub(super) async fn advance_to(
    db: &TestDb,
    owner: &str,
    cursors: &[SlotCursor],
    to: CursorPos,
    exceptions: Vec<NewException>,
) -> ferry_core::AdvanceResult {
    cs(db)
        .advance(&advance_all(owner, cursors, to, exceptions))
        .await
        .unwrap()
}

/// An exception row for a read event whose send got no answer.
pub(super) fn unknown(e: &ferry_core::CursorEvent) -> NewException {
    exception(e, ExceptionKind::Unknown("no answer".into()))
}

/// The event ids of a read, in read order.
pub(super) fn ids(b: &ferry_core::CursorBatch) -> Vec<&str> {
    b.events
        .iter()
        .map(|e| e.event.token.event_id.as_str())
        .collect()
}

/// `db` if it is a `backend` database; otherwise prints why the case does not apply (`why`)
/// and drops the database.
pub(super) async fn only_on(
    db: TestDb,
    backend: ferry_store::Backend,
    why: &str,
) -> Option<TestDb> {
    if db.backend == backend {
        return Some(db);
    }
    eprintln!("{why}");
    db.cleanup().await;
    None
}
