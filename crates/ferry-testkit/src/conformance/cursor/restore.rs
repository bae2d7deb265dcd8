//! A database restored on a server with lower transaction ids (PostgreSQL).

use ferry_core::{AdvanceResult, DispatchMode, EventState, ExceptionKind};

use super::super::slots::all_slots;
use super::relay::{
    advance_to, cs, ev, exception, find, ids, only_on, own_and_read, owned, read_req, read_until,
    state, unknown,
};
use crate::db::TestDb;

/// A database restored on a server whose transaction ids are lower than the ones its ticks
/// and rows hold (a logical dump restored elsewhere, a logical-replication switchover) must not
/// make new intents look dispatched (PostgreSQL; the other stores keep no transaction ids). The
/// restore is simulated by moving every stored xid up by 10^9. Reads, status and purge then
/// refuse; a starting relay's `set_dispatch_mode` re-bases the cursors, after which the
/// restored undispatched intents (an unknown outcome among them) and every intent written
/// since come back once, in per-aggregate order, and the dispatched ones stay SENT.
pub async fn restored_elsewhere_rebases_cursors(db: TestDb) {
    let why = "not applicable: only PostgreSQL cursors hold transaction ids";
    let Some(db) = only_on(db, ferry_store::Backend::Postgres, why).await else {
        return;
    };
    let (cursors, b) = own_and_read(&db, &[ev("s", 1), ev("s", 2), ev("u", 1), ev("u", 2)]).await;
    let exceptions = vec![
        unknown(find(&b, "u", 1)),
        exception(find(&b, "u", 2), ExceptionKind::Held),
    ];
    let r = advance_to(&db, "a", &cursors, b.upto, exceptions).await;
    assert_eq!(r, AdvanceResult::Applied);
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
            .purge_sent(&crate::fixtures::purge_all(10))
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
                advance_to(&db, "a", &cursors, b.upto, vec![]).await;
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
    let read = ids(&b);
    let mut sorted = read.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        vec!["e-n-1", "e-n-2", "e-p-1", "e-p-2", "e-u-1", "e-u-2"],
        "undispatched and new intents, once; the dispatched ones not again: {read:?}"
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
    advance_to(&db, "a", &cursors, b.upto, vec![]).await;
    assert_eq!(db.store.status().await.unwrap().pending, 0);
    // and later intents flow as before
    db.store.enqueue(&[ev("n", 3)]).await.unwrap();
    let cursors = cs(&db).load_cursors("a", &all_slots()).await.unwrap();
    let b = read_until(&db, &read_req(&cursors, 100), 1).await;
    assert_eq!(ids(&b), vec!["e-n-3"]);
    db.cleanup().await;
}
