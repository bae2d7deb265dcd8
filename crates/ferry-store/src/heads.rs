//! Row claims past a deep backlog, shared by every backend: how far a claim's window
//! reaches, and where the next scan for heads starts (docs/architecture.md, "Row claims past a
//! deep backlog").
//!
//! A row claim takes only each aggregate's lowest unfinished version (its *head*). Walked without
//! a bound, the claim's read in `seq` order reaches the end of the backlog whenever fewer than its
//! limit qualify, so each claim costs the whole backlog. A claim therefore walks a bounded window
//! at the front, and when that comes back short with rows past it, visits the heads of the
//! aggregates past it, a bounded number of aggregates per claim, in aggregate order, starting
//! where the last scan stopped.
use std::sync::{Arc, Mutex};

/// Rows the window holds at most: two claims' worth, and never fewer than 1,024. It is also how
/// many aggregates one scan for heads visits at most.
pub(crate) fn window_rows(limit: usize) -> i64 {
    i64::try_from(limit.saturating_mul(2))
        .unwrap_or(i64::MAX)
        .max(1024)
}

/// The aggregate id after which the next scan for heads starts ("" for the first, and after a
/// scan reached the last aggregate). One per store, shared by its workers.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeadsFrom(Arc<Mutex<String>>);

impl HeadsFrom {
    pub(crate) fn get(&self) -> String {
        self.0.lock().expect("heads_from").clone()
    }

    /// Where the next scan starts: after `next`, or at the first aggregate when `None`.
    pub(crate) fn set(&self, next: Option<String>) {
        *self.0.lock().expect("heads_from") = next.unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::{window_rows, HeadsFrom};

    #[test]
    fn a_window_holds_two_claims_and_at_least_1024_rows() {
        assert_eq!(window_rows(1), 1024);
        assert_eq!(window_rows(500), 1024);
        assert_eq!(window_rows(1000), 2000);
        assert_eq!(window_rows(usize::MAX), i64::MAX);
    }

    #[test]
    fn a_scan_that_reached_the_end_wraps_to_the_first_aggregate() {
        let h = HeadsFrom::default();
        assert_eq!(h.get(), "");
        h.set(Some("order-17".into()));
        assert_eq!(h.clone().get(), "order-17", "shared by clones");
        h.set(None);
        assert_eq!(h.get(), "");
    }
}
