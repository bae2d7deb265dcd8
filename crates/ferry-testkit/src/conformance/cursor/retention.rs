//! Reconciliation and purge over the derived states.
use std::time::Duration;

use ferry_core::{EventState, Watermark};

use super::relay::{
    advance_to, ev, find, own_and_read, owned, read_req, read_until, state, unknown,
};
use crate::db::TestDb;

/// Reconciliation and retention see the derived states: SENT behind the cursor, PENDING ahead,
/// exception states as written; purge deletes only SENT rows behind the cursors.
pub async fn reconcile_and_purge_use_derived_states(db: TestDb) {
    let (cursors, b) = own_and_read(&db, &[ev("r", 1), ev("r", 2), ev("s", 1)]).await;
    advance_to(&db, "a", &cursors, b.upto, vec![unknown(find(&b, "r", 2))]).await;
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
            ..crate::fixtures::purge_all(10)
        })
        .await
        .unwrap();
    assert_eq!(dry, 2);
    let n = db
        .store
        .purge_sent(&crate::fixtures::purge_all(1))
        .await
        .unwrap();
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
    advance_to(&db, "a", &cursors, b.upto, vec![unknown(find(&b, "p", 1))]).await;
    let by_age = |dry_run, vacuum| ferry_core::PurgeRequest {
        older_than: Duration::from_secs(1),
        dry_run,
        vacuum,
        ..crate::fixtures::purge_all(1)
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
    assert_eq!(
        db.store
            .purge_sent(&crate::fixtures::purge_all(10))
            .await
            .unwrap(),
        1
    );
    assert!(db.store.record("e-y-1").await.unwrap().is_none());
    assert_eq!(state(&db, "e-p-1").await, Some(EventState::Pending));
    db.cleanup().await;
}
