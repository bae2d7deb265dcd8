//! MariaDB: `ferry_outbox_predecessor` leads with `state`, so a row claim finds an aggregate's
//! lowest PENDING version past its window with one probe that never reads SENT versions
//! (`ferry_store::mysql` claim; docs/schema.md §3.4). Migration 13 rebuilds an index of the old
//! order (`aggregate_id, state, aggregate_version`) where it exists, and leaves a table in cursor
//! dispatch (which has no such index) alone.
use ferry_core::DispatchMode;
use ferry_store::Backend;
use ferry_testkit::TestDb;

/// The index's columns: (how many, whether `state` is the first).
async fn predecessor(db: &TestDb) -> (i64, bool) {
    let of = "FROM information_schema.STATISTICS WHERE table_schema = DATABASE() \
              AND table_name = 'ferry_outbox' AND index_name = 'ferry_outbox_predecessor'";
    let n = db.scalar(&format!("SELECT count(*) {of}")).await.unwrap();
    let first = db
        .scalar(&format!(
            "SELECT count(*) {of} AND seq_in_index = 1 AND column_name = 'state'"
        ))
        .await
        .unwrap();
    (n, first == 1)
}

async fn forget_migration_13(db: &TestDb) {
    let v = ferry_store::MIGRATIONS_MYSQL
        .iter()
        .find(|m| m.name == "predecessor_by_state")
        .expect("migration predecessor_by_state")
        .version;
    db.exec(&format!(
        "DELETE FROM ferry_schema_migrations WHERE version = {v}"
    ))
    .await
    .unwrap();
}

#[tokio::test]
async fn the_predecessor_index_leads_with_state_after_migration_13() {
    let Some(db) = TestDb::open(Backend::Mysql).await else {
        return;
    };
    let cs = db.store.cursor().expect("cursor dispatch on MariaDB");
    assert_eq!(cs.dispatch_mode().await.unwrap(), DispatchMode::Row);
    assert_eq!(predecessor(&db).await, (3, true), "a fresh outbox");

    // an outbox migrated before migration 13, in row dispatch
    db.exec(
        "ALTER TABLE ferry_outbox DROP INDEX ferry_outbox_predecessor, \
         ADD INDEX ferry_outbox_predecessor (aggregate_id, state, aggregate_version)",
    )
    .await
    .unwrap();
    assert_eq!(predecessor(&db).await, (3, false));
    forget_migration_13(&db).await;
    let applied = ferry_store::migrate_url(&db.url).await.unwrap();
    assert_eq!(applied.len(), 1, "{applied:?}");
    assert_eq!(predecessor(&db).await, (3, true), "rebuilt");
    // run again (a migration that died before its version row was written): nothing changes
    forget_migration_13(&db).await;
    ferry_store::migrate_url(&db.url).await.unwrap();
    assert_eq!(predecessor(&db).await, (3, true), "re-run");

    // in cursor dispatch the index does not exist, and the migration does not build it
    assert!(cs
        .set_dispatch_mode(DispatchMode::Cursor, "pi")
        .await
        .unwrap());
    assert_eq!(predecessor(&db).await, (0, false), "cursor dispatch");
    forget_migration_13(&db).await;
    ferry_store::migrate_url(&db.url).await.unwrap();
    assert_eq!(
        predecessor(&db).await,
        (0, false),
        "cursor dispatch, migrated"
    );
    assert!(cs.set_dispatch_mode(DispatchMode::Row, "pi").await.unwrap());
    assert_eq!(predecessor(&db).await, (3, true), "back in row dispatch");
    db.cleanup().await;
}
