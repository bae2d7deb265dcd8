//! COMMIT → broker-ack latency, measured in this process.
//!
//! The relay can only measure from an intent's `created_at`, which the database sets when the
//! producer's transaction *starts* (PostgreSQL `now()`); that over-states the latency by the
//! business transaction itself. Here the producers note the instant their COMMIT returned, per
//! event id, and a wrapper around the in-process relays' sink (`relays::ObservedSink`) notes
//! the instant the sink reported each event acked by the broker. Both are `Instant`s of this
//! process: no clock skew.
use std::sync::Mutex;
use std::time::Instant;

use dashmap::DashMap;
use hdrhistogram::Histogram;

use crate::db::new_histogram;

/// Commit instants of the events not yet acked, and the COMMIT → ack histogram.
pub struct CommitClock {
    committed: DashMap<String, Instant>,
    acked: Mutex<Histogram<u64>>,
}

impl Default for CommitClock {
    fn default() -> Self {
        Self {
            committed: DashMap::new(),
            acked: Mutex::new(new_histogram()),
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

impl CommitClock {
    /// The producer's COMMIT of these events returned at `at`.
    pub fn committed<'a>(&self, ids: impl IntoIterator<Item = &'a str>, at: Instant) {
        for id in ids {
            self.committed.insert(id.to_string(), at);
        }
    }

    /// The sink reported these events acked at `at`; the first ack of each is recorded (a
    /// resend's ack is not a second sample). Events acked before their producer saw its COMMIT
    /// return (possible: the relay may read a row while the COMMIT reply is on its way) are
    /// recorded as 1 µs, not dropped.
    pub fn acked<'a>(&self, ids: impl IntoIterator<Item = &'a str>, at: Instant) {
        let mut samples = Vec::new();
        for id in ids {
            if let Some((_, c)) = self.committed.remove(id) {
                samples.push(at.saturating_duration_since(c).as_micros() as u64);
            }
        }
        if samples.is_empty() {
            return;
        }
        let mut h = self.acked.lock().unwrap_or_else(|e| e.into_inner());
        for us in samples {
            let _ = h.record(us.clamp(1, 3_600_000_000));
        }
    }

    /// COMMIT → broker ack so far, µs.
    pub fn histogram(&self) -> Histogram<u64> {
        self.acked.lock().unwrap_or_else(|e| e.into_inner()).clone()
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
        assert_eq!(c.committed.len(), 0);
    }
}
