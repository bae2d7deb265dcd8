//! Rows every backend decodes the same way: slot leases, status counts, an event's record, a
//! quarantined event, relay members.
use std::str::FromStr;

use ferry_core::{
    EventRecord, EventState, OutboxStatus, Payload, SlotId, SlotLease, StoreError, StoreErrorKind,
};

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

/// A slot's cursor from its `ferry_slot_lease` row: the slot (in the backend's column type),
/// its epoch and cursor version, and its position.
pub(crate) fn cursor_from<S: Into<i64>>(
    (slot, epoch, version): (S, i64, i64),
    pos: ferry_core::CursorPos,
) -> ferry_core::SlotCursor {
    ferry_core::SlotCursor {
        slot: slot.into() as SlotId,
        epoch,
        version,
        pos,
    }
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
/// last_error, resolved_by` and the payload as text and bytes (one of them NULL).
pub(crate) type RecordRow = (
    String,
    String,
    i64,
    Option<String>,
    i32,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<Vec<u8>>,
);

pub(crate) fn record_from(row: RecordRow) -> Result<EventRecord, StoreError> {
    let (event_id, state, claim_version, claim_id, attempts, last_error, resolved_by, text, bytes) =
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
        payload: Payload::from_columns(text, bytes),
    })
}

/// [`ferry_core::SlotOwnership::members`] from `(owner, sink_stalled_us)` rows.
pub(crate) fn members_from(
    rows: impl IntoIterator<Item = (String, Option<i64>)>,
) -> Vec<ferry_core::MemberInfo> {
    rows.into_iter()
        .map(|(owner, sink_stalled_us)| ferry_core::MemberInfo {
            owner,
            sink_stalled_us,
        })
        .collect()
}
