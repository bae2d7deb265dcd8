//! One run: fresh database namespace (put in the run's dispatch mode) and topic → verifier →
//! relays → producers for `--duration` → drain → verification → report. With `--preload` (a
//! queue burn-down) the producers commit the whole queue before the relays start, and the
//! drain, timed from starting the relays, is the measurement.
//!
//! The verifier starts before anything is produced and reads concurrently (the mock cluster
//! keeps only ~5 MiB per partition). Loss is computed from what the producers know they
//! committed — event numbers `0..committed` of each producer — against the ids the consumer
//! saw, never from the store's own bookkeeping. Without a consumer (`--sink null|stdout`) the
//! store is all there is: loss is what the producers committed less the rows SENT. The versions
//! the order checks compare are the database's: producers take them from the aggregates'
//! business rows, and after the drain every aggregate's committed versions are checked to be
//! exactly `1..=n` (its row's `ver`), so a version first delivered before its predecessor is a
//! reordering, never a gap left by a rolled-back transaction.
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_core::DispatchMode;
use ferry_relay::ownership::desired_slots;
use ferry_testkit::verify::Verifier;
use hdrhistogram::Histogram;
use rand::Rng;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cli::{FlagValue, RelayMode, SinkKind};
use crate::db::{new_histogram, Database, PgCosts, SqliteWrites, VersionCheck};
use crate::error::{Error, Result};
use crate::inbox::InboxConsumer;
use crate::intervals::IntervalReport;
use crate::kafka::KafkaTarget;
use crate::producer::{self, Counters, KeySource, ProducerPlan, ProducerResult};
use crate::progress::{Live, Sampler, Totals};
use crate::relays::{RelayMetrics, Relays, SendOrder};
use crate::report::{
    self, round3, Baseline, BatchStats, Claims, Contention, DbCosts, InboxReport, Latencies,
    PreloadReport, Quantiles, RetentionReport, RowWrites, RunReport, StoreCheck, Verification,
};
use crate::retention::{PurgeTally, Purger, StorePurge};
use crate::spec::{Preload, RunSpec};
use crate::workload::Ids;
use ferry_store::Backend;

impl RunSpec {
    /// The producers' plan; `flat_out` ignores `--rate` (the baseline, a preload).
    fn plan(&self, run: &str, topic: &str, flat_out: bool) -> ProducerPlan {
        let mut work = self.work.clone();
        if flat_out {
            work.rate = 0;
        }
        ProducerPlan {
            ids: Ids {
                run: run.to_string(),
            },
            producers: self.producers,
            topic: topic.to_string(),
            keys: KeySource::new(&work, self.producers),
            work,
        }
    }

    /// ANALYZE stands in for autovacuum (PostgreSQL, unless `--pg-analyze-every 0`).
    fn analyze(&self) -> bool {
        self.db.store == Backend::Postgres && !self.flags.pg_analyze_every.is_zero()
    }
}

fn new_run_id() -> String {
    format!("{:06x}", rand::thread_rng().gen::<u32>() & 0x00ff_ffff)
}

fn committed(results: &[ProducerResult]) -> u64 {
    results.iter().map(|r| r.committed).sum()
}

/// Runs producers against `db` until `stop`, returning their handles.
fn start_producers(
    db: &Arc<Database>,
    plan: ProducerPlan,
    counters: &Arc<Counters>,
    stop: &CancellationToken,
) -> Vec<JoinHandle<Result<ProducerResult>>> {
    let plan = Arc::new(plan);
    (0..plan.producers)
        .map(|p| {
            let (db, plan, counters) = (db.clone(), plan.clone(), counters.clone());
            tokio::spawn(producer::run(db, plan, p, counters, stop.clone()))
        })
        .collect()
}

/// Joins producers: their results, and the errors of those that failed.
async fn join_producers(
    handles: Vec<JoinHandle<Result<ProducerResult>>>,
) -> (Vec<ProducerResult>, Vec<String>) {
    let mut ok = Vec::new();
    let mut errors = Vec::new();
    for h in handles {
        match h.await {
            Ok(Ok(r)) => ok.push(r),
            Ok(Err(e)) => errors.push(e.to_string()),
            Err(e) => errors.push(format!("a producer task panicked: {e}")),
        }
    }
    (ok, errors)
}

/// The producer-only baseline `spec` asks for (`--baseline`), as (length, intents committed):
/// the same producers, flat out, no relay, in a namespace of their own (so their rows do not
/// become a backlog for the measured run).
pub async fn baseline(
    spec: &RunSpec,
    interrupt: &CancellationToken,
) -> Result<Option<(Duration, u64)>> {
    let Some(length) = spec.baseline else {
        return Ok(None);
    };
    let run = new_run_id();
    if spec.progress {
        eprintln!(
            "loadgen: baseline: {} producers, no relay, {:.0}s",
            spec.producers,
            length.as_secs_f64()
        );
    }
    let db = Arc::new(Database::create(spec, false, &run, spec.producers as u32 + 2).await?);
    let counters = Arc::new(Counters::default());
    let stop = CancellationToken::new();
    let t0 = Instant::now();
    // Flat out whatever --rate says: the baseline is the database's own insert ceiling.
    let plan = spec.plan(&run, "loadgen-baseline", true);
    let handles = start_producers(&db, plan, &counters, &stop);
    tokio::select! {
        _ = tokio::time::sleep(length) => {}
        _ = interrupt.cancelled() => {}
    }
    stop.cancel();
    let (results, errors) = join_producers(handles).await;
    let elapsed = t0.elapsed();
    let n = committed(&results);
    if spec.progress {
        eprintln!(
            "loadgen: baseline: {n} intents in {:.1}s = {} ev/s",
            elapsed.as_secs_f64(),
            report::rate(n as f64 / elapsed.as_secs_f64())
        );
    }
    if let Ok(db) = Arc::try_unwrap(db) {
        db.finish().await;
    }
    if let Some(e) = errors.into_iter().next() {
        return Err(Error::Baseline(e));
    }
    Ok(Some((elapsed, n)))
}

/// Carries out one run and reports it, relating its throughput to `baseline` if given.
/// `interrupt` (Ctrl-C) ends the load phase early; the drain and the verification still run.
pub async fn run(
    spec: &RunSpec,
    baseline: Option<(Duration, u64)>,
    interrupt: &CancellationToken,
) -> Result<RunReport> {
    let run = new_run_id();
    let db = Arc::new(
        Database::create(spec, spec.flags.keep_db, &run, spec.producers as u32 + 4).await?,
    );
    let result = Run::new(spec, &run, &db, interrupt).execute(baseline).await;
    match Arc::try_unwrap(db) {
        Ok(db) => db.finish().await,
        Err(_) => eprintln!("loadgen: the database is still in use; not dropping it"),
    }
    result
}

/// ANALYZEs the outbox 1 s into the load and then every `every` until `stop`; returns how
/// often it ran. Failures are logged, not fatal: they only cost plan quality.
fn start_analyzer(db: Arc<Database>, every: Duration, stop: CancellationToken) -> JoinHandle<u32> {
    tokio::spawn(async move {
        let mut n = 0;
        let mut wait = Duration::from_secs(1).min(every);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return n,
                _ = tokio::time::sleep(wait) => {}
            }
            match db.pg_analyze().await {
                Ok(true) => n += 1,
                Ok(false) => return n,
                Err(e) => tracing::warn!(error = %e, "ANALYZE failed"),
            }
            wait = every;
        }
    })
}

/// Waits until the relays split the slots as rendezvous hashing says (every expected owner
/// holds exactly its share), so the measurement does not include the rebalance.
async fn wait_for_slots(
    db: &Database,
    relays: &Relays,
    n: usize,
    timeout: Duration,
) -> Result<bool> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        relays.check_alive().await?;
        if let Ok(leases) = db.store.slot_leases().await {
            let owners: Vec<String> = leases
                .iter()
                .map(|l| l.owner.clone())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let settled = owners.len() == n
                && leases.len() == ferry_core::SLOT_COUNT as usize
                && owners.iter().all(|o| {
                    let held: BTreeSet<_> = leases
                        .iter()
                        .filter(|l| &l.owner == o)
                        .map(|l| l.slot)
                        .collect();
                    held == desired_slots(o, &owners).into_iter().collect()
                });
            if settled {
                return Ok(true);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(false)
}

/// Ids committed by the producers that the verifier has not seen: all of them, or of those
/// still missing at the last check.
fn missing_ids(
    v: &Verifier,
    ids: &Ids,
    results: &[ProducerResult],
    last: Option<Vec<String>>,
) -> Vec<String> {
    if let Some(m) = last {
        return m.into_iter().filter(|id| !v.was_delivered(id)).collect();
    }
    let mut out = Vec::new();
    for r in results {
        for n in 0..r.committed {
            let id = ids.event(r.producer, n);
            if !v.was_delivered(&id) {
                out.push(id);
            }
        }
    }
    out
}

/// Whether the relays of `live`, if any, are still running.
async fn check_alive(live: &Live<'_>) -> Option<Result<()>> {
    Some(live.relays?.check_alive().await)
}

/// Runs a blocking Kafka metadata call off the runtime's workers.
async fn kafka_blocking<T: Send + 'static>(
    k: &KafkaTarget,
    f: fn(&str, &str, i32) -> Option<T>,
) -> Option<T> {
    let (brokers, topic, partitions) = (k.brokers.clone(), k.topic.clone(), k.partitions);
    tokio::task::spawn_blocking(move || f(&brokers, &topic, partitions))
        .await
        .ok()
        .flatten()
}

/// What the verification found.
struct Verified {
    delivered: u64,
    consumed: u64,
    duplicates: u64,
    lost: u64,
    ordering_violations: u64,
    consumed_latency: Option<Histogram<u64>>,
    verification: Verification,
    store: StoreCheck,
}

/// The outbox's database costs at one point of the run.
struct CostSnapshot {
    pg: Option<PgCosts>,
    sqlite: Option<SqliteWrites>,
}

/// One run in progress: what its phases share, and the notes and errors they report.
struct Run<'a> {
    spec: &'a RunSpec,
    run: &'a str,
    db: &'a Arc<Database>,
    ids: Ids,
    topic: String,
    counters: Arc<Counters>,
    /// Rows `--retention` purged so far.
    purged: Arc<AtomicU64>,
    interrupt: &'a CancellationToken,
    notes: Mutex<Vec<String>>,
    errors: Mutex<Vec<String>>,
}

impl<'a> Run<'a> {
    fn new(
        spec: &'a RunSpec,
        run: &'a str,
        db: &'a Arc<Database>,
        interrupt: &'a CancellationToken,
    ) -> Self {
        Self {
            spec,
            run,
            db,
            ids: Ids {
                run: run.to_string(),
            },
            topic: spec
                .flags
                .topic
                .clone()
                .unwrap_or_else(|| format!("loadgen-{run}")),
            counters: Arc::new(Counters::default()),
            purged: Arc::default(),
            interrupt,
            notes: Mutex::default(),
            errors: Mutex::default(),
        }
    }

    fn note(&self, n: String) {
        self.notes.lock().expect("notes lock").push(n);
    }

    fn error(&self, e: String) {
        self.errors.lock().expect("errors lock").push(e);
    }

    fn has_errors(&self) -> bool {
        !self.errors.lock().expect("errors lock").is_empty()
    }

    /// The run from the database's "before" snapshot to the report.
    async fn execute(self, baseline: Option<(Duration, u64)>) -> Result<RunReport> {
        let (spec, db) = (self.spec, self.db);
        // the setup's statistics (migrations, the dispatch switch) were reported when its
        // connections closed (Database::create reconnects): wait until they show
        let before = CostSnapshot {
            pg: db
                .pg_costs_settled(Duration::from_millis(200))
                .await?
                .map(|(c, _)| c),
            sqlite: db.sqlite_writes().await?,
        };
        let server = db.server_info().await;
        let kafka = self.kafka().await?;
        let kafka_partitions = kafka.as_ref().map(|k| k.partitions);
        let verifier = kafka.as_ref().map(KafkaTarget::verifier).transpose()?;
        if let Some(v) = &verifier {
            // every id this run can produce, so the verifier's set never rehashes mid-run
            let expected = match spec.work.preload {
                Some(p) => p.total,
                None => spec.work.rate.saturating_mul(spec.duration.as_secs() + 1),
            };
            v.reserve(
                usize::try_from(expected)
                    .unwrap_or(usize::MAX)
                    .min(200_000_000),
            );
        }
        let inbox = match (spec.flags.inbox, &kafka) {
            (true, Some(k)) => Some(
                InboxConsumer::start(spec, self.run, &k.brokers, &k.topic, k.partitions).await?,
            ),
            _ => None,
        };
        let log_dir = std::env::temp_dir().join(format!("loadgen-{}-relay-logs", self.run));
        if spec.relays.mode == RelayMode::Process {
            std::fs::create_dir_all(&log_dir).map_err(|source| Error::Io {
                what: "create the relay log directory",
                path: log_dir.clone(),
                source,
            })?;
        }
        let mut sampler = Sampler::new(spec.progress);
        let preloaded = match spec.work.preload {
            Some(shape) => {
                let live = self.live(None, verifier.as_ref(), inbox.as_ref());
                Some(self.preload(shape, &live, &mut sampler).await)
            }
            None => None,
        };
        let relays_started = Instant::now();
        let relays = self
            .start_relays(&kafka, &log_dir, preloaded.is_none())
            .await?;
        if preloaded.is_some() {
            // a burn-down's intervals start with the relays
            sampler.start_intervals(relays_started, spec.report_interval, &self.counters.clock);
        }
        // retention runs from here (the load phase, or the burn-down) to the end of the drain
        let purger = match self.start_purger(verifier.is_some()).await {
            Ok(p) => p,
            Err(e) => {
                let _ = relays.stop().await;
                return Err(e);
            }
        };
        let chaos_stop = CancellationToken::new();
        let chaos = match (spec.chaos, relays.processes()) {
            (Some(every), Some(p)) => Some(crate::chaos::start(p, every, chaos_stop.clone())),
            _ => None,
        };
        let live = self.live(Some(&relays), verifier.as_ref(), inbox.as_ref());
        // --broker-stall: a third of the way into the load phase (the flag needs one)
        let stall = match (spec.broker_stall, &kafka, &preloaded) {
            (Some(length), Some(k), None) => k.stall(spec.duration / 3, length),
            _ => None,
        };
        let (results, load_secs, at_load_end) = match preloaded {
            Some(preloaded) => preloaded,
            None => {
                // the load phase (and the timeline) start now, after the slots settled
                sampler = Sampler::new(spec.progress);
                let t0 = sampler.t0;
                sampler.start_intervals(t0, spec.report_interval, &self.counters.clock);
                self.load_phase(&live, &mut sampler).await
            }
        };
        // after a preload the drain is timed from starting the relays
        let drain_start = match spec.work.preload {
            Some(_) => relays_started,
            None => Instant::now(),
        };
        let timeout = spec.drain_timeout.saturating_sub(drain_start.elapsed());
        let (drained, missing) = self.drain(&live, &mut sampler, &results, timeout).await;
        let drain_secs = drain_start.elapsed().as_secs_f64();
        sampler.finish_intervals(&live).await;
        let purge = match purger {
            Some((p, pool)) => {
                let tally = p.stop().await;
                // its backends exit and report their statistics (PostgreSQL costs)
                pool.close_idle().await;
                Some(tally)
            }
            None => None,
        };
        let intervals = self.intervals(&sampler, drain_start, load_secs);
        if let Some(stall) = stall {
            match stall.await {
                Ok(Ok((down, up))) => self.note(format!(
                    "--broker-stall: every broker of the mock cluster was down from {down:.1}s to {up:.1}s into the load phase"
                )),
                Ok(Err(e)) => self.error(e.to_string()),
                Err(e) => self.error(format!("the --broker-stall task failed: {e}")),
            }
        }
        sampler.tick(&live, "drain").await;
        sampler.finish_line();
        chaos_stop.cancel();
        let chaos_kills = match chaos {
            Some(h) => h.await.ok(),
            None => None,
        };
        let relay_metrics = relays.metrics().await;
        let order_check = relays.order_check();
        if let Err(e) = relays.stop().await {
            self.error(e.to_string());
        }
        let inbox = match (inbox, &kafka) {
            (Some(ib), Some(k)) => {
                let applied = at_load_end.inbox as f64 / load_secs;
                Some(
                    self.finish_inbox(ib, k, applied, &sampler, &results)
                        .await?,
                )
            }
            _ => None,
        };
        let verified = self
            .check(
                kafka.as_ref(),
                verifier,
                order_check.as_deref(),
                missing,
                &results,
                drained,
                purge.as_ref(),
            )
            .await?;
        let retention_bytes = match &purge {
            Some(_) => db.outbox_bytes().await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot measure the outbox's size");
                None
            }),
            None => None,
        };
        drop(kafka);
        let versions = self.version_check().await?;
        let commit_to_ack = self.relay_checks(&relay_metrics).await?;
        let sqlite_after = db.sqlite_writes().await?;
        // relays are stopped (their pools closed, processes exited); closing the producers'
        // pool makes its backends exit, which reports their last statistics
        db.close_pool().await;
        let pg_after = db.pg_costs_settled(Duration::ZERO).await?;
        if let (Some(tally), Some((after, _))) = (&purge, &pg_after) {
            if tally.vacuum {
                self.note("each purge run ended with VACUUM (autovacuum is off on this server): purged rows' space is reused, and the size at the end is the table's high-water mark, free space included".to_string());
            } else if after.autovacuum_count == 0 {
                self.note("PostgreSQL reuses a purged row's space only after a vacuum, and autovacuum did not vacuum the outbox during this run (its naptime is 1 min): the size at the end still holds the purged rows as dead tuples".to_string());
            }
        }
        let db_costs = costs(
            db.kind,
            committed(&results),
            before,
            sqlite_after,
            pg_after,
            sampler.dead_peak,
            purge.as_ref().map_or(0, |t| t.purged),
        );
        let measured = Measured {
            results,
            load_secs,
            drain_secs,
            drained,
            at_load_end,
            relay_metrics,
            commit_to_ack,
            chaos_kills,
            verified,
            versions,
            inbox,
            db_costs,
            server,
            partitions: kafka_partitions,
            timeline: std::mem::take(&mut sampler.timeline),
            intervals,
            purge,
            retention_bytes,
        };
        Ok(self.report(measured, baseline, &log_dir))
    }

    fn live<'b>(
        &'b self,
        relays: Option<&'b Relays>,
        verifier: Option<&'b Verifier>,
        inbox: Option<&'b InboxConsumer>,
    ) -> Live<'b> {
        Live {
            db: self.db,
            counters: &self.counters,
            relays,
            verifier,
            inbox,
            purged: self.spec.retention.map(|_| &*self.purged),
        }
    }

    /// Starts `--retention`'s purger on a store of its own (as `ferry purge` would connect),
    /// with its pool; `None` without retention. `consumer`: a consumer verifies order (else,
    /// in row dispatch, the purger checks the order of SENT marks before each run).
    async fn start_purger(
        &self,
        consumer: bool,
    ) -> Result<Option<(Purger, crate::db::PoolHandle)>> {
        let Some(retention) = self.spec.retention else {
            return Ok(None);
        };
        let (store, pool) = self.db.open_store(2, false).await?;
        // What an operator of this server has to do: with autovacuum off nothing reclaims the
        // purged rows, and every later purge and read walks them (`ferry purge --vacuum`).
        let vacuum = store
            .server_warnings()
            .await
            .map(|w| {
                w.iter().any(|w| {
                    matches!(
                        w.setting.as_str(),
                        "autovacuum" | "track_counts" | "ferry_outbox.autovacuum_enabled"
                    )
                })
            })
            .unwrap_or(false);
        let target = StorePurge {
            store,
            db: self.db.clone(),
            retention,
            check_order: !consumer && self.spec.db.dispatch == DispatchMode::Row,
            vacuum,
        };
        let purger = Purger::start(target, retention.every, self.purged.clone());
        Ok(Some((purger, pool)))
    }

    /// The per-interval table: the load phase's intervals, then the drain's (a burn-down has
    /// only the drain: its load phase is the preload, with no relay).
    fn intervals(
        &self,
        sampler: &Sampler,
        drain_start: Instant,
        load_secs: f64,
    ) -> Option<IntervalReport> {
        let log = sampler.intervals.as_ref()?;
        let load_end = match self.spec.work.preload {
            Some(_) => log.start,
            None => (sampler.t0 + Duration::from_secs_f64(load_secs))
                .min(drain_start)
                .into_std(),
        };
        let acks = match self.spec.relays.mode {
            RelayMode::InProcess => self.counters.clock.intervals(),
            RelayMode::Process => None,
        };
        Some(log.report(sampler.t0.into_std(), load_end, acks.as_ref()))
    }

    /// The embedded mock cluster or the external broker, with the run's topic.
    async fn kafka(&self) -> Result<Option<KafkaTarget>> {
        if self.spec.relays.sink != SinkKind::Kafka {
            return Ok(None);
        }
        let (brokers, topic, partitions) = (
            self.spec.flags.kafka_brokers.clone(),
            self.topic.clone(),
            self.spec.flags.partitions as i32,
        );
        let target = tokio::task::spawn_blocking(move || match brokers {
            Some(b) => KafkaTarget::external(&b, &topic, partitions),
            None => KafkaTarget::embedded(&topic, partitions),
        })
        .await
        .map_err(|e| Error::Kafka(format!("setup task failed: {e}")))??;
        Ok(Some(target))
    }

    /// Starts the relays; before a load phase, waits until they split the slots.
    async fn start_relays(
        &self,
        kafka: &Option<KafkaTarget>,
        log_dir: &std::path::Path,
        settle_first: bool,
    ) -> Result<Relays> {
        let spec = self.spec;
        let brokers = kafka.as_ref().map(|k| k.brokers.as_str());
        let clock = self.counters.clock.clone();
        let relays = Relays::start(spec, self.db, self.run, brokers, clock, log_dir).await?;
        if !settle_first {
            if spec.relays.relays > 1 {
                self.note(format!(
                    "the {} relays started on the preloaded queue together: the slot rebalance between them is part of the drain time",
                    spec.relays.relays
                ));
            }
            return Ok(relays);
        }
        let settle = match spec.relays.mode {
            // relays heartbeat every 5 s by default: a rebalance takes two or three rounds
            RelayMode::InProcess => Duration::from_secs(30),
            RelayMode::Process => Duration::from_secs(40),
        };
        match wait_for_slots(self.db, &relays, spec.relays.relays, settle).await {
            Ok(true) => {}
            Ok(false) => self.note(format!(
                "slot ownership had not settled after {:.0}s; the load started anyway",
                settle.as_secs_f64()
            )),
            Err(e) => {
                let _ = relays.stop().await;
                return Err(e);
            }
        }
        Ok(relays)
    }

    /// The load phase: producers for `--duration` with the relays running. Returns what the
    /// producers committed, the phase's length and the totals at its end.
    async fn load_phase(
        &self,
        live: &Live<'_>,
        sampler: &mut Sampler,
    ) -> (Vec<ProducerResult>, f64, Totals) {
        let spec = self.spec;
        let stop = CancellationToken::new();
        let plan = spec.plan(self.run, &self.topic, false);
        let handles = start_producers(self.db, plan, &self.counters, &stop);
        let analyzer = spec
            .analyze()
            .then(|| start_analyzer(self.db.clone(), spec.flags.pg_analyze_every, stop.clone()));
        let t0 = sampler.t0;
        let load_end = t0 + spec.duration;
        let mut tick = 1u32;
        loop {
            let next = (t0 + Duration::from_secs(u64::from(tick))).min(load_end);
            // wake at each interval's end as well, to read the backlog and the consumer there
            let wake = sampler.next_interval_end().map_or(next, |e| e.min(next));
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => {}
                _ = self.interrupt.cancelled() => {
                    self.note(format!("interrupted after {:.1}s of load", t0.elapsed().as_secs_f64()));
                    break;
                }
            }
            sampler.close_intervals(live).await;
            if Instant::now() < next {
                continue;
            }
            tick += 1;
            sampler.tick(live, "load").await;
            if let Some(Err(e)) = check_alive(live).await {
                self.error(e.to_string());
                break;
            }
            if handles.iter().any(JoinHandle::is_finished) {
                self.error("a producer stopped early (see below)".to_string());
                break;
            }
            if Instant::now() >= load_end {
                break;
            }
        }
        stop.cancel();
        let (results, producer_errors) = join_producers(handles).await;
        self.errors
            .lock()
            .expect("errors lock")
            .extend(producer_errors);
        if let Some(a) = analyzer {
            let n = a.await.unwrap_or(0);
            self.note(format!(
                "ANALYZE ran {n} time(s) during the load (--pg-analyze-every {:.0}s), standing in for autovacuum on the fresh schema",
                spec.flags.pg_analyze_every.as_secs_f64()
            ));
        }
        (results, t0.elapsed().as_secs_f64(), live.totals().await)
    }

    /// The preload of a burn-down: the producers commit their whole share of the queue as
    /// fast as they can, with no relay running. Returns what they committed, how long it took,
    /// and the totals at its end (everything is backlog).
    async fn preload(
        &self,
        shape: Preload,
        live: &Live<'_>,
        sampler: &mut Sampler,
    ) -> (Vec<ProducerResult>, f64, Totals) {
        let spec = self.spec;
        if spec.progress {
            eprintln!(
                "loadgen: preload: {} intents ({} aggregates × {} versions) with {} producers, no relay running",
                shape.total,
                shape.aggregates(),
                shape.per_aggregate,
                spec.producers
            );
        }
        let stop = CancellationToken::new();
        let plan = spec.plan(self.run, &self.topic, true);
        let handles = start_producers(self.db, plan, &self.counters, &stop);
        let t0 = Instant::now();
        let join = join_producers(handles);
        tokio::pin!(join);
        let mut next = t0 + Duration::from_secs(1);
        let (results, producer_errors) = loop {
            tokio::select! {
                r = &mut join => break r,
                _ = tokio::time::sleep_until(next) => {
                    next += Duration::from_secs(1);
                    sampler.tick(live, "preload").await;
                }
                _ = self.interrupt.cancelled(), if !stop.is_cancelled() => {
                    self.note(format!("interrupted after {:.1}s of preload: the relays drain what was committed", t0.elapsed().as_secs_f64()));
                    stop.cancel();
                }
            }
        };
        let secs = t0.elapsed().as_secs_f64();
        self.errors
            .lock()
            .expect("errors lock")
            .extend(producer_errors);
        sampler.tick(live, "preload").await;
        if spec.progress {
            let n = committed(&results);
            eprintln!(
                "loadgen: preload: {n} intents committed in {secs:.2}s ({} ev/s); starting the relays",
                report::rate(n as f64 / secs.max(1e-9))
            );
        }
        if spec.analyze() {
            // the planner should see the queue it drains (autovacuum would have analyzed it)
            match self.db.pg_analyze().await {
                Ok(_) => self.note(
                    "ANALYZE ran once after the preload, before the relays started (standing in for autovacuum on the fresh schema)".to_string(),
                ),
                Err(e) => tracing::warn!(error = %e, "ANALYZE failed"),
            }
        }
        (results, secs, live.totals().await)
    }

    /// Waits until every committed intent is SENT and, with a consumer, delivered. Returns
    /// whether that happened before `timeout`, and the ids still missing at the last exact
    /// check. (The Inbox consumer catches up afterwards, once the relays have stopped: see
    /// `InboxConsumer::finish`.)
    async fn drain(
        &self,
        live: &Live<'_>,
        sampler: &mut Sampler,
        results: &[ProducerResult],
        timeout: Duration,
    ) -> (bool, Option<Vec<String>>) {
        let committed = committed(results);
        let start = Instant::now();
        let deadline = start + timeout;
        let mut missing: Option<Vec<String>> = None;
        let mut store_drained_at: Option<Instant> = None;
        let mut next_tick = start + Duration::from_secs(1);
        let mut last_store_check = start;
        let drained = loop {
            sampler.close_intervals(live).await;
            if Instant::now() >= next_tick {
                sampler.tick(live, "drain").await;
                next_tick += Duration::from_secs(1);
                if let Some(Err(e)) = check_alive(live).await {
                    self.error(e.to_string());
                    break false;
                }
            }
            // The store's count is the arbiter, but in cursor dispatch it walks the backlog
            // (seconds with 100k behind): while in-process relays' own counters say events are
            // left, ask the store only every 5 s, so the drain does not measure its own polling.
            let counters_done = live
                .relays
                .and_then(Relays::sent)
                .is_none_or(|sent| sent >= committed);
            let open = if counters_done || last_store_check.elapsed() >= Duration::from_secs(5) {
                last_store_check = Instant::now();
                match live.db.store.status().await {
                    Ok(s) => s.pending + s.claimed,
                    Err(_) => 1,
                }
            } else {
                1
            };
            if open == 0 {
                let since = *store_drained_at.get_or_insert_with(Instant::now);
                let Some(v) = live.verifier else {
                    break true;
                };
                // A cheap count first; the exact per-id check once it looks complete (or once
                // the consumer has had 3 s to catch up), then only the stragglers.
                if v.report().delivered >= committed || since.elapsed() > Duration::from_secs(3) {
                    let still = missing_ids(v, &self.ids, results, missing.take());
                    let done = still.is_empty();
                    missing = Some(still);
                    if done {
                        break true;
                    }
                }
            }
            if Instant::now() >= deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        (drained, missing)
    }

    /// The Inbox consumer catches up to the topic's final high watermarks; its effects are
    /// read back.
    async fn finish_inbox(
        &self,
        ib: InboxConsumer,
        k: &KafkaTarget,
        applied_per_sec: f64,
        sampler: &Sampler,
        results: &[ProducerResult],
    ) -> Result<InboxReport> {
        let spec = self.spec;
        let high = kafka_blocking(k, crate::kafka::high_watermarks).await;
        let mut r = ib
            .finish(high, spec.drain_timeout, &self.ids, results, spec.progress)
            .await?;
        r.applied_per_sec = round3(applied_per_sec);
        r.lag_peak = sampler
            .timeline
            .iter()
            .filter_map(|s| s.inbox_lag)
            .max()
            .unwrap_or(0);
        if !r.settled {
            self.error(format!(
                "the Inbox consumer stopped applying messages for {:.0}s (--drain-timeout) before it had applied every message of the topic",
                spec.drain_timeout.as_secs_f64()
            ));
        }
        Ok(r)
    }

    /// Loss and order: the outbox's rows against what the producers committed; then against
    /// the consumer's deliveries when there is one, else against the store (every committed
    /// intent SENT; row mode: successive versions SENT in order) and, for in-process relays,
    /// the order in which versions were handed to the sink. Notes on a timed-out drain and on
    /// the mock cluster's retention. With `--retention` (`purge`), the rows purged count with
    /// the rows and the SENT rows (purge deletes SENT rows only), and the order checks made
    /// before each purge count with the one made now.
    #[allow(clippy::too_many_arguments)]
    async fn check(
        &self,
        kafka: Option<&KafkaTarget>,
        verifier: Option<Verifier>,
        order_check: Option<&SendOrder>,
        missing: Option<Vec<String>>,
        results: &[ProducerResult],
        drained: bool,
        purge: Option<&PurgeTally>,
    ) -> Result<Verified> {
        let (spec, db) = (self.spec, self.db);
        let committed = committed(results);
        let rows = db.count_rows().await?;
        let sent_rows = db.count_sent().await?;
        let purged = purge.map_or(0, |t| t.purged);
        let unsent_examples = if sent_rows < rows {
            db.unsent_examples().await?
        } else {
            Vec::new()
        };
        let accounted = rows.max(0) as u64 + purged;
        if accounted != committed {
            let msg = match purge {
                None => format!(
                    "the outbox holds {rows} rows but the producers committed {committed} intents"
                ),
                Some(t) => format!(
                    "the outbox holds {rows} rows and {purged} were purged ({accounted} in all) but the producers committed {committed} intents{}",
                    if t.failed_runs > 0 {
                        format!(
                            "; {} purge runs failed, and a failed run reports no count: the batches it committed before its error are missing from the purged rows",
                            t.failed_runs
                        )
                    } else {
                        String::new()
                    }
                ),
            };
            if accounted < committed {
                self.error(msg);
            } else {
                self.note(msg);
            }
        }
        if let Some(t) = purge {
            if t.order_check_failures > 0 {
                self.error(format!(
                    "{} order checks before a purge failed: the pairs those purges deleted went unchecked",
                    t.order_check_failures
                ));
            }
        }
        let mut verification = Verification::default();
        let mut verified = match &verifier {
            Some(v) => {
                let rep = v.report();
                let still = missing_ids(v, &self.ids, results, missing);
                verification.method = "kafka-consumer".to_string();
                verification.ordering_check = "kafka-consumer".to_string();
                verification.foreign = rep.foreign;
                verification.lost_examples = still.iter().take(10).cloned().collect();
                verification.ordering_examples = rep.examples.clone();
                Verified {
                    delivered: rep.delivered,
                    consumed: rep.consumed,
                    duplicates: rep.duplicates,
                    lost: still.len() as u64,
                    ordering_violations: rep.ordering_violations,
                    consumed_latency: Some(v.latency()),
                    verification,
                    store: StoreCheck::default(),
                }
            }
            None => {
                verification.method = "store".to_string();
                let mut store_order = db.sent_order_violations().await?.map(|n| n.max(0) as u64);
                // pairs found before a purge that the check now no longer counts (a row purged)
                if let (Some(n), Some(t)) = (store_order.as_mut(), purge) {
                    for (agg, ver) in &t.order_pairs {
                        if !db.counts_as_sent_order_violation(agg, *ver).await? {
                            *n += 1;
                        }
                        if verification.ordering_examples.len() < 10 {
                            verification.ordering_examples.push(format!(
                                "{agg} v{ver} SENT before v{} (seen before a purge)",
                                ver - 1
                            ));
                        }
                    }
                }
                let sink_order = order_check.map(|c| {
                    let c = c.lock().unwrap_or_else(|e| e.into_inner());
                    (c.violations, c.examples.clone())
                });
                let (ordering_violations, how) = match (store_order, &sink_order) {
                    (Some(s), Some((k, _))) => (s.max(*k), "store+sink"),
                    (Some(s), None) => (s, "store"),
                    (None, Some((k, _))) => (*k, "sink"),
                    (None, None) => (0, "not checked"),
                };
                verification.ordering_check = how.to_string();
                if let Some((_, examples)) = sink_order {
                    verification.ordering_examples.extend(examples);
                }
                let order = match how {
                    "store+sink" => "that successive versions were marked SENT in order and handed to the sink in order",
                    "store" => "that successive versions were marked SENT in order",
                    "sink" => "that each aggregate's versions were handed to the sink in order (rows dispatched by the cursor carry no sent_at)",
                    _ => "NOT the order: rows dispatched by the cursor carry no sent_at and relay processes' sinks are out of reach (use --sink kafka or in-process relays)",
                };
                let sent = match db.dispatch {
                    DispatchMode::Row => "SENT",
                    DispatchMode::Cursor => "SENT (behind its slot's cursor or by its exception row: ferry_outbox_cursor_view)",
                };
                verification.consumer_skipped = Some(format!(
                    "--sink {} has no consumer; checked instead that every committed intent is {sent}, and {order}",
                    spec.relays.sink.as_str()
                ));
                verification.lost_examples = unsent_examples.clone();
                Verified {
                    delivered: 0,
                    consumed: 0,
                    duplicates: 0,
                    // purged rows were SENT (purge deletes nothing else)
                    lost: committed.saturating_sub(sent_rows.max(0) as u64 + purged),
                    ordering_violations,
                    consumed_latency: None,
                    verification,
                    store: StoreCheck::default(),
                }
            }
        };
        drop(verifier);
        verified.store = StoreCheck {
            rows,
            sent_rows,
            purged,
            unsent_examples,
        };
        if !drained && verified.lost > 0 {
            self.note(format!(
                "the drain timed out after {:.0}s: `lost` counts intents still undelivered at that deadline ({} rows not SENT); rerun with a longer --drain-timeout to tell a slow relay from a lossy one",
                spec.drain_timeout.as_secs_f64(),
                rows - sent_rows
            ));
        }
        if let Some(k) = kafka.filter(|k| k.embedded && verified.lost > 0) {
            let truncated = kafka_blocking(k, crate::kafka::truncated_partitions).await;
            verified.verification.retention_truncated_partitions = truncated;
            if truncated.unwrap_or(0) > 0 {
                self.note(format!(
                    "{} partitions of the mock cluster dropped old messages (~5 MiB retention per partition): if the consumer lagged that far, the missing ids are retention drops, not relay loss; check `store.sent_rows` and rerun with more --partitions",
                    truncated.unwrap_or(0)
                ));
            }
        }
        Ok(verified)
    }

    /// What the business rows say about the committed versions: how many aggregates the
    /// producers shared, and an error unless every aggregate's versions are exactly `1..=n`
    /// (a version taken by a rolled-back transaction must never have committed).
    async fn version_check(&self) -> Result<VersionCheck> {
        let v = self.db.version_check().await?;
        if v.version_mismatches > 0 {
            self.error(format!(
                "{} aggregates' committed versions are not exactly 1..=n matching their loadgen_aggregates row",
                v.version_mismatches
            ));
        }
        Ok(v)
    }

    /// Commit→ack latency (the in-process relays' own histogram, else from the rows'
    /// timestamps), and an error unless the relays ran in the dispatch mode asked for.
    async fn relay_checks(&self, m: &RelayMetrics) -> Result<Histogram<u64>> {
        let (spec, dispatch) = (self.spec, self.spec.db.dispatch);
        let in_process = spec.relays.mode == RelayMode::InProcess;
        let commit_to_ack = if in_process {
            m.commit_to_ack.clone()
        } else if let Some(h) = self.db.commit_to_ack_from_rows().await? {
            self.note("relays ran as processes: commit→ack is computed from the rows' created_at/sent_at, claim counters are scraped from each surviving relay's /metrics (a killed process takes its counters along)".to_string());
            if spec.retention.is_some() {
                self.note(format!(
                    "with --retention, created_at → SENT covers the {} rows left at the end, not the purged ones (their timestamps went with them)",
                    h.len()
                ));
            }
            h
        } else {
            self.note("relays ran as processes in cursor mode: commit→ack is not reported (rows dispatched by the cursor carry no sent_at; the relays' own ferry_commit_to_ack_seconds summaries cannot be merged); claim counters are scraped from each surviving relay's /metrics".to_string());
            new_histogram()
        };
        // the relays must have run in the mode asked for (a relay reports it as
        // ferry_dispatch_cursor)
        let (want, other) = match dispatch {
            DispatchMode::Cursor => (m.dispatch_cursor, m.dispatch_row),
            DispatchMode::Row => (m.dispatch_row, m.dispatch_cursor),
        };
        if other > 0 {
            self.error(format!(
                "{other} relay(s) reported the other dispatch mode than --dispatch {} (ferry_dispatch_cursor)",
                dispatch.as_str()
            ));
        } else if want == 0 && in_process {
            self.error("no relay reported its dispatch mode".to_string());
        }
        Ok(commit_to_ack)
    }

    /// The report of what the phases measured.
    fn report(
        self,
        m: Measured,
        baseline: Option<(Duration, u64)>,
        log_dir: &std::path::Path,
    ) -> RunReport {
        let spec = self.spec;
        let committed = committed(&m.results);
        let (load_secs, drain_secs) = (m.load_secs, m.drain_secs);
        let total_secs = load_secs + drain_secs;
        let rm = &m.relay_metrics;
        let sent = match spec.relays.mode {
            RelayMode::InProcess => rm.sent,
            RelayMode::Process => m.verified.store.sent_rows.max(0) as u64,
        };
        let sent_per_sec = m.at_load_end.sent as f64 / load_secs;
        // after a preload the relays ran during the drain only
        let relay_secs = match spec.work.preload {
            Some(_) => drain_secs,
            None => total_secs,
        };
        let claims = claims(rm, relay_secs);
        if claims.quarantined > 0 {
            self.error(format!(
                "{} events were quarantined (see the relay warnings)",
                claims.quarantined
            ));
        }
        let v = m.verified;
        let ok = v.lost == 0
            && v.ordering_violations == 0
            && !self.has_errors()
            && m.inbox.as_ref().is_none_or(InboxReport::ok);
        if spec.relays.mode == RelayMode::Process {
            if ok {
                let _ = std::fs::remove_dir_all(log_dir);
            } else {
                self.note(format!(
                    "relay process logs are kept in {}",
                    log_dir.display()
                ));
            }
        }
        let mut producer_tx = new_histogram();
        for r in &m.results {
            let _ = producer_tx.add(&r.tx_latency);
        }
        let per_sec = |n: u64, secs: f64| round3(n as f64 / secs);
        let preload = spec.work.preload.map(|shape| PreloadReport {
            intents: committed,
            versions_per_aggregate: shape.per_aggregate,
            aggregates: shape.aggregates(),
            producers: spec.producers,
            commit_secs: round3(load_secs),
            commit_per_sec: per_sec(committed, load_secs.max(1e-9)),
            drain_secs: round3(drain_secs),
            drain_per_sec: per_sec(committed, drain_secs.max(1e-9)),
            drained: m.drained,
        });
        RunReport {
            label: spec.label.clone(),
            ok,
            dispatch: spec.db.dispatch,
            preload,
            enqueued: committed,
            sent,
            consumed: v.consumed,
            delivered: v.delivered,
            duplicates: v.duplicates,
            lost: v.lost,
            ordering_violations: v.ordering_violations,
            enqueued_per_sec: per_sec(committed, load_secs),
            sent_per_sec: round3(sent_per_sec),
            consumed_per_sec: per_sec(m.at_load_end.consumed, load_secs),
            sent_per_sec_overall: per_sec(sent, total_secs),
            duration_secs: round3(load_secs),
            drain_secs: round3(drain_secs),
            drained: m.drained,
            backlog_at_end_of_load: m.at_load_end.backlog,
            retention: m
                .purge
                .as_ref()
                .map(|t| self.retention_report(t, &v.store, m.retention_bytes)),
            intervals: m.intervals,
            latency_ms: Latencies {
                commit_to_ack: Quantiles::from_us(&m.commit_to_ack),
                committed_to_broker_ack: Quantiles::from_us(&self.counters.clock.histogram()),
                commit_to_consumed: v.consumed_latency.as_ref().and_then(Quantiles::from_us),
                producer_tx: Quantiles::from_us(&producer_tx),
                claim: Quantiles::from_us(&rm.claim_latency),
                ack_cas: Quantiles::from_us(&rm.ack_latency),
            },
            claims: Some(claims),
            batch_size: BatchStats::from_hist(&rm.batch_size),
            per_relay_sent: rm.per_relay_sent.clone(),
            chaos_kills: m.chaos_kills,
            producer_txs: self.counters.txs.load(Ordering::Relaxed),
            producer_retries: self.counters.retries.load(Ordering::Relaxed),
            contention: Contention {
                producers: spec.producers,
                aggregates: spec.work.aggregate_rows(),
                deadlocks: self.counters.deadlocks.load(Ordering::Relaxed),
                lock_waits: self.counters.lock_waits.load(Ordering::Relaxed),
                conflicts: self.counters.conflicts.load(Ordering::Relaxed),
                versions: m.versions,
            },
            store: v.store,
            verification: v.verification,
            inbox: m.inbox,
            baseline: baseline.map(|b| baseline_report(b, sent_per_sec, committed, load_secs)),
            db_costs: m.db_costs,
            peak_rss_mb: report::peak_rss_mb(),
            config: spec.echo(self.run, &self.topic, &m.server, m.partitions),
            timeline: m.timeline,
            errors: self.errors.into_inner().expect("errors lock"),
            notes: self.notes.into_inner().expect("notes lock"),
        }
    }
}

impl Run<'_> {
    /// The retention section: what the purger did (`t`), the outbox left (`store`, `bytes` at
    /// the end), and the outbox without retention (every committed row; its size estimated
    /// from the bytes per row before the first purge that deleted rows).
    fn retention_report(
        &self,
        t: &PurgeTally,
        store: &StoreCheck,
        bytes: Option<i64>,
    ) -> RetentionReport {
        let r = self.spec.retention.expect("a tally comes from --retention");
        let without = store.rows.max(0) as u64 + t.purged;
        let (estimate, basis) = match t.before_first_delete {
            _ if self.db.kind == Backend::Mysql => (
                None,
                Some("not estimated on MariaDB: InnoDB allocates the tablespace file in extents of up to several MiB, so its bytes per row early in a run do not extrapolate; compare with a run without --retention".to_string()),
            ),
            Some((rows, b)) if rows > 0 => (
                Some((b as f64 / rows as f64 * without as f64).round() as i64),
                Some(format!(
                    "{:.0} B/row measured at {rows} rows, before the first purge that deleted any",
                    b as f64 / rows as f64
                )),
            ),
            _ => (None, None),
        };
        if t.failed_runs > 0 {
            self.note(format!(
                "{} of {} purge runs failed (first: {}); the run goes on, as a failed `ferry purge` would be run again",
                t.failed_runs,
                t.runs,
                t.errors.first().map_or("", String::as_str)
            ));
        }
        RetentionReport {
            age_secs: round3(r.age.as_secs_f64()),
            every_secs: round3(r.every.as_secs_f64()),
            batch: r.batch,
            purged: t.purged,
            runs: t.runs,
            failed_runs: t.failed_runs,
            batches: t.statements,
            purge_secs: round3(t.busy.as_secs_f64()),
            purge_us_per_event: (t.purged > 0)
                .then(|| round3(t.busy.as_secs_f64() * 1e6 / t.purged as f64)),
            longest_run_ms: round3(t.longest.as_secs_f64() * 1000.0),
            errors: t.errors.clone(),
            rows_at_end: store.rows,
            rows_without_retention: without,
            bytes_source: self.db.outbox_bytes_source().to_string(),
            bytes_at_end: bytes,
            bytes_without_retention_estimate: estimate,
            estimate_basis: basis,
            vacuum: t.vacuum,
            order_checks: t.order_checks,
            order_check_failures: t.order_check_failures,
            order_check_secs: round3(t.order_check_busy.as_secs_f64()),
        }
    }
}

/// What the phases of a run measured, for its report.
struct Measured {
    results: Vec<ProducerResult>,
    load_secs: f64,
    drain_secs: f64,
    drained: bool,
    at_load_end: Totals,
    relay_metrics: RelayMetrics,
    commit_to_ack: Histogram<u64>,
    chaos_kills: Option<u64>,
    verified: Verified,
    versions: VersionCheck,
    inbox: Option<InboxReport>,
    db_costs: Option<DbCosts>,
    server: Vec<(String, String)>,
    /// The topic's own partition count (an external broker's existing topic keeps its own).
    partitions: Option<i32>,
    timeline: Vec<report::Sample>,
    intervals: Option<IntervalReport>,
    /// What `--retention` did, and the outbox's size at the end.
    purge: Option<PurgeTally>,
    retention_bytes: Option<i64>,
}

/// The run against the producer-only baseline of `d` and `n` events.
fn baseline_report(
    (d, n): (Duration, u64),
    sent_per_sec: f64,
    committed: u64,
    load_secs: f64,
) -> Baseline {
    let per_sec = n as f64 / d.as_secs_f64();
    Baseline {
        duration_secs: round3(d.as_secs_f64()),
        enqueued: n,
        enqueued_per_sec: round3(per_sec),
        relay_ratio: round3(sent_per_sec / per_sec.max(1e-9)),
        enqueue_ratio: round3(committed as f64 / load_secs / per_sec.max(1e-9)),
    }
}

/// The relays' claim counters with their rates over `secs`.
fn claims(m: &RelayMetrics, secs: f64) -> Claims {
    Claims {
        claims_per_sec: round3(m.claims.claims as f64 / secs.max(1e-9)),
        empty_ratio: round3(m.claims.empty_claims as f64 / m.claims.claims.max(1) as f64),
        ..m.claims.clone()
    }
}

/// The costs section: PostgreSQL sizes and per-table statistics (deltas over the run), or what
/// SQLite can tell cheaply; row writes per event from either.
fn costs(
    kind: Backend,
    events: u64,
    before: CostSnapshot,
    sqlite_after: Option<SqliteWrites>,
    pg_after: Option<(PgCosts, bool)>,
    dead_peak: i64,
    purged: u64,
) -> Option<DbCosts> {
    let per = |n: i64| Some(round3(n as f64 / events.max(1) as f64));
    match kind {
        Backend::Postgres => {
            let (before, (after, settled)) = (before.pg?, pg_after?);
            let growth = after.outbox_total_bytes - before.outbox_total_bytes;
            let tables: Vec<_> = after
                .tables
                .iter()
                .map(|a| {
                    let b = before.tables.iter().find(|b| b.table == a.table);
                    a.since(b.cloned().unwrap_or_default())
                })
                .collect();
            let outbox = || tables.iter().filter(|t| t.table != "ferry_slot_lease");
            let writes: i64 = outbox()
                .map(|t| t.n_tup_ins + t.n_tup_upd + t.n_tup_del)
                .sum();
            let dead: i64 = outbox().map(|t| t.n_dead_tup).sum();
            let lease_upd: i64 = tables
                .iter()
                .filter(|t| t.table == "ferry_slot_lease")
                .map(|t| t.n_tup_upd)
                .sum();
            Some(DbCosts {
                n_dead_tup_peak: Some(dead_peak.max(after.n_dead_tup)),
                outbox_growth_bytes: Some(growth),
                outbox_bytes_per_event: Some(round3(growth as f64 / events.max(1) as f64)),
                row_writes: RowWrites {
                    source: "pg_stat_user_tables".to_string(),
                    events,
                    tables,
                    row_writes_per_event: per(writes),
                    slot_lease_updates_per_event: per(lease_upd),
                    dead_tuples_per_event: per(dead),
                    stats_settled: Some(settled),
                    sqlite: None,
                },
                before: Some(before),
                after: Some(after),
            })
        }
        Backend::Sqlite => {
            let mut d = sqlite_after?.since(&before.sqlite?);
            // purged rows were inserted too (and deleted: one more write each)
            d.purged_rows = purged as i64;
            d.outbox_rows += d.purged_rows;
            // INSERTs exact; every claim is one UPDATE and its outcome (SENT, retry, release)
            // another; cursor advances move cursor_version (one UPDATE per slot moved)
            let writes = d.outbox_rows
                + d.purged_rows
                + 2 * d.outbox_claims
                + d.exception_rows
                + 2 * d.exception_claims;
            Some(DbCosts {
                row_writes: RowWrites {
                    source: "sqlite-estimate".to_string(),
                    events,
                    tables: Vec::new(),
                    row_writes_per_event: per(writes),
                    slot_lease_updates_per_event: (d.cursor_versions > 0)
                        .then(|| per(d.cursor_versions))
                        .flatten(),
                    dead_tuples_per_event: None,
                    stats_settled: None,
                    sqlite: Some(d),
                },
                ..DbCosts::default()
            })
        }
        Backend::Mysql => None,
    }
}
