//! The cases of `ferry lab`, in the order `--case all` runs them.

/// Every case: the protocol's cases first, then the two that need real contention and a real
/// broker (`two-sessions`, `kafka-duplicate`).
pub const CASES: &[&str] = &[
    "rollback",
    "committed",
    "send-before-mark",
    "mark-before-send",
    "stale-claim",
    "stale-cursor",
    "batch",
    "two-sessions",
    "kafka-duplicate",
];
