//! COMMIT → broker-ack latency, measured in this process.
//!
//! The relay can only measure from an intent's `created_at`, which the database sets when the
//! producer's transaction *starts* (PostgreSQL `now()`); that over-states the latency by the
//! business transaction itself. Here the producers note the instant their COMMIT returned, per
//! event id, and a wrapper around the in-process relays' sink (`relays::ObservedSink`) notes
//! the instant the sink reported each event acked by the broker. Both are `Instant`s of this
//! process: no clock skew. Once [`CommitClock::start_intervals`] was called, each sample is
//! also counted in the interval of its ack ([`Buckets`], the per-interval table).
use std::sync::Mutex;
use std::time::{Duration, Instant};

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use hdrhistogram::Histogram;

use crate::db::new_histogram;
use crate::intervals::Buckets;

/// Commit instants of the events not yet acked, and the COMMIT → ack histograms.
pub struct CommitClock {
    committed: DashMap<String, Mark>,
    acked: Mutex<Acked>,
}

/// The COMMIT → ack samples: all of them, and per interval of their ack.
struct Acked {
    all: Histogram<u64>,
    intervals: Option<Buckets>,
}

/// What is known of an event not yet sampled.
enum Mark {
    /// Its producer's COMMIT returned then.
    Committed(Instant),
    /// Acked before its producer saw the COMMIT return.
    AckedFirst,
}

impl Default for CommitClock {
    fn default() -> Self {
        Self {
            committed: DashMap::new(),
            acked: Mutex::new(Acked {
                all: new_histogram(),
                intervals: None,
            }),
        }
    }
}

impl std::fmt::Debug for CommitClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitClock")
            .field("unacked", &self.committed.len())
            .finish()
    }
}

impl ferry_testkit::workload::CommitObserver for CommitClock {
    fn committed(&self, ids: &[String], at: Instant) {
        CommitClock::committed(self, ids.iter().map(String::as_str), at);
    }
}

impl CommitClock {
    /// The producer's COMMIT of these events returned at `at`.
    pub fn committed<'a>(&self, ids: impl IntoIterator<Item = &'a str>, at: Instant) {
        let mut early = 0;
        for id in ids {
            match self.committed.entry(id.to_string()) {
                Entry::Occupied(o) if matches!(o.get(), Mark::AckedFirst) => {
                    o.remove();
                    early += 1;
                }
                Entry::Occupied(mut o) => {
                    o.insert(Mark::Committed(at));
                }
                Entry::Vacant(v) => {
                    v.insert(Mark::Committed(at));
                }
            }
        }
        self.record(std::iter::repeat_n(1, early), at);
    }

    /// The sink reported these events acked at `at`; the first ack of each is recorded (a
    /// resend's ack is not a second sample). Events acked before their producer saw its COMMIT
    /// return (possible: the relay may read a row while the COMMIT reply is on its way) are
    /// recorded as 1 µs, not dropped. (A resend's ack after the first was sampled leaves a
    /// marker behind: resends are rare.)
    pub fn acked<'a>(&self, ids: impl IntoIterator<Item = &'a str>, at: Instant) {
        let mut samples = Vec::new();
        for id in ids {
            let since = |c: Instant| at.saturating_duration_since(c).as_micros() as u64;
            let first = self
                .committed
                .remove_if(id, |_, m| matches!(m, Mark::Committed(_)));
            if let Some((_, Mark::Committed(c))) = first {
                samples.push(since(c));
                continue;
            }
            // rare: not committed yet (as far as this process knows), or acked before
            match self.committed.entry(id.to_string()) {
                Entry::Occupied(o) => {
                    if let Mark::Committed(c) = o.get() {
                        samples.push(since(*c));
                        o.remove();
                    }
                }
                Entry::Vacant(v) => {
                    v.insert(Mark::AckedFirst);
                }
            }
        }
        self.record(samples, at);
    }

    /// Records `samples` of acks that arrived at `at` (an ack before its COMMIT returned: at
    /// the COMMIT).
    fn record(&self, samples: impl IntoIterator<Item = u64>, at: Instant) {
        let mut samples = samples.into_iter().peekable();
        if samples.peek().is_none() {
            return;
        }
        let mut a = self.samples();
        for us in samples {
            let us = us.clamp(1, 3_600_000_000);
            let _ = a.all.record(us);
            if let Some(b) = a.intervals.as_mut() {
                b.record(at, us);
            }
        }
    }

    fn samples(&self) -> std::sync::MutexGuard<'_, Acked> {
        self.acked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// From now on, also counts each sample in interval `floor((ack - start) / len)`.
    pub fn start_intervals(&self, start: Instant, len: Duration) {
        self.samples().intervals = Some(Buckets::new(start, len));
    }

    /// COMMIT → broker ack so far, µs.
    pub fn histogram(&self) -> Histogram<u64> {
        self.samples().all.clone()
    }

    /// The samples per interval of their ack (`None`: intervals were not started).
    pub fn intervals(&self) -> Option<Buckets> {
        self.samples().intervals.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn first_ack_after_commit_is_the_sample() {
        let c = CommitClock::default();
        let t0 = Instant::now();
        c.committed(["a", "b"], t0);
        c.acked(["a"], t0 + Duration::from_millis(3));
        // a resend of "a" is not a second sample; "x" was never committed here
        c.acked(["a", "x"], t0 + Duration::from_millis(50));
        c.acked(["b"], t0 + Duration::from_millis(7));
        let h = c.histogram();
        assert_eq!(h.len(), 2);
        assert!((2_990..=3_010).contains(&h.min()), "min {}", h.min());
        assert!((6_990..=7_010).contains(&h.max()), "max {}", h.max());
        // the resend of "a" and the unknown "x" leave markers
        assert_eq!(c.committed.len(), 2);
    }

    #[test]
    fn an_ack_before_the_commit_returned_is_one_microsecond() {
        let c = CommitClock::default();
        let t0 = Instant::now();
        c.acked(["e"], t0);
        c.committed(["e", "f"], t0 + Duration::from_millis(2));
        c.acked(["f"], t0 + Duration::from_millis(5));
        let h = c.histogram();
        assert_eq!(h.len(), 2);
        assert_eq!(h.min(), 1);
        assert!((2_990..=3_010).contains(&h.max()), "max {}", h.max());
        assert_eq!(c.committed.len(), 0);
    }

    #[test]
    fn samples_are_counted_in_the_interval_of_their_ack() {
        let c = CommitClock::default();
        let t0 = Instant::now();
        c.committed(["a", "b"], t0);
        // before the intervals started: in the total only
        c.acked(["a"], t0 + Duration::from_millis(1));
        c.start_intervals(t0, Duration::from_secs(1));
        c.committed(["c", "d"], t0 + Duration::from_millis(900));
        c.acked(["b", "c"], t0 + Duration::from_millis(999));
        c.acked(["d"], t0 + Duration::from_millis(1_001));
        // acked before its COMMIT returned: in the interval of the COMMIT
        c.acked(["e"], t0 + Duration::from_millis(1_500));
        c.committed(["e"], t0 + Duration::from_millis(2_100));
        assert_eq!(c.histogram().len(), 5);
        let b = c.intervals().unwrap();
        assert_eq!(b.get(0).unwrap().len(), 2);
        assert_eq!(b.get(1).unwrap().len(), 1);
        assert_eq!(b.get(2).unwrap().len(), 1);
        assert_eq!(b.get(2).unwrap().max(), 1);
    }
}
