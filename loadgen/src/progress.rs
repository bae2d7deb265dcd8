//! The once-a-second progress line on stderr and the run's timeline.
//!
//! In-process relays are read through their counters (cheap); relay processes through the
//! store's status (`sent` = committed − pending − claimed − quarantined).
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferry_testkit::verify::Verifier;
use hdrhistogram::Histogram;
use tokio::time::Instant;

use crate::clock::CommitClock;
use crate::db::Database;
use crate::inbox::InboxConsumer;
use crate::intervals::IntervalLog;
use crate::relays::Relays;
use crate::report::{self, Quantiles, Sample};
use ferry_testkit::workload::Counters;

/// What the sampler reads every second.
pub struct Live<'a> {
    pub db: &'a Database,
    pub counters: &'a Counters,
    /// `None` while a preload runs (no relay started yet).
    pub relays: Option<&'a Relays>,
    pub verifier: Option<&'a Verifier>,
    pub inbox: Option<&'a InboxConsumer>,
    /// Rows purged so far (`--retention`).
    pub purged: Option<&'a AtomicU64>,
}

/// Totals at one instant.
#[derive(Default, Clone, Copy)]
pub struct Totals {
    pub enqueued: u64,
    pub sent: u64,
    pub consumed: u64,
    /// Messages the Inbox consumer applied.
    pub inbox: u64,
    pub backlog: i64,
}

impl Live<'_> {
    /// Totals now.
    pub async fn totals(&self) -> Totals {
        let enqueued = self.counters.enqueued.load(Ordering::Relaxed);
        let consumed = self.verifier.map_or(0, |v| v.report().consumed);
        let inbox = self.inbox.map_or(0, InboxConsumer::processed);
        let (sent, backlog) = match self.relays.map(Relays::sent) {
            // preload: nothing is sent yet
            None => (0, enqueued as i64),
            Some(Some(sent)) => (sent, enqueued as i64 - sent as i64),
            Some(None) => match self.db.store.status().await {
                // processes: what is neither pending, claimed nor quarantined was sent
                Ok(s) => {
                    let open = s.pending + s.claimed + s.quarantined;
                    (
                        (enqueued as i64 - open).max(0) as u64,
                        s.pending + s.claimed,
                    )
                }
                Err(_) => (0, 0),
            },
        };
        Totals {
            enqueued,
            sent,
            consumed,
            inbox,
            backlog: backlog.max(0),
        }
    }
}

/// Once-a-second progress line and timeline.
pub struct Sampler {
    /// When the load phase started.
    pub t0: Instant,
    last_at: Instant,
    last: Totals,
    last_hist: Option<Histogram<u64>>,
    print: bool,
    tty: bool,
    pub timeline: Vec<Sample>,
    /// Highest PostgreSQL `n_dead_tup` sampled.
    pub dead_peak: i64,
    /// The per-interval table's readings, once started.
    pub intervals: Option<IntervalLog>,
}

impl Sampler {
    /// A sampler starting now; `print` shows the line.
    pub fn new(print: bool) -> Self {
        let now = Instant::now();
        Self {
            t0: now,
            last_at: now,
            last: Totals::default(),
            last_hist: None,
            print,
            tty: std::io::stderr().is_terminal(),
            timeline: Vec::new(),
            dead_peak: 0,
            intervals: None,
        }
    }

    /// Starts the per-interval table at `start` (and the per-interval COMMIT → ack samples of
    /// `clock`).
    pub fn start_intervals(&mut self, start: Instant, len: Duration, clock: &CommitClock) {
        self.intervals = Some(IntervalLog::new(start.into_std(), len));
        clock.start_intervals(start.into_std(), len);
    }

    /// When the current interval ends, once the table started.
    pub fn next_interval_end(&self) -> Option<Instant> {
        self.intervals
            .as_ref()
            .map(|l| Instant::from_std(l.next_end()))
    }

    /// Closes the intervals that have ended, with the backlog and the consumer's latency read
    /// now; with `last` (the end of the drain) also the last, partial one.
    pub async fn close_intervals(&mut self, live: &Live<'_>, last: bool) {
        let now = std::time::Instant::now();
        if !self.intervals.as_ref().is_some_and(|l| last || l.due(now)) {
            return;
        }
        let backlog = live.totals().await.backlog;
        let consumed = live.verifier.map(Verifier::latency);
        if let Some(l) = self.intervals.as_mut() {
            if last {
                l.finish(now, backlog, consumed.as_ref());
            } else {
                l.close_due(now, backlog, consumed.as_ref());
            }
        }
    }

    /// Samples, records and (maybe) prints one line.
    pub async fn tick(&mut self, live: &Live<'_>, phase: &'static str) {
        let now = Instant::now();
        let dt = now.duration_since(self.last_at).as_secs_f64().max(1e-3);
        let t = live.totals().await;
        let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
        // p99 of what was acked in this interval: cumulative histogram minus the last one
        let hist = live.relays.and_then(Relays::commit_to_ack);
        let p99 = match (&hist, &self.last_hist) {
            (Some(h), Some(prev)) => {
                let mut d = h.clone();
                d.subtract(prev)
                    .ok()
                    .and_then(|_| Quantiles::from_us(&d))
                    .map(|q| q.p99)
            }
            (Some(h), None) => Quantiles::from_us(h).map(|q| q.p99),
            _ => None,
        };
        if let Some(dead) = live.db.pg_dead_tuples().await {
            self.dead_peak = self.dead_peak.max(dead);
        }
        let s = Sample {
            t: report::round3(now.duration_since(self.t0).as_secs_f64()),
            phase,
            enqueued_per_sec: report::round3(per(t.enqueued, self.last.enqueued)),
            sent_per_sec: report::round3(per(t.sent, self.last.sent)),
            consumed_per_sec: report::round3(per(t.consumed, self.last.consumed)),
            backlog: t.backlog,
            p99_commit_to_ack_ms: p99,
            inbox_applied_per_sec: live
                .inbox
                .map(|_| report::round3(per(t.inbox, self.last.inbox))),
            inbox_lag: live
                .inbox
                .map(|_| (t.consumed as i64 - t.inbox as i64).max(0)),
            purged: live.purged.map(|n| n.load(Ordering::Relaxed)),
        };
        if self.print {
            let inbox = match (s.inbox_applied_per_sec, s.inbox_lag) {
                (Some(r), Some(lag)) => {
                    format!("  inbox {:>7}/s lag {lag:>6}", report::render::rate(r))
                }
                _ => String::new(),
            };
            let purged = live.purged.map_or(String::new(), |n| {
                format!("  purged {:>8}", n.load(Ordering::Relaxed))
            });
            let line = format!(
                "loadgen [{:>5.0}s {phase:<5}] enq {:>7}/s  sent {:>7}/s  cons {:>7}/s{inbox}  backlog {:>8}{purged}  p99 commit→ack {}",
                s.t,
                report::render::rate(s.enqueued_per_sec),
                report::render::rate(s.sent_per_sec),
                if live.verifier.is_some() { report::render::rate(s.consumed_per_sec) } else { "-".to_string() },
                s.backlog,
                p99.map_or("-".to_string(), |v| format!("{v:.1} ms")),
            );
            let mut err = std::io::stderr().lock();
            if self.tty {
                let _ = write!(err, "\r{line}\x1b[K");
            } else {
                let _ = writeln!(err, "{line}");
            }
            let _ = err.flush();
        }
        self.timeline.push(s);
        self.last = t;
        self.last_at = now;
        if hist.is_some() {
            self.last_hist = hist;
        }
    }

    /// Ends a `\r`-updated line.
    pub fn finish_line(&self) {
        if self.print && self.tty {
            eprintln!();
        }
    }
}
