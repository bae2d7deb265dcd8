//! The report of a run: one value serialized to JSON (`--json`) and printed as a table.
//!
//! JSON field names are a contract for scripts (`lost`, `ordering_violations`, ...); add fields,
//! do not rename them. CI relies on the exit code, which the same verdict sets. This module holds
//! the data; [`render`] writes it as text.
use std::path::Path;
use std::time::Duration;

use ferry_core::DispatchMode;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::db::{PgCosts, SqliteWrites, TableStats};
use crate::error::{Error, Result};
use crate::spec::{ConfigEcho, RunSpec};
use ferry_testkit::workload::VersionCheck;

pub mod render;

/// Latency quantiles in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Quantiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub count: u64,
}

impl Quantiles {
    /// From a histogram of microseconds; `None` when empty.
    pub fn from_us(h: &Histogram<u64>) -> Option<Self> {
        if h.is_empty() {
            return None;
        }
        let ms = |q: f64| round3(h.value_at_quantile(q) as f64 / 1000.0);
        Some(Self {
            p50: ms(0.5),
            p90: ms(0.9),
            p99: ms(0.99),
            p999: ms(0.999),
            max: round3(h.max() as f64 / 1000.0),
            count: h.len(),
        })
    }
}

/// The latency distributions.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latencies {
    /// The intent's `created_at` (on PostgreSQL the *start* of the producer's transaction) →
    /// its SENT state committed (the cursor advance or SENT compare-and-set after the ack).
    pub commit_to_ack: Option<Quantiles>,
    /// The producer's COMMIT returned → the sink reported the broker's ack (in-process relays;
    /// measured in loadgen, the first ack of each event).
    pub committed_to_broker_ack: Option<Quantiles>,
    /// Commit timestamp header (taken before the producer's transaction) → first delivery to
    /// the verifying consumer.
    pub commit_to_consumed: Option<Quantiles>,
    /// One business transaction, begin → COMMIT returned, its retries and their backoff
    /// included.
    pub producer_tx: Option<Quantiles>,
    /// One claim transaction (in-process relays; cursor mode: one cursor read).
    pub claim: Option<Quantiles>,
    /// One batch's outcome compare-and-set (in-process relays; cursor mode: one cursor advance).
    pub ack_cas: Option<Quantiles>,
}

/// Claim statistics: the in-process relays' registries, or the counters scraped from the relay
/// processes' `/metrics` at the end of the drain. In cursor mode a "claim" is one cursor read.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Claims {
    pub claims: u64,
    /// Per second over load + drain (after a preload: over the drain, when the relays ran).
    pub claims_per_sec: f64,
    pub empty_claims: u64,
    /// `empty_claims / claims`.
    pub empty_ratio: f64,
    /// Events claimed (more than sent when claims were released or fenced).
    pub claimed_items: u64,
    /// Updates fenced by another relay (stale outcome CAS, lease renewals, fenced advances).
    pub fenced: u64,
    /// Slot leases found taken over by another relay.
    pub slot_fenced: u64,
    pub retried: u64,
    /// Items with unknown outcome, released for resend.
    pub unknown: u64,
    pub quarantined: u64,
    /// Store operations that failed (retried, or their items left to the lease).
    pub store_errors: u64,
    /// Due rows claims passed over because a concurrent transaction held their lock (SKIP
    /// LOCKED) or took them mid-claim; always 0 on SQLite (one writer, nothing to skip), `null`
    /// when the relays did not report it.
    pub rows_skipped_locked: Option<u64>,
    /// Cursor mode: items the sink acked after an earlier version of their aggregate in the
    /// same batch was not (held and resent in order; `ferry_acked_after_failed_predecessor_total`).
    pub acked_after_failed_predecessor: u64,
}

/// Items per claimed batch.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct BatchStats {
    pub mean: f64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

impl BatchStats {
    /// From a histogram of batch sizes; `None` when empty.
    pub fn from_hist(h: &Histogram<u64>) -> Option<Self> {
        (!h.is_empty()).then(|| Self {
            mean: round3(h.mean()),
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        })
    }
}

/// How delivery was verified.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verification {
    /// `kafka-consumer` (read back from the topic), or `store` (no consumer: every committed
    /// row must be SENT, and in row dispatch successive versions SENT in order).
    pub method: String,
    /// Why consumer verification was skipped, if it was.
    pub consumer_skipped: Option<String>,
    /// Consumed messages without ferry headers (ignored).
    pub foreign: u64,
    /// Up to ten lost event ids.
    pub lost_examples: Vec<String>,
    /// Up to ten ordering violations.
    pub ordering_examples: Vec<String>,
    /// How per-aggregate order was checked: `kafka-consumer` (first deliveries), `store`
    /// (row mode: successive versions' `sent_at`), `sink` (in-process relays without a consumer:
    /// the order batches were handed to the sink), `store+sink`, or `not checked` (cursor mode,
    /// relay processes, no consumer: nothing records the send order).
    pub ordering_check: String,
    /// Mock-cluster partitions whose log start moved past offset 0 (retention).
    pub retention_truncated_partitions: Option<u32>,
}

/// The store's view at the end of the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StoreCheck {
    /// Outbox rows (`rows + purged` fewer than `enqueued` is an error, more a note).
    pub rows: i64,
    pub sent_rows: i64,
    /// Rows `--retention` purged during the run (all of them SENT): counted with `rows`, and
    /// with `sent_rows` when the store is the loss check.
    pub purged: u64,
    /// Up to ten rows not SENT, `event_id (STATE)`.
    pub unsent_examples: Vec<String>,
}

/// What `--retention` purged, what it cost, and the outbox it left (`retention` in the JSON).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RetentionReport {
    /// Who purged: `loadgen` (its purger) or `relays` (`--retention-in-relays`).
    pub by: &'static str,
    /// Only SENT intents older than this were deleted.
    pub age_secs: f64,
    /// Time between purge runs.
    pub every_secs: f64,
    /// Rows per DELETE statement.
    pub batch: usize,
    /// Outbox rows deleted: the sum of what each purge run reported.
    pub purged: u64,
    /// Purge runs (`purge_sent` calls), and of them failed (a failed run reports no count).
    pub runs: u64,
    pub failed_runs: u64,
    /// DELETE statements of outbox rows: every full batch of each run and its last, short one.
    pub batches: u64,
    /// Wall time inside the purge runs.
    pub purge_secs: f64,
    /// `purge_secs` per purged row, µs (`null` when nothing was purged).
    pub purge_us_per_event: Option<f64>,
    pub longest_run_ms: f64,
    /// Up to five errors of failed runs or pre-purge order checks.
    pub errors: Vec<String>,
    /// Outbox rows at the end.
    pub rows_at_end: i64,
    /// Rows the outbox would hold without retention: `rows_at_end + purged` (every committed
    /// intent: loadgen deletes nothing else).
    pub rows_without_retention: u64,
    /// How the sizes are measured.
    pub bytes_source: String,
    /// The outbox's size at the end.
    pub bytes_at_end: Option<i64>,
    /// Without retention, estimated: `rows_without_retention` × the bytes per row measured
    /// before the last purge run that still found nothing to delete (`estimate_basis`).
    pub bytes_without_retention_estimate: Option<i64>,
    pub estimate_basis: Option<String>,
    /// Each purge run ended with `VACUUM` of the outbox, slot leases, ticks and exception rows
    /// (`ferry purge --vacuum`), because the server's or the outbox's autovacuum is off; its
    /// time is in `purge_secs`.
    pub vacuum: bool,
    /// Row dispatch without a consumer: order checks run before purges, their failures and
    /// their time.
    pub order_checks: u64,
    pub order_check_failures: u64,
    pub order_check_secs: f64,
    /// `--fold-orders`: business orders folded out of `loadgen_orders`, and the time spent
    /// (not in `purge_secs`); `null` without it.
    pub orders_folded: Option<u64>,
    pub fold_secs: Option<f64>,
}

/// The producer-only ceiling measured in the same invocation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Baseline {
    /// Length of the producer-only phase.
    pub duration_secs: f64,
    pub enqueued: u64,
    pub enqueued_per_sec: f64,
    /// `sent_per_sec / enqueued_per_sec` of the baseline: end-to-end throughput as a share of
    /// the database's own insert ceiling.
    pub relay_ratio: f64,
    /// `enqueued_per_sec` with relays running, as a share of the baseline.
    pub enqueue_ratio: f64,
}

/// A producer-only baseline as `loadgen baseline --json FILE` saves it and `--compare FILE`
/// reads it back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedBaseline {
    /// Length of the producer-only phase (not rounded: the ratios are computed from it).
    pub duration_secs: f64,
    pub enqueued: u64,
    pub enqueued_per_sec: f64,
    /// The settings it ran with, for a reader to match runs against it.
    pub store: String,
    pub producers: usize,
    pub orders_per_tx: usize,
    pub payload_bytes: usize,
}

impl SavedBaseline {
    /// `n` intents committed in `d` by the producers of `spec`.
    pub fn new(spec: &RunSpec, (d, n): (Duration, u64)) -> Self {
        Self {
            duration_secs: d.as_secs_f64(),
            enqueued: n,
            enqueued_per_sec: round3(n as f64 / d.as_secs_f64().max(1e-9)),
            store: spec.db.store.as_str().to_string(),
            producers: spec.producers,
            orders_per_tx: spec.work.orders_per_tx,
            payload_bytes: spec.work.payload_bytes,
        }
    }

    /// Reads a baseline `loadgen baseline --json` wrote.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            what: "read the baseline from",
            path: path.to_path_buf(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| {
            Error::Setup(format!(
                "--compare {}: not a baseline saved by 'loadgen baseline --json': {e}",
                path.display()
            ))
        })
    }

    /// (length, intents committed), as the run relates its throughput to it.
    pub fn measured(&self) -> (Duration, u64) {
        (Duration::from_secs_f64(self.duration_secs), self.enqueued)
    }
}

/// Database costs of the run: PostgreSQL sizes and statistics before and after, and the row
/// writes per event on every backend that can tell.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DbCosts {
    /// PostgreSQL: right after creating the schema (`null` elsewhere).
    pub before: Option<PgCosts>,
    /// PostgreSQL: after the drain, once the statistics settled.
    pub after: Option<PgCosts>,
    /// PostgreSQL: highest outbox `n_dead_tup` seen by the once-a-second sampler.
    pub n_dead_tup_peak: Option<i64>,
    /// PostgreSQL: `after.outbox_total_bytes - before.outbox_total_bytes`.
    pub outbox_growth_bytes: Option<i64>,
    /// PostgreSQL: growth per committed intent.
    pub outbox_bytes_per_event: Option<f64>,
    pub row_writes: RowWrites,
}

/// Row writes per committed intent: what the dispatch mode costs the database.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RowWrites {
    /// `pg_stat_user_tables` (PostgreSQL: exact counters) or `sqlite-estimate` (row counts and
    /// claim versions); MariaDB reports no costs (`db_costs` is null).
    pub source: String,
    /// Committed intents the ratios divide by.
    pub events: u64,
    /// PostgreSQL: per-table counter deltas over the run (`n_dead_tup`: at the end).
    pub tables: Vec<TableStats>,
    /// (INSERT + UPDATE + DELETE) on `ferry_outbox` and `ferry_outbox_exception` per event
    /// (SQLite: INSERTs exact, UPDATEs estimated as two per claim, claim and outcome).
    pub row_writes_per_event: Option<f64>,
    /// UPDATEs of `ferry_slot_lease` per event: cursor advances, slot heartbeats and takeovers
    /// (SQLite: cursor advances only, from `cursor_version`; `null` in row mode).
    pub slot_lease_updates_per_event: Option<f64>,
    /// Dead tuples of `ferry_outbox` and `ferry_outbox_exception` at the end per event
    /// (PostgreSQL; `null` elsewhere).
    pub dead_tuples_per_event: Option<f64>,
    /// PostgreSQL: whether two successive reads of the statistics agreed before they were used
    /// (backends report their counters at most once a second, at exit at the latest).
    pub stats_settled: Option<bool>,
    /// SQLite: the counts the estimate is made of (deltas over the run).
    pub sqlite: Option<SqliteWrites>,
}

/// A queue burn-down (`--preload`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PreloadReport {
    /// Intents committed with no relay running.
    pub intents: u64,
    /// Versions per aggregate asked for.
    pub versions_per_aggregate: u64,
    /// Aggregates of the preloaded queue.
    pub aggregates: u64,
    /// Producer tasks that committed it.
    pub producers: usize,
    pub commit_secs: f64,
    /// `intents / commit_secs`.
    pub commit_per_sec: f64,
    /// From starting the relays until every intent was SENT (and, with a consumer, delivered).
    pub drain_secs: f64,
    /// `intents / drain_secs`: the relays' burn-down rate.
    pub drain_per_sec: f64,
    /// Whether the queue drained within --drain-timeout.
    pub drained: bool,
}

/// One second of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the load phase started.
    pub t: f64,
    /// `load`, `preload` (relays not started yet) or `drain`.
    pub phase: &'static str,
    pub enqueued_per_sec: f64,
    /// Events marked SENT per second.
    pub sent_per_sec: f64,
    pub consumed_per_sec: f64,
    /// Committed but not yet SENT.
    pub backlog: i64,
    /// p99 commit→ack of the events acked in this second.
    pub p99_commit_to_ack_ms: Option<f64>,
    /// Messages the Inbox consumer applied per second (`--inbox`).
    pub inbox_applied_per_sec: Option<f64>,
    /// Messages the verifier consumed that the Inbox consumer had not applied yet.
    pub inbox_lag: Option<i64>,
    /// Outbox rows purged so far (`--retention`).
    pub purged: Option<u64>,
}

/// What the Inbox consumer found; the `inbox` object of the JSON report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct InboxReport {
    /// `sqlite`, `postgres` or `mysql`.
    pub backend: String,
    /// The Inbox database (password redacted); the temporary file's URL by default.
    pub url: String,
    /// The Inbox consumer name (`loadgen-<run>`).
    pub consumer: String,
    pub workers: usize,
    /// Connections in the Inbox pool.
    pub connections: u32,
    /// The consumer runner's counts (flattened into this object in the JSON report). Gap,
    /// early and stale verdicts must be 0 (the relay delivers in order); `effect_failures` are
    /// effects `loadgen_effects`' primary key rejected (an event applied twice) or that failed
    /// otherwise: must be 0.
    #[serde(flatten)]
    pub stats: ferry_inbox::runner::RunnerStats,
    /// Rows of this run in `loadgen_effects`.
    pub effects_rows: u64,
    /// Effect rows whose event the producers did not commit (foreign or unknown ids).
    pub effects_unexpected: u64,
    /// Committed events without an effect row.
    pub effects_missing: u64,
    /// Events recorded in `ferry_inbox` for this consumer (`consumed_counts`).
    pub inbox_rows: u64,
    /// Aggregates in `loadgen_projection`.
    pub projection_aggregates: u64,
    /// Aggregates whose application count differs from their last applied version.
    pub projection_mismatches: u64,
    /// Aggregates the Inbox lists with an open gap at the end.
    pub open_gaps: u64,
    /// Effect rows equal the committed events, none applied twice or failed, the projection
    /// and the Inbox agree, and every message was applied.
    pub effects_exactly_once: bool,
    /// Whether every consumed message had gone through `apply_once` by the end.
    pub settled: bool,
    /// Time after the relays stopped until the last message was applied (the consumer catching
    /// up when it applies more slowly than the relays send).
    pub settle_secs: f64,
    /// Messages applied per second during the load phase.
    pub applied_per_sec: f64,
    /// Highest once-a-second lag behind the verifying consumer (messages).
    pub lag_peak: i64,
}

impl InboxReport {
    /// Every check this report makes passed.
    pub fn ok(&self) -> bool {
        self.effects_exactly_once
            && self.stats.gaps == 0
            && self.stats.early == 0
            && self.stats.stale == 0
    }
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// `run`, or the sweep point (`batch_size=100`).
    pub label: String,
    /// No loss, no ordering violation, no error (and with `--inbox`, effects exactly once).
    pub ok: bool,
    /// Dispatch mode: `cursor` or `row`.
    pub dispatch: DispatchMode,
    /// The queue burn-down, with `--preload` (then the "load phase" is the preload: relays
    /// stopped, so `sent_per_sec` is 0 and `drain_secs` is the burn-down).
    pub preload: Option<PreloadReport>,
    /// Intents committed by the producers.
    pub enqueued: u64,
    /// Events marked SENT (the relays' count, or the store's for processes).
    pub sent: u64,
    /// Messages the verifier consumed (duplicates included).
    pub consumed: u64,
    /// Distinct events the verifier saw.
    pub delivered: u64,
    /// Messages whose event id was already delivered.
    pub duplicates: u64,
    /// Committed intents never delivered (or never SENT without a consumer) by the end of the
    /// drain.
    pub lost: u64,
    /// First deliveries of v(n+1) before v(n) of an aggregate.
    pub ordering_violations: u64,
    /// `enqueued / duration`.
    pub enqueued_per_sec: f64,
    /// SENT during the load phase / its duration: throughput under concurrent load.
    pub sent_per_sec: f64,
    /// Consumed during the load phase / its duration.
    pub consumed_per_sec: f64,
    /// All SENT / (load + drain time).
    pub sent_per_sec_overall: f64,
    pub duration_secs: f64,
    /// Time from the end of the load phase until everything was sent and consumed.
    pub drain_secs: f64,
    /// Whether the drain finished within the timeout.
    pub drained: bool,
    /// Committed but unsent when the load phase ended.
    pub backlog_at_end_of_load: i64,
    pub latency_ms: Latencies,
    /// Latency per interval of the run (`--report-interval`).
    pub intervals: Option<IntervalReport>,
    /// What `--retention` purged and cost.
    pub retention: Option<RetentionReport>,
    pub claims: Option<Claims>,
    /// Items per claim (in-process relays).
    pub batch_size: Option<BatchStats>,
    /// Events each relay marked SENT (in-process relays, or the relay processes still
    /// answering at the end).
    pub per_relay_sent: Vec<u64>,
    /// Relay processes killed by `--chaos`.
    pub chaos_kills: Option<u64>,
    pub producer_txs: u64,
    /// Failed business transaction attempts that were retried.
    pub producer_retries: u64,
    /// How much the producers contended for aggregates.
    pub contention: Contention,
    pub store: StoreCheck,
    pub verification: Verification,
    /// The Inbox consumer's account (`--inbox`): verdicts, effect rows, exactly-once.
    pub inbox: Option<InboxReport>,
    pub baseline: Option<Baseline>,
    /// Database costs: PostgreSQL sizes and statistics, row writes per event.
    pub db_costs: Option<DbCosts>,
    /// Peak resident set size of loadgen (VmHWM; includes in-process relays, the verifier and
    /// the mock cluster, not relay processes).
    pub peak_rss_mb: f64,
    /// Failures found during or after the run (each fails the verdict).
    pub errors: Vec<String>,
    /// Things worth knowing when reading the numbers.
    pub notes: Vec<String>,
    pub timeline: Vec<Sample>,
    pub config: ConfigEcho,
}

/// How much the producers contended for the aggregates they share: the failed attempts their
/// transactions lost to each other (counted as they happened) and what the business rows say
/// after the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Contention {
    /// Producer tasks.
    pub producers: usize,
    /// Aggregates of the run (business rows).
    pub aggregates: u64,
    /// Attempts the database rolled back to break a deadlock (then retried with new versions).
    pub deadlocks: u64,
    /// Attempts whose lock wait timed out, or that found SQLite busy.
    pub lock_waits: u64,
    /// Attempts lost to another conflict (serialization failure).
    pub conflicts: u64,
    #[serde(flatten)]
    pub versions: VersionCheck,
}

/// Peak resident set size of this process in MiB (`VmHWM`), 0 when unavailable.
pub fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| round3(kb / 1024.0))
        .unwrap_or(0.0)
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| Error::Io {
        what: "serialize the report for",
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(path, text + "\n").map_err(|source| Error::Io {
        what: "write the JSON report to",
        path: path.to_path_buf(),
        source,
    })
}

/// Rounds to three decimals (reports carry no false precision).
pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

// ---- the per-interval table (its rows are collected while the run goes on)

/// Count and quantiles of one interval's samples, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    pub count: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

impl Stats {
    pub fn of(h: Option<&Histogram<u64>>) -> Self {
        let q = h.and_then(Quantiles::from_us);
        Self {
            count: q.map_or(0, |q| q.count),
            p50_ms: q.map(|q| q.p50),
            p99_ms: q.map(|q| q.p99),
        }
    }
}

/// One interval of the table.
#[derive(Debug, Clone, Serialize)]
pub struct IntervalRow {
    /// Seconds since the load phase started (the timeline's `t`).
    pub t_start: f64,
    pub t_end: f64,
    /// `load`, `drain` or `load+drain`.
    pub phase: &'static str,
    /// A whole interval (the last one, cut by the end of the drain, is not).
    pub full: bool,
    /// COMMIT → broker ack of the acks that arrived in the interval (in-process relays).
    pub commit_to_broker_ack: Option<Stats>,
    /// tx start → consumed of the first deliveries consumed in the interval (Kafka sink).
    pub tx_start_to_consumed: Option<Stats>,
    /// Committed but not yet SENT at the interval's end.
    pub backlog_at_end: i64,
}

/// The p99 of the first against the last interval.
#[derive(Debug, Clone, Serialize)]
pub struct FirstVsLast {
    /// `commit_to_broker_ack`, else `tx_start_to_consumed`.
    pub metric: &'static str,
    /// Which intervals were compared: the full ones of the load phase with samples (with
    /// `--preload`: of the drain).
    pub scope: &'static str,
    pub first: usize,
    pub last: usize,
    pub first_p99_ms: f64,
    pub last_p99_ms: f64,
    /// `last_p99_ms / first_p99_ms`.
    pub ratio: f64,
}

/// The per-interval table of a run (`intervals` in the JSON report).
#[derive(Debug, Clone, Serialize)]
pub struct IntervalReport {
    pub interval_secs: f64,
    /// What places a sample in an interval.
    pub bucketed_by: String,
    pub rows: Vec<IntervalRow>,
    /// `None` with fewer than two comparable intervals.
    pub first_vs_last: Option<FirstVsLast>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_milliseconds() {
        let mut h = crate::db::new_histogram();
        for us in 1..=1000u64 {
            h.record(us * 1000).unwrap();
        }
        let q = Quantiles::from_us(&h).unwrap();
        assert!((q.p50 - 500.0).abs() < 1.0, "{q:?}");
        assert!((q.max - 1000.0).abs() < 1.0, "{q:?}");
        assert!(Quantiles::from_us(&crate::db::new_histogram()).is_none());
    }

    #[test]
    fn peak_rss_reads_proc() {
        assert!(peak_rss_mb() > 0.0);
    }
}
