//! Switching between row and cursor dispatch converts the delivery state both ways.

use ferry_core::{DispatchMode, EventState, ExceptionKind};

use super::super::slots::all_slots;
use super::relay::{advance_all, cs, ev, exception, find, read_req, read_until, state, LONG};
use crate::db::TestDb;

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
    let claimed = db
        .store
        .claim(&crate::fixtures::claim_all(10, LONG))
        .await
        .unwrap();
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
    let held = exception(find(&b, "m", 2), ExceptionKind::Held);
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
    let again = db
        .store
        .claim(&crate::fixtures::claim_all(10, LONG))
        .await
        .unwrap();
    let ids: Vec<&str> = again.iter().map(|e| e.token.event_id.as_str()).collect();
    assert_eq!(ids, vec!["e-m-1"]);
    db.cleanup().await;
}
