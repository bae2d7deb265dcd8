//! Per-item send outcomes.

/// What the sink reported for one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The broker acknowledged the record.
    Acked,
    /// A transient failure: retry with backoff ([`crate::Backoff`]), or quarantine once the
    /// relay's `max_attempts` is reached.
    Retry(String),
    /// A permanent failure (too large, invalid record, unknown topic): quarantine.
    Permanent(String),
    /// No answer (the record may or may not be in the log): the relay releases the item for a
    /// resend with the same event id and payload (row dispatch: `CLAIMED → PENDING`, due now;
    /// cursor dispatch: an exception row, due now). If the relay dies first, the claim's lease
    /// (row) or the slot's cursor (cursor) brings it back.
    Unknown(String),
}

/// An outcome tied to its item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemOutcome {
    /// Index of the item in its batch.
    pub index: usize,
    /// What the sink reported for that item.
    pub outcome: Outcome,
}

/// Counts of a batch's outcomes (folded, never collapsed into one success).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutcomeCounts {
    /// Acked items.
    pub acked: usize,
    /// Items to retry.
    pub retry: usize,
    /// Items to quarantine.
    pub permanent: usize,
    /// Items whose outcome is unknown.
    pub unknown: usize,
}

impl OutcomeCounts {
    /// Counts each outcome in its own class; nothing is merged or dropped.
    pub fn fold<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> Self {
        let mut c = Self::default();
        for o in outcomes {
            match o {
                Outcome::Acked => c.acked += 1,
                Outcome::Retry(_) => c.retry += 1,
                Outcome::Permanent(_) => c.permanent += 1,
                Outcome::Unknown(_) => c.unknown += 1,
            }
        }
        c
    }
}
