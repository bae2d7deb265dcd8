//! One run: fresh database namespace (put in the run's dispatch mode) and topic → verifier →
//! relays → producers for `--duration` → drain → verification → report. With `--preload` (a
//! queue burn-down) the producers commit the whole queue before the relays start, and the
//! drain, timed from starting the relays, is the measurement.
//!
//! The verifier starts before anything is produced and reads concurrently (the mock cluster
//! keeps only ~5 MiB per partition). Loss is computed from what the producers know they
//! committed — event numbers `0..committed` of each producer — against the ids the consumer
//! saw, never from the store's own bookkeeping.
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ferry_relay::ownership::desired_slots;
use ferry_store::redact_url;
use ferry_testkit::verify::Verifier;
use hdrhistogram::Histogram;
use rand::Rng;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cli::{Args, Dispatch, RelayMode, SinkKind, Skew, StoreKind};
use crate::db::{new_histogram, Database, DbSpec};
use crate::error::{Error, Result};
use crate::inbox::{InboxConsumer, InboxSpec};
use crate::kafka::KafkaTarget;
use crate::producer::{self, Counters, Preload, ProducerPlan, ProducerResult};
use crate::progress::{Live, Sampler};
use crate::relays::{RelayMetrics, RelaySpec, Relays};
use crate::report::{
    self, Baseline, BatchStats, Claims, ConfigEcho, DbCosts, Latencies, PreloadReport, Quantiles,
    RowWrites, RunReport, StoreCheck, Verification,
};
use crate::workload::Ids;

/// Everything one run needs; sweeps clone it and change one field.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Label in reports (`run`, `batch_size=100`).
    pub label: String,
    /// Load phase.
    pub duration: Duration,
    /// Drain limit.
    pub drain_timeout: Duration,
    /// Database.
    pub db: DbSpec,
    /// Relays.
    pub relays: RelaySpec,
    /// Chaos interval (process relays only).
    pub chaos: Option<Duration>,
    /// Producer tasks.
    pub producers: usize,
    /// Orders per transaction.
    pub orders_per_tx: usize,
    /// Target events/s (0 = flat out).
    pub rate: u64,
    /// Aggregates.
    pub aggregates: u64,
    /// Key popularity.
    pub skew: Skew,
    /// Zipf exponent.
    pub zipf_s: f64,
    /// Payload size.
    pub payload_bytes: usize,
    /// External Kafka brokers.
    pub kafka_brokers: Option<String>,
    /// Fixed topic name.
    pub topic: Option<String>,
    /// Partitions of the embedded topic.
    pub partitions: i32,
    /// PostgreSQL ANALYZE interval during the load (zero: never).
    pub pg_analyze_every: Duration,
    /// Producer-only baseline phase length.
    pub baseline: Option<Duration>,
    /// The Inbox consumer (`--inbox`).
    pub inbox: Option<InboxSpec>,
    /// Live progress line.
    pub progress: bool,
    /// Workload seed.
    pub seed: u64,
    /// Dispatch mode of the relays and the outbox.
    pub dispatch: Dispatch,
    /// Queue burn-down instead of a load phase (`--preload`, `--versions-per-aggregate`).
    pub preload: Option<Preload>,
}

impl RunSpec {
    /// The run the flags describe.
    pub fn from_args(a: &Args) -> Self {
        let store = a.store_kind();
        let producers = a.producers.map(|p| p as usize).unwrap_or(match store {
            // SQLite has one writer: more producers only queue on its lock.
            StoreKind::Sqlite => 2,
            // Server databases overlap commits (group commit); 8 keeps 2 cores busy.
            StoreKind::Postgres | StoreKind::Mysql => 8,
        });
        let drain_timeout = a.drain_timeout.unwrap_or(if a.preload.is_some() {
            // the whole burn-down happens in the drain; it ends as soon as the queue is empty
            Duration::from_secs(300)
        } else if a.chaos {
            // a killed relay's claims wait out their lease (60 s by default) before takeover
            Duration::from_secs(120)
        } else {
            Duration::from_secs(60)
        });
        let dispatch = a.dispatch();
        // the relay's worker settings for this dispatch mode, where the flags leave them unset
        let defaults =
            ferry_relay::WorkerDefaults::for_mode(dispatch.mode(), store == StoreKind::Sqlite);
        Self {
            label: "run".to_string(),
            duration: a.duration,
            drain_timeout,
            db: DbSpec {
                store,
                url: a.database_url.clone(),
                keep: a.keep_db,
                sqlite_sync: a.sqlite_synchronous,
                dispatch,
            },
            relays: RelaySpec {
                relays: a.relays as usize,
                mode: a.relay_mode,
                workers: a.workers.map_or(defaults.workers, |w| w as usize),
                batch_size: a.batch_size.map_or(defaults.batch_size, |b| b as usize),
                in_flight: a.in_flight.map_or(defaults.max_in_flight, |n| n as usize),
                poll_min: a.poll_min,
                read_linger: a.read_linger,
                kafka_linger: a.kafka_linger,
                sink: a.sink,
                ferry_bin: a.ferry_bin.clone(),
                extra_args: a.relay_args.clone(),
                // contention exists only between relays; a relays sweep measures every point
                // (the 1-relay point too) so the points pay the same cost
                measure_contention: a
                    .measure_contention
                    .unwrap_or(a.relays > 1 || a.sweep_relays.is_some()),
                dispatch,
                clock: None,
            },
            chaos: a.chaos.then_some(a.chaos_interval),
            producers,
            orders_per_tx: a.orders_per_tx as usize,
            rate: a.rate,
            aggregates: a.aggregates,
            skew: a.skew,
            zipf_s: a.zipf_s,
            payload_bytes: a.payload_bytes as usize,
            kafka_brokers: a.kafka_brokers.clone(),
            topic: a.topic.clone(),
            partitions: a.partitions as i32,
            pg_analyze_every: a.pg_analyze_every,
            baseline: a.baseline.then(|| {
                a.baseline_duration
                    .unwrap_or(a.duration.min(Duration::from_secs(10)))
            }),
            inbox: a.inbox.then(|| InboxSpec {
                url: a.inbox_url.clone(),
                workers: a.inbox_workers as usize,
                sqlite_sync: a.sqlite_synchronous,
                keep: a.keep_db,
            }),
            progress: !a.no_progress,
            seed: a.seed.unwrap_or_else(|| rand::thread_rng().gen()),
            dispatch,
            preload: a.preload.map(|total| Preload {
                total,
                per_aggregate: a.versions_per_aggregate.unwrap_or(1),
            }),
        }
    }

    /// Producer tasks that get work (a preload gives every producer whole aggregates).
    fn producer_tasks(&self) -> usize {
        match &self.preload {
            Some(p) => p.producers(self.producers),
            None => self.producers,
        }
    }

    fn plan(&self, run: &str, topic: &str) -> ProducerPlan {
        ProducerPlan {
            ids: Ids {
                run: run.to_string(),
            },
            producers: self.producer_tasks(),
            aggregates: self.aggregates,
            skew: self.skew,
            zipf_s: self.zipf_s,
            orders_per_tx: self.orders_per_tx,
            rate: self.rate,
            payload_bytes: self.payload_bytes,
            topic: topic.to_string(),
            seed: self.seed,
            preload: self.preload,
        }
    }
}

fn new_run_id() -> String {
    format!("{:06x}", rand::thread_rng().gen::<u32>() & 0x00ff_ffff)
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
            tokio::spawn(producer::run(
                db.clone(),
                plan.clone(),
                p,
                counters.clone(),
                stop.clone(),
            ))
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

/// The producer-only ceiling: the same producers, flat out, no relay, in a namespace of their
/// own (so their rows do not become a backlog for the measured run).
async fn run_baseline(
    spec: &RunSpec,
    length: Duration,
    interrupt: &CancellationToken,
) -> Result<(Duration, u64)> {
    let run = new_run_id();
    let mut db_spec = spec.db.clone();
    db_spec.keep = false;
    if spec.progress {
        eprintln!(
            "loadgen: baseline: {} producers, no relay, {:.0}s",
            spec.producers,
            length.as_secs_f64()
        );
    }
    let db = Arc::new(Database::create(&db_spec, &run, spec.producers as u32 + 2).await?);
    let counters = Arc::new(Counters::default());
    let stop = CancellationToken::new();
    let t0 = Instant::now();
    // Flat out whatever --rate says: the baseline is the database's own insert ceiling.
    let mut plan = spec.plan(&run, "loadgen-baseline");
    plan.rate = 0;
    let handles = start_producers(&db, plan, &counters, &stop);
    tokio::select! {
        _ = tokio::time::sleep(length) => {}
        _ = interrupt.cancelled() => {}
    }
    stop.cancel();
    let (results, errors) = join_producers(handles).await;
    let elapsed = t0.elapsed();
    if spec.progress {
        let n: u64 = results.iter().map(|r| r.committed).sum();
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
        return Err(Error::Producer {
            producer: 0,
            reason: format!("baseline phase: {e}"),
        });
    }
    Ok((elapsed, results.iter().map(|r| r.committed).sum()))
}

/// The producer-only baseline `spec` asks for (`--baseline`), as (length, intents committed).
pub async fn baseline(
    spec: &RunSpec,
    interrupt: &CancellationToken,
) -> Result<Option<(Duration, u64)>> {
    match spec.baseline {
        Some(d) => Ok(Some(run_baseline(spec, d, interrupt).await?)),
        None => Ok(None),
    }
}

/// Carries out one run and reports it, relating its throughput to `baseline` if given.
/// `interrupt` (Ctrl-C) ends the load phase early; the drain and the verification still run.
pub async fn run(
    spec: &RunSpec,
    baseline: Option<(Duration, u64)>,
    interrupt: &CancellationToken,
) -> Result<RunReport> {
    let run = new_run_id();
    let db = Arc::new(Database::create(&spec.db, &run, spec.producers as u32 + 4).await?);
    let result = execute(spec, &run, &db, baseline, interrupt).await;
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

/// Ids committed by the producers that the verifier has not seen.
fn missing_ids(v: &Verifier, ids: &Ids, results: &[ProducerResult]) -> Vec<String> {
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

/// Waits until every committed intent is SENT and, with a consumer, delivered. Returns whether
/// that happened before `timeout`, and the ids still missing at the last exact check. (The
/// Inbox consumer catches up afterwards, once the relays have stopped: see `inbox::finish`.)
async fn drain(
    live: &Live<'_>,
    sampler: &mut Sampler,
    ids: &Ids,
    results: &[ProducerResult],
    timeout: Duration,
    errors: &mut Vec<String>,
) -> (bool, Option<Vec<String>>) {
    let committed: u64 = results.iter().map(|r| r.committed).sum();
    let start = Instant::now();
    let deadline = start + timeout;
    let mut missing: Option<Vec<String>> = None;
    let mut store_drained_at: Option<Instant> = None;
    let mut next_tick = start + Duration::from_secs(1);
    let mut last_store_check = start;
    let drained = loop {
        if Instant::now() >= next_tick {
            sampler.tick(live, "drain").await;
            next_tick += Duration::from_secs(1);
            if let Some(relays) = live.relays {
                if let Err(e) = relays.check_alive().await {
                    errors.push(e.to_string());
                    break false;
                }
            }
        }
        // The store's count is the arbiter, but in cursor dispatch it walks the backlog (seconds
        // with 100k behind): while in-process relays' own counters say events are left, ask
        // the store only every 5 s, so the drain does not measure its own polling.
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
            match live.verifier {
                None => break true,
                Some(v) => {
                    // A cheap count first; the exact per-id check once it looks complete (or
                    // once the consumer has had 3 s to catch up), then only the stragglers.
                    if v.report().delivered >= committed || since.elapsed() > Duration::from_secs(3)
                    {
                        let still = match missing.take() {
                            None => missing_ids(v, ids, results),
                            Some(m) => m.into_iter().filter(|id| !v.was_delivered(id)).collect(),
                        };
                        let done = still.is_empty();
                        missing = Some(still);
                        if done {
                            break true;
                        }
                    }
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

/// What the verification found.
struct Verified {
    delivered: u64,
    consumed: u64,
    duplicates: u64,
    lost: u64,
    ordering_violations: u64,
    consumed_latency: Option<Histogram<u64>>,
    verification: Verification,
}

/// Loss and order: against the consumer's deliveries when there is one, else against the
/// store (every committed intent SENT; row mode: successive versions SENT in order) and, for
/// in-process relays, the order in which versions were handed to the sink.
#[allow(clippy::too_many_arguments)]
async fn verify(
    db: &Database,
    verifier: Option<&Verifier>,
    order_check: Option<&crate::relays::OrderCheck>,
    missing: Option<Vec<String>>,
    ids: &Ids,
    results: &[ProducerResult],
    sink: SinkKind,
    sent_rows: i64,
    unsent_examples: &[String],
) -> Result<Verified> {
    let committed: u64 = results.iter().map(|r| r.committed).sum();
    let mut verification = Verification::default();
    Ok(match verifier {
        Some(v) => {
            let rep = v.report();
            let still: Vec<String> = match missing {
                Some(m) => m.into_iter().filter(|id| !v.was_delivered(id)).collect(),
                None => missing_ids(v, ids, results),
            };
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
            }
        }
        None => {
            verification.method = "store".to_string();
            let store_order = db.sent_order_violations().await?.map(|n| n.max(0) as u64);
            let sink_order = order_check.map(crate::relays::OrderCheck::result);
            let (ordering_violations, how) = match (store_order, &sink_order) {
                (Some(s), Some((k, _, _))) => (s.max(*k), "store+sink"),
                (Some(s), None) => (s, "store"),
                (None, Some((k, _, _))) => (*k, "sink"),
                (None, None) => (0, "not checked"),
            };
            verification.ordering_check = how.to_string();
            if let Some((_, _, examples)) = sink_order {
                verification.ordering_examples = examples;
            }
            let order = match how {
                "store+sink" => "that successive versions were marked SENT in order and handed to the sink in order",
                "store" => "that successive versions were marked SENT in order",
                "sink" => "that each aggregate's versions were handed to the sink in order (rows dispatched by the cursor carry no sent_at)",
                _ => "NOT the order: rows dispatched by the cursor carry no sent_at and relay processes' sinks are out of reach (use --sink kafka or in-process relays)",
            };
            let sent = match db.dispatch {
                Dispatch::Row => "SENT",
                Dispatch::Cursor => "SENT (behind its slot's cursor or by its exception row: ferry_outbox_cursor_view)",
            };
            verification.consumer_skipped = Some(format!(
                "--sink {} has no consumer; checked instead that every committed intent is {sent}, and {order}",
                sink.as_str()
            ));
            verification.lost_examples = unsent_examples.to_vec();
            Verified {
                delivered: 0,
                consumed: 0,
                duplicates: 0,
                lost: committed.saturating_sub(sent_rows.max(0) as u64),
                ordering_violations,
                consumed_latency: None,
                verification,
            }
        }
    })
}

/// The load phase: producers for `--duration` with the relays running. Returns what the
/// producers committed and the phase's length.
#[allow(clippy::too_many_arguments)]
async fn load_phase(
    spec: &RunSpec,
    db: &Arc<Database>,
    run: &str,
    topic: &str,
    counters: &Arc<Counters>,
    live: &Live<'_>,
    sampler: &mut Sampler,
    interrupt: &CancellationToken,
    notes: &mut Vec<String>,
    errors: &mut Vec<String>,
) -> (Vec<ProducerResult>, f64) {
    let stop = CancellationToken::new();
    let handles = start_producers(db, spec.plan(run, topic), counters, &stop);
    let analyzer = (spec.db.store == StoreKind::Postgres && !spec.pg_analyze_every.is_zero())
        .then(|| start_analyzer(db.clone(), spec.pg_analyze_every, stop.clone()));
    let t0 = sampler.t0;
    let load_end = t0 + spec.duration;
    let mut tick = 1u32;
    loop {
        let next = (t0 + Duration::from_secs(u64::from(tick))).min(load_end);
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = interrupt.cancelled() => {
                notes.push(format!("interrupted after {:.1}s of load", t0.elapsed().as_secs_f64()));
                break;
            }
        }
        tick += 1;
        sampler.tick(live, "load").await;
        if let Some(relays) = live.relays {
            if let Err(e) = relays.check_alive().await {
                errors.push(e.to_string());
                break;
            }
        }
        if handles.iter().any(JoinHandle::is_finished) {
            errors.push("a producer stopped early (see below)".to_string());
            break;
        }
        if Instant::now() >= load_end {
            break;
        }
    }
    stop.cancel();
    let (results, producer_errors) = join_producers(handles).await;
    errors.extend(producer_errors);
    if let Some(a) = analyzer {
        let n = a.await.unwrap_or(0);
        notes.push(format!(
            "ANALYZE ran {n} time(s) during the load (--pg-analyze-every {:.0}s), standing in for autovacuum on the fresh schema",
            spec.pg_analyze_every.as_secs_f64()
        ));
    }
    (results, t0.elapsed().as_secs_f64())
}

/// The preload of a burn-down: the producers commit their whole share of the queue as fast as
/// they can, with no relay running. Returns what they committed, how long it took, and the
/// totals at its end (everything is backlog).
#[allow(clippy::too_many_arguments)]
async fn preload(
    spec: &RunSpec,
    db: &Arc<Database>,
    run: &str,
    topic: &str,
    shape: Preload,
    counters: &Arc<Counters>,
    sampler: &mut Sampler,
    verifier: Option<&Verifier>,
    inbox: Option<&InboxConsumer>,
    interrupt: &CancellationToken,
    notes: &mut Vec<String>,
    errors: &mut Vec<String>,
) -> (Vec<ProducerResult>, f64, crate::progress::Totals) {
    let live = Live {
        db,
        counters,
        relays: None,
        verifier,
        inbox,
    };
    if spec.progress {
        eprintln!(
            "loadgen: preload: {} intents ({} aggregates × {} versions) with {} producers, no relay running",
            shape.total,
            shape.aggregates(),
            shape.per_aggregate,
            spec.producer_tasks()
        );
    }
    let stop = CancellationToken::new();
    let mut plan = spec.plan(run, topic);
    plan.rate = 0;
    let handles = start_producers(db, plan, counters, &stop);
    let t0 = Instant::now();
    let join = join_producers(handles);
    tokio::pin!(join);
    let mut next = t0 + Duration::from_secs(1);
    let (results, producer_errors) = loop {
        tokio::select! {
            r = &mut join => break r,
            _ = tokio::time::sleep_until(next) => {
                next += Duration::from_secs(1);
                sampler.tick(&live, "preload").await;
            }
            _ = interrupt.cancelled(), if !stop.is_cancelled() => {
                notes.push(format!("interrupted after {:.1}s of preload: the relays drain what was committed", t0.elapsed().as_secs_f64()));
                stop.cancel();
            }
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    errors.extend(producer_errors);
    sampler.tick(&live, "preload").await;
    let committed: u64 = results.iter().map(|r| r.committed).sum();
    if spec.progress {
        eprintln!(
            "loadgen: preload: {committed} intents committed in {secs:.2}s ({} ev/s); starting the relays",
            report::rate(committed as f64 / secs.max(1e-9))
        );
    }
    if spec.db.store == StoreKind::Postgres && !spec.pg_analyze_every.is_zero() {
        // the planner should see the queue it drains (autovacuum would have analyzed it)
        match db.pg_analyze().await {
            Ok(_) => notes.push(
                "ANALYZE ran once after the preload, before the relays started (standing in for autovacuum on the fresh schema)".to_string(),
            ),
            Err(e) => tracing::warn!(error = %e, "ANALYZE failed"),
        }
    }
    let totals = live.totals().await;
    (results, secs, totals)
}

/// The outbox's rows against what the producers committed, then [`verify`]; notes on a
/// timed-out drain and on the mock cluster's retention. Returns `(rows, SENT rows, examples of
/// unsent rows, the verdict)`.
#[allow(clippy::too_many_arguments)]
async fn check(
    db: &Database,
    spec: &RunSpec,
    kafka: Option<&KafkaTarget>,
    verifier: Option<Verifier>,
    order_check: Option<&crate::relays::OrderCheck>,
    missing: Option<Vec<String>>,
    (ids, results): (&Ids, &[ProducerResult]),
    drained: bool,
    (notes, errors): (&mut Vec<String>, &mut Vec<String>),
) -> Result<(i64, i64, Vec<String>, Verified)> {
    let committed: u64 = results.iter().map(|r| r.committed).sum();
    let rows = db.count_rows().await?;
    let sent_rows = db.count_sent().await?;
    let unsent_examples = if sent_rows < rows {
        db.unsent_examples().await?
    } else {
        Vec::new()
    };
    if rows as u64 != committed {
        let msg =
            format!("the outbox holds {rows} rows but the producers committed {committed} intents");
        if (rows as u64) < committed {
            errors.push(msg);
        } else {
            notes.push(msg);
        }
    }
    let mut verified = verify(
        db,
        verifier.as_ref(),
        order_check,
        missing,
        ids,
        results,
        spec.relays.sink,
        sent_rows,
        &unsent_examples,
    )
    .await?;
    drop(verifier);
    let lost = verified.lost;
    if !drained && lost > 0 {
        notes.push(format!(
            "the drain timed out after {:.0}s: `lost` counts intents still undelivered at that deadline ({} rows not SENT); rerun with a longer --drain-timeout to tell a slow relay from a lossy one",
            spec.drain_timeout.as_secs_f64(),
            rows - sent_rows
        ));
    }
    if let Some(k) = kafka {
        if lost > 0 && k.embedded {
            let truncated = {
                let (brokers, topic, partitions) =
                    (k.brokers.clone(), k.topic.clone(), k.partitions);
                tokio::task::spawn_blocking(move || {
                    crate::kafka::truncated_partitions(&brokers, &topic, partitions)
                })
                .await
                .ok()
                .flatten()
            };
            verified.verification.retention_truncated_partitions = truncated;
            if truncated.unwrap_or(0) > 0 {
                notes.push(format!(
                    "{} partitions of the mock cluster dropped old messages (~5 MiB retention per partition): if the consumer lagged that far, the missing ids are retention drops, not relay loss; check `store.sent_rows` and rerun with more --partitions",
                    truncated.unwrap_or(0)
                ));
            }
        }
    }
    Ok((rows, sent_rows, unsent_examples, verified))
}

async fn execute(
    spec: &RunSpec,
    run: &str,
    db: &Arc<Database>,
    baseline: Option<(Duration, u64)>,
    interrupt: &CancellationToken,
) -> Result<RunReport> {
    let mut notes = Vec::new();
    let mut errors = Vec::new();
    // the setup's statistics (migrations, the dispatch switch) were reported when its
    // connections closed (Database::create reconnects): wait until they show
    let pg_before = db
        .pg_costs_settled(Duration::from_millis(200))
        .await?
        .map(|(c, _)| c);
    let sqlite_before = db.sqlite_writes().await?;
    let server = db.server_info().await;
    let topic = spec
        .topic
        .clone()
        .unwrap_or_else(|| format!("loadgen-{run}"));
    let kafka = if spec.relays.sink == SinkKind::Kafka {
        let (brokers, topic, partitions) =
            (spec.kafka_brokers.clone(), topic.clone(), spec.partitions);
        let target = tokio::task::spawn_blocking(move || match brokers {
            Some(b) => KafkaTarget::external(&b, &topic, partitions),
            None => KafkaTarget::embedded(&topic, partitions),
        })
        .await
        .map_err(|e| Error::Kafka(format!("setup task failed: {e}")))??;
        Some(target)
    } else {
        None
    };
    let kafka_partitions = kafka.as_ref().map(|k| k.partitions);
    let verifier = kafka.as_ref().map(KafkaTarget::verifier).transpose()?;
    let inbox = match (&spec.inbox, &kafka) {
        (Some(s), Some(k)) => {
            Some(InboxConsumer::start(s, run, &k.brokers, &k.topic, k.partitions).await?)
        }
        _ => None,
    };
    let log_dir = std::env::temp_dir().join(format!("loadgen-{run}-relay-logs"));
    if spec.relays.mode == RelayMode::Process {
        std::fs::create_dir_all(&log_dir).map_err(|source| Error::Io {
            what: "create the relay log directory",
            path: log_dir.clone(),
            source,
        })?;
    }
    let ids = Ids {
        run: run.to_string(),
    };
    let counters = Arc::new(Counters::default());
    let mut sampler = Sampler::new(spec.progress);

    // ---- preload (a queue burn-down): commit everything with no relay running
    let preloaded = match spec.preload {
        Some(shape) => Some(
            preload(
                spec,
                db,
                run,
                &topic,
                shape,
                &counters,
                &mut sampler,
                verifier.as_ref(),
                inbox.as_ref(),
                interrupt,
                &mut notes,
                &mut errors,
            )
            .await,
        ),
        None => None,
    };
    let relays_started = Instant::now();

    let relay_spec = RelaySpec {
        clock: Some(counters.clock.clone()),
        ..spec.relays.clone()
    };
    let relays = Relays::start(
        &relay_spec,
        db,
        run,
        kafka.as_ref().map(|k| k.brokers.as_str()),
        &log_dir,
    )
    .await?;
    if preloaded.is_none() {
        let settle = match spec.relays.mode {
            // relays heartbeat every 5 s by default: a rebalance takes two or three rounds
            RelayMode::InProcess => Duration::from_secs(30),
            RelayMode::Process => Duration::from_secs(40),
        };
        let settled = match wait_for_slots(db, &relays, spec.relays.relays, settle).await {
            Ok(settled) => settled,
            Err(e) => {
                let _ = relays.stop().await;
                return Err(e);
            }
        };
        if !settled {
            notes.push(format!(
                "slot ownership had not settled after {:.0}s; the load started anyway",
                settle.as_secs_f64()
            ));
        }
    } else if spec.relays.relays > 1 {
        notes.push(format!(
            "the {} relays started on the preloaded queue together: the slot rebalance between them is part of the drain time",
            spec.relays.relays
        ));
    }
    let chaos_stop = CancellationToken::new();
    let chaos = match (spec.chaos, relays.processes()) {
        (Some(every), Some(p)) => Some(crate::chaos::start(p, every, chaos_stop.clone())),
        _ => None,
    };

    let live = Live {
        db,
        counters: &counters,
        relays: Some(&relays),
        verifier: verifier.as_ref(),
        inbox: inbox.as_ref(),
    };
    let (results, load_secs, at_load_end) = match preloaded {
        Some((results, secs, at_end)) => (results, secs, at_end),
        None => {
            // the load phase (and the timeline) start now, after the slots settled
            sampler = Sampler::new(spec.progress);
            let (results, secs) = load_phase(
                spec,
                db,
                run,
                &topic,
                &counters,
                &live,
                &mut sampler,
                interrupt,
                &mut notes,
                &mut errors,
            )
            .await;
            (results, secs, live.totals().await)
        }
    };
    let committed: u64 = results.iter().map(|r| r.committed).sum();

    // ---- drain: until every committed intent is SENT and (with a consumer) delivered; after a
    // preload, timed from starting the relays
    let drain_start = if spec.preload.is_some() {
        relays_started
    } else {
        Instant::now()
    };
    let (drained, missing) = drain(
        &live,
        &mut sampler,
        &ids,
        &results,
        spec.drain_timeout.saturating_sub(drain_start.elapsed()),
        &mut errors,
    )
    .await;
    let drain_secs = drain_start.elapsed().as_secs_f64();
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
        errors.push(e.to_string());
    }

    // ---- Inbox: every message up to the final high watermarks applied, effects read back
    let inbox = match (inbox, &kafka) {
        (Some(ib), Some(k)) => {
            let high = {
                let (brokers, topic, partitions) =
                    (k.brokers.clone(), k.topic.clone(), k.partitions);
                tokio::task::spawn_blocking(move || {
                    crate::kafka::high_watermarks(&brokers, &topic, partitions)
                })
                .await
                .ok()
                .flatten()
            };
            let mut r = ib
                .finish(high, spec.drain_timeout, &ids, &results, spec.progress)
                .await?;
            r.applied_per_sec = report::round3(at_load_end.inbox as f64 / load_secs);
            r.lag_peak = sampler
                .timeline
                .iter()
                .filter_map(|s| s.inbox_lag)
                .max()
                .unwrap_or(0);
            if !r.settled {
                errors.push(format!(
                    "the Inbox consumer stopped applying messages for {:.0}s (--drain-timeout) before it had applied every message of the topic",
                    spec.drain_timeout.as_secs_f64()
                ));
            }
            Some(r)
        }
        _ => None,
    };

    // ---- verification
    let (rows, sent_rows, unsent_examples, verified) = check(
        db,
        spec,
        kafka.as_ref(),
        verifier,
        order_check.as_deref(),
        missing,
        (&ids, &results),
        drained,
        (&mut notes, &mut errors),
    )
    .await?;
    let Verified {
        delivered,
        consumed,
        duplicates,
        lost,
        ordering_violations,
        consumed_latency,
        verification,
    } = verified;
    drop(kafka);

    // ---- latencies and costs
    let in_process = spec.relays.mode == RelayMode::InProcess;
    let commit_to_ack = relay_checks(db, spec, &relay_metrics, (&mut notes, &mut errors)).await?;
    let mut producer_tx = new_histogram();
    for r in &results {
        let _ = producer_tx.add(&r.tx_latency);
    }
    let sqlite_after = db.sqlite_writes().await?;
    // relays are stopped (their pools closed, processes exited); closing the producers' pool
    // makes its backends exit, which reports their last statistics
    db.close_pool().await;
    let pg_after = db.pg_costs_settled(Duration::ZERO).await?;
    let db_costs = costs(
        db.kind,
        committed,
        pg_before,
        pg_after,
        sqlite_before,
        sqlite_after,
        sampler.dead_peak,
    );

    let total_secs = load_secs + drain_secs;
    let sent = if in_process {
        relay_metrics.sent
    } else {
        sent_rows.max(0) as u64
    };
    let sent_per_sec = at_load_end.sent as f64 / load_secs;
    let baseline = baseline.map(|b| baseline_report(b, sent_per_sec, committed, load_secs));
    // after a preload the relays ran during the drain only
    let relay_secs = if spec.preload.is_some() {
        drain_secs
    } else {
        total_secs
    };
    let claims = claims(&relay_metrics, relay_secs);
    let batch_size = BatchStats::from_hist(&relay_metrics.batch_size);
    if claims.quarantined > 0 {
        errors.push(format!(
            "{} events were quarantined (see the relay warnings)",
            claims.quarantined
        ));
    }
    let ok = lost == 0
        && ordering_violations == 0
        && errors.is_empty()
        && match &inbox {
            Some(r) => r.ok(),
            None => true,
        };
    if spec.relays.mode == RelayMode::Process {
        if ok {
            let _ = std::fs::remove_dir_all(&log_dir);
        } else {
            notes.push(format!(
                "relay process logs are kept in {}",
                log_dir.display()
            ));
        }
    }
    let preload = spec.preload.map(|shape| PreloadReport {
        intents: committed,
        versions_per_aggregate: shape.per_aggregate,
        aggregates: shape.aggregates(),
        producers: spec.producer_tasks(),
        commit_secs: report::round3(load_secs),
        commit_per_sec: report::round3(committed as f64 / load_secs.max(1e-9)),
        drain_secs: report::round3(drain_secs),
        drain_per_sec: report::round3(committed as f64 / drain_secs.max(1e-9)),
        drained,
    });
    Ok(RunReport {
        label: spec.label.clone(),
        ok,
        dispatch: spec.dispatch,
        preload,
        enqueued: committed,
        sent,
        consumed,
        delivered,
        duplicates,
        lost,
        ordering_violations,
        enqueued_per_sec: report::round3(committed as f64 / load_secs),
        sent_per_sec: report::round3(sent_per_sec),
        consumed_per_sec: report::round3(at_load_end.consumed as f64 / load_secs),
        sent_per_sec_overall: report::round3(sent as f64 / total_secs),
        duration_secs: report::round3(load_secs),
        drain_secs: report::round3(drain_secs),
        drained,
        backlog_at_end_of_load: at_load_end.backlog,
        latency_ms: Latencies {
            commit_to_ack: Quantiles::from_us(&commit_to_ack),
            committed_to_broker_ack: Quantiles::from_us(&counters.clock.histogram()),
            commit_to_consumed: consumed_latency.as_ref().and_then(Quantiles::from_us),
            producer_tx: Quantiles::from_us(&producer_tx),
            claim: Quantiles::from_us(&relay_metrics.claim_latency),
            ack_cas: Quantiles::from_us(&relay_metrics.ack_latency),
        },
        claims: Some(claims),
        batch_size,
        per_relay_sent: relay_metrics.per_relay_sent.clone(),
        chaos_kills,
        producer_txs: counters.txs.load(Ordering::Relaxed),
        producer_retries: counters.retries.load(Ordering::Relaxed),
        store: StoreCheck {
            rows,
            sent_rows,
            unsent_examples,
        },
        verification,
        inbox,
        baseline,
        db_costs,
        peak_rss_mb: report::peak_rss_mb(),
        errors,
        notes,
        timeline: std::mem::take(&mut sampler.timeline),
        config: echo(spec, run, &topic, &server, kafka_partitions),
    })
}

/// Commit→ack latency (the in-process relays' own histogram, else from the rows'
/// timestamps), and an error unless the relays ran in the dispatch mode asked for.
async fn relay_checks(
    db: &Database,
    spec: &RunSpec,
    relay_metrics: &RelayMetrics,
    (notes, errors): (&mut Vec<String>, &mut Vec<String>),
) -> Result<Histogram<u64>> {
    let in_process = spec.relays.mode == RelayMode::InProcess;
    let commit_to_ack = if in_process {
        relay_metrics.commit_to_ack.clone()
    } else {
        match db.commit_to_ack_from_rows().await? {
            Some(h) => {
                notes.push("relays ran as processes: commit→ack is computed from the rows' created_at/sent_at, claim counters are scraped from each surviving relay's /metrics (a killed process takes its counters along)".to_string());
                h
            }
            None => {
                notes.push("relays ran as processes in cursor mode: commit→ack is not reported (rows dispatched by the cursor carry no sent_at; the relays' own ferry_commit_to_ack_seconds summaries cannot be merged); claim counters are scraped from each surviving relay's /metrics".to_string());
                new_histogram()
            }
        }
    };
    // the relays must have run in the mode asked for (a relay reports it as ferry_dispatch_cursor)
    let (want, other) = match spec.dispatch {
        Dispatch::Cursor => (relay_metrics.dispatch_cursor, relay_metrics.dispatch_row),
        Dispatch::Row => (relay_metrics.dispatch_row, relay_metrics.dispatch_cursor),
    };
    if other > 0 {
        errors.push(format!(
            "{other} relay(s) reported the other dispatch mode than --dispatch {} (ferry_dispatch_cursor)",
            spec.dispatch.as_str()
        ));
    } else if want == 0 && in_process {
        errors.push("no relay reported its dispatch mode".to_string());
    }
    Ok(commit_to_ack)
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
        duration_secs: report::round3(d.as_secs_f64()),
        enqueued: n,
        enqueued_per_sec: report::round3(per_sec),
        relay_ratio: report::round3(sent_per_sec / per_sec.max(1e-9)),
        enqueue_ratio: report::round3(committed as f64 / load_secs / per_sec.max(1e-9)),
    }
}

fn claims(m: &RelayMetrics, secs: f64) -> Claims {
    Claims {
        claims: m.claims,
        claims_per_sec: report::round3(m.claims as f64 / secs.max(1e-9)),
        empty_claims: m.empty_claims,
        empty_ratio: report::round3(m.empty_claims as f64 / m.claims.max(1) as f64),
        claimed_items: m.claimed_items,
        fenced: m.fenced,
        slot_fenced: m.slot_fenced,
        retried: m.retried,
        unknown: m.unknown,
        quarantined: m.quarantined,
        store_errors: m.store_errors,
        rows_skipped_locked: m.skipped_locked,
        acked_after_failed_predecessor: m.acked_after_failed_predecessor,
    }
}

/// The costs section: PostgreSQL sizes and per-table statistics (deltas over the run), or what
/// SQLite can tell cheaply; row writes per event from either.
fn costs(
    kind: StoreKind,
    events: u64,
    pg_before: Option<crate::db::PgCosts>,
    pg_after: Option<(crate::db::PgCosts, bool)>,
    sqlite_before: Option<crate::db::SqliteWrites>,
    sqlite_after: Option<crate::db::SqliteWrites>,
    dead_peak: i64,
) -> Option<DbCosts> {
    let per = |n: i64| Some(report::round3(n as f64 / events.max(1) as f64));
    match kind {
        StoreKind::Postgres => {
            let (before, (after, settled)) = (pg_before?, pg_after?);
            let growth = after.outbox_total_bytes - before.outbox_total_bytes;
            let tables: Vec<crate::db::TableStats> = after
                .tables
                .iter()
                .map(|a| {
                    let b = before
                        .tables
                        .iter()
                        .find(|b| b.table == a.table)
                        .cloned()
                        .unwrap_or_default();
                    crate::db::TableStats {
                        table: a.table.clone(),
                        n_tup_ins: a.n_tup_ins - b.n_tup_ins,
                        n_tup_upd: a.n_tup_upd - b.n_tup_upd,
                        n_tup_del: a.n_tup_del - b.n_tup_del,
                        n_tup_hot_upd: a.n_tup_hot_upd - b.n_tup_hot_upd,
                        n_dead_tup: a.n_dead_tup,
                    }
                })
                .collect();
            let outbox: Vec<_> = tables
                .iter()
                .filter(|t| t.table != "ferry_slot_lease")
                .collect();
            let writes: i64 = outbox
                .iter()
                .map(|t| t.n_tup_ins + t.n_tup_upd + t.n_tup_del)
                .sum();
            let dead: i64 = outbox.iter().map(|t| t.n_dead_tup).sum();
            let lease_upd: i64 = tables
                .iter()
                .filter(|t| t.table == "ferry_slot_lease")
                .map(|t| t.n_tup_upd)
                .sum();
            Some(DbCosts {
                n_dead_tup_peak: Some(dead_peak.max(after.n_dead_tup)),
                outbox_growth_bytes: Some(growth),
                outbox_bytes_per_event: Some(report::round3(growth as f64 / events.max(1) as f64)),
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
        StoreKind::Sqlite => {
            let (b, a) = (sqlite_before?, sqlite_after?);
            let d = crate::db::SqliteWrites {
                outbox_rows: a.outbox_rows - b.outbox_rows,
                outbox_claims: a.outbox_claims - b.outbox_claims,
                exception_rows: a.exception_rows - b.exception_rows,
                exception_claims: a.exception_claims - b.exception_claims,
                cursor_versions: a.cursor_versions - b.cursor_versions,
            };
            // INSERTs exact; every claim is one UPDATE and its outcome (SENT, retry, release)
            // another; cursor advances move cursor_version (one UPDATE per slot moved)
            let writes =
                d.outbox_rows + 2 * d.outbox_claims + d.exception_rows + 2 * d.exception_claims;
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
        StoreKind::Mysql => None,
    }
}

fn echo(
    spec: &RunSpec,
    run: &str,
    topic: &str,
    server: &[(String, String)],
    partitions: Option<i32>,
) -> ConfigEcho {
    let kafka = spec.relays.sink == SinkKind::Kafka;
    ConfigEcho {
        run_id: run.to_string(),
        store: spec.db.store,
        database_url: spec.db.url.as_deref().map(redact_url),
        server: server.to_vec(),
        sink: spec.relays.sink,
        kafka: kafka.then(|| {
            spec.kafka_brokers
                .clone()
                .unwrap_or_else(|| "embedded mock cluster".to_string())
        }),
        topic: kafka.then(|| topic.to_string()),
        // the topic's own count (an external broker's existing topic keeps its own)
        partitions,
        relays: spec.relays.relays,
        relay_mode: spec.relays.mode,
        workers: spec.relays.workers,
        batch_size: spec.relays.batch_size,
        in_flight: spec.relays.in_flight,
        read_linger_ms: spec
            .relays
            .read_linger
            .unwrap_or(ferry_relay::RelayConfig::default().read_linger)
            .as_millis() as u64,
        producers: spec.producer_tasks(),
        orders_per_tx: spec.orders_per_tx,
        rate: spec.rate,
        aggregates: spec.aggregates,
        skew: spec.skew,
        zipf_s: (spec.skew == Skew::Zipf).then_some(spec.zipf_s),
        payload_bytes: spec.payload_bytes,
        duration_secs: spec.duration.as_secs_f64(),
        drain_timeout_secs: spec.drain_timeout.as_secs_f64(),
        chaos_interval_secs: spec.chaos.map(|d| d.as_secs_f64()),
        seed: spec.seed,
        dispatch: spec.dispatch,
        preload: spec.preload.map(|p| p.total),
        versions_per_aggregate: spec.preload.map(|p| p.per_aggregate),
    }
}
