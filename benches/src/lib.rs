//! Shared fixtures of the ferry criterion benches (`cargo bench -p ferry-benches`).
//!
//! Benches measure; they assert nothing about speed. The store benches run on the in-memory
//! store and SQLite (a file in a temporary directory); PostgreSQL and MariaDB join when
//! `FERRY_TEST_POSTGRES_URL` / `FERRY_TEST_MYSQL_URL` name a server (a fresh schema/database
//! per bench, dropped at the end, via `ferry_testkit::TestDb`).
//!
//! Sizes are chosen so the whole suite finishes in well under ten minutes on 2 cores: few
//! samples, short measurement windows, setup (enqueueing) outside the timed sections.
#![warn(missing_docs, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use criterion::Criterion;
use ferry_core::{ClaimRequest, NewEvent, OutboxStore};
use ferry_relay::{Metrics, NullSink, Relay, RelayConfig};
use ferry_store::Backend;
use ferry_testkit::memory::MemoryStore;
use ferry_testkit::{Cleanup, RelayTask, TestDb};

/// The payload size of the performance goals (200 bytes, docs/performance.md).
pub const PAYLOAD_BYTES: usize = 200;

/// A criterion configuration for slow, whole-system benches: 10 samples, a short window.
pub fn quick(measurement: Duration) -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(measurement)
        .configure_from_args()
}

/// A multi-thread tokio runtime with one worker per core (2 on the reference machine).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A JSON payload of exactly `bytes` bytes (at least 11).
pub fn payload(bytes: usize) -> String {
    let pad = bytes.saturating_sub(10).max(1);
    let p = format!(r#"{{"pad":"{}"}}"#, "x".repeat(pad));
    debug_assert_eq!(p.len(), pad + 10);
    p
}

/// Generates events: `aggregates` aggregates per round, each round one more version of each,
/// so successive rounds exercise the predecessor rule.
#[derive(Debug)]
pub struct Feeder {
    prefix: String,
    payload: String,
    next: u64,
    aggregates: u64,
}

impl Feeder {
    /// Every event its own aggregate (version 1): no successor ever waits.
    pub fn unique(prefix: &str) -> Self {
        Self::chained(prefix, u64::MAX)
    }

    /// `aggregates` aggregates, versions 1, 2, 3, … in enqueue order.
    pub fn chained(prefix: &str, aggregates: u64) -> Self {
        Self {
            prefix: prefix.to_string(),
            payload: payload(PAYLOAD_BYTES),
            next: 0,
            aggregates: aggregates.max(1),
        }
    }

    /// The next `n` events.
    pub fn take(&mut self, n: usize) -> Vec<NewEvent> {
        (0..n)
            .map(|_| {
                let i = self.next;
                self.next += 1;
                let (agg, version) = (i % self.aggregates, i / self.aggregates + 1);
                NewEvent::new(
                    format!("{}-{agg}", self.prefix),
                    version as i64,
                    "bench",
                    "BenchEvent",
                    self.payload.clone(),
                )
            })
            .collect()
    }
}

/// Enqueues `n` events from `feeder` in transactions of 1,000 (the SQL backends' multi-row
/// insert chunk).
pub async fn fill(store: &dyn OutboxStore, feeder: &mut Feeder, n: usize) {
    let mut left = n;
    while left > 0 {
        let k = left.min(1000);
        store.enqueue(&feeder.take(k)).await.expect("bench enqueue");
        left -= k;
    }
}

/// A running relay over `store` with `workers` workers and batches of `batch`, sending to the
/// null sink (ownership on: fenced claims, as in production), and its metrics.
pub fn null_relay(
    store: Arc<dyn OutboxStore>,
    workers: usize,
    batch: usize,
) -> (RelayTask, Arc<Metrics>) {
    let config = RelayConfig {
        workers,
        batch_size: batch,
        ..RelayConfig::default()
    };
    let relay = Relay::new(store, Arc::new(NullSink), config).expect("relay config");
    let metrics = relay.metrics();
    (RelayTask::spawn(|cancel| relay.run(cancel)), metrics)
}

/// Empties the store of SENT rows (outside a timed section); failures (a store without
/// purge) only mean it grows.
pub async fn purge_sent(store: &dyn OutboxStore) {
    let _ = store.purge_sent(&ferry_testkit::purge_all(10_000)).await;
}

/// A claim over every slot, unfenced.
pub fn claim_all(limit: usize) -> ClaimRequest {
    ferry_testkit::claim_all(limit, Duration::from_secs(60))
}

/// A store under bench.
pub struct Store {
    /// `memory`, `sqlite`, `postgres` or `mysql`.
    pub name: &'static str,
    /// The store.
    pub store: Arc<dyn OutboxStore>,
    _db: Option<TestDb>,
    cleanup: Option<Cleanup>,
}

impl Store {
    /// The in-memory store.
    pub fn memory() -> Self {
        Self {
            name: "memory",
            store: Arc::new(MemoryStore::new()),
            _db: None,
            cleanup: None,
        }
    }

    /// A fresh database of `backend`, or `None` when its URL is not set.
    pub async fn sql(backend: Backend) -> Option<Self> {
        Self::sql_with(backend, false).await
    }

    /// As [`Store::sql`]; `measure_contention` makes the store count rows its claims skip as
    /// locked (`ConnectOptions::measure_contention`).
    pub async fn sql_with(backend: Backend, measure_contention: bool) -> Option<Self> {
        let db = TestDb::open_with(
            backend,
            ferry_store::ConnectOptions {
                max_connections: 16,
                measure_contention,
                ..Default::default()
            },
        )
        .await?;
        let name = match backend {
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
            _ => "sqlite",
        };
        Some(Self {
            name,
            store: db.store.clone(),
            cleanup: Some(db.cleanup_handle()),
            _db: Some(db),
        })
    }

    /// Every store this run can use: memory, SQLite, and the servers whose URLs are set.
    pub async fn all() -> Vec<Self> {
        Self::all_with(false).await
    }

    /// As [`Store::all`], the SQL stores counting rows skipped as locked when asked.
    pub async fn all_with(measure_contention: bool) -> Vec<Self> {
        let mut v = vec![Self::memory()];
        for b in [Backend::Sqlite, Backend::Postgres, Backend::Mysql] {
            if let Some(s) = Self::sql_with(b, measure_contention).await {
                v.push(s);
            }
        }
        v
    }

    /// Refreshes the planner's statistics after a bulk fill, as auto-analyze would in
    /// production. Without it a table created empty is planned as empty: on PostgreSQL the
    /// claim then evaluates the predecessor check for *every* due row and sorts them instead of
    /// walking the seq index up to its LIMIT (measured: 35 ms instead of 2 ms for 500 of 10,000
    /// due rows), and autovacuum may be off on a test server.
    pub async fn analyze(&self) {
        let Some(db) = &self._db else { return };
        let sql = match self.name {
            "postgres" => "ANALYZE ferry_outbox",
            "mysql" => "ANALYZE TABLE ferry_outbox",
            _ => "ANALYZE",
        };
        let _ = db.exec(sql).await;
    }

    /// Drops the schema/database (SQLite: the temporary directory goes with `self`).
    pub async fn cleanup(mut self) {
        if let Some(c) = self.cleanup.take() {
            c.run().await;
        }
    }
}
