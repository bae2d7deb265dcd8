//! Inbox retention at scale: fills `ferry_inbox` with `rows` old dedupe rows (10 versions per
//! aggregate, every version covered by its aggregate's contiguous mark), then times
//! `Inbox::prune` while one task keeps applying new deliveries, and prints the prune's rate and
//! the deliveries' latency quantiles before and during it.
//!
//! `cargo run --release -p ferry-benches --example inbox_prune -- <database-url> [rows] [alone]`
//! (a fresh schema or database per run on PostgreSQL and MariaDB, a temporary file for
//! `sqlite`; dropped afterwards).
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::BoxFuture;
use ferry_inbox::{BoxError, Conn, Delivery, Inbox, InboxConfig};
use ferry_store::Backend;
use ferry_testkit::TestDb;

fn no_effect<'c>(_: Conn<'c>, _: &'c Delivery) -> BoxFuture<'c, Result<(), BoxError>> {
    Box::pin(async { Ok(()) })
}

/// Applies new deliveries until `stop`; their latencies in µs.
async fn deliver(inbox: Arc<Inbox>, tag: &'static str, stop: Arc<AtomicBool>) -> Vec<u64> {
    let mut lat = Vec::new();
    let mut n = 0i64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let d = Delivery::new(
            "c",
            format!("{tag}-{n}"),
            format!("{tag}-{}", n % 1000),
            n / 1000 + 1,
        );
        let t = Instant::now();
        inbox.apply_once(&d, no_effect).await.expect("delivery");
        lat.push(t.elapsed().as_micros() as u64);
    }
    lat.sort_unstable();
    lat
}

fn quantiles(lat: &[u64]) -> String {
    let q = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0) as f64
            / 1000.0
    };
    format!(
        "{} deliveries, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        lat.len(),
        q(0.5),
        q(0.99),
        q(1.0)
    )
}

#[tokio::main]
async fn main() {
    let url = std::env::args()
        .nth(1)
        .expect("usage: inbox_prune <database-url|sqlite> [rows]");
    let rows: u64 = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let aggs = rows / 10;
    let backend = if url == "sqlite" {
        Backend::Sqlite
    } else {
        Backend::from_url(&url).expect("url")
    };
    let db = match backend {
        Backend::Sqlite => TestDb::sqlite().await,
        _ => TestDb::open_on(backend, &url, Default::default())
            .await
            .expect("database"),
    };
    let inbox = Arc::new(
        Inbox::connect(&db.url, InboxConfig::default())
            .await
            .expect("inbox"),
    );
    let t = Instant::now();
    let (fill, marks) = match backend {
        Backend::Postgres => (
            format!("INSERT INTO ferry_inbox (consumer, event_id, aggregate_id, aggregate_version, recorded_at) \
             SELECT 'c', 'old-' || g, 'old-' || (g / 10), g % 10 + 1, TIMESTAMPTZ '2000-01-01 00:00:00+00' \
             FROM generate_series(0, {rows} - 1) AS g"),
            format!("INSERT INTO ferry_inbox_aggregate (consumer, aggregate_id, applied_upto, max_seen, updated_at) \
             SELECT 'c', 'old-' || g, 10, 10, now() FROM generate_series(0, {aggs} - 1) AS g"),
        ),
        Backend::Mysql => (
            format!("INSERT INTO ferry_inbox (consumer, event_id, aggregate_id, aggregate_version, recorded_at) \
             SELECT 'c', CONCAT('old-', seq), CONCAT('old-', seq DIV 10), seq MOD 10 + 1, '2000-01-01 00:00:00' \
             FROM seq_0_to_{}", rows - 1),
            format!("INSERT INTO ferry_inbox_aggregate (consumer, aggregate_id, applied_upto, max_seen, updated_at) \
             SELECT 'c', CONCAT('old-', seq), 10, 10, UTC_TIMESTAMP(6) FROM seq_0_to_{}", aggs - 1),
        ),
        Backend::Sqlite => (
            format!("WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n < {rows} - 1) \
             INSERT INTO ferry_inbox (consumer, event_id, aggregate_id, aggregate_version, recorded_at) \
             SELECT 'c', 'old-' || n, 'old-' || (n / 10), n % 10 + 1, 0 FROM g"),
            format!("WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n < {aggs} - 1) \
             INSERT INTO ferry_inbox_aggregate (consumer, aggregate_id, applied_upto, max_seen, updated_at) \
             SELECT 'c', 'old-' || n, 10, 10, 0 FROM g"),
        ),
    };
    db.exec(&fill).await.expect("fill");
    db.exec(&marks).await.expect("marks");
    if backend == Backend::Postgres {
        db.exec("ANALYZE ferry_inbox").await.expect("analyze");
        db.exec("ANALYZE ferry_inbox_aggregate")
            .await
            .expect("analyze");
    }
    println!(
        "{backend:?}: filled {rows} old rows over {aggs} aggregates in {:.1}s",
        t.elapsed().as_secs_f64()
    );

    // deliveries alone for 5 s, then during the prune
    let stop = Arc::new(AtomicBool::new(false));
    let before = tokio::spawn(deliver(inbox.clone(), "before", stop.clone()));
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    let before = before.await.unwrap();
    // `alone` as the third argument: no deliveries during the prune
    let alone = std::env::args().nth(3).as_deref() == Some("alone");
    let stop = Arc::new(AtomicBool::new(alone));
    let during = tokio::spawn(deliver(inbox.clone(), "during", stop.clone()));
    let t = Instant::now();
    let deleted = inbox
        .prune("c", Duration::from_secs(3600))
        .await
        .expect("prune");
    let secs = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let during = during.await.unwrap();
    println!(
        "prune: {deleted} rows in {secs:.1}s = {:.0} rows/s",
        deleted as f64 / secs
    );
    println!("deliveries before the prune: {}", quantiles(&before));
    println!("deliveries during the prune: {}", quantiles(&during));
    db.cleanup().await;
}
