//! The phases that put load on the system: the topic, the relays, the producers (a load
//! phase or a preloaded queue) and the drain.
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::DispatchMode;
use ferry_relay::ownership::desired_slots;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::context::Run;
use super::verify::missing_ids;
use crate::cli::{RelayMode, SinkKind};
use crate::db::Database;
use crate::error::{Error, Result};
use crate::kafka::KafkaTarget;
use crate::progress::{Live, Sampler, Totals};
use crate::relays::Relays;
use crate::report::{self};
use crate::retention::{Purger, StorePurge};
use crate::spec::{Preload, RunSpec};
use ferry_store::Backend;
use ferry_testkit::verify::Verifier;
use ferry_testkit::workload::{producer, Ids, ProducerPlan, ProducerResult};

impl RunSpec {
    /// The producers' plan; `flat_out` ignores `--rate` (the baseline, a preload).
    pub(super) fn plan(&self, run: &str, topic: &str, flat_out: bool) -> ProducerPlan {
        let mut work = self.work.clone();
        if flat_out {
            work.rate = 0;
        }
        let ids = Ids {
            run: run.to_string(),
        };
        ProducerPlan::new(ids, self.producers, topic, work)
    }

    /// ANALYZE stands in for autovacuum (PostgreSQL, unless `--pg-analyze-every 0`).
    pub(super) fn analyze(&self) -> bool {
        self.db.store == Backend::Postgres && !self.db.analyze_every.is_zero()
    }
}

/// ANALYZEs the outbox 1 s into the load and then every `every` until `stop`; returns how
/// often it ran. Failures are logged, not fatal: they only cost plan quality.
pub(super) fn start_analyzer(
    db: Arc<Database>,
    every: Duration,
    stop: CancellationToken,
) -> JoinHandle<u32> {
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
pub(super) async fn wait_for_slots(
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

/// Whether the relays of `live`, if any, are still running.
pub(super) async fn check_alive(live: &Live<'_>) -> Option<Result<()>> {
    Some(live.relays?.check_alive().await)
}

impl Run<'_> {
    /// The consumer that reads the topic back for the verification, sized for every id this
    /// run can produce so its set never rehashes mid-run.
    pub(super) fn verifier(&self, kafka: Option<&KafkaTarget>) -> Result<Option<Verifier>> {
        let Some(v) = kafka.map(KafkaTarget::verifier).transpose()? else {
            return Ok(None);
        };
        let (spec, work) = (self.spec, &self.spec.work);
        let expected = match work.preload {
            Some(p) => p.total,
            None => work.rate.saturating_mul(spec.duration.as_secs() + 1),
        };
        v.reserve(
            usize::try_from(expected)
                .unwrap_or(usize::MAX)
                .min(200_000_000),
        );
        Ok(Some(v))
    }
}

impl<'a> Run<'a> {
    /// Starts `--retention`'s purger on a store of its own (as `ferry purge` would connect),
    /// with its pool; `None` without retention. `consumer`: a consumer verifies order (else,
    /// in row dispatch, the purger checks the order of SENT marks before each run).
    pub(super) async fn start_purger(
        &self,
        consumer: bool,
    ) -> Result<Option<(Purger, crate::db::PoolHandle)>> {
        let Some(retention) = self.spec.retention.filter(|r| !r.in_relays) else {
            return Ok(None);
        };
        let (store, pool) = self.db.open_store(2, false, crate::db::PURGE).await?;
        let vacuum = crate::retention::needs_vacuum(&*store).await;
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

    /// The embedded mock cluster or the external broker, with the run's topic.
    pub(super) async fn kafka(&self) -> Result<Option<KafkaTarget>> {
        if self.spec.relays.sink != SinkKind::Kafka {
            return Ok(None);
        }
        let (brokers, topic, partitions) = (
            self.spec.kafka.brokers.clone(),
            self.topic.clone(),
            self.spec.kafka.partitions as i32,
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
    pub(super) async fn start_relays(
        &self,
        kafka: &Option<KafkaTarget>,
        log_dir: &std::path::Path,
        settle_first: bool,
    ) -> Result<Relays> {
        let spec = self.spec;
        let brokers = kafka.as_ref().map(|k| k.brokers.as_str());
        let clock = self.clock.clone();
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
    pub(super) async fn load_phase(
        &self,
        live: &Live<'_>,
        sampler: &mut Sampler,
    ) -> (Vec<ProducerResult>, f64, Totals) {
        let spec = self.spec;
        let stop = CancellationToken::new();
        let mut plan = spec.plan(self.run, &self.topic, false);
        plan.observer = Some(self.clock.clone());
        let handles = producer::spawn_all(self.db.pool(), Arc::new(plan), &self.counters, &stop);
        let analyzer = spec
            .analyze()
            .then(|| start_analyzer(self.db.clone(), spec.db.analyze_every, stop.clone()));
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
            sampler.close_intervals(live, false).await;
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
        let (results, producer_errors) = producer::join_all(handles).await;
        self.errors
            .lock()
            .expect("errors lock")
            .extend(producer_errors);
        if let Some(a) = analyzer {
            let n = a.await.unwrap_or(0);
            self.note(format!(
                "ANALYZE ran {n} time(s) during the load (--pg-analyze-every {:.0}s), standing in for autovacuum on the fresh schema",
                spec.db.analyze_every.as_secs_f64()
            ));
        }
        (results, t0.elapsed().as_secs_f64(), live.totals().await)
    }

    /// The preload of a burn-down: the producers commit their whole share of the queue as
    /// fast as they can, with no relay running. Returns what they committed, how long it took,
    /// and the totals at its end (everything is backlog).
    pub(super) async fn preload(
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
        let mut plan = spec.plan(self.run, &self.topic, true);
        plan.observer = Some(self.clock.clone());
        let handles = producer::spawn_all(self.db.pool(), Arc::new(plan), &self.counters, &stop);
        let t0 = Instant::now();
        let join = producer::join_all(handles);
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
            let n = producer::committed(&results);
            eprintln!(
                "loadgen: preload: {n} intents committed in {secs:.2}s ({} ev/s); starting the relays",
                report::render::rate(n as f64 / secs.max(1e-9))
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
    pub(super) async fn drain(
        &self,
        live: &Live<'_>,
        sampler: &mut Sampler,
        results: &[ProducerResult],
        timeout: Duration,
    ) -> (bool, Option<Vec<String>>) {
        let committed = producer::committed(results);
        let start = Instant::now();
        let deadline = start + timeout;
        let mut missing: Option<Vec<String>> = None;
        let mut store_drained_at: Option<Instant> = None;
        let mut next_tick = start + Duration::from_secs(1);
        let mut last_store_check = start;
        let drained = loop {
            sampler.close_intervals(live, false).await;
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
}
