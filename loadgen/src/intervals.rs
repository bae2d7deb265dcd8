//! The per-interval latency table (`--report-interval`): COMMIT → broker ack and tx start →
//! consumed per interval of the run, with the backlog at each interval's end.
//!
//! Interval `k` is `[start + k·len, start + (k+1)·len)`; `start` is the start of the load phase
//! (with `--preload`: the start of the relays), and the last interval ends with the drain
//! (shorter than the others). COMMIT → broker ack samples are bucketed exactly by the instant
//! the sink reported the ack ([`Buckets`], kept by the commit clock); tx start →
//! consumed samples by the instant the verifier consumed the message, as the difference of its
//! cumulative histogram read at each interval's end ([`IntervalLog`]: in the load phase the
//! run wakes at each end; in the drain it polls every 100 ms, so an end is read up to ~100 ms
//! late). The backlog is read at the same instants.
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::report::{round3, FirstVsLast, IntervalReport, IntervalRow, Stats};

/// A load of at least this long gets [`LONG_LOAD_INTERVAL`] intervals by default.
pub const LONG_LOAD: Duration = Duration::from_secs(15 * 60);
/// The default interval of a long load.
pub const LONG_LOAD_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// The default interval of a burn-down (`--preload`), whose length is not known in advance.
pub const PRELOAD_INTERVAL: Duration = Duration::from_secs(5);
/// At most this many intervals per run (load and drain): each holds two small histograms.
pub const MAX_INTERVALS: u64 = 2000;

/// The default interval: 5 min for a load of 15 min or more, else a quarter of the load (at
/// least 1 s); `None` (a burn-down) gets [`PRELOAD_INTERVAL`].
pub fn default_interval(load: Option<Duration>) -> Duration {
    match load {
        Some(d) if d >= LONG_LOAD => LONG_LOAD_INTERVAL,
        Some(d) => (d / 4).max(Duration::from_secs(1)),
        None => PRELOAD_INTERVAL,
    }
}

/// A histogram for one interval's samples (µs): the run's bounds at 2 significant digits
/// (p99 to 1 %), about 26 KiB, so long runs with short intervals stay small.
pub fn interval_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 2).expect("valid histogram bounds")
}

/// The interval `at` falls in: `floor((at - start) / len)`; instants before `start` count in
/// interval 0.
pub fn index(start: Instant, len: Duration, at: Instant) -> usize {
    let since = at.saturating_duration_since(start).as_nanos();
    (since / len.as_nanos().max(1)) as usize
}

/// Latency samples bucketed by the instant they were taken.
#[derive(Debug, Clone)]
pub struct Buckets {
    start: Instant,
    len: Duration,
    hists: Vec<Histogram<u64>>,
}

impl Buckets {
    pub fn new(start: Instant, len: Duration) -> Self {
        Self {
            start,
            len,
            hists: Vec::new(),
        }
    }

    /// Records `us` taken at `at` (intervals past [`MAX_INTERVALS`] count in the last one).
    pub fn record(&mut self, at: Instant, us: u64) {
        let k = index(self.start, self.len, at).min(MAX_INTERVALS as usize - 1);
        while self.hists.len() <= k {
            self.hists.push(interval_histogram());
        }
        let _ = self.hists[k].record(us.clamp(1, 3_600_000_000));
    }

    /// Interval `k`'s samples (`None`: none were taken).
    pub fn get(&self, k: usize) -> Option<&Histogram<u64>> {
        self.hists.get(k).filter(|h| !h.is_empty())
    }
}

/// What was read at the end of one interval.
#[derive(Debug, Clone)]
struct Closed {
    end: Instant,
    backlog: i64,
    /// tx start → consumed samples taken in the interval (`None`: no consumer).
    consumed: Option<Stats>,
}

/// The interval ends read so far.
#[derive(Debug)]
pub struct IntervalLog {
    pub start: Instant,
    pub len: Duration,
    closed: Vec<Closed>,
    /// The consumer's cumulative histogram at the last end read.
    prev_consumed: Option<Histogram<u64>>,
}

impl IntervalLog {
    pub fn new(start: Instant, len: Duration) -> Self {
        Self {
            start,
            len,
            closed: Vec::new(),
            prev_consumed: None,
        }
    }

    /// The end of the interval not yet closed.
    pub fn next_end(&self) -> Instant {
        self.start + self.len * (self.closed.len() as u32 + 1)
    }

    /// Whether an interval ended by `now` has not been closed yet.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next_end()
    }

    /// Closes every interval that ended by `now` with the readings taken now: the backlog and
    /// the consumer's cumulative histogram (when several ended, the first takes every sample
    /// since the last reading). Returns how many were closed.
    pub fn close_due(
        &mut self,
        now: Instant,
        backlog: i64,
        consumed_cum: Option<&Histogram<u64>>,
    ) -> usize {
        let mut n = 0;
        while self.due(now) {
            let end = self.next_end();
            let consumed = self.take_consumed(consumed_cum);
            self.closed.push(Closed {
                end,
                backlog,
                consumed,
            });
            n += 1;
        }
        n
    }

    /// Closes the last, partial interval at `now` (the end of the drain), unless an interval
    /// ended within the last millisecond.
    pub fn finish(&mut self, now: Instant, backlog: i64, consumed_cum: Option<&Histogram<u64>>) {
        self.close_due(now, backlog, consumed_cum);
        let last = self.closed.last().map_or(self.start, |c| c.end);
        if now.saturating_duration_since(last) >= Duration::from_millis(1) {
            let consumed = self.take_consumed(consumed_cum);
            self.closed.push(Closed {
                end: now,
                backlog,
                consumed,
            });
        }
    }

    /// The samples of `cum` since the last reading.
    fn take_consumed(&mut self, cum: Option<&Histogram<u64>>) -> Option<Stats> {
        let cum = cum?;
        let mut d = cum.clone();
        if let Some(prev) = &self.prev_consumed {
            if d.subtract(prev).is_err() {
                d = cum.clone();
            }
        }
        self.prev_consumed = Some(cum.clone());
        Some(Stats::of(Some(&d)))
    }

    /// The table: one row per closed interval, COMMIT → broker ack from `acks` (`None`: not
    /// measured), times in seconds since `t0` (the timeline's origin); intervals ending by
    /// `load_end` are `load`, those starting at or after it `drain`.
    pub fn report(&self, t0: Instant, load_end: Instant, acks: Option<&Buckets>) -> IntervalReport {
        let secs = |at: Instant| round3(at.saturating_duration_since(t0).as_secs_f64());
        let mut rows = Vec::with_capacity(self.closed.len());
        let mut from = self.start;
        for (k, c) in self.closed.iter().enumerate() {
            let phase = if c.end <= load_end {
                "load"
            } else if from >= load_end {
                "drain"
            } else {
                "load+drain"
            };
            rows.push(IntervalRow {
                t_start: secs(from),
                t_end: secs(c.end),
                phase,
                full: c.end.saturating_duration_since(from) + Duration::from_millis(1) >= self.len,
                commit_to_broker_ack: acks.map(|b| Stats::of(b.get(k))),
                tx_start_to_consumed: c.consumed,
                backlog_at_end: c.backlog,
            });
            from = c.end;
        }
        let first_vs_last = first_vs_last(&rows);
        IntervalReport {
            interval_secs: round3(self.len.as_secs_f64()),
            bucketed_by: "COMMIT → broker ack: the instant the sink reported the ack; tx start → consumed: the instant the verifier consumed the message".to_string(),
            rows,
            first_vs_last,
        }
    }
}

/// The first and last full intervals with samples of the load phase (none: of the drain),
/// compared by COMMIT → broker ack p99, else by tx start → consumed p99.
fn first_vs_last(rows: &[IntervalRow]) -> Option<FirstVsLast> {
    type Pick = fn(&IntervalRow) -> Option<Stats>;
    let metrics: [(&'static str, Pick); 2] = [
        ("commit_to_broker_ack", |r| r.commit_to_broker_ack),
        ("tx_start_to_consumed", |r| r.tx_start_to_consumed),
    ];
    let has_load = rows.iter().any(|r| r.phase == "load");
    let (phase, scope) = if has_load {
        ("load", "full load-phase intervals with samples")
    } else {
        ("drain", "full drain intervals with samples (no load phase)")
    };
    for (metric, pick) in metrics {
        let cand: Vec<(usize, f64)> = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.full && r.phase == phase)
            .filter_map(|(k, r)| pick(r).and_then(|s| s.p99_ms).map(|p| (k, p)))
            .collect();
        if rows.iter().all(|r| pick(r).is_none()) {
            continue;
        }
        let (&(first, a), &(last, b)) = (cand.first()?, cand.last()?);
        if first == last {
            return None;
        }
        return Some(FirstVsLast {
            metric,
            scope,
            first,
            last,
            first_p99_ms: a,
            last_p99_ms: b,
            ratio: round3(b / a.max(0.001)),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn defaults() {
        assert_eq!(default_interval(Some(12 * S)), 3 * S);
        assert_eq!(default_interval(Some(2 * S)), S);
        assert_eq!(default_interval(Some(14 * 60 * S)), 210 * S);
        assert_eq!(default_interval(Some(15 * 60 * S)), 300 * S);
        assert_eq!(default_interval(Some(3600 * S)), 300 * S);
        assert_eq!(default_interval(None), PRELOAD_INTERVAL);
    }

    #[test]
    fn samples_land_in_the_interval_of_their_instant() {
        let t = Instant::now();
        assert_eq!(index(t, 3 * S, t), 0);
        assert_eq!(index(t, 3 * S, t + 2999 * S / 1000), 0);
        assert_eq!(index(t, 3 * S, t + 3 * S), 1);
        assert_eq!(index(t, 3 * S, t + 10 * S), 3);
        // before the start: the first interval
        assert_eq!(index(t + S, 3 * S, t), 0);
        let mut b = Buckets::new(t, 3 * S);
        b.record(t + S, 1_000);
        b.record(t + 2 * S, 3_000);
        b.record(t + 7 * S, 50_000);
        assert_eq!(b.get(0).unwrap().len(), 2);
        assert!(b.get(1).is_none(), "an interval without acks");
        assert_eq!(b.get(2).unwrap().len(), 1);
        assert!(b.get(3).is_none());
        // far past the cap: the last interval
        b.record(t + 3 * S * (MAX_INTERVALS as u32 + 5), 1);
        assert_eq!(b.get(MAX_INTERVALS as usize - 1).unwrap().len(), 1);
    }

    fn cum(values: &[u64]) -> Histogram<u64> {
        let mut h = crate::db::new_histogram();
        for v in values {
            h.record(*v).unwrap();
        }
        h
    }

    #[test]
    fn the_table_has_one_row_per_interval_and_compares_first_and_last() {
        let t0 = Instant::now();
        let len = 3 * S;
        let mut log = IntervalLog::new(t0, len);
        let mut acks = Buckets::new(t0, len);
        // four load intervals; p99 grows from ~2 ms to ~8 ms; interval 2 has no ack
        for (k, ms) in [(0u32, 2u64), (1, 4), (3, 8)] {
            for i in 0..100u32 {
                acks.record(t0 + len * k + S * i / 100, ms * 1000);
            }
        }
        // drain: one ack in the partial last interval
        acks.record(t0 + 13 * S, 20_000);
        assert!(!log.due(t0 + 2 * S));
        assert_eq!(log.close_due(t0 + 3 * S, 10, Some(&cum(&[1000, 1000]))), 1);
        // the reading at 6 s came 50 ms late, the one for 9 s late enough to close two
        assert_eq!(
            log.close_due(t0 + 6 * S + S / 20, 12, Some(&cum(&[1000; 5]))),
            1
        );
        assert_eq!(log.close_due(t0 + 12 * S, 5, Some(&cum(&[1000; 9]))), 2);
        log.finish(t0 + 13 * S + S / 2, 0, Some(&cum(&[1000; 10])));
        let load_end = t0 + 12 * S;
        let r = log.report(t0, load_end, Some(&acks));
        let t: Vec<(f64, f64, &str, bool)> = r
            .rows
            .iter()
            .map(|r| (r.t_start, r.t_end, r.phase, r.full))
            .collect();
        assert_eq!(
            t,
            [
                (0.0, 3.0, "load", true),
                (3.0, 6.0, "load", true),
                (6.0, 9.0, "load", true),
                (9.0, 12.0, "load", true),
                (12.0, 13.5, "drain", false),
            ]
        );
        let acks_per: Vec<u64> = r
            .rows
            .iter()
            .map(|r| r.commit_to_broker_ack.unwrap().count)
            .collect();
        assert_eq!(acks_per, [100, 100, 0, 100, 1]);
        let consumed: Vec<u64> = r
            .rows
            .iter()
            .map(|r| r.tx_start_to_consumed.unwrap().count)
            .collect();
        // differences of the cumulative readings; of two intervals closed at once the first
        // takes what was read
        assert_eq!(consumed, [2, 3, 4, 0, 1]);
        assert_eq!(
            r.rows.iter().map(|r| r.backlog_at_end).collect::<Vec<_>>(),
            [10, 12, 5, 5, 0]
        );
        let f = r.first_vs_last.unwrap();
        assert_eq!((f.metric, f.first, f.last), ("commit_to_broker_ack", 0, 3));
        assert!((f.first_p99_ms - 2.0).abs() < 0.05, "{f:?}");
        assert!((f.last_p99_ms - 8.0).abs() < 0.1, "{f:?}");
        assert!((f.ratio - 4.0).abs() < 0.1, "{f:?}");
    }

    #[test]
    fn a_burn_down_compares_drain_intervals_and_one_interval_compares_nothing() {
        let t0 = Instant::now();
        let mut log = IntervalLog::new(t0, S);
        log.close_due(t0 + 2 * S, 0, None);
        log.finish(t0 + 2 * S + S / 2, 0, None);
        let mut acks = Buckets::new(t0, S);
        acks.record(t0, 1_000);
        acks.record(t0 + S, 3_000);
        // no load phase: everything is drain
        let r = log.report(t0, t0, Some(&acks));
        assert!(r.rows.iter().all(|r| r.phase == "drain"));
        assert!(r.rows[0].tx_start_to_consumed.is_none());
        let f = r.first_vs_last.unwrap();
        assert_eq!((f.first, f.last), (0, 1));
        assert!(f.scope.contains("drain"));
        // one full interval only: no comparison
        let mut log = IntervalLog::new(t0, 10 * S);
        log.close_due(t0 + 10 * S, 0, None);
        log.finish(t0 + 11 * S, 0, None);
        assert!(log
            .report(t0, t0 + 10 * S, Some(&acks))
            .first_vs_last
            .is_none());
        // no ack measured (relay processes): the consumer's latency is compared
        let mut log = IntervalLog::new(t0, S);
        log.close_due(t0 + S, 0, Some(&cum(&[1000])));
        log.close_due(t0 + 2 * S, 0, Some(&cum(&[1000, 5000])));
        let f = log.report(t0, t0 + 2 * S, None).first_vs_last.unwrap();
        assert_eq!(f.metric, "tx_start_to_consumed");
        assert!((f.ratio - 5.0).abs() < 0.1, "{f:?}");
    }
}
