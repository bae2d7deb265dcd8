//! Backend-neutral helpers shared by the SQL backends (PostgreSQL, MySQL/MariaDB, SQLite) and
//! the in-memory store: operator errors, sqlx error context, row decoding, cursor-dispatch
//! exception rows.
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use ferry_core::{
    DispatchMode, EnqueueError, EventRecord, EventState, ExceptionKind, OutboxStatus,
    QuarantinedEvent, SlotId, SlotLease, StoreError, StoreErrorKind, ValidatedEvent,
};

use crate::db_err;

/// A duration in whole microseconds, saturating.
pub(crate) fn micros(d: Duration) -> i64 {
    d.as_micros().min(i64::MAX as u128) as i64
}

/// `.ctx("what")` on a sqlx result: the error mapped by [`db_err`] with `what` as context.
pub(crate) trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, StoreError>;
}

impl<T> Ctx<T> for Result<T, sqlx::Error> {
    fn ctx(self, what: &str) -> Result<T, StoreError> {
        self.map_err(|e| db_err(what, e))
    }
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

/// A `ferry_slot_lease` row: `slot, owner, epoch, lease_until` (µs). The slot column is `int2`
/// on PostgreSQL, `INTEGER` on SQLite.
pub(crate) fn lease_from<S: Into<i64>>(
    (slot, owner, epoch, lease_until): (S, String, i64, i64),
) -> SlotLease {
    SlotLease {
        slot: slot.into() as SlotId,
        owner,
        epoch,
        lease_until,
    }
}

/// Why a dispatch-mode switch to `mode` is refused while `others` live relays dispatch in
/// `current` mode.
pub(crate) fn mode_in_use(current: &str, others: i64, mode: DispatchMode) -> StoreError {
    StoreError::new(
        StoreErrorKind::InvalidInput,
        format!(
            "the outbox is dispatched in {current} mode by {others} live relay(s); \
             stop them (or start this relay with --dispatch {current}) before switching to {mode}"
        ),
    )
}

/// A status row: `pending, claimed, quarantined, oldest_unfinished_age_us, blocked_aggregates`.
pub(crate) type StatusRow = (i64, i64, i64, Option<i64>, i64);

pub(crate) fn status_from(row: StatusRow) -> OutboxStatus {
    let (pending, claimed, quarantined, oldest_unfinished_age_us, blocked_aggregates) = row;
    OutboxStatus {
        pending,
        claimed,
        quarantined,
        oldest_unfinished_age_us,
        blocked_aggregates,
    }
}

/// An event's delivery-state row: `event_id, state, claim_version, claim_id, attempts,
/// last_error, resolved_by, payload`.
pub(crate) type RecordRow = (
    String,
    String,
    i64,
    Option<String>,
    i32,
    Option<String>,
    Option<String>,
    String,
);

/// The relation whose `state` is an intent's effective state: the outbox in row dispatch; in
/// cursor dispatch the view (the exception row's state, else SENT behind the slot's cursor).
pub(crate) fn state_table(mode: DispatchMode) -> &'static str {
    match mode {
        DispatchMode::Row => "ferry_outbox",
        DispatchMode::Cursor => "ferry_outbox_cursor_view",
    }
}

pub(crate) fn record_from(row: RecordRow) -> Result<EventRecord, StoreError> {
    let (event_id, state, claim_version, claim_id, attempts, last_error, resolved_by, payload) =
        row;
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

/// A quarantined event's row: `event_id, aggregate_id, aggregate_version, last_error,
/// attempts, blocked_successors`.
pub(crate) type QuarantinedRow = (String, String, i64, Option<String>, i32, i64);

pub(crate) fn quarantined_from(row: QuarantinedRow) -> QuarantinedEvent {
    let (event_id, aggregate_id, aggregate_version, last_error, attempts, blocked_successors) = row;
    QuarantinedEvent {
        event_id,
        aggregate_id,
        aggregate_version,
        last_error,
        attempts,
        blocked_successors,
    }
}
