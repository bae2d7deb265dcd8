//! Domain types and the storage contract of the ferry transactional-outbox relay.
//!
//! This crate states the contract every other crate keeps, and depends on neither sqlx nor
//! rdkafka (no I/O): storage backends implement its traits (ferry-store), the relay drives them
//! (ferry-relay). The arguments behind each rule are in `docs/architecture.md`; this page says
//! what the rules are, where they are enforced and which test holds them.
//!
//! # Main types
//!
//! * [`NewEvent`] → [`ValidatedEvent`]: a publish intent (`event_id`, aggregate identity and
//!   version, topic, key, headers, payload) and the row an enqueue writes. [`EventState`] is
//!   its recoverable delivery state (`PENDING → CLAIMED → SENT`, or `QUARANTINED` / `SKIPPED`).
//! * [`OutboxStore`] = [`RowDispatch`] (per-row claims and their compare-and-set outcomes) +
//!   [`SlotOwnership`] (slot leases, relay membership) + [`OperatorActions`] (requeue, skip,
//!   status) + optional capabilities (purge, reconcile, [`CursorStore`] for cursor dispatch,
//!   commit wake-ups, harmful server settings, [bulk quarantine actions](BulkRequest) and their
//!   [`OperatorRecord`]).
//! * [`ClaimToken`] / [`CasReport`] (row dispatch) and [`SlotCursor`] / [`CursorAdvance`] /
//!   [`AdvanceResult`] (cursor dispatch): the fencing tokens and what a fenced write reports.
//! * [`Outcome`]: what a sink reports for one item; [`Backoff`]: the retry delay;
//!   [`slot_for`]: aggregate → one of [`SLOT_COUNT`] shard slots.
//!
//! # Invariants
//!
//! 1. **One gate for intents.** Every enqueue through the Rust API, on every backend, passes
//!    [`NewEvent::validate`] / [`validate_batch`] (non-empty identifiers of at most
//!    [`MAX_IDENT_LEN`] bytes, version ≥ 1, a text payload that parses as JSON (a [`Payload::Bytes`] is never inspected)
//!    within [`Limits`], no duplicate
//!    version or id inside a batch); on error nothing is written. (A plain SQL `INSERT` from
//!    another language meets the schema's constraints instead: docs/schema.md §2.1.) Tests:
//!    `event.rs` unit tests; `bad_inputs_are_refused_and_write_nothing` in
//!    `crates/ferry-store/tests/conformance.rs`.
//! 2. **The slot of an aggregate never changes.** [`slot_for`] is FNV-1a-64 mod 256, stored in
//!    the row at enqueue; workers and processes own slots, never rows, so changing their number
//!    rewrites nothing. Test: `slot_hash_is_stable` (pinned values, shared with the SQL
//!    functions of the plain-INSERT migrations: `plain_insert_fills_what_the_rust_api_fills`).
//! 3. **Every row transition after a claim is a compare-and-set on the whole token**
//!    (`state = 'CLAIMED'`, `claim_version`, `claim_id`). A stale token updates zero rows and is
//!    reported as [`CasResult::Fenced`], a counted result, never an error or a panic;
//!    [`CasReport::from_applied`] applies an input only if its whole token matched, so a stale
//!    and a live token of one row in one batch are told apart. Tests: `stale_claim_is_fenced`,
//!    `stale_and_live_token_of_one_row_in_one_batch` (conformance).
//! 4. **A cursor advance is all or nothing, fenced per slot** by the live lease, `epoch` and
//!    cursor `version` ([`CursorStore::advance`]): a stale owner's advance writes no cursor and
//!    no exception row ([`AdvanceResult::Fenced`]). Test: `stale_owner_advance_is_fenced`
//!    (`crates/ferry-store/tests/cursor_conformance.rs`).
//! 5. **Per-aggregate order.** A row claim returns only events whose aggregate has no lower
//!    version in `PENDING`, `CLAIMED` or `QUARANTINED`; in cursor dispatch a later event of an
//!    aggregate with an open exception comes back `held`. Tests: `predecessor_blocks_successors`,
//!    `predecessor_rule_under_concurrency` (conformance), `exceptions_hold_successors_in_order`
//!    (cursor conformance).
//! 6. **Nothing uncommitted is announced, nothing committed is skipped.** Claims and cursor reads
//!    see committed rows only. Tests: `rollback_leaves_neither_order_nor_intent`,
//!    `open_transactions_delay_only_their_own_rows`, `a_reader_behind_many_ticks_misses_nothing`.
//! 7. **`SENT` means the broker acked it.** In cursor dispatch it is derived: an intent behind
//!    its slot's cursor is SENT unless an exception row gives it another state
//!    ([`OperatorActions::record`], reconcile and purge read it that way). Tests:
//!    `read_advance_derives_sent`, `reconcile_and_purge_use_derived_states` (cursor
//!    conformance).
//! 8. **A lost commit response is resolved by the pre-generated id**, never by re-reading the
//!    claim version: [`RowDispatch::lookup_claim`], [`CursorStore::lookup_advance`]. Tests:
//!    `lost_claim_commit_is_recovered_by_claim_id`, `lookup_advance_finds_a_committed_advance`.
//! 9. **Each item keeps its own [`Outcome`]**; [`OutcomeCounts`] folds them and never collapses a
//!    batch into one success. Test: `batch_with_mixed_outcomes_confirms_only_acked`.
//! 10. **Retry `n` waits a uniform time in `[c/2, c]`, `c = min(base·2ⁿ⁻¹, max)`**
//!     ([`Backoff::delay`]). Test: `grows_and_caps`.
//!
//! `conformance.rs` runs on the memory and SQLite stores and, when `FERRY_TEST_POSTGRES_URL` /
//! `FERRY_TEST_MYSQL_URL` are set, on PostgreSQL and MariaDB; `cursor_conformance.rs` on the
//! three SQL backends.
#![deny(missing_docs)]
#![warn(unreachable_pub)]

mod backoff;
mod bulk;
mod claim;
mod cursor;
mod duration;
mod error;
mod event;
pub mod failpoint;
mod future;
mod outcome;
pub mod pause;
mod payload;
pub mod replay;
mod shard;
pub mod store;
mod time;

pub use backoff::Backoff;
pub use bulk::{
    BulkOutcome, BulkRequest, BulkVerb, OperatorRecord, QuarantineFilter, MAX_REASON_LEN,
};
pub use claim::{
    CasReport, CasResult, ClaimRequest, ClaimToken, ClaimedEvent, RetryItem, SlotFence,
};
pub use cursor::{
    AdvanceResult, CursorAdvance, CursorBatch, CursorEvent, CursorPos, CursorRead, CursorStore,
    DispatchMode, ExceptionKind, ExceptionOutcomes, HorizonInfo, NewException, SlotAdvance,
    SlotCursor,
};
pub use duration::parse_duration;
pub use error::{EnqueueError, StoreError, StoreErrorKind};
pub use event::{
    is_kafka_topic, new_event_id, validate_batch, EventState, Limits, NewEvent, ValidatedEvent,
    MAX_HEADERS_BYTES, MAX_IDENT_LEN,
};
pub use future::BoxFuture;
pub use outcome::{ItemOutcome, Outcome, OutcomeCounts};
pub use pause::{is_paused, PauseControl, PauseRequest, PausedTopic, ALL_TOPICS};
pub use payload::Payload;
pub use shard::{slot_for, slots_for_worker, SlotId, SLOT_COUNT};
pub use store::{
    BusinessTable, EventRecord, LeaseExtension, MemberHeartbeat, MemberInfo, OperatorAction,
    OperatorActions, OutboxSize, OutboxStatus, OutboxStore, PurgeRequest, QuarantinedEvent,
    ReconcileReport, ReconcileRequest, RowDispatch, SettingWarning, SlotLease, SlotOwnership,
    SlotRelease, SlotRequest, Watermark,
};
pub use time::{now_micros, Micros};
