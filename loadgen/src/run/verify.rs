//! The checks after the drain: loss and order against what the producers committed, the
//! Inbox's effects, the business rows' versions and the relays' own counters.

use ferry_core::DispatchMode;
use ferry_testkit::verify::Verifier;
use hdrhistogram::Histogram;

use super::context::Run;
use crate::cli::{FlagValue, RelayMode};
use crate::db::new_histogram;
use crate::error::Result;
use crate::inbox::InboxConsumer;
use crate::kafka::KafkaTarget;
use crate::progress::Sampler;
use crate::relays::{RelayMetrics, SendOrder};
use crate::report::{round3, InboxReport, StoreCheck, Verification};
use crate::retention::PurgeTally;
use ferry_testkit::workload::producer;
use ferry_testkit::workload::Ids;
use ferry_testkit::workload::ProducerResult;
use ferry_testkit::workload::VersionCheck;

/// Ids committed by the producers that the verifier has not seen: all of them, or of those
/// still missing at the last check.
pub(super) fn missing_ids(
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

/// What the verification found.
pub(super) struct Verified {
    pub(super) delivered: u64,
    pub(super) consumed: u64,
    pub(super) duplicates: u64,
    pub(super) lost: u64,
    pub(super) ordering_violations: u64,
    pub(super) consumed_latency: Option<Histogram<u64>>,
    pub(super) verification: Verification,
    pub(super) store: StoreCheck,
}

impl<'a> Run<'a> {
    /// The Inbox consumer catches up to the topic's final high watermarks; its effects are
    /// read back.
    pub(super) async fn finish_inbox(
        &self,
        ib: InboxConsumer,
        applied_per_sec: f64,
        sampler: &Sampler,
        results: &[ProducerResult],
    ) -> Result<InboxReport> {
        let spec = self.spec;
        let mut r = ib
            .finish(spec.drain_timeout, &self.ids, results, spec.progress)
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
    pub(super) async fn check(
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
        let committed = producer::committed(results);
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
            let (brokers, topic, partitions) = (k.brokers.clone(), k.topic.clone(), k.partitions);
            // a blocking metadata call, off the runtime's workers
            let truncated = tokio::task::spawn_blocking(move || {
                crate::kafka::truncated_partitions(&brokers, &topic, partitions)
            });
            let truncated = truncated.await.ok().flatten();
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
    pub(super) async fn version_check(&self) -> Result<VersionCheck> {
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
    pub(super) async fn relay_checks(&self, m: &RelayMetrics) -> Result<Histogram<u64>> {
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
}
