//! A purge on SQLite takes its turn on the in-process write gate, like every other writer of the
//! store: its batches queue in order with the producers, claims and advances instead of sleeping
//! in SQLite's busy handler, which let every writer that met a purge batch sleep up to 100 ms per
//! collision (docs/schema.md §4.4, "The write gate"; docs/performance.md, "Retention beside the
//! load on SQLite").
use std::time::Duration;

use ferry_core::{OutboxStore, PurgeRequest};
use ferry_store::sqlite::SqliteStore;
use ferry_testkit::TempDir;

/// Delivered intents, sent long ago.
const SENT_LONG_AGO: &str = "INSERT INTO ferry_outbox (event_id, aggregate_id, aggregate_version, \
     shard_slot, topic, msg_key, event_type, payload, created_at, available_at, state, sent_at) \
     SELECT 'e-' || value, 'a-' || value, 1, 0, 't', 'k', 'x', '{}', 1, 1, 'SENT', 1 \
     FROM json_each('[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]')";

#[tokio::test]
async fn a_purge_batch_queues_on_the_write_gate_in_order() {
    let dir = TempDir::new("ferry-sqlite-purge-gate").unwrap();
    let file = dir.path().join("outbox.db");
    let store = SqliteStore::connect(&format!("sqlite://{}", file.display()), &Default::default())
        .await
        .unwrap();
    sqlx::query(SENT_LONG_AGO)
        .execute(store.pool())
        .await
        .unwrap();

    // A writer holds the gate and the write lock; a purge starts, then another writer
    let first = store.begin_write().await.unwrap();
    let purge = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .purge_sent(&PurgeRequest {
                    older_than: Duration::from_secs(1),
                    batch: 1000,
                    consumer: None,
                    dry_run: false,
                    vacuum: false,
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let later = tokio::spawn({
        let store = store.clone();
        async move {
            let mut tx = store.begin_write().await.unwrap();
            let left: i64 = sqlx::query_scalar("SELECT count(*) FROM ferry_outbox")
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            left
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.commit().await.unwrap();

    // the purge's batch was queued before the later writer: it ran and committed first
    assert_eq!(
        later.await.unwrap(),
        0,
        "the writer that queued after the purge found its rows still there"
    );
    assert_eq!(purge.await.unwrap().unwrap(), 10);
}
