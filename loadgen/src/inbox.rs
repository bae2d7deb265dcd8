//! `--inbox`: a consumer that applies every delivered message through ferry's consumer Inbox
//! ([`ferry_inbox::Inbox::apply_once`]) with a real business effect in the same transaction,
//! and proves at the end that every committed event's effect was applied exactly once.
//!
//! # How it consumes
//!
//! [`ferry_inbox::ConsumerRunner`] reads every partition from the beginning on its own thread,
//! concurrently with the load (so the mock cluster's ~5 MiB-per-partition retention never
//! overtakes it), and applies each message of this run on one of `--inbox-workers` tasks keyed
//! by the aggregate: one aggregate is applied in partition order, so a gap the Inbox reports is
//! a real ordering fault. Each message is one `apply_once` transaction: record `(consumer,
//! event id)` in `ferry_inbox`, and, only for a `New` (or `Gap`) verdict, the effect.
//! Duplicates, which chaos produces (a relay killed after the broker's ack but before its SENT
//! commit), are recorded as `Duplicate` verdicts and their effect is skipped.
//!
//! # The effect
//!
//! * `loadgen_effects (event_id PRIMARY KEY, applied)`: a plain INSERT with `applied = 1`. A
//!   second application of the same event would violate the primary key, fail its transaction
//!   loudly and count as an `effect_failures` ("applied twice"), which must never happen.
//! * `loadgen_projection (aggregate_id PRIMARY KEY, version, applied)`: an upsert that sets the
//!   aggregate's last applied version and counts applications. Producers commit versions
//!   `1..=n` of each aggregate, so at the end every row must have `applied = version`: a
//!   missing, doubled or reordered application breaks that equality.
//!
//! # Settling and the verdict
//!
//! After the relays stopped, loadgen reads each partition's high watermark and waits until the
//! runner has caught up with it ([`ConsumerRunner::caught_up`]): every message (duplicates
//! included) was applied or rejected, none is in flight. Then the effect
//! rows of the run are read back and matched against what the producers committed (event
//! numbers `0..committed` per producer). `effects_exactly_once` holds when the rows are exactly
//! the committed events, no effect failed or was applied twice, the projection agrees and
//! the Inbox recorded exactly as many events as effects.
//!
//! # Database
//!
//! By default a fresh SQLite file `inbox.db` in a temporary directory of its own (independent
//! of the outbox store), removed after the run unless `--keep-db`; or `--inbox-url` (the
//! consumer name `loadgen-<run>` and the `run_id` column keep runs apart, and this run's rows
//! are deleted afterwards unless `--keep-db`). SQLite has one writer: the pool has a single
//! connection (more would only sleep in SQLite's busy handler) and the workers queue on it.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::BoxFuture;
use ferry_inbox::{
    Backend, BoxError, Conn, ConsumerRunner, Delivery, Inbox, InboxConfig, InboxPool, PoolOptions,
    RunnerConfig, RunnerStats,
};
use ferry_store::redact_url;
use ferry_testkit::{on_inbox, TempDir};
use sqlx::Executor;
use tokio::time::Instant;

use crate::cli::SqliteSync;
use crate::db::dialect;
use crate::error::{Error, Result};
use crate::producer::ProducerResult;
use crate::report::{round3, InboxReport};
use crate::spec::{InboxSpec, RunSpec};
use crate::workload::Ids;

/// Examples of failures kept for the report.
const MAX_EXAMPLES: usize = 10;

/// The effect found the event's row already there: it was applied before.
#[derive(Debug, thiserror::Error)]
#[error("effect applied twice: event {0} is already in loadgen_effects")]
struct AppliedTwice(String);

/// The running Inbox consumer.
pub struct InboxConsumer {
    inbox: Inbox,
    run: Arc<str>,
    consumer: String,
    url: String,
    workers: usize,
    connections: u32,
    /// Temporary directory of the default SQLite file.
    dir: Option<TempDir>,
    keep: bool,
    runner: Option<ConsumerRunner>,
}

impl InboxConsumer {
    /// Opens (and migrates) the Inbox database, creates the effect tables and starts consuming
    /// `topic` (all `partitions`) from `brokers`.
    pub async fn start(
        spec: &RunSpec,
        inbox: &InboxSpec,
        run: &str,
        brokers: &str,
        topic: &str,
        partitions: i32,
    ) -> Result<Self> {
        let (url, dir) = match &inbox.url {
            Some(u) => (u.clone(), None),
            None => {
                let dir =
                    TempDir::new(&format!("loadgen-{run}-inbox")).map_err(|source| Error::Io {
                        what: "create the Inbox directory in",
                        path: std::env::temp_dir(),
                        source,
                    })?;
                let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
                (url, Some(dir))
            }
        };
        let workers = inbox.workers.max(1);
        let setup = async {
            let backend = Backend::from_url(&url).map_err(|e| {
                Error::Setup(format!(
                    "--inbox-url {}: {e} (use postgres://, mysql:// or sqlite://)",
                    redact_url(&url)
                ))
            })?;
            let (pool, connections) = match backend {
                Backend::Sqlite => (sqlite_pool(&url, spec.db.sqlite_sync).await?, 1),
                Backend::Postgres | Backend::Mysql => {
                    let n = workers as u32;
                    let pool = InboxPool::connect(&url, n).await.map_err(|e| {
                        Error::Setup(format!(
                            "cannot open the Inbox database {}: {e}",
                            redact_url(&url)
                        ))
                    })?;
                    (pool, n)
                }
            };
            let inbox = Inbox::new(pool, InboxConfig::default());
            inbox.migrate().await.map_err(|e| {
                Error::Setup(format!(
                    "cannot migrate the Inbox database {}: {e}",
                    redact_url(&url)
                ))
            })?;
            create_effect_tables(inbox.pool()).await?;
            Ok::<_, Error>((inbox, connections))
        };
        let (inbox, connections) = setup.await?;

        let run: Arc<str> = Arc::from(run);
        let consumer = format!("loadgen-{run}");
        let mut config = RunnerConfig::new(brokers, topic, partitions, &consumer);
        config.workers = workers;
        let prefix = format!("lg-{run}-");
        let effect_run = run.clone();
        let runner = ConsumerRunner::start(
            inbox.clone(),
            config,
            ferry_inbox::runner::effect(move |c, d| effect(c, d, effect_run.clone())),
            // another run's event on a reused topic is foreign
            Some(Box::new(move |d: &Delivery| {
                d.event_id.starts_with(&prefix)
            })),
        )
        .map_err(|e| Error::Kafka(format!("cannot start the Inbox consumer: {e}")))?;
        Ok(Self {
            inbox,
            run,
            consumer,
            url,
            workers,
            connections,
            dir,
            keep: spec.db.keep,
            runner: Some(runner),
        })
    }

    /// Messages that went through `apply_once` (or were skipped as foreign) so far.
    pub fn processed(&self) -> u64 {
        self.runner.as_ref().map_or(0, ConsumerRunner::processed)
    }

    /// Waits until every message up to the topic's high watermarks (`high`, read after the
    /// relays stopped) has been applied, giving up when no message was applied for `stall`,
    /// stops consuming, then reads the effects back and checks them against what the producers
    /// committed.
    pub async fn finish(
        mut self,
        high: Option<Vec<i64>>,
        stall: Duration,
        ids: &Ids,
        results: &[ProducerResult],
        progress: bool,
    ) -> Result<InboxReport> {
        let start = Instant::now();
        let mut settled = false;
        let mut next_line = start + Duration::from_secs(1);
        let (mut last, mut last_at) = (self.processed(), start);
        if let Some(high) = &high {
            let total: i64 = high.iter().map(|h| (*h).max(0)).sum();
            loop {
                if self.runner.as_ref().is_some_and(|r| r.caught_up(high)) {
                    settled = true;
                    break;
                }
                let now = Instant::now();
                let n = self.processed();
                if n != last {
                    (last, last_at) = (n, now);
                } else if now.duration_since(last_at) >= stall {
                    break;
                }
                if progress && now >= next_line {
                    next_line += Duration::from_secs(1);
                    eprintln!(
                        "loadgen [{:>5.0}s inbox] applied {n} of {total} messages after the relays stopped",
                        now.duration_since(start).as_secs_f64()
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let settle_secs = round3(start.elapsed().as_secs_f64());
        let stats = match self.runner.take() {
            Some(r) => r.stop().await,
            None => RunnerStats::default(),
        };

        let mut r = InboxReport {
            backend: format!("{:?}", self.inbox.pool().backend()).to_lowercase(),
            url: redact_url(&self.url),
            consumer: self.consumer.clone(),
            workers: self.workers,
            connections: self.connections,
            settled,
            settle_secs,
            stats,
            ..InboxReport::default()
        };
        if high.is_none() {
            r.stats
                .examples
                .push("the topic's high watermarks could not be read: not settled".to_string());
        }

        // ---- read the effects back
        let effect_ids = self.effect_ids().await?;
        r.effects_rows = effect_ids.len() as u64;
        let committed: HashMap<usize, u64> =
            results.iter().map(|p| (p.producer, p.committed)).collect();
        let total_committed: u64 = committed.values().sum();
        let mut matched = 0u64;
        for id in &effect_ids {
            match parse_event(ids, id) {
                Some((p, n)) if n < committed.get(&p).copied().unwrap_or(0) => matched += 1,
                _ => {
                    r.effects_unexpected += 1;
                    if r.stats.examples.len() < MAX_EXAMPLES {
                        r.stats
                            .examples
                            .push(format!("unexpected effect row: {id}"));
                    }
                }
            }
        }
        r.effects_missing = total_committed.saturating_sub(matched);
        let (aggregates, mismatches) = self.projection().await?;
        r.projection_aggregates = aggregates;
        r.projection_mismatches = mismatches;
        r.inbox_rows = self
            .inbox
            .consumed_counts()
            .await
            .map_err(|e| Error::Setup(format!("Inbox consumed_counts: {e}")))?
            .get(&self.consumer)
            .copied()
            .unwrap_or(0)
            .max(0) as u64;
        r.open_gaps = self
            .inbox
            .gaps(&self.consumer)
            .await
            .map_err(|e| Error::Setup(format!("Inbox gaps: {e}")))?
            .len() as u64;
        r.effects_exactly_once = settled
            && r.stats.effect_failures == 0
            && r.stats.errors == 0
            && r.effects_unexpected == 0
            && r.effects_missing == 0
            && r.effects_rows == total_committed
            && r.effects_rows == r.stats.new + r.stats.gaps
            && r.inbox_rows == r.effects_rows
            && r.projection_mismatches == 0;
        self.cleanup().await;
        Ok(r)
    }

    /// Event ids of this run's effect rows.
    async fn effect_ids(&self) -> Result<Vec<String>> {
        let pool = self.inbox.pool();
        let stmt = dialect(
            pool,
            "SELECT event_id FROM loadgen_effects WHERE run_id = ?",
        );
        let run: &str = &self.run;
        on_inbox!(InboxPool, pool, p => sqlx::query_scalar(&stmt).bind(run).fetch_all(p).await)
            .map_err(Error::sql("read loadgen_effects back"))
    }

    /// (aggregates, aggregates whose application count differs from their last version).
    async fn projection(&self) -> Result<(u64, u64)> {
        let pool = self.inbox.pool();
        // COUNT and a CASE count (not SUM: NUMERIC/DECIMAL on the servers)
        let stmt = dialect(
            pool,
            "SELECT COUNT(*), COUNT(CASE WHEN applied <> version THEN 1 END) \
             FROM loadgen_projection WHERE run_id = ?",
        );
        let run: &str = &self.run;
        let (n, bad): (i64, i64) =
            on_inbox!(InboxPool, pool, p => sqlx::query_as(&stmt).bind(run).fetch_one(p).await)
                .map_err(Error::sql("read loadgen_projection back"))?;
        Ok((n.max(0) as u64, bad.max(0) as u64))
    }

    /// Removes the temporary database, or this run's rows from `--inbox-url` (not with
    /// `--keep-db`, which says where they are).
    async fn cleanup(&mut self) {
        let pool = self.inbox.pool();
        if self.keep {
            eprintln!(
                "loadgen: kept the Inbox database: {} (consumer {})",
                redact_url(&self.url),
                self.consumer
            );
            std::mem::forget(self.dir.take());
            return;
        }
        if self.dir.is_none() {
            let (run, consumer): (&str, &str) = (&self.run, &self.consumer);
            for (table, col, v) in [
                ("loadgen_effects", "run_id", run),
                ("loadgen_projection", "run_id", run),
                ("ferry_inbox", "consumer", consumer),
                ("ferry_inbox_aggregate", "consumer", consumer),
            ] {
                let stmt = format!("DELETE FROM {table} WHERE {col} = ?");
                let stmt = dialect(pool, &stmt);
                if let Err(e) = on_inbox!(InboxPool, pool, p => sqlx::query(&stmt).bind(v).execute(p).await.map(drop))
                {
                    let e = Error::sql(format!("delete this run's rows from {table}"))(e);
                    eprintln!("loadgen: could not delete this run's Inbox rows: {e}");
                    break;
                }
            }
        }
        on_inbox!(InboxPool, pool, p => p.close().await);
        drop(self.dir.take());
    }
}

impl Drop for InboxConsumer {
    fn drop(&mut self) {
        // error paths: dropping the runner stops it
        if self.keep {
            std::mem::forget(self.dir.take());
        }
    }
}

/// A SQLite Inbox pool of one connection (one writer: more connections would only sleep in
/// the busy handler), WAL, `synchronous` as asked.
async fn sqlite_pool(url: &str, sync: SqliteSync) -> Result<InboxPool> {
    // one connection: SQLite has one writer, and the workers queue on it (hence the long wait)
    let options = PoolOptions {
        max_connections: 1,
        acquire_timeout: Duration::from_secs(30),
        sqlite_synchronous: sync.into(),
    };
    InboxPool::connect_with(url, &options)
        .await
        .map_err(|e| Error::Setup(format!("open the Inbox database {}: {e}", redact_url(url))))
}

/// `loadgen_effects` and `loadgen_projection` on a server (MySQL adds its engine).
const EFFECTS: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS loadgen_effects (event_id VARCHAR(255) PRIMARY KEY, \
     run_id VARCHAR(32) NOT NULL, aggregate_id VARCHAR(255) NOT NULL, \
     aggregate_version BIGINT NOT NULL, applied INT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS loadgen_projection (aggregate_id VARCHAR(255) PRIMARY KEY, \
     run_id VARCHAR(32) NOT NULL, version BIGINT NOT NULL, applied BIGINT NOT NULL)",
];
const EFFECTS_SQLITE: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS loadgen_effects (event_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, \
     aggregate_id TEXT NOT NULL, aggregate_version INTEGER NOT NULL, applied INTEGER NOT NULL) \
     WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS loadgen_projection (aggregate_id TEXT PRIMARY KEY, \
     run_id TEXT NOT NULL, version INTEGER NOT NULL, applied INTEGER NOT NULL) WITHOUT ROWID",
];

async fn create_effect_tables(pool: &InboxPool) -> Result<()> {
    let (ddl, suffix) = match pool {
        InboxPool::Sqlite(_) => (EFFECTS_SQLITE, ""),
        InboxPool::Postgres(_) => (EFFECTS, ""),
        InboxPool::Mysql(_) => (EFFECTS, " ENGINE = InnoDB"),
    };
    for stmt in ddl {
        let stmt = format!("{stmt}{suffix}");
        on_inbox!(InboxPool, pool, p => p.execute(stmt.as_str()).await.map(drop)).map_err(
            Error::sql("create the effect tables loadgen_effects and loadgen_projection"),
        )?;
    }
    Ok(())
}

/// The business effect, on the Inbox's transaction: the event's effect row (a second
/// application fails on the primary key) and the aggregate's projection.
fn effect<'c>(
    conn: Conn<'c>,
    d: &'c Delivery,
    run: Arc<str>,
) -> BoxFuture<'c, Result<(), BoxError>> {
    Box::pin(async move {
        let (id, agg, v) = (&d.event_id, &d.aggregate_id, d.aggregate_version);
        let run: &str = &run;
        let twice = |e: sqlx::Error| -> BoxError {
            match &e {
                sqlx::Error::Database(db) if db.is_unique_violation() => {
                    Box::new(AppliedTwice(id.clone()))
                }
                _ => Box::new(e),
            }
        };
        // the effect row (unique per event: a second apply fails loudly) and the projection
        macro_rules! apply {
            ($c:expr, $effect:expr, $projection:expr) => {{
                sqlx::query($effect)
                    .bind(id)
                    .bind(run)
                    .bind(agg)
                    .bind(v)
                    .execute(&mut *$c)
                    .await
                    .map_err(twice)?;
                sqlx::query($projection)
                    .bind(agg)
                    .bind(run)
                    .bind(v)
                    .execute(&mut *$c)
                    .await?;
            }};
        }
        const EFFECT: &str = "INSERT INTO loadgen_effects (event_id, run_id, aggregate_id, \
            aggregate_version, applied) VALUES (?, ?, ?, ?, 1)";
        const PROJECTION: &str = "INSERT INTO loadgen_projection (aggregate_id, run_id, version, \
            applied) VALUES (?, ?, ?, 1) ON CONFLICT (aggregate_id) DO UPDATE SET \
            version = excluded.version, applied = loadgen_projection.applied + 1";
        match conn {
            Conn::Sqlite(c) => apply!(c, EFFECT, PROJECTION),
            Conn::Postgres(c) => apply!(
                c,
                "INSERT INTO loadgen_effects (event_id, run_id, aggregate_id, \
                 aggregate_version, applied) VALUES ($1, $2, $3, $4, 1)",
                "INSERT INTO loadgen_projection (aggregate_id, run_id, version, applied) \
                 VALUES ($1, $2, $3, 1) ON CONFLICT (aggregate_id) DO UPDATE SET \
                 version = excluded.version, applied = loadgen_projection.applied + 1"
            ),
            Conn::Mysql(c) => apply!(
                c,
                EFFECT,
                "INSERT INTO loadgen_projection (aggregate_id, run_id, version, applied) \
                 VALUES (?, ?, ?, 1) ON DUPLICATE KEY UPDATE \
                 version = VALUES(version), applied = applied + 1"
            ),
        }
        Ok(())
    })
}

/// `(producer, n)` of a loadgen event id of this run (`lg-<run>-p<producer>-<n>`).
fn parse_event(ids: &Ids, id: &str) -> Option<(usize, u64)> {
    let rest = id.strip_prefix("lg-")?.strip_prefix(ids.run.as_str())?;
    let (p, n) = rest.strip_prefix("-p")?.split_once('-')?;
    Some((p.parse().ok()?, n.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use ferry_inbox::{InboxError, Verdict};

    use super::*;

    #[test]
    fn event_ids_parse_back() {
        let ids = Ids {
            run: "abc123".into(),
        };
        assert_eq!(parse_event(&ids, &ids.event(7, 42)), Some((7, 42)));
        let other = Ids {
            run: "ffffff".into(),
        };
        assert_eq!(parse_event(&ids, &other.event(7, 42)), None);
        assert_eq!(parse_event(&ids, "e-7-1"), None);
    }

    #[tokio::test]
    async fn duplicates_are_skipped_and_a_second_application_fails_loudly() {
        let dir = TempDir::new("loadgen-inbox-test").unwrap();
        let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
        let inbox = Inbox::new(
            sqlite_pool(&url, SqliteSync::Normal).await.unwrap(),
            InboxConfig::default(),
        );
        inbox.migrate().await.unwrap();
        create_effect_tables(inbox.pool()).await.unwrap();
        let run: Arc<str> = Arc::from("abc123");
        let apply = |d: Delivery| {
            let (inbox, run) = (inbox.clone(), run.clone());
            async move { inbox.apply_once(&d, |c, d| effect(c, d, run)).await }
        };
        let d = |n: u64, v: i64| {
            Delivery::new(
                "loadgen-abc123",
                format!("lg-abc123-p000-{n:012}"),
                "lg-abc123-a1",
                v,
            )
        };
        assert_eq!(apply(d(0, 1)).await.unwrap(), Verdict::New);
        assert_eq!(apply(d(0, 1)).await.unwrap(), Verdict::Duplicate); // a redelivery
                                                                       // a consumer whose dedupe does not see the first record: the effect's key rejects it
        let mut again = d(0, 1);
        again.consumer = "another-consumer".into();
        let e = apply(again).await.unwrap_err();
        assert!(matches!(e, InboxError::Effect(_)), "{e}");
        assert!(e.to_string().contains("applied twice"), "{e}");
        // v3 before v2: a gap, applied and reported; then v2 closes it
        let gap = apply(d(2, 3)).await.unwrap();
        assert!(
            matches!(
                gap,
                Verdict::Gap {
                    expected: 2,
                    got: 3
                }
            ),
            "{gap:?}"
        );
        assert_eq!(apply(d(1, 2)).await.unwrap(), Verdict::New);
        let InboxPool::Sqlite(p) = inbox.pool() else {
            unreachable!()
        };
        let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM loadgen_effects")
            .fetch_one(p)
            .await
            .unwrap();
        assert_eq!(rows, 3);
        // applied v1, v3, v2: three applications, last version 2: the projection disagrees
        let (n, v): (i64, i64) = sqlx::query_as(
            "SELECT applied, version FROM loadgen_projection WHERE aggregate_id = ?",
        )
        .bind("lg-abc123-a1")
        .fetch_one(p)
        .await
        .unwrap();
        assert_eq!((n, v), (3, 2));
        p.close().await;
    }
}
