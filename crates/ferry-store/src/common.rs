//! Backend-neutral helpers shared by the SQL backends (PostgreSQL, MySQL/MariaDB, SQLite) and
//! the in-memory store: operator errors, record decoding, cursor-dispatch exception rows.
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use ferry_core::{
    EnqueueError, EventRecord, EventState, ExceptionKind, StoreError, StoreErrorKind,
    ValidatedEvent,
};

use crate::db_err;

/// A duration in whole microseconds, saturating.
pub(crate) fn micros(d: Duration) -> i64 {
    d.as_micros().min(i64::MAX as u128) as i64
}

/// The error of an operator enqueue whose own transaction could not begin.
pub(crate) fn begin_err(e: sqlx::Error) -> EnqueueError {
    EnqueueError::Store(db_err("begin", e).to_string())
}

/// Runs `commit` (an operator enqueue's own transaction's `commit()`, not yet polled, after
/// `rows` were inserted in it) past the `enqueue-before-commit` failpoint and returns the rows'
/// event ids, in order.
pub(crate) async fn commit_enqueue(
    commit: impl Future<Output = Result<(), sqlx::Error>>,
    rows: Vec<ValidatedEvent>,
) -> Result<Vec<String>, EnqueueError> {
    ferry_core::failpoint::hit("enqueue-before-commit");
    commit
        .await
        .map_err(|e| EnqueueError::Store(db_err("commit", e).to_string()))?;
    Ok(rows.into_iter().map(|r| r.event_id).collect())
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

pub(crate) fn not_quarantined(event_id: &str, rec: Option<EventRecord>) -> StoreError {
    match rec {
        None => StoreError::new(StoreErrorKind::InvalidInput, format!("no outbox event with id {event_id:?}")),
        Some(r) => StoreError::new(
            StoreErrorKind::InvalidInput,
            format!("event {event_id:?} is {}, not QUARANTINED; only quarantined events can be requeued or skipped", r.state),
        ),
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn record_from(
    event_id: String,
    state: String,
    claim_version: i64,
    claim_id: Option<String>,
    attempts: i32,
    last_error: Option<String>,
    resolved_by: Option<String>,
    payload: String,
) -> Result<EventRecord, StoreError> {
    let state =
        EventState::from_str(&state).map_err(|e| StoreError::new(StoreErrorKind::Schema, e))?;
    Ok(EventRecord {
        event_id,
        state,
        claim_version,
        claim_id,
        attempts,
        last_error,
        resolved_by,
        payload,
    })
}
