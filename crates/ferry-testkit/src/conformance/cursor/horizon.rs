//! Open producer transactions: they delay only their own rows (PostgreSQL's horizon,
//! MariaDB's commit gate), and a running statement of a long one is waited for.
use std::time::Duration;

use ferry_core::{EventState, SlotCursor};

use super::super::slots::all_slots;
use super::relay::{
    advance_to, agg_in_slot, cs, drain, ev, ids, only_on, owned, read_req, read_until, state,
};
use crate::db::TestDb;

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
    assert_eq!(ids(&b), vec!["e-early-1"], "only the committed intent");
    let h = cs(&db).horizon().await.unwrap();
    assert!(
        h.oldest_xact_pid.is_some(),
        "the open transaction is reported: {h:?}"
    );
    advance_to(&db, "a", &cursors, b.upto, vec![]).await;
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
        advance_to(&db, "a", &cursors, b.upto, vec![]).await;
        cursors = cs(&db).load_cursors("a", &all_slots()).await.unwrap();
    }
    assert_eq!(seen, vec!["e-late-1".to_string()]);
    assert_eq!(state(&db, "e-late-1").await, Some(EventState::Sent));
    assert!(db.store.record("e-gone-1").await.unwrap().is_none());
    db.cleanup().await;
}

/// MySQL/MariaDB (the commit gate): an open producer transaction holds back the slots it wrote
/// once it is idle: intents committed after it began are read in every other slot, not in its
/// own; once it ends, its intents and the later ones of its slots are read in `seq` order, and
/// a rolled-back one never appears.
async fn open_transactions_hold_the_mysql_horizon(
    db: TestDb,
    cursors: Vec<SlotCursor>,
    open: crate::db::OpenTx,
    rolled: crate::db::OpenTx,
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
    let why = "MySQL/MariaDB only: the commit gate";
    let Some(db) = only_on(db, ferry_store::Backend::Mysql, why).await else {
        return;
    };
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
