//! MariaDB, cursor dispatch: a purge batch must not lock the slot leases. The relays renew them
//! and advance their cursors in them; a purge whose `DELETE` read the cursor view in a subquery
//! share-locked every lease row it joined (InnoDB reads a DML statement's subquery with locks)
//! for as long as the statement ran, and beside a flat-out load the renewals waited up to 23 s
//! behind it until the relay lost its slots (docs/notes/2026-12-07-steady-state-log.md). The
//! purge now chooses its rows with a plain read and deletes them by key.
use std::time::Duration;

use ferry_core::{DispatchMode, NewEvent, PurgeRequest};
use ferry_store::Backend;
use ferry_testkit::TestDb;
use sqlx::{Connection, Executor, MySqlConnection};

#[tokio::test]
async fn a_purge_waiting_on_a_row_lock_leaves_the_slot_leases_free() {
    let Some(db) = TestDb::open(Backend::Mysql).await else {
        return;
    };
    let events: Vec<NewEvent> = (1..=20)
        .map(|i| NewEvent::new(format!("a-{i}"), 1, "t", "created", "{}"))
        .collect();
    db.store.enqueue(&events).await.unwrap();
    // cursor dispatch, every intent behind its slot's cursor: delivered
    let cursor = db.store.cursor().expect("cursor dispatch on MariaDB");
    assert!(cursor
        .set_dispatch_mode(DispatchMode::Cursor, "test")
        .await
        .unwrap());
    let behind = db.exec("UPDATE ferry_slot_lease SET cursor_seq = 1000000000");
    assert_eq!(behind.await.unwrap(), 256);
    tokio::time::sleep(Duration::from_millis(20)).await;

    // an application transaction holds the newest intent's row
    let newest = db
        .scalar("SELECT max(seq) FROM ferry_outbox")
        .await
        .unwrap();
    let slot = db
        .scalar("SELECT shard_slot FROM ferry_outbox ORDER BY seq LIMIT 1")
        .await
        .unwrap();
    let mut holder = MySqlConnection::connect(&db.url).await.unwrap();
    holder.execute("BEGIN").await.unwrap();
    holder
        .execute(format!("SELECT seq FROM ferry_outbox WHERE seq = {newest} FOR UPDATE").as_str())
        .await
        .unwrap();

    // a purge starts and waits for that row
    let everything_sent = PurgeRequest {
        older_than: Duration::ZERO,
        batch: 1000,
        consumer: None,
        dry_run: false,
        vacuum: false,
    };
    let store = db.store.clone();
    let purge = tokio::spawn(async move { store.purge_sent(&everything_sent).await });
    tokio::time::sleep(Duration::from_millis(500)).await;

    // a relay renews the lease of the oldest intent's slot meanwhile
    let mut relay = MySqlConnection::connect(&db.url).await.unwrap();
    relay
        .execute("SET SESSION innodb_lock_wait_timeout = 2")
        .await
        .unwrap();
    let renewed = relay
        .execute(
            format!(
                "UPDATE ferry_slot_lease SET lease_until = UTC_TIMESTAMP(6) + INTERVAL 15 SECOND \
                 WHERE slot = {slot}"
            )
            .as_str(),
        )
        .await;
    holder.execute("ROLLBACK").await.unwrap();
    let purged = purge.await.unwrap().unwrap();
    assert!(
        renewed.is_ok(),
        "the lease renewal waited for the purge: {renewed:?}"
    );
    assert_eq!(purged, 20);
    assert_eq!(
        db.scalar("SELECT count(*) FROM ferry_outbox")
            .await
            .unwrap(),
        0
    );
}
