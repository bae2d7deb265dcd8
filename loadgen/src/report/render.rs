//! The report as text: the tables `loadgen` prints.
use std::fmt::Write as _;

use ferry_core::DispatchMode;

use crate::cli::FlagValue;

use super::{InboxReport, IntervalReport, RetentionReport, RowWrites, RunReport, Stats};

/// `123456.7` → `123.5k`.
pub fn rate(v: f64) -> String {
    if v >= 1_000_000.0 {
        format!("{:.2}M", v / 1_000_000.0)
    } else if v >= 10_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn mib(bytes: i64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// `s` unless `n` is 1.
fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

impl RunReport {
    /// The human-readable table.
    pub fn render(&self) -> String {
        let (c, mut o) = (&self.config, String::new());
        let (label, run_id) = (&self.label, &c.run_id);
        let (d, r, w) = (&c.spec.db, &c.spec.relays, &c.spec.work);
        let _ = writeln!(o, "\nferry loadgen — {label} (run {run_id})");
        let db = c.database_url.as_deref().unwrap_or("temporary file");
        let server: Vec<String> = c.server.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let (store, server) = (d.store.as_str(), server.join(" "));
        let _ = writeln!(o, "  store     {store} ({db}) {server}");
        let kafka = match (&c.kafka, &c.topic) {
            (Some(k), Some(t)) => format!(
                " → {k} topic {t} ({} partitions)",
                c.partitions.unwrap_or(0)
            ),
            _ => String::new(),
        };
        let _ = writeln!(o, "  sink      {}{kafka}", r.sink.as_str());
        let cursor = d.dispatch == DispatchMode::Cursor;
        let linger = if cursor {
            format!(
                ", read linger {} ms, read interval {} ms",
                c.read_linger_ms,
                r.read_interval.as_millis()
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "  relays    {} × {} workers, batch {}, in-flight {} ({:?}), dispatch {}{linger}",
            r.relays,
            r.workers,
            r.batch_size,
            r.in_flight,
            r.mode,
            d.dispatch.as_str()
        );
        if let Some(p) = &self.preload {
            let (aggs, vpa, prods) = (p.aggregates, p.versions_per_aggregate, p.producers as u64);
            let _ = writeln!(
                o,
                "  workload  preload {} intents: {aggs} aggregate{} × {vpa} version{}, {prods} producer{}, {} orders/tx, {} B payload (no load phase)",
                p.intents, plural(aggs), plural(vpa), plural(prods), w.orders_per_tx, w.payload_bytes
            );
            let _ = writeln!(
                o,
                "\n  preload: {} intents committed in {:.2} s ({} ev/s); drained in {:.2} s → {} ev/s{}",
                p.intents, p.commit_secs, rate(p.commit_per_sec), p.drain_secs, rate(p.drain_per_sec), timed_out(p.drained)
            );
            let _ = writeln!(o, "    sent {}   consumed {}", self.sent, self.consumed);
        } else {
            let target = match w.rate {
                0 => "flat out".to_string(),
                r => format!("{r} ev/s"),
            };
            let _ = writeln!(
                o,
                "  workload  {} producers, {} orders/tx, {target}, {} aggregates ({:?}, {}), {} B payload, {:.0}s",
                c.producers, w.orders_per_tx, w.aggregates, w.skew,
                if w.producers_own_aggregates { "each producer its own" } else { "shared by the producers" },
                w.payload_bytes, c.spec.duration.as_secs_f64()
            );
            self.render_throughput(&mut o);
        }
        let _ = writeln!(
            o,
            "\n  latency (ms)              p50      p90      p99    p99.9      max"
        );
        let lat = &self.latency_ms;
        for (name, q) in [
            ("COMMIT → broker ack", lat.committed_to_broker_ack),
            ("created_at → SENT", lat.commit_to_ack),
            ("tx start → consumed", lat.commit_to_consumed),
            ("producer tx", lat.producer_tx),
            (if cursor { "cursor read" } else { "claim tx" }, lat.claim),
            (
                if cursor { "cursor advance" } else { "ack CAS" },
                lat.ack_cas,
            ),
        ] {
            let Some(q) = q else { continue };
            let (a, b, c, d, e) = (ms(q.p50), ms(q.p90), ms(q.p99), ms(q.p999), ms(q.max));
            let _ = writeln!(o, "    {name:<20} {a:>8} {b:>8} {c:>8} {d:>8} {e:>8}");
        }
        if let Some(iv) = &self.intervals {
            render_intervals(&mut o, iv);
        }
        self.render_rest(&mut o, cursor);
        o
    }

    /// The load-phase throughput table.
    fn render_throughput(&self, o: &mut String) {
        let r = |v: f64| format!("{}/s", rate(v));
        let _ = writeln!(o, "\n  throughput            total        per second");
        let overall = format!("   (overall incl. drain {})", r(self.sent_per_sec_overall));
        for (name, total, per_sec, extra) in [
            ("enqueued", self.enqueued, self.enqueued_per_sec, ""),
            ("sent", self.sent, self.sent_per_sec, overall.as_str()),
            ("consumed", self.consumed, self.consumed_per_sec, ""),
        ] {
            let _ = writeln!(o, "    {name:<12} {total:>14} {:>14}{extra}", r(per_sec));
        }
        let _ = writeln!(
            o,
            "    backlog at end of load {}, drained in {:.1}s{}",
            self.backlog_at_end_of_load,
            self.drain_secs,
            timed_out(self.drained)
        );
        if let Some(b) = &self.baseline {
            let _ = writeln!(
                o,
                "    baseline (producers only, {:.0}s): {} ev/s → relay {:.2}× of it, enqueue under relay {:.2}×",
                b.duration_secs, rate(b.enqueued_per_sec), b.relay_ratio, b.enqueue_ratio
            );
        }
    }

    /// Everything after the latency table.
    fn render_rest(&self, o: &mut String, cursor: bool) {
        if let Some(cl) = &self.claims {
            let skipped = cl
                .rows_skipped_locked
                .map_or_else(|| "not measured".to_string(), |n| n.to_string());
            let held = if cursor {
                format!(
                    ", acked after a failed predecessor {}",
                    cl.acked_after_failed_predecessor
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                o,
                "\n  {}    {} ({}/s), empty {} ({:.2}%), rows skipped as locked {skipped}, fenced {}, slot takeovers {}, retried {}, unknown {}, quarantined {}, store errors {}{held}",
                if cursor { "reads " } else { "claims" },
                cl.claims, rate(cl.claims_per_sec), cl.empty_claims, cl.empty_ratio * 100.0,
                cl.fenced, cl.slot_fenced, cl.retried, cl.unknown, cl.quarantined, cl.store_errors
            );
        }
        if let Some(b) = &self.batch_size {
            let _ = writeln!(
                o,
                "  batch     mean {:.1}, p50 {}, p99 {}, max {}",
                b.mean, b.p50, b.p99, b.max
            );
        }
        if self.per_relay_sent.len() > 1 {
            let _ = writeln!(o, "  per relay sent {:?}", self.per_relay_sent);
        }
        if let Some(k) = self.chaos_kills {
            let _ = writeln!(o, "  chaos     {k} relay processes killed and restarted");
        }
        let (txs, retries) = (self.producer_txs, self.producer_retries);
        let _ = writeln!(
            o,
            "  producers {txs} transactions, {retries} retried attempts"
        );
        let c = &self.contention;
        let v = &c.versions;
        let xids = v.xid_inversions.map_or(String::new(), |x| {
            format!(", {x} with the later version's transaction id lower")
        });
        let _ = writeln!(
            o,
            "  contention {} producers over {} aggregates: {} touched, {} of them by 2+ producers; {} successive versions from different producers{xids}",
            c.producers, c.aggregates, v.aggregates_touched, v.aggregates_shared, v.handoffs,
        );
        let _ = writeln!(
            o,
            "            rolled back and retried: {} deadlocks, {} lock waits timed out, {} other conflicts; versions 1..=n per aggregate: {}",
            c.deadlocks, c.lock_waits, c.conflicts,
            if v.version_mismatches == 0 { "ok".to_string() } else { format!("{} MISMATCHED", v.version_mismatches) }
        );
        if let Some(d) = &self.db_costs {
            if let (Some(before), Some(a)) = (&d.before, &d.after) {
                let _ = writeln!(
                    o,
                    "\n  postgres  outbox {} → {} (table {}, indexes {}), {:.0} B/event; orders {}",
                    mib(before.outbox_total_bytes),
                    mib(a.outbox_total_bytes),
                    mib(a.outbox_table_bytes),
                    mib(a.outbox_index_bytes),
                    d.outbox_bytes_per_event.unwrap_or(0.0),
                    mib(a.orders_total_bytes)
                );
                let _ = writeln!(
                    o,
                    "            dead tuples {} at the end (peak {}), updates {} ({} HOT), autovacuums {}",
                    a.n_dead_tup, d.n_dead_tup_peak.unwrap_or(0), a.n_tup_upd, a.n_tup_hot_upd, a.autovacuum_count
                );
            } else {
                let _ = writeln!(o);
            }
            render_row_writes(o, &d.row_writes);
        }
        if let Some(r) = &self.retention {
            render_retention(o, r);
        }
        let _ = writeln!(o, "  peak RSS  {:.0} MiB", self.peak_rss_mb);
        let v = &self.verification;
        let _ = writeln!(
            o,
            "\n  verification ({}; order: {})",
            v.method, v.ordering_check
        );
        if let Some(why) = &v.consumer_skipped {
            let _ = writeln!(o, "    consumer check skipped: {why}");
        }
        let purged = match self.retention {
            Some(_) => format!(" + purged {}", self.store.purged),
            None => String::new(),
        };
        let _ = writeln!(
            o,
            "    delivered {}   duplicates {}   lost {}   ordering violations {}   store rows {} (SENT {}){purged}",
            self.delivered, self.duplicates, self.lost, self.ordering_violations, self.store.rows, self.store.sent_rows
        );
        let examples = [
            ("lost", &v.lost_examples),
            ("reordered", &v.ordering_examples),
            ("not SENT", &self.store.unsent_examples),
        ];
        for (what, list) in examples {
            for e in list.iter().take(5) {
                let _ = writeln!(o, "    {what}: {e}");
            }
        }
        if let Some(ib) = &self.inbox {
            render_inbox(o, ib, self.enqueued, self.delivered);
        }
        for n in &self.notes {
            let _ = writeln!(o, "  note: {n}");
        }
        for e in &self.errors {
            let _ = writeln!(o, "  ERROR: {e}");
        }
        let _ = writeln!(o, "\n  {}", self.verdict());
    }

    /// One line saying whether the run passed, and why not.
    pub fn verdict(&self) -> String {
        if self.ok {
            let inbox = self.inbox.as_ref().map_or(String::new(), |ib| {
                format!(
                    "; Inbox: {} effects applied exactly once, {} duplicates skipped",
                    ib.effects_rows, ib.stats.duplicates
                )
            });
            let order = match self.verification.ordering_check.as_str() {
                "not checked" => "order not checked",
                _ => "0 ordering violations",
            };
            return format!(
                "PASS: {} committed, 0 lost, {order} ({} duplicates){inbox}",
                self.enqueued, self.duplicates
            );
        }
        let mut why = Vec::new();
        if self.lost > 0 {
            why.push(format!("{} lost", self.lost));
        }
        if self.ordering_violations > 0 {
            why.push(format!("{} ordering violations", self.ordering_violations));
        }
        if let Some(ib) = &self.inbox {
            if !ib.effects_exactly_once {
                why.push("Inbox effects not exactly once".to_string());
            }
            let order = ib.stats.gaps + ib.stats.early + ib.stats.stale;
            if order > 0 {
                why.push(format!("{order} Inbox gap/early/stale verdicts"));
            }
        }
        if !self.errors.is_empty() {
            why.push(format!("{} error(s)", self.errors.len()));
        }
        format!("FAIL: {}", why.join(", "))
    }
}

fn timed_out(drained: bool) -> &'static str {
    if drained {
        ""
    } else {
        " (TIMED OUT)"
    }
}

/// The Inbox section.
fn render_inbox(o: &mut String, ib: &InboxReport, enqueued: u64, delivered: u64) {
    let _ = writeln!(
        o,
        "\n  inbox ({} {}, consumer {}, {} workers on {} connection{})",
        ib.backend,
        ib.url,
        ib.consumer,
        ib.workers,
        ib.connections,
        plural(u64::from(ib.connections))
    );
    let _ = writeln!(
        o,
        "    consumed {}   inbox_new {}   inbox_duplicates {}   inbox_gaps {}   inbox_early {}   stale {}   foreign {}",
        ib.stats.consumed, ib.stats.new, ib.stats.duplicates, ib.stats.gaps, ib.stats.early, ib.stats.stale, ib.stats.foreign
    );
    let _ = writeln!(
        o,
        "    effects_rows {} (committed {enqueued}, delivered {delivered}; missing {}, unexpected {})   inbox rows {}   projection {} aggregates, {} mismatched",
        ib.effects_rows, ib.effects_missing, ib.effects_unexpected, ib.inbox_rows, ib.projection_aggregates, ib.projection_mismatches
    );
    let _ = writeln!(
        o,
        "    applied twice {}   errors {}   retried {}   open gaps {}   applied {}/s during load, peak lag {}, settled {} in {:.1}s",
        ib.stats.effect_failures, ib.stats.errors, ib.stats.retries, ib.open_gaps, rate(ib.applied_per_sec), ib.lag_peak,
        if ib.settled { "yes" } else { "NO" }, ib.settle_secs
    );
    let _ = writeln!(o, "    effects_exactly_once {}", ib.effects_exactly_once);
    for e in ib.stats.examples.iter().take(5) {
        let _ = writeln!(o, "    inbox: {e}");
    }
}

/// The per-interval table.
fn render_intervals(o: &mut String, iv: &IntervalReport) {
    let acks = iv.rows.iter().any(|r| r.commit_to_broker_ack.is_some());
    let consumed = iv.rows.iter().any(|r| r.tx_start_to_consumed.is_some());
    let mut by = Vec::new();
    if acks {
        by.push("COMMIT → broker ack by the ack's arrival");
    }
    if consumed {
        by.push("tx start → consumed by the consumption");
    }
    if by.is_empty() {
        by.push("no latency measured: relay processes, no consumer");
    }
    let _ = writeln!(
        o,
        "\n  per interval of {}s ({}; backlog at each interval's end)",
        iv.interval_secs,
        by.join(", ")
    );
    let mut head = format!("    {:<15} {:<10}", "t (s)", "phase");
    if acks {
        head.push_str("     acks   p50 ms   p99 ms");
    }
    if consumed {
        head.push_str("  consumed   p50 ms   p99 ms");
    }
    head.push_str("    backlog");
    let _ = writeln!(o, "{head}");
    let q = |v: Option<f64>| v.map_or_else(|| "-".to_string(), ms);
    let cols =
        |s: &Stats, w: usize| format!("{:>w$} {:>8} {:>8}", s.count, q(s.p50_ms), q(s.p99_ms));
    for r in &iv.rows {
        let t = format!(
            "{:.1}–{:.1}{}",
            r.t_start,
            r.t_end,
            if r.full { "" } else { "*" }
        );
        let mut line = format!("    {t:<15} {:<10}", r.phase);
        if let Some(s) = r.commit_to_broker_ack.as_ref().filter(|_| acks) {
            line.push_str(&format!(" {}", cols(s, 8)));
        }
        if let Some(s) = r.tx_start_to_consumed.as_ref().filter(|_| consumed) {
            line.push_str(&format!(" {}", cols(s, 9)));
        }
        line.push_str(&format!(" {:>10}", r.backlog_at_end));
        let _ = writeln!(o, "{line}");
    }
    if iv.rows.iter().any(|r| !r.full) {
        let _ = writeln!(o, "    (* a partial interval: cut by the end of the drain)");
    }
    match &iv.first_vs_last {
        Some(f) => {
            let (a, b) = (&iv.rows[f.first], &iv.rows[f.last]);
            let metric = match f.metric {
                "commit_to_broker_ack" => "COMMIT → broker ack",
                _ => "tx start → consumed",
            };
            let _ = writeln!(
                o,
                "    p99 first vs last interval ({metric}; {}: {:.1}–{:.1} s vs {:.1}–{:.1} s): {} ms → {} ms = {:.2}×",
                f.scope, a.t_start, a.t_end, b.t_start, b.t_end, ms(f.first_p99_ms), ms(f.last_p99_ms), f.ratio
            );
        }
        None => {
            let why = if acks || consumed {
                "fewer than two full intervals with samples to compare: the load phase's, with --preload the drain's"
            } else {
                "no latency measured"
            };
            let _ = writeln!(o, "    p99 first vs last interval: n/a ({why})");
        }
    }
}

/// The retention section.
fn render_retention(o: &mut String, r: &RetentionReport) {
    let per = r
        .purge_us_per_event
        .map_or_else(|| "n/a".to_string(), |v| format!("{v:.1} µs"));
    let _ = writeln!(
        o,
        "\n  retention {}s by {} (purge every {}s, batch {}): purged {} rows in {} runs ({} DELETE batches, {} failed runs); {:.3} s purging = {per} per purged row (longest run {:.1} ms)",
        r.age_secs, r.by, r.every_secs, r.batch, r.purged, r.runs, r.batches, r.failed_runs, r.purge_secs, r.longest_run_ms
    );
    let share = r.rows_at_end as f64 * 100.0 / r.rows_without_retention.max(1) as f64;
    let size = match (r.bytes_at_end, r.bytes_without_retention_estimate) {
        (Some(a), Some(b)) => format!(
            "; {} (without retention ≈ {}, {})",
            mib(a),
            mib(b),
            r.estimate_basis.as_deref().unwrap_or("")
        ),
        (Some(a), None) => format!(
            "; {} (without retention: {})",
            mib(a),
            r.estimate_basis.as_deref().unwrap_or("not measured")
        ),
        _ => String::new(),
    };
    let _ = writeln!(
        o,
        "            outbox at the end {} rows (without retention {}: {share:.1} %){size}",
        r.rows_at_end, r.rows_without_retention
    );
    let _ = writeln!(o, "            size: {}", r.bytes_source);
    if r.vacuum {
        let _ = writeln!(
            o,
            "            autovacuum is off on this server: each run ended with VACUUM of the outbox, slot leases, ticks and exception rows (ferry purge --vacuum), in the time above"
        );
    }
    if r.order_checks > 0 {
        let _ = writeln!(
            o,
            "            SENT order checked before each purge: {} checks ({} failed), {:.3} s",
            r.order_checks, r.order_check_failures, r.order_check_secs
        );
    }
    if let (Some(n), Some(secs)) = (r.orders_folded, r.fold_secs) {
        let _ = writeln!(
            o,
            "            business orders folded out of loadgen_orders after each run (--fold-orders): {n}, {secs:.3} s (not in the time above)"
        );
    }
    for e in r.errors.iter().take(5) {
        let _ = writeln!(o, "            purge error: {e}");
    }
}

fn per_event(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.3}"))
}

/// The row-writes lines of the costs section.
fn render_row_writes(o: &mut String, w: &RowWrites) {
    let settled = match w.stats_settled {
        Some(false) => ", statistics had NOT settled",
        _ => "",
    };
    let _ = writeln!(
        o,
        "  row writes/event {} (ferry_outbox + ferry_outbox_exception), slot-lease updates/event {}, dead tuples/event {} ({} events; {}{settled})",
        per_event(w.row_writes_per_event), per_event(w.slot_lease_updates_per_event),
        per_event(w.dead_tuples_per_event), w.events, w.source
    );
    for t in &w.tables {
        let _ = writeln!(
            o,
            "             {} ins {} upd {} (HOT {}) del {} dead {}",
            t.table, t.n_tup_ins, t.n_tup_upd, t.n_tup_hot_upd, t.n_tup_del, t.n_dead_tup
        );
    }
    if let Some(s) = &w.sqlite {
        let _ = writeln!(
            o,
            "             sqlite: {} outbox INSERTs, {} row claims, {} exception rows ({} claims), {} slot-cursor UPDATEs{}; other UPDATEs estimated as claim + outcome; heartbeats and dead tuples n/a",
            s.outbox_rows, s.outbox_claims, s.exception_rows, s.exception_claims, s.cursor_versions,
            if s.purged_rows > 0 {
                format!(", {} purged rows' DELETEs (their claims went with them: not counted)", s.purged_rows)
            } else {
                String::new()
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_short() {
        assert_eq!(rate(950.0), "950");
        assert_eq!(rate(123_456.0), "123.5k");
        assert_eq!(rate(1_250_000.0), "1.25M");
    }
}
