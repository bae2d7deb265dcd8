//! The report of a run, assembled from what its phases measured.
use std::sync::atomic::Ordering;
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

use super::context::Run;
use super::verify::Verified;
use crate::cli::RelayMode;
use crate::db::{new_histogram, PgCosts, SqliteWrites};
use crate::error::Result;
use ferry_testkit::workload::producer;
use ferry_testkit::workload::VersionCheck;

use crate::progress::{Sampler, Totals};
use crate::relays::RelayMetrics;
use crate::report::{
    self, round3, Baseline, BatchStats, Claims, Contention, DbCosts, InboxReport, IntervalReport,
    Latencies, PreloadReport, Quantiles, RetentionReport, RowWrites, RunReport, StoreCheck,
};
use crate::retention::PurgeTally;
use ferry_store::Backend;
use ferry_testkit::workload::ProducerResult;

/// The outbox's database costs at one point of the run.
pub(super) struct CostSnapshot {
    pub(super) pg: Option<PgCosts>,
    pub(super) sqlite: Option<SqliteWrites>,
}

impl<'a> Run<'a> {
    /// The per-interval table: the load phase's intervals, then the drain's (a burn-down has
    /// only the drain: its load phase is the preload, with no relay).
    pub(super) fn intervals(
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
            RelayMode::InProcess => self.clock.intervals(),
            RelayMode::Process => None,
        };
        Some(log.report(sampler.t0.into_std(), load_end, acks.as_ref()))
    }

    /// The report of what the phases measured.
    pub(super) fn report(
        self,
        m: Measured,
        baseline: Option<(Duration, u64)>,
        log_dir: &std::path::Path,
    ) -> RunReport {
        let spec = self.spec;
        let committed = producer::committed(&m.results);
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
                committed_to_broker_ack: Quantiles::from_us(&self.clock.histogram()),
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

impl<'a> Run<'a> {
    /// The retention section: what the purger did (`t`), the outbox left (`store`, `bytes` at
    /// the end), and the outbox without retention (every committed row; its size estimated
    /// from the bytes per row before the first purge that deleted rows).
    pub(super) fn retention_report(
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
            by: if r.in_relays { "relays" } else { "loadgen" },
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
            orders_folded: r.fold_orders.then_some(t.orders_folded),
            fold_secs: r.fold_orders.then(|| round3(t.fold_busy.as_secs_f64())),
        }
    }
}

/// What the phases of a run measured, for its report.
pub(super) struct Measured {
    pub(super) results: Vec<ProducerResult>,
    pub(super) load_secs: f64,
    pub(super) drain_secs: f64,
    pub(super) drained: bool,
    pub(super) at_load_end: Totals,
    pub(super) relay_metrics: RelayMetrics,
    pub(super) commit_to_ack: Histogram<u64>,
    pub(super) chaos_kills: Option<u64>,
    pub(super) verified: Verified,
    pub(super) versions: VersionCheck,
    pub(super) inbox: Option<InboxReport>,
    pub(super) db_costs: Option<DbCosts>,
    pub(super) server: Vec<(String, String)>,
    /// The topic's own partition count (an external broker's existing topic keeps its own).
    pub(super) partitions: Option<i32>,
    pub(super) timeline: Vec<report::Sample>,
    pub(super) intervals: Option<IntervalReport>,
    /// What `--retention` did, and the outbox's size at the end.
    pub(super) purge: Option<PurgeTally>,
    pub(super) retention_bytes: Option<i64>,
}

/// The run against the producer-only baseline of `d` and `n` events.
pub(super) fn baseline_report(
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
pub(super) fn claims(m: &RelayMetrics, secs: f64) -> Claims {
    Claims {
        claims_per_sec: round3(m.claims.claims as f64 / secs.max(1e-9)),
        empty_ratio: round3(m.claims.empty_claims as f64 / m.claims.claims.max(1) as f64),
        ..m.claims.clone()
    }
}

impl Run<'_> {
    /// The database's costs before anything is produced. The setup's statistics (migrations,
    /// the dispatch switch) were reported when its connections closed (`Database::create`
    /// reconnects): wait until they show.
    pub(super) async fn costs_before(&self) -> Result<CostSnapshot> {
        Ok(CostSnapshot {
            pg: self
                .db
                .pg_costs_settled(Duration::from_millis(200))
                .await?
                .map(|(c, _)| c),
            sqlite: self.db.sqlite_writes().await?,
        })
    }

    /// The costs section, once the relays stopped: closes the producers' pool, whose backends
    /// then report their last statistics (PostgreSQL).
    pub(super) async fn costs_after(
        &self,
        before: CostSnapshot,
        results: &[ProducerResult],
        dead_peak: i64,
        purge: Option<&PurgeTally>,
    ) -> Result<Option<DbCosts>> {
        let db = self.db;
        let sqlite_after = db.sqlite_writes().await?;
        db.close_pool().await;
        let pg_after = db.pg_costs_settled(Duration::ZERO).await?;
        if let (Some(tally), Some((after, _))) = (purge, &pg_after) {
            if tally.vacuum {
                self.note("each purge run ended with VACUUM (autovacuum is off on this server): purged rows' space is reused, and the size at the end is the table's high-water mark, free space included".to_string());
            } else if after.autovacuum_count == 0 {
                self.note("PostgreSQL reuses a purged row's space only after a vacuum, and autovacuum did not vacuum the outbox during this run (its naptime is 1 min): the size at the end still holds the purged rows as dead tuples".to_string());
            }
        }
        Ok(costs(
            db.kind,
            producer::committed(results),
            before,
            sqlite_after,
            pg_after,
            dead_peak,
            purge.map_or(0, |t| t.purged),
        ))
    }
}

/// The costs section: PostgreSQL sizes and per-table statistics (deltas over the run), or what
/// SQLite can tell cheaply; row writes per event from either.
pub(super) fn costs(
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
