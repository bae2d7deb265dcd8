//! Cursor dispatch on PostgreSQL reads a window in `seq` order, which is an aggregate's version
//! order only if the outbox's identity sequence hands out values in time order: a sequence that
//! caches values per session is refused, naming the fix.
use ferry_core::{DispatchMode, StoreErrorKind};
use ferry_store::Backend;
use ferry_testkit::TestDb;

#[tokio::test]
async fn a_cached_outbox_sequence_is_refused_in_cursor_dispatch() {
    let Some(db) = TestDb::open(Backend::Postgres).await else {
        return;
    };
    let cs = db.store.cursor().expect("cursor dispatch on PostgreSQL");
    db.exec("ALTER TABLE ferry_outbox ALTER COLUMN seq SET CACHE 20")
        .await
        .unwrap();
    let err = cs
        .set_dispatch_mode(DispatchMode::Cursor, "seq-cache")
        .await
        .expect_err("a sequence with CACHE 20 must be refused");
    assert_eq!(err.kind(), StoreErrorKind::InvalidInput, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("caches 20 values") && msg.contains("CACHE 1"),
        "{msg}"
    );
    // row dispatch does not depend on seq order
    cs.set_dispatch_mode(DispatchMode::Row, "seq-cache")
        .await
        .unwrap();
    db.exec("ALTER TABLE ferry_outbox ALTER COLUMN seq SET CACHE 1")
        .await
        .unwrap();
    assert!(cs
        .set_dispatch_mode(DispatchMode::Cursor, "seq-cache")
        .await
        .unwrap());
    db.cleanup().await;
}
