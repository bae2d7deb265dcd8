//! Backend-neutral pieces of cursor dispatch shared by the SQLite and PostgreSQL implementations.
use std::time::Duration;

use ferry_core::ExceptionKind;

/// A duration in whole microseconds, saturating.
pub(crate) fn micros(d: Duration) -> i64 {
    d.as_micros().min(i64::MAX as u128) as i64
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
