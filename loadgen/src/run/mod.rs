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
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cli::RelayMode;
use crate::db::Database;
use crate::error::{Error, Result};
use crate::inbox::InboxConsumer;
use crate::progress::Sampler;
use crate::report::{self, RunReport};
use crate::spec::RunSpec;
use ferry_testkit::workload::{producer, Counters};

mod assemble;
mod context;
mod load;
mod verify;

use self::assemble::Measured;
use self::context::Run;

fn new_run_id() -> String {
    format!("{:06x}", rand::thread_rng().gen::<u32>() & 0x00ff_ffff)
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
    let handles = producer::spawn_all(db.pool(), Arc::new(plan), &counters, &stop);
    tokio::select! {
        _ = tokio::time::sleep(length) => {}
        _ = interrupt.cancelled() => {}
    }
    stop.cancel();
    let (results, errors) = producer::join_all(handles).await;
    let elapsed = t0.elapsed();
    let n = producer::committed(&results);
    if spec.progress {
        eprintln!(
            "loadgen: baseline: {n} intents in {:.1}s = {} ev/s",
            elapsed.as_secs_f64(),
            report::render::rate(n as f64 / elapsed.as_secs_f64())
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
    let db = Arc::new(Database::create(spec, spec.db.keep, &run, spec.producers as u32 + 4).await?);
    let result = Run::new(spec, &run, &db, interrupt).execute(baseline).await;
    match Arc::try_unwrap(db) {
        Ok(db) => db.finish().await,
        Err(_) => eprintln!("loadgen: the database is still in use; not dropping it"),
    }
    result
}

impl<'a> Run<'a> {
    /// The run from the database's "before" snapshot to the report.
    async fn execute(self, baseline: Option<(Duration, u64)>) -> Result<RunReport> {
        let (spec, db) = (self.spec, self.db);
        // the setup's statistics (migrations, the dispatch switch) were reported when its
        // connections closed (Database::create reconnects): wait until they show
        let before = self.costs_before().await?;
        let server = db.server_info().await;
        let kafka = self.kafka().await?;
        let kafka_partitions = kafka.as_ref().map(|k| k.partitions);
        let verifier = self.verifier(kafka.as_ref())?;
        let inbox = match (&spec.inbox, &kafka) {
            (Some(ib), Some(k)) => Some(
                InboxConsumer::start(spec, ib, self.run, &k.brokers, &k.topic, k.partitions)
                    .await?,
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
            sampler.start_intervals(relays_started, spec.report_interval, &self.clock);
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
                sampler.start_intervals(t0, spec.report_interval, &self.clock);
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
        sampler.close_intervals(&live, true).await;
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
        let in_relays = spec.retention.filter(|r| r.in_relays);
        let registries = in_relays.and_then(|_| relays.retention_registries());
        if let Err(e) = relays.stop().await {
            self.error(e.to_string());
        }
        // the relays purged until they stopped: their counts are final now
        let purge = match (purge, in_relays, registries) {
            (None, Some(r), Some((m, vacuum))) => {
                Some(crate::retention::relays_tally(&m, vacuum, r.batch))
            }
            (purge, _, _) => purge,
        };
        let inbox = match inbox {
            Some(ib) => {
                let applied = at_load_end.inbox as f64 / load_secs;
                Some(self.finish_inbox(ib, applied, &sampler, &results).await?)
            }
            None => None,
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
        let db_costs = self
            .costs_after(before, &results, sampler.dead_peak, purge.as_ref())
            .await?;
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
}
