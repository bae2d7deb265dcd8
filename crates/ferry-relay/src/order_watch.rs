//! The order net: notices when an aggregate's version goes down in what a shard worker hands to
//! its sink, counts it in `ferry_order_regressions_total` and logs the aggregate. The protocol
//! already keeps each aggregate in order (docs/architecture.md); this is the production check
//! that it did, and the place a producer that commits versions out of order shows up.
//!
//! # What counts as a regression
//!
//! Redelivery is legal: an Unknown outcome, a retry, a requeue, a fenced advance or a crash
//! sends versions the sink was handed before, again. So "a version below one sent before" is
//! not the signal; "a later version was handed to the sink before an earlier one" is. Each
//! worker keeps, per aggregate, the version it handed to the sink last in the aggregate's
//! current *epoch* (since the worker's last legitimate rewind of it), and checks every batch it
//! hands to the sink item by item, in send order:
//!
//! 1. **Within one batch** an aggregate's versions must strictly increase: an item whose version
//!    is at or below the aggregate's previous item in the same batch is a regression. No legal
//!    path puts an aggregate twice or backwards into one batch: a cursor read returns each row
//!    once, in dispatch order; a row claim and an exception claim return at most one version per
//!    aggregate; `(aggregate_id, aggregate_version)` is unique.
//! 2. **Across batches** an item whose version is below the last one handed in the epoch is a
//!    regression. The same version again is a resend (Unknown, retry, requeue, a row taken over
//!    after its lease), a higher one is progress.
//! 3. **Rewinds end an epoch**, at the points where a worker legitimately goes back:
//!    * cursor dispatch, a reset (fenced or failed advance, changed slot set, first load):
//!      everything past the durable cursors is read and sent again, so the worker forgets every
//!      aggregate ([`OrderWatch::clear`]);
//!    * cursor dispatch, an advance that writes exception rows for an aggregate: the exception
//!      path resends it from its lowest exception row on (in version order), so its last version
//!      is lowered to that one ([`OrderWatch::rewind`]): lowered, never raised, so an older open
//!      exception still counts, and the exception path's own order is still checked;
//!    * row dispatch needs none: a claim returns a version only when no lower version of its
//!      aggregate is PENDING, CLAIMED or QUARANTINED, and what is sent again (released, retried,
//!      requeued, taken over) is that same version, which rule 2 accepts. No operator action
//!      moves a SENT row back.
//!
//! Hence no legal resend is counted. What is not seen: a regression spanning a reset, or across
//! workers and relays (each worker compares only what it handed to the sink itself; a slot
//! that changes hands starts fresh), or against an aggregate forgotten by the bounded memory
//! ([`CAPACITY`]).
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use ferry_core::ClaimedEvent;

use crate::metrics::Metrics;

/// Aggregates a worker remembers at most: 65,536, in two generations of 32,768. An aggregate
/// is remembered until at least 32,768 other aggregates were handed to the sink after it: 16
/// full cursor batches (2,000 events), four times the cursor worker's in-flight window (4 × 2,000)
/// and 32 times row dispatch's (2 × 500), which covers the neighbouring batches where a
/// protocol slip would reorder; at 100k events/s of all-distinct aggregates that is at least
/// 0.33 s, and much longer when aggregates repeat (a repeat renews it). The price is about
/// 100 bytes per entry (the id, its version, the map's overhead): about 6.5 MB per worker when
/// full, and one or two hash lookups per event sent.
pub(crate) const CAPACITY: usize = 65_536;

/// What the watch remembers of one aggregate.
#[derive(Debug, Clone, Copy)]
struct Last {
    /// The version handed to the sink last (lowered by a rewind).
    version: i64,
    /// The [`OrderWatch::check`] call that handed it (rule 1 vs rule 2).
    batch: u64,
}

/// One version handed to the sink after a later one of its aggregate (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Regression {
    /// Its index in the checked batch.
    pub(crate) index: usize,
    /// The aggregate's version handed to the sink before it.
    pub(crate) before: i64,
    /// Its own version.
    pub(crate) now: i64,
    /// Whether `before` was handed in the same batch.
    pub(crate) same_batch: bool,
}

/// Per worker: aggregate → last version handed to the sink, bounded to `capacity` aggregates
/// in two generations (the older is dropped when the newer fills up: no per-entry recency
/// bookkeeping, as an LRU would need, and one or two lookups per event).
#[derive(Debug)]
pub(crate) struct OrderWatch {
    current: HashMap<String, Last>,
    previous: HashMap<String, Last>,
    /// Entries per generation.
    generation: usize,
    /// Batches checked so far.
    batches: u64,
}

impl Default for OrderWatch {
    fn default() -> Self {
        Self::with_capacity(CAPACITY)
    }
}

impl OrderWatch {
    /// A watch that remembers at most `capacity` aggregates (at least 2).
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            current: HashMap::new(),
            previous: HashMap::new(),
            generation: (capacity / 2).max(1),
            batches: 0,
        }
    }

    /// Checks one batch about to be handed to the sink, `(aggregate_id, version)` in send order,
    /// and remembers each item's version as its aggregate's last. Returns the regressions.
    pub(crate) fn check<'a>(
        &mut self,
        batch: impl IntoIterator<Item = (&'a str, i64)>,
    ) -> Vec<Regression> {
        self.batches += 1;
        let this = self.batches;
        let mut found = Vec::new();
        for (index, (aggregate, version)) in batch.into_iter().enumerate() {
            let now = Last {
                version,
                batch: this,
            };
            let before = match self.current.get_mut(aggregate) {
                Some(last) => Some(std::mem::replace(last, now)),
                None => {
                    let before = self.previous.remove(aggregate);
                    self.insert(aggregate, now);
                    before
                }
            };
            let Some(before) = before else { continue };
            let same_batch = before.batch == this;
            let went_down = if same_batch {
                version <= before.version
            } else {
                version < before.version
            };
            if went_down {
                found.push(Regression {
                    index,
                    before: before.version,
                    now: version,
                    same_batch,
                });
            }
        }
        found
    }

    /// The worker will resend `aggregate` from `version` on (its exception rows): a send of
    /// `version` or above is no longer a regression. Lowers a remembered version, never raises
    /// one, and remembers nothing new.
    pub(crate) fn rewind(&mut self, aggregate: &str, version: i64) {
        if let Some(last) = self
            .current
            .get_mut(aggregate)
            .or_else(|| self.previous.get_mut(aggregate))
        {
            last.version = last.version.min(version);
        }
    }

    /// The worker will resend anything past its durable cursors: forgets every aggregate.
    pub(crate) fn clear(&mut self) {
        self.current.clear();
        self.previous.clear();
    }

    /// Aggregates remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    fn insert(&mut self, aggregate: &str, last: Last) {
        if self.current.len() >= self.generation {
            // the newer generation is full: it becomes the older one, the older is dropped
            // (its allocation is kept for the next generation)
            std::mem::swap(&mut self.current, &mut self.previous);
            self.current.clear();
        }
        self.current.insert(aggregate.to_owned(), last);
    }
}

/// The worker's watch, locked. A panic elsewhere while it was held leaves at worst one batch
/// half recorded (a missed or extra comparison for its aggregates), not a reason to stop
/// relaying: the poison is ignored.
pub(crate) fn lock(watch: &Mutex<OrderWatch>) -> MutexGuard<'_, OrderWatch> {
    watch
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Checks `items`, about to be handed to the sink in this order, against the worker's `watch`,
/// and counts and logs each regression ([`Metrics::note_order_regression`]). One lock per batch.
pub(crate) fn check_send(watch: &Mutex<OrderWatch>, metrics: &Metrics, items: &[ClaimedEvent]) {
    let found = lock(watch).check(
        items
            .iter()
            .map(|e| (e.aggregate_id.as_str(), e.aggregate_version)),
    );
    for r in found {
        metrics.note_order_regression(&items[r.index], r.before, r.same_batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(w: &mut OrderWatch, batch: &[(&str, i64)]) -> Vec<Regression> {
        w.check(batch.iter().copied())
    }

    #[test]
    fn an_in_order_batch_and_its_successors_are_no_regression() {
        let mut w = OrderWatch::default();
        assert_eq!(check(&mut w, &[("a", 1), ("b", 7), ("a", 2), ("a", 3)]), []);
        assert_eq!(check(&mut w, &[("b", 8), ("a", 4)]), []);
        // gaps are not this net's business (the consumer's Inbox sees them)
        assert_eq!(check(&mut w, &[("a", 9)]), []);
    }

    #[test]
    fn a_version_before_a_later_one_in_one_batch_is_one_regression() {
        let mut w = OrderWatch::default();
        assert_eq!(
            check(&mut w, &[("x", 2), ("y", 1), ("x", 1)]),
            [Regression {
                index: 2,
                before: 2,
                now: 1,
                same_batch: true
            }]
        );
        // the same version twice in one batch: no legal path does that either
        assert_eq!(
            check(&mut w, &[("z", 5), ("z", 5)]),
            [Regression {
                index: 1,
                before: 5,
                now: 5,
                same_batch: true
            }]
        );
    }

    #[test]
    fn a_lower_version_in_a_later_batch_is_one_regression() {
        let mut w = OrderWatch::default();
        assert_eq!(check(&mut w, &[("x", 3)]), []);
        assert_eq!(check(&mut w, &[("other", 1)]), []);
        assert_eq!(
            check(&mut w, &[("x", 2)]),
            [Regression {
                index: 0,
                before: 3,
                now: 2,
                same_batch: false
            }]
        );
        // from there on the aggregate is compared with what was sent last: 3 again is progress
        assert_eq!(check(&mut w, &[("x", 3)]), []);
    }

    #[test]
    fn resending_the_same_version_in_a_later_batch_is_no_regression() {
        // Unknown, retry, requeue, a row taken over after its lease: the same version again
        let mut w = OrderWatch::default();
        assert_eq!(check(&mut w, &[("x", 1), ("x", 2)]), []);
        assert_eq!(check(&mut w, &[("x", 2)]), []);
        assert_eq!(check(&mut w, &[("x", 2), ("x", 3)]), []);
    }

    #[test]
    fn resends_after_a_rewind_are_no_regression() {
        // a reset: the worker re-reads from its durable cursors and resends v3.. in order
        let mut w = OrderWatch::default();
        assert_eq!(check(&mut w, &[("x", 1), ("x", 2), ("x", 3), ("x", 4)]), []);
        assert_eq!(check(&mut w, &[("x", 5)]), []);
        w.clear();
        assert_eq!(check(&mut w, &[("x", 3), ("x", 4), ("x", 5)]), []);
        assert_eq!(w.len(), 1);

        // exception rows from v2 on (v2 not acked, v3 and v4 held): resent one per round trip
        let mut w = OrderWatch::default();
        assert_eq!(check(&mut w, &[("x", 1), ("x", 2), ("x", 3), ("x", 4)]), []);
        w.rewind("x", 2);
        w.rewind("x", 3);
        w.rewind("x", 4);
        for v in 2..=6 {
            assert_eq!(check(&mut w, &[("x", v)]), [], "v{v}");
        }
        // the exception path's own order is still checked: below the rewind is a regression
        w.rewind("x", 5);
        assert_eq!(check(&mut w, &[("x", 6)]), []);
        assert_eq!(check(&mut w, &[("x", 5)]).len(), 1);
        // a rewind lowers, never raises, and remembers nothing new
        let mut w = OrderWatch::default();
        assert_eq!(check(&mut w, &[("x", 2)]), []);
        w.rewind("x", 9);
        assert_eq!(check(&mut w, &[("x", 2)]), []);
        w.rewind("fresh", 4);
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn memory_is_bounded_and_keeps_the_last_half_capacity_aggregates() {
        let capacity = 64;
        let mut w = OrderWatch::with_capacity(capacity);
        assert_eq!(check(&mut w, &[("x", 5)]), []);
        // half the capacity of other aggregates later, x is still remembered
        for i in 0..capacity / 2 {
            assert_eq!(check(&mut w, &[(&format!("a{i}"), 1)]), []);
        }
        assert_eq!(check(&mut w, &[("x", 4)]).len(), 1);
        // sending it renews it; then far more aggregates than fit
        for i in 0..10 * capacity {
            assert_eq!(check(&mut w, &[(&format!("b{i}"), 1)]), []);
            assert!(w.len() <= capacity, "{} entries", w.len());
        }
        assert!(w.len() >= capacity / 2);
        // x is forgotten (a missed regression, never a false one)
        assert_eq!(check(&mut w, &[("x", 1)]), []);
        // an aggregate found in the older generation moves to the newer one, not duplicated
        let mut w = OrderWatch::with_capacity(4);
        assert_eq!(check(&mut w, &[("p", 3), ("q", 1), ("r", 1)]), []);
        assert_eq!(w.len(), 3);
        assert_eq!(check(&mut w, &[("p", 2)]).len(), 1);
        assert_eq!(w.len(), 3);
    }
}
