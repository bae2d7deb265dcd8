//! What the relay tests share. Each test crate uses a part of it.
#![allow(dead_code)]
use std::sync::Mutex;
use std::time::Duration;

use ferry_core::{BoxFuture, ClaimedEvent, DispatchMode, Outcome};
use ferry_relay::{RelayConfig, Sink};
use ferry_store::Backend;
use ferry_testkit::TestDb;

/// A relay in `mode` that reacts quickly: 2 workers, batches of 50, a heartbeat of 200 ms, slot
/// leases of 2 s, a poll every 50 ms when idle, claim leases of 20 s, status every 200 ms.
pub fn relay_config(mode: DispatchMode) -> RelayConfig {
    RelayConfig {
        dispatch: Some(mode),
        workers: 2,
        batch_size: 50,
        heartbeat: Duration::from_millis(200),
        slot_ttl: Duration::from_secs(2),
        poll_idle: Duration::from_millis(50),
        claim_lease: Duration::from_secs(20),
        status_interval: Duration::from_millis(200),
        ..Default::default()
    }
}

/// Acks everything; records `(topic, aggregate, version)` in the order items were handed to it
/// (shared by the relays of a test).
#[derive(Default)]
pub struct RecordingSink {
    handed: Mutex<Vec<(String, String, i64)>>,
}

impl RecordingSink {
    /// Everything handed so far, in order.
    pub fn handed(&self) -> Vec<(String, String, i64)> {
        self.handed.lock().unwrap().clone()
    }
    /// Whether version `v` of `agg` was handed.
    pub fn has(&self, agg: &str, v: i64) -> bool {
        self.handed().iter().any(|(_, a, x)| a == agg && *x == v)
    }
    /// The versions of `agg` handed so far, in order.
    pub fn versions_of(&self, agg: &str) -> Vec<i64> {
        self.handed()
            .into_iter()
            .filter(|(_, a, _)| a == agg)
            .map(|(_, _, v)| v)
            .collect()
    }
}

impl Sink for RecordingSink {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn send_batch<'a>(&'a self, items: &'a [ClaimedEvent]) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(async move {
            self.handed.lock().unwrap().extend(
                items
                    .iter()
                    .map(|e| (e.topic.clone(), e.aggregate_id.clone(), e.aggregate_version)),
            );
            vec![Outcome::Acked; items.len()]
        })
    }
}

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
