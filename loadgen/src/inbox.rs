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
//! After the relays stopped, the runner reads each partition's high watermark and loadgen waits
//! until it has caught up with them ([`ConsumerRunner::settle`]): every message (duplicates
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
//! are deleted afterwards unless `--keep-db`). The pool is [`InboxPool::for_workers`]: on SQLite
//! a single connection the workers queue on.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::BoxFuture;
use ferry_inbox::{
    Backend, BoxError, Conn, ConsumerRunner, Delivery, Inbox, InboxConfig, InboxError, InboxPool,
    RunnerConfig, RunnerStats,
};
use ferry_store::redact_url;
use ferry_testkit::{on_inbox, TempDir};
use sqlx::Executor;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::report::{round3, InboxReport};
use crate::spec::{InboxSpec, RunSpec};
use ferry_testkit::workload::dialect;
use ferry_testkit::workload::Ids;
use ferry_testkit::workload::ProducerResult;

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
        let setup = |what: &'static str| {
            let url = redact_url(&url);
            move |e: InboxError| {
                Error::Setup(format!("cannot {what} the Inbox database {url}: {e}"))
            }
        };
        let pool = InboxPool::for_workers(&url, workers, spec.db.sqlite_sync.into())
            .await
            .map_err(setup("open"))?;
        let inbox = Inbox::new(pool, InboxConfig::default());
        inbox.migrate().await.map_err(setup("migrate"))?;
        create_effect_tables(inbox.pool()).await?;

        let run: Arc<str> = Arc::from(run);
        let consumer = format!("loadgen-{run}");
        let mut config = RunnerConfig::new(brokers, topic, partitions, &consumer);
        config.workers = workers;
        let prefix = format!("lg-{run}-");
        let effects = Arc::new(Effects::new(inbox.pool().backend(), run.clone()));
        let runner = ConsumerRunner::start(
            inbox.clone(),
            config,
            ferry_inbox::runner::effect(move |c, d| effect(c, d, effects.clone())),
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
            dir,
            keep: spec.db.keep,
            runner: Some(runner),
        })
    }

    /// Messages that went through `apply_once` (or were skipped as foreign) so far.
    pub fn processed(&self) -> u64 {
        self.runner.as_ref().map_or(0, ConsumerRunner::processed)
    }

    /// Waits until every message up to the topic's high watermarks (read now, after the relays
    /// stopped) has been applied, giving up when no message was applied for `stall`, stops
    /// consuming, then reads the effects back and checks them against what the producers
    /// committed.
    pub async fn finish(
        mut self,
        stall: Duration,
        ids: &Ids,
        results: &[ProducerResult],
        progress: bool,
    ) -> Result<InboxReport> {
        let start = Instant::now();
        let runner = self.runner.take();
        let settle = match &runner {
            Some(r) => r
                .settle(stall, |n, total| {
                    if progress {
                        eprintln!(
                            "loadgen [{:>5.0}s inbox] applied {n} of {total} messages after the relays stopped",
                            start.elapsed().as_secs_f64()
                        );
                    }
                })
                .await
                .map_err(|e| e.to_string()),
            None => Ok(false),
        };
        let settle_secs = round3(start.elapsed().as_secs_f64());
        let stats = match runner {
            Some(r) => r.stop().await,
            None => RunnerStats::default(),
        };
        let mut r = InboxReport {
            backend: self.inbox.pool().backend().as_str().to_string(),
            url: redact_url(&self.url),
            consumer: self.consumer.clone(),
            workers: self.workers,
            connections: self.inbox.pool().max_connections(),
            settled: settle == Ok(true),
            settle_secs,
            stats,
            ..InboxReport::default()
        };
        if let Err(e) = settle {
            r.stats.examples.push(format!(
                "the topic's high watermarks could not be read ({e}): not settled"
            ));
        }

        // ---- read the effects back
        let effect_ids = self.effect_ids().await?;
        r.effects_rows = effect_ids.len() as u64;
        let committed: HashMap<usize, u64> =
            results.iter().map(|p| (p.producer, p.committed)).collect();
        let total_committed: u64 = committed.values().sum();
        let mut matched = 0u64;
        for id in &effect_ids {
            match ids.parse(id) {
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
        (r.projection_aggregates, r.projection_mismatches) = self.projection().await?;
        let inbox_err =
            |what: &'static str| move |e: InboxError| Error::Setup(format!("Inbox {what}: {e}"));
        r.inbox_rows = (self.inbox.consumed_counts().await)
            .map_err(inbox_err("consumed_counts"))?
            .get(&self.consumer)
            .map_or(0, |n| (*n).max(0) as u64);
        r.open_gaps = (self.inbox.gaps(&self.consumer).await)
            .map_err(inbox_err("gaps"))?
            .len() as u64;
        r.effects_exactly_once = r.settled
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

/// `loadgen_effects` and `loadgen_projection` (SQLite: `WITHOUT ROWID`, MySQL: InnoDB).
const EFFECT_TABLES: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS loadgen_effects (event_id VARCHAR(255) PRIMARY KEY, \
     run_id VARCHAR(32) NOT NULL, aggregate_id VARCHAR(255) NOT NULL, \
     aggregate_version BIGINT NOT NULL, applied INT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS loadgen_projection (aggregate_id VARCHAR(255) PRIMARY KEY, \
     run_id VARCHAR(32) NOT NULL, version BIGINT NOT NULL, applied BIGINT NOT NULL)",
];

async fn create_effect_tables(pool: &InboxPool) -> Result<()> {
    let suffix = match pool.backend() {
        Backend::Sqlite => " WITHOUT ROWID",
        Backend::Postgres => "",
        Backend::Mysql => " ENGINE = InnoDB",
    };
    for stmt in EFFECT_TABLES {
        let stmt = format!("{stmt}{suffix}");
        on_inbox!(InboxPool, pool, p => p.execute(stmt.as_str()).await.map(drop)).map_err(
            Error::sql("create the effect tables loadgen_effects and loadgen_projection"),
        )?;
    }
    Ok(())
}

/// The business effect's statements in the Inbox database's dialect, and the run they record.
struct Effects {
    run: Arc<str>,
    /// The event's row, then the aggregate's projection upsert.
    sql: [String; 2],
}

impl Effects {
    fn new(backend: Backend, run: Arc<str>) -> Self {
        let projection = match backend {
            Backend::Mysql => {
                "INSERT INTO loadgen_projection (aggregate_id, run_id, version, \
                applied) VALUES (?, ?, ?, 1) ON DUPLICATE KEY UPDATE \
                version = VALUES(version), applied = applied + 1"
            }
            Backend::Postgres | Backend::Sqlite => {
                "INSERT INTO loadgen_projection (aggregate_id, \
                run_id, version, applied) VALUES (?, ?, ?, 1) ON CONFLICT (aggregate_id) DO \
                UPDATE SET version = excluded.version, applied = loadgen_projection.applied + 1"
            }
        };
        let effect = "INSERT INTO loadgen_effects (event_id, run_id, aggregate_id, \
            aggregate_version, applied) VALUES (?, ?, ?, ?, 1)";
        let pg = backend == Backend::Postgres;
        let sql = [effect, projection].map(|s| ferry_testkit::placeholder(s, pg).into_owned());
        Self { run, sql }
    }
}

/// The business effect, on the Inbox's transaction: the event's effect row (a second
/// application fails on the primary key) and the aggregate's projection.
fn effect<'c>(
    conn: Conn<'c>,
    d: &'c Delivery,
    e: Arc<Effects>,
) -> BoxFuture<'c, Result<(), BoxError>> {
    Box::pin(async move {
        let (id, agg, v, run) = (&d.event_id, &d.aggregate_id, d.aggregate_version, &*e.run);
        let twice = |err: sqlx::Error| -> BoxError {
            match &err {
                sqlx::Error::Database(db) if db.is_unique_violation() => {
                    Box::new(AppliedTwice(id.clone()))
                }
                _ => Box::new(err),
            }
        };
        on_inbox!(Conn, conn, c => {
            let q = sqlx::query(&e.sql[0]).bind(id).bind(run).bind(agg).bind(v);
            q.execute(&mut *c).await.map_err(twice)?;
            let q = sqlx::query(&e.sql[1]).bind(agg).bind(run).bind(v);
            q.execute(&mut *c).await?;
        });
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use ferry_inbox::{SqliteSynchronous, Verdict};

    use super::*;

    #[test]
    fn event_ids_parse_back() {
        let ids = Ids {
            run: "abc123".into(),
        };
        assert_eq!(ids.parse(&ids.event(7, 42)), Some((7, 42)));
        let other = Ids {
            run: "ffffff".into(),
        };
        assert_eq!(ids.parse(&other.event(7, 42)), None);
        assert_eq!(ids.parse("e-7-1"), None);
    }

    #[tokio::test]
    async fn duplicates_are_skipped_and_a_second_application_fails_loudly() {
        let dir = TempDir::new("loadgen-inbox-test").unwrap();
        let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
        let pool = InboxPool::for_workers(&url, 4, SqliteSynchronous::Normal);
        let inbox = Inbox::new(pool.await.unwrap(), InboxConfig::default());
        inbox.migrate().await.unwrap();
        create_effect_tables(inbox.pool()).await.unwrap();
        let effects = Arc::new(Effects::new(Backend::Sqlite, Arc::from("abc123")));
        let apply = |d: Delivery| {
            let (inbox, e) = (inbox.clone(), effects.clone());
            async move { inbox.apply_once(&d, |c, d| effect(c, d, e)).await }
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
