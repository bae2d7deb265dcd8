//! PostgreSQL keeps 30 % of each outbox heap page free for row dispatch's HOT updates; cursor
//! dispatch never updates an outbox row, so it fills the pages (fillfactor 100), and a switch
//! back to row dispatch restores 70.
use ferry_core::DispatchMode;
use ferry_store::Backend;
use ferry_testkit::TestDb;

async fn fillfactor(db: &TestDb) -> i64 {
    db.scalar(
        "SELECT coalesce((SELECT substr(o, 12)::int8 FROM unnest(c.reloptions) o \
           WHERE o LIKE 'fillfactor=%'), 100) \
         FROM pg_class c WHERE c.oid = 'ferry_outbox'::regclass",
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn the_outbox_fillfactor_follows_the_dispatch_mode() {
    let Some(db) = TestDb::open(Backend::Postgres).await else {
        return;
    };
    let cs = db.store.cursor().expect("cursor dispatch on PostgreSQL");
    cs.set_dispatch_mode(DispatchMode::Row, "ff").await.unwrap();
    assert_eq!(fillfactor(&db).await, 70, "row dispatch");
    assert!(cs
        .set_dispatch_mode(DispatchMode::Cursor, "ff")
        .await
        .unwrap());
    assert_eq!(fillfactor(&db).await, 100, "cursor dispatch");
    assert!(cs.set_dispatch_mode(DispatchMode::Row, "ff").await.unwrap());
    assert_eq!(fillfactor(&db).await, 70, "back in row dispatch");
    db.cleanup().await;
}
