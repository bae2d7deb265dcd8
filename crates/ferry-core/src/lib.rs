//! Domain types of the ferry transactional-outbox relay.
//!
//! This crate holds the contract every other crate keeps, and depends on neither sqlx nor
//! rdkafka:
//!
//! * An outbox row is an immutable *intent* (`event_id`, aggregate identity and version, topic,
//!   key, headers, payload) plus recoverable *delivery state* (`PENDING → CLAIMED → SENT`, or
//!   `QUARANTINED`). [`NewEvent::validate`] is the single gate every backend's enqueue passes.
//! * Aggregates are hashed into [`SLOT_COUNT`] fixed logical shard slots ([`slot_for`]); workers
//!   own slots, never rows, so changing the number of workers never rewrites a row.
//! * A claim is fenced by a [`ClaimToken`] (`claim_id` generated before the claim transaction,
//!   `claim_version` incremented inside it). Every later transition is a compare-and-set on that
//!   token; a stale token updates zero rows and is reported as [`CasResult::Fenced`], a normal
//!   counted result.
//! * Each item of a batch keeps its own [`Outcome`]; a batch is never collapsed into one success.
#![warn(missing_docs, unreachable_pub)]

mod backoff;
mod claim;
mod cursor;
mod error;
mod event;
pub mod failpoint;
mod outcome;
mod shard;
pub mod store;

pub use backoff::Backoff;
pub use claim::{CasReport, CasResult, ClaimRequest, ClaimToken, ClaimedEvent, SlotFence};
pub use cursor::{
    AdvanceResult, CursorAdvance, CursorBatch, CursorEvent, CursorPos, CursorRead, CursorStore,
    DispatchMode, ExceptionKind, ExceptionOutcomes, HorizonInfo, NewException, SlotAdvance,
    SlotCursor,
};
pub use error::{EnqueueError, StoreError, StoreErrorKind};
pub use event::{
    new_event_id, validate_batch, EventState, Limits, NewEvent, ValidatedEvent, MAX_IDENT_LEN,
};
pub use outcome::{ItemOutcome, Outcome, OutcomeCounts};
pub use shard::{slot_for, slots_for_worker, SlotId, SLOT_COUNT};
pub use store::{
    BoxFuture, BusinessTable, EventRecord, LeaseExtension, MemberHeartbeat, OperatorAction,
    OperatorActions, OutboxStatus, OutboxStore, PurgeRequest, QuarantinedEvent, ReconcileReport,
    ReconcileRequest, RetryItem, RowDispatch, SlotLease, SlotOwnership, SlotRelease, SlotRequest,
    Watermark,
};

/// Microseconds since the Unix epoch, the unit every timestamp crosses the store API in.
pub type Micros = i64;

/// The current wall-clock time in microseconds since the Unix epoch.
pub fn now_micros() -> Micros {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}
