//! Cursor dispatch: a slot's owner reads committed intents past a durable per-slot cursor with
//! no per-row write, and advances the cursor with one fenced compare-and-set per batch.
//!
//! Invariants every backend keeps (docs/architecture.md argues each one):
//! * **No skipped commit.** Every committed row falls in exactly one read window, and a window's
//!   rows are fixed once the window exists (PostgreSQL: the rows whose transaction is visible in
//!   one stored snapshot and not in the previous one, as PgQ does; SQLite: one writer, so `seq`
//!   order is commit order and a window ends at the head `seq` the read saw; MariaDB: a window
//!   ends at the horizon the commit-gate ticker published, below which every `seq` is
//!   committed or rolled back).
//! * **Nothing uncommitted.** Reads are plain snapshot reads: only committed rows are visible.
//! * **Fenced advance.** [`CursorStore::advance`] changes a slot's cursor only while `owner` holds
//!   the slot's lease with the expected `epoch` and cursor `version`; otherwise nothing of the
//!   advance (no cursor, no exception row) is written.
//! * **Exceptions in the same transaction.** Items that were not acked get per-row state in
//!   `ferry_outbox_exception` in the advance's own transaction, and every later event of their
//!   aggregate is held behind them ([`ExceptionKind::Held`]) until they are SENT or skipped.
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::claim::{CasReport, ClaimRequest, ClaimToken, ClaimedEvent, RetryItem};
use crate::error::StoreError;
use crate::future::BoxFuture;
use crate::shard::SlotId;

/// How a relay moves intents from the outbox to the sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DispatchMode {
    /// Per-row claims: `PENDING → CLAIMED → SENT`, three row writes per event (the classic
    /// outbox claim protocol: `ferry lab`, claim-contention benchmarks, and MariaDB without the
    /// `PROCESS` privilege where producers keep transactions open for seconds, which would hold
    /// back its cursor horizon in every slot).
    Row,
    /// A durable cursor per slot: one write per event (the INSERT), one cursor CAS per batch.
    Cursor,
}

impl DispatchMode {
    /// `row` or `cursor`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Row => "row",
            Self::Cursor => "cursor",
        }
    }
}

impl fmt::Display for DispatchMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DispatchMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "row" => Ok(Self::Row),
            "cursor" => Ok(Self::Cursor),
            other => Err(format!(
                "unknown dispatch mode {other:?}; use \"cursor\" or \"row\""
            )),
        }
    }
}

/// A position in a slot's dispatch order, ordered by `(tick, xid, seq)`; every store writes
/// `xid = 0`, so the order is `(tick, seq)`.
///
/// * PostgreSQL (snapshot windows, as PgQ): `tick` names a stored snapshot (`ferry_tick`);
///   window `t` holds the rows whose inserting transaction is visible in snapshot `t` but not in
///   snapshot `t - 1`, read in `seq` order. Position `(t, 0, s)` means: every row visible in
///   snapshot `t - 1` is dispatched, and of window `t` every row up to seq `s`. (Not xid order:
///   a transaction takes its xid at its first write and may insert an aggregate's next version
///   after a transaction with a higher xid committed the previous one.)
/// * SQLite and MariaDB: `tick` is always 0; `seq` alone is the order (SQLite: one writer, so
///   `AUTOINCREMENT` order is commit order; MariaDB: reads stop at the commit-gate horizon).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize)]
pub struct CursorPos {
    /// Snapshot window (0 where the backend has none).
    pub tick: i64,
    /// Always 0: no store orders by the inserting transaction id (see above); the stored
    /// `cursor_xid` column keeps it.
    pub xid: i64,
    /// Insertion sequence.
    pub seq: i64,
}

impl CursorPos {
    /// A position in window 0 (backends without snapshot windows).
    pub fn new(xid: i64, seq: i64) -> Self {
        Self { tick: 0, xid, seq }
    }
    /// A position in window `tick`.
    pub fn at(tick: i64, xid: i64, seq: i64) -> Self {
        Self { tick, xid, seq }
    }
}

/// A slot's durable cursor as its owner holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SlotCursor {
    /// The slot.
    pub slot: SlotId,
    /// Ownership term of the slot lease this cursor was loaded under.
    pub epoch: i64,
    /// Cursor version: incremented by every advance (the batch-level claim version).
    pub version: i64,
    /// Every intent of the slot at or below this position is dispatched.
    pub pos: CursorPos,
}

/// A read past in-memory positions (no write).
#[derive(Debug, Clone)]
pub struct CursorRead {
    /// Per slot, the position to read past (the durable cursor or further, when earlier batches
    /// are still in flight).
    pub from: Vec<(SlotId, CursorPos)>,
    /// Maximum rows.
    pub limit: usize,
}

/// One intent a read returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorEvent {
    /// Its position.
    pub pos: CursorPos,
    /// Its aggregate has an open exception (retrying, claimed or quarantined): it must not be
    /// sent now; the advance records it as [`ExceptionKind::Held`].
    pub held: bool,
    /// The intent (its token carries `seq` and `event_id`; `claim_id`/`claim_version` are the
    /// batch's).
    pub event: ClaimedEvent,
}

/// What a read returned.
#[derive(Debug, Clone, Default)]
pub struct CursorBatch {
    /// Rows in dispatch order (ascending position).
    pub events: Vec<CursorEvent>,
    /// Every requested slot whose position is below it has been read up to here: the last
    /// row's position when the read returned `limit` rows, else the end of the window (no
    /// intent at or below it can still commit).
    pub upto: CursorPos,
    /// The read stopped at its limit: more committed rows may follow `upto` right now.
    pub more: bool,
    /// Requested slots read up to a position of their own instead of `upto` (a read that took
    /// slots lagging far behind the others in a statement of their own), with the same meaning
    /// as `upto` for each. Empty when every requested slot was read up to `upto`.
    pub slot_upto: Vec<(SlotId, CursorPos)>,
}

impl CursorBatch {
    /// How far `slot` was read: its entry in [`slot_upto`](Self::slot_upto), else `upto`.
    pub fn upto_of(&self, slot: SlotId) -> CursorPos {
        self.slot_upto
            .iter()
            .find(|(s, _)| *s == slot)
            .map_or(self.upto, |(_, p)| *p)
    }
}

/// Why an item gets per-row state at the advance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExceptionKind {
    /// Sent and not acked with a transient error: due again after `delay`.
    Retry {
        /// Backoff.
        delay: Duration,
        /// The error.
        error: String,
    },
    /// A permanent error: quarantined until an operator requeues or skips it.
    Quarantine(String),
    /// No answer from the sink: due again now, same event id and payload.
    Unknown(String),
    /// Not sent (or its ack is not trusted) because an earlier version of its aggregate is an
    /// exception: due now, sent after its predecessors.
    Held,
}

/// One exception row to write at the advance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewException {
    /// Outbox `seq`.
    pub seq: i64,
    /// Slot.
    pub slot: SlotId,
    /// Aggregate.
    pub aggregate_id: String,
    /// Version.
    pub aggregate_version: i64,
    /// Failed attempts so far including this one.
    pub attempts: i32,
    /// Why.
    pub kind: ExceptionKind,
}

/// One slot's part of an advance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotAdvance {
    /// The slot.
    pub slot: SlotId,
    /// Expected ownership term.
    pub epoch: i64,
    /// Expected cursor version (the advance sets `version + 1`).
    pub version: i64,
    /// New position.
    pub to: CursorPos,
}

/// A batch's cursor advance: one transaction, all or nothing.
#[derive(Debug, Clone)]
pub struct CursorAdvance {
    /// The slot owner.
    pub owner: String,
    /// Unique id of this advance, generated before it (lost-commit recovery).
    pub claim_id: String,
    /// The slots and their new positions.
    pub slots: Vec<SlotAdvance>,
    /// Exception rows written in the same transaction.
    pub exceptions: Vec<NewException>,
}

/// The result of an advance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdvanceResult {
    /// Every slot matched its token: cursors moved, exceptions written.
    Applied,
    /// At least one slot's lease, epoch or version no longer matched: nothing was written.
    Fenced,
}

/// The oldest open write transaction (PostgreSQL, MariaDB). PostgreSQL: it delays only its own
/// intents, but every read re-walks the intents committed since it began (the window's lower
/// snapshot keeps it). MariaDB: the intents committed after it began wait for it, in every slot
/// for the first moments, then only in the slots it wrote once it is idle (the commit gate).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct HorizonInfo {
    /// Age of the oldest transaction with an xid (µs), if any is open.
    pub oldest_xact_age_us: Option<i64>,
    /// Its backend pid (PostgreSQL; 0 for a prepared transaction) or connection id (MariaDB).
    pub oldest_xact_pid: Option<i64>,
    /// MariaDB, while reads go past transactions that hold a gate row for long: how many slots
    /// wait for them (the slots they wrote). `None`: not known, or no such reading (PostgreSQL,
    /// where an open transaction delays only its own intents; MariaDB while the ticker waits
    /// for it: every slot).
    pub held_slots: Option<u32>,
}

/// Outcomes of a batch of exception rows (the per-row protocol on `ferry_outbox_exception`).
#[derive(Debug, Clone, Default)]
pub struct ExceptionOutcomes {
    /// `CLAIMED → SENT`.
    pub acked: Vec<ClaimToken>,
    /// `CLAIMED → PENDING` later, attempts + 1.
    pub retry: Vec<RetryItem>,
    /// `CLAIMED → QUARANTINED`.
    pub quarantine: Vec<(ClaimToken, String)>,
    /// `CLAIMED → PENDING` now.
    pub release: Vec<ClaimToken>,
}

/// The cursor-dispatch capability of a store.
pub trait CursorStore: Send + Sync {
    /// The stored dispatch mode of this outbox.
    fn dispatch_mode(&self) -> BoxFuture<'_, Result<DispatchMode, StoreError>>;

    /// Switches the outbox to `mode` if it is not there yet, converting delivery state (see
    /// docs/architecture.md). Refuses while relays of another mode are alive. Returns whether
    /// it converted. A store whose cursors can outlive their meaning re-bases them here when
    /// asked for the mode it is already in (PostgreSQL after a restore on a server with lower
    /// transaction ids: docs/architecture.md, "After a restore on another server"), refusing
    /// while another relay is alive, and returns `true` then too.
    fn set_dispatch_mode<'a>(
        &'a self,
        mode: DispatchMode,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// The durable cursors of `slots` whose lease `owner` holds now (other slots are omitted).
    fn load_cursors<'a>(
        &'a self,
        owner: &'a str,
        slots: &'a [SlotId],
    ) -> BoxFuture<'a, Result<Vec<SlotCursor>, StoreError>>;

    /// Reads committed intents past the given positions, in dispatch order (no write).
    fn read_batch<'a>(
        &'a self,
        req: &'a CursorRead,
    ) -> BoxFuture<'a, Result<CursorBatch, StoreError>>;

    /// Advances cursors and writes exceptions in one transaction, fenced per slot.
    fn advance<'a>(
        &'a self,
        req: &'a CursorAdvance,
    ) -> BoxFuture<'a, Result<AdvanceResult, StoreError>>;

    /// After an advance whose commit response was lost: did the advance `claim_id` commit?
    fn lookup_advance<'a>(&'a self, claim_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Claims due exception rows of the requested slots (fenced by slot ownership like a row
    /// claim), respecting the predecessor rule among exceptions.
    fn claim_exceptions<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>>;

    /// Applies exception outcomes with the per-row compare-and-set, in one transaction
    /// (MariaDB: one per category, in the order below). The report lists acked, retry,
    /// quarantine, release items in that order.
    fn settle_exceptions<'a>(
        &'a self,
        out: &'a ExceptionOutcomes,
    ) -> BoxFuture<'a, Result<CasReport, StoreError>>;

    /// What holds the horizon back (PostgreSQL, MariaDB); default: nothing to report.
    fn horizon(&self) -> BoxFuture<'_, Result<HorizonInfo, StoreError>> {
        Box::pin(async { Ok(HorizonInfo::default()) })
    }
}
