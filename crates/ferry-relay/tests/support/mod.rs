//! What the relay tests share.
use ferry_store::Backend;
use ferry_testkit::TestDb;

/// Commits one intent with a plain `INSERT` into `ferry_outbox` (as a producer outside ferry
/// would), into the `slot` given rather than the aggregate's own: event id `event_id`, key and
/// aggregate `agg`, version `v`, empty headers and payload.
pub async fn insert_intent(db: &TestDb, event_id: &str, agg: &str, v: i64, slot: u16, topic: &str) {
    let timestamps = match db.backend {
        // SQLite has no defaults for the timestamps (the Rust API and the insert view set them)
        Backend::Sqlite => (", created_at, available_at", ", 1, 1"),
        _ => ("", ""),
    };
    db.exec(&format!(
        "INSERT INTO ferry_outbox (event_id, aggregate_id, aggregate_version, shard_slot, topic, \
         msg_key, event_type, headers, payload{}) \
         VALUES ('{event_id}', '{agg}', {v}, {slot}, '{topic}', '{agg}', 'T', '{{}}', '{{}}'{})",
        timestamps.0, timestamps.1
    ))
    .await
    .unwrap();
}
