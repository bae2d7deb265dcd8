//! Open gaps as an operator lists them.

/// One aggregate with an open gap for a consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GapInfo {
    /// The aggregate.
    pub aggregate_id: String,
    /// Highest version applied contiguously; `applied_upto + 1` is the missing one.
    pub applied_upto: i64,
    /// Highest version seen (recorded under `Report`, or held back under `HoldBack`).
    pub max_seen: i64,
    /// When the gap was first detected (µs since the Unix epoch).
    pub since_micros: i64,
}

impl GapInfo {
    /// The first missing version.
    pub fn missing(&self) -> i64 {
        self.applied_upto + 1
    }
}
