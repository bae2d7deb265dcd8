//! Cursor dispatch's exception rows, the same on every backend: the row an exception starts as,
//! and the events an exception claim returns.
use ferry_core::ExceptionKind;

use crate::time::micros;

/// Exception rows just claimed as events: each intent's row (`events`, read from `ferry_outbox`)
/// with the exception row's claim — `claim_id`, and from `claimed` (`seq`, new claim version,
/// attempts) its version and attempts.
pub(crate) fn claimed_exceptions(
    events: impl IntoIterator<Item = ferry_core::ClaimedEvent>,
    claimed: impl IntoIterator<Item = (i64, i64, i32)>,
    claim_id: &str,
) -> Vec<ferry_core::ClaimedEvent> {
    let by_seq: std::collections::HashMap<i64, (i64, i32)> =
        claimed.into_iter().map(|(s, cv, a)| (s, (cv, a))).collect();
    events
        .into_iter()
        .map(|mut e| {
            let (cv, attempts) = by_seq[&e.token.seq];
            e.token.claim_id = claim_id.to_string();
            e.token.claim_version = cv;
            e.attempts = attempts;
            e
        })
        .collect()
}

/// The row an exception starts as: its state, how long from now until it is due (µs), and its
/// error text.
///
/// * `Retry` → `PENDING`, due after the backoff;
/// * `Quarantine` → `QUARANTINED` (parked for an operator);
/// * `Unknown` → `PENDING`, due now (resend with the same id and payload);
/// * `Held` → `PENDING`, due now (sent after its predecessors: the predecessor rule).
pub(crate) fn exception_row(kind: &ExceptionKind) -> (&'static str, i64, Option<&str>) {
    match kind {
        ExceptionKind::Retry { delay, error } => ("PENDING", micros(*delay), Some(error)),
        ExceptionKind::Quarantine(e) => ("QUARANTINED", 0, Some(e)),
        ExceptionKind::Unknown(e) => ("PENDING", 0, Some(e)),
        ExceptionKind::Held => ("PENDING", 0, None),
    }
}
