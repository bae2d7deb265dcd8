//! The storage contract every backend implements.
use std::time::Duration;

use crate::claim::{CasReport, ClaimRequest, ClaimToken, ClaimedEvent};
use crate::cursor::CursorStore;
use crate::error::{EnqueueError, StoreError, StoreErrorKind};
use crate::event::{EventState, NewEvent};
use crate::shard::SlotId;
use crate::time::Micros;

pub use crate::claim::RetryItem;
pub use crate::future::BoxFuture;

/// Aggregate counts for `ferry status` and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct OutboxStatus {
    /// Rows in `PENDING`.
    pub pending: i64,
    /// Rows in `CLAIMED`: the unknown exposure (sent or not, we do not know yet).
    pub claimed: i64,
    /// Rows in `QUARANTINED`.
    pub quarantined: i64,
    /// Age of the oldest unfinished (pending/claimed/quarantined) intent, µs.
    pub oldest_unfinished_age_us: Option<i64>,
    /// Aggregates with at least one QUARANTINED event (its successors wait behind it).
    pub blocked_aggregates: i64,
}

/// A server setting that puts committed intents, their order or the outbox's upkeep at risk,
/// as [`OutboxStore::server_warnings`] finds it (`ferry status` prints each as a WARNING).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SettingWarning {
    /// The setting as the server names it (`fsync`), or the object it is set on
    /// (`ferry_outbox.autovacuum_enabled`).
    pub setting: String,
    /// Its value as the server reports it.
    pub value: String,
    /// One sentence: the setting and its value, why it hurts, and how to fix it.
    pub message: String,
}

/// The outbox's size on disk as its server accounts for it ([`OutboxStore::outbox_size`];
/// `ferry status` prints it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OutboxSize {
    /// The table: its rows (PostgreSQL: with TOAST and the free-space and visibility maps;
    /// MariaDB: InnoDB's clustered index).
    pub table_bytes: i64,
    /// Its indexes.
    pub index_bytes: i64,
    /// Where the figures come from, and whether they are exact.
    pub source: &'static str,
}

/// A quarantined event as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct QuarantinedEvent {
    /// Event id.
    pub event_id: String,
    /// Aggregate.
    pub aggregate_id: String,
    /// Version.
    pub aggregate_version: i64,
    /// Why it was quarantined.
    pub last_error: Option<String>,
    /// Attempts so far.
    pub attempts: i32,
    /// Unfinished successors it blocks.
    pub blocked_successors: i64,
}

/// A row's delivery state (tests, lab, operators).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    /// Event id.
    pub event_id: String,
    /// State.
    pub state: EventState,
    /// Current claim term: incremented by every claim of the row (0: never claimed).
    pub claim_version: i64,
    /// Claim id of the latest claim.
    pub claim_id: Option<String>,
    /// Failed attempts.
    pub attempts: i32,
    /// Last error.
    pub last_error: Option<String>,
    /// Who resolved a quarantine (requeue/skip), if anyone.
    pub resolved_by: Option<String>,
    /// Payload (text or bytes).
    pub payload: crate::payload::Payload,
}

/// Lease of one shard slot by a relay process.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SlotLease {
    /// The slot.
    pub slot: SlotId,
    /// Owner id of the relay process.
    pub owner: String,
    /// Ownership term: incremented every time the slot changes hands.
    pub epoch: i64,
    /// Lease end, µs since the epoch (database clock).
    pub lease_until: Micros,
}

/// Where a reconciliation stops: every intent at or below it is classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Watermark {
    /// Insertion sequence (`seq <= n`): stable, the recommended form.
    Seq(i64),
    /// Creation time in µs since the epoch (`created_at <= t`).
    Time(Micros),
}

/// A business table to check for orders without an intent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BusinessTable {
    /// Table name (validated identifier).
    pub table: String,
    /// Id column (validated identifier).
    pub id_column: String,
    /// `aggregate_id = prefix || id` (e.g. `order-`).
    pub aggregate_prefix: String,
    /// Only business rows with `id <= max_id` (the business watermark).
    pub max_id: Option<i64>,
}

/// What to reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileRequest {
    /// The fixed watermark: every intent at or below it is classified, none above.
    pub watermark: Watermark,
    /// Consumer name whose Inbox (`ferry_inbox`, same database) proves consumption.
    pub consumer: Option<String>,
    /// Business table to check for orders with no intent.
    pub business: Option<BusinessTable>,
    /// Max ids listed per class that must be listed (unknown, quarantined, anomalies).
    pub list_limit: usize,
}

/// Mutually exclusive classes of every intent under a watermark (priority in this order:
/// consumed, quarantined, skipped, published, unknown, pending). They sum to `total`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReconcileReport {
    /// Intents under the watermark.
    pub total: i64,
    /// Recorded in the consumer's Inbox (only with a consumer).
    pub consumed: i64,
    /// Known failures awaiting an operator.
    pub quarantined: i64,
    /// Skipped by an operator (never delivered).
    pub skipped: i64,
    /// SENT (broker acked), not (yet) recorded as consumed.
    pub published_awaiting_consumption: i64,
    /// CLAIMED: the outcome is unknown; listed in `unknown_ids`, never counted as success.
    pub outcome_unknown: i64,
    /// PENDING: not yet published.
    pub not_yet_published: i64,
    /// Age of the oldest not-yet-published intent, µs.
    pub oldest_not_published_age_us: Option<i64>,
    /// Ids of intents whose outcome is unknown (up to `list_limit`).
    pub unknown_ids: Vec<String>,
    /// Ids of quarantined intents (up to `list_limit`).
    pub quarantined_ids: Vec<String>,
    /// Business rows checked (with a business table).
    pub business_rows: Option<i64>,
    /// Business rows with no intent at all: anomalies.
    pub business_without_intent: Option<i64>,
    /// Their ids (up to `list_limit`).
    pub business_without_intent_ids: Vec<i64>,
}

impl ReconcileReport {
    /// True when the classes cover every intent exactly once.
    pub fn classes_sum_to_total(&self) -> bool {
        self.consumed
            + self.quarantined
            + self.skipped
            + self.published_awaiting_consumption
            + self.outcome_unknown
            + self.not_yet_published
            == self.total
    }
}

/// [`SlotOwnership::acquire_slots`]: take or renew slot leases.
#[derive(Debug, Clone, Copy)]
pub struct SlotRequest<'a> {
    /// The relay process.
    pub owner: &'a str,
    /// The slots it wants.
    pub slots: &'a [SlotId],
    /// Lease length: a granted slot is the owner's until now + `ttl` unless renewed.
    pub ttl: Duration,
}

impl<'a> SlotRequest<'a> {
    /// A request by `owner` for `slots`, leased for `ttl`.
    pub fn new(owner: &'a str, slots: &'a [SlotId], ttl: Duration) -> Self {
        Self { owner, slots, ttl }
    }
}

/// [`SlotOwnership::release_slots`]: give slots up.
#[derive(Debug, Clone, Copy)]
pub struct SlotRelease<'a> {
    /// The relay process.
    pub owner: &'a str,
    /// The slots it gives up.
    pub slots: &'a [SlotId],
}

impl<'a> SlotRelease<'a> {
    /// `owner` gives up `slots`.
    pub fn new(owner: &'a str, slots: &'a [SlotId]) -> Self {
        Self { owner, slots }
    }
}

/// [`SlotOwnership::heartbeat_member`]: register or renew a relay process.
#[derive(Debug, Clone, Copy)]
pub struct MemberHeartbeat<'a> {
    /// The relay process's owner id.
    pub owner: &'a str,
    /// Which start of a process holds `owner` (a random id per run): the membership row is held
    /// by one instance at a time, so two processes configured with the same owner id cannot
    /// both run.
    pub instance: &'a str,
    /// Membership lease length: the member counts as live until now + `ttl` unless renewed.
    pub ttl: Duration,
    /// The process's sink has had no ack for this long while events were in flight, past its
    /// stall threshold (`None`: not stalled). Stored with the membership for `ferry status`.
    pub sink_stalled: Option<Duration>,
}

impl<'a> MemberHeartbeat<'a> {
    /// `owner` is alive for `ttl` (instance `""`: tools and tests that run one instance).
    pub fn new(owner: &'a str, ttl: Duration) -> Self {
        Self {
            owner,
            instance: "",
            ttl,
            sink_stalled: None,
        }
    }

    /// The same heartbeat from `instance`.
    pub fn instance(self, instance: &'a str) -> Self {
        Self { instance, ..self }
    }

    /// The same heartbeat, reporting a stalled sink.
    pub fn sink_stalled(self, sink_stalled: Option<Duration>) -> Self {
        Self {
            sink_stalled,
            ..self
        }
    }

    /// [`sink_stalled`](Self::sink_stalled) in µs, as stored.
    pub fn sink_stalled_us(&self) -> Option<i64> {
        self.sink_stalled
            .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
    }
}

/// A live relay process, as its last heartbeat left it ([`SlotOwnership::members`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberInfo {
    /// Its owner id.
    pub owner: String,
    /// How long its sink had gone without an ack while events were in flight, at its last
    /// heartbeat, when past its stall threshold (µs); `None`: not stalled.
    pub sink_stalled_us: Option<i64>,
}

/// [`RowDispatch::extend_lease`]: push claimed items' leases out.
#[derive(Debug, Clone, Copy)]
pub struct LeaseExtension<'a> {
    /// The claimed items.
    pub tokens: &'a [ClaimToken],
    /// New lease, from now.
    pub lease: Duration,
}

impl<'a> LeaseExtension<'a> {
    /// Extends `tokens` to now + `lease`.
    pub fn new(tokens: &'a [ClaimToken], lease: Duration) -> Self {
        Self { tokens, lease }
    }
}

/// [`OperatorActions::requeue`] and [`OperatorActions::skip`]: an operator's decision on one
/// quarantined event.
#[derive(Debug, Clone, Copy)]
pub struct OperatorAction<'a> {
    /// The quarantined event.
    pub event_id: &'a str,
    /// Who decided (recorded in `resolved_by`).
    pub operator: &'a str,
}

impl<'a> OperatorAction<'a> {
    /// `operator` acts on `event_id`.
    pub fn new(event_id: &'a str, operator: &'a str) -> Self {
        Self { event_id, operator }
    }
}

/// [`OutboxStore::purge_sent`]: retention.
#[derive(Debug, Clone, Copy)]
pub struct PurgeRequest<'a> {
    /// Only SENT rows older than this.
    pub older_than: Duration,
    /// Rows per delete transaction.
    pub batch: usize,
    /// Only rows recorded in this consumer's Inbox (`ferry_inbox`, same database).
    pub consumer: Option<&'a str>,
    /// Count what would be deleted, delete nothing.
    pub dry_run: bool,
    /// PostgreSQL: `VACUUM` the outbox and the small tables every advance rewrites (slot
    /// leases, ticks, exception rows) after the run, for a server or tables whose autovacuum is
    /// off (deleted rows and old row versions stay in the heap and every index until a vacuum,
    /// and later purges, reads and advances walk them). Ignored by the other backends:
    /// MariaDB's purge thread and SQLite's free list reuse the space on their own.
    pub vacuum: bool,
}

impl PurgeRequest<'_> {
    /// Rows per delete transaction when the caller does not choose (`ferry purge --batch`).
    pub const DEFAULT_BATCH: usize = 1000;
}

/// Row dispatch: per-row claims and their outcomes. Every method after `claim` is a
/// compare-and-set on the item's [`ClaimToken`] and reports each item as applied or fenced; a
/// fenced item is a normal outcome.
pub trait RowDispatch: Send + Sync {
    /// Claims due, predecessor-free events of the requested slots in one short transaction.
    fn claim<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>>;

    /// Recovers a claim whose commit response was lost: the items still `CLAIMED` under
    /// `claim_id`. Returns nothing for a claim that never committed or was taken over.
    fn lookup_claim<'a>(
        &'a self,
        claim_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>>;

    /// `CLAIMED → SENT` (+ `sent_at`).
    fn ack<'a>(&'a self, tokens: &'a [ClaimToken]) -> BoxFuture<'a, Result<CasReport, StoreError>>;

    /// `CLAIMED → PENDING` with `available_at` pushed back, `attempts + 1`, `last_error`.
    fn retry<'a>(&'a self, items: &'a [RetryItem]) -> BoxFuture<'a, Result<CasReport, StoreError>>;

    /// `CLAIMED → QUARANTINED` with the reason.
    fn quarantine<'a>(
        &'a self,
        items: &'a [(ClaimToken, String)],
    ) -> BoxFuture<'a, Result<CasReport, StoreError>>;

    /// `CLAIMED → PENDING`, due now, attempts unchanged: an [`crate::Outcome::Unknown`] item
    /// (resent with the same id and payload) and, at graceful shutdown, every item still in
    /// flight.
    fn release<'a>(
        &'a self,
        tokens: &'a [ClaimToken],
    ) -> BoxFuture<'a, Result<CasReport, StoreError>>;

    /// Pushes `lease_until` to now + `lease` (heartbeat for slow sends).
    fn extend_lease<'a>(
        &'a self,
        req: &'a LeaseExtension<'a>,
    ) -> BoxFuture<'a, Result<CasReport, StoreError>>;

    /// Claim contention: due rows this store's claims passed over because a concurrent
    /// transaction held them locked (`SKIP LOCKED`) or took them between the claim's snapshot
    /// and its lock, summed over every claim since the store was opened. `None` where the
    /// backend cannot observe it. Counted only for claims that came back short of their limit
    /// (a full claim lost nothing to contention).
    fn rows_skipped_locked(&self) -> Option<u64> {
        None
    }
}

/// Slot ownership and relay membership (both dispatch modes).
pub trait SlotOwnership: Send + Sync {
    /// Takes or renews slot leases for `req.owner`: a slot is granted when it is free, its lease
    /// expired, or the owner already holds it. A slot changing hands gets `epoch + 1`. Returns
    /// the leases the owner holds after the call among `req.slots`.
    fn acquire_slots<'a>(
        &'a self,
        req: &'a SlotRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<SlotLease>, StoreError>>;

    /// Gives up slots held by `req.owner` (rebalance, shutdown).
    fn release_slots<'a>(
        &'a self,
        req: &'a SlotRelease<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Registers/renews a relay process in the membership table; returns the live members
    /// (including the caller), sorted. The row of `req.owner` is taken only when it is absent,
    /// held by `req.instance` or expired; while another instance holds it live, the call
    /// changes nothing and fails with [`StoreErrorKind::OwnerInUse`](crate::StoreErrorKind).
    fn heartbeat_member<'a>(
        &'a self,
        req: &'a MemberHeartbeat<'a>,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>>;

    /// Removes a relay process from the membership table (clean shutdown).
    fn leave_member<'a>(&'a self, owner: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Current slot leases (status).
    fn slot_leases(&self) -> BoxFuture<'_, Result<Vec<SlotLease>, StoreError>>;

    /// The live relay processes (membership not expired), sorted by owner id (status). The
    /// in-memory store keeps no membership details: it returns none.
    fn members(&self) -> BoxFuture<'_, Result<Vec<MemberInfo>, StoreError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// What tools and operators do: enqueue outside an application transaction, resolve
/// quarantined events, read status and single rows. Behaves the same in both dispatch modes
/// (in cursor dispatch, states are derived where no row says them).
pub trait OperatorActions: Send + Sync {
    /// Enqueues events in a transaction of the store's own (tools, demos). Applications enqueue
    /// inside their own transaction with the backend's `enqueue` functions instead.
    fn enqueue<'a>(
        &'a self,
        events: &'a [NewEvent],
    ) -> BoxFuture<'a, Result<Vec<String>, EnqueueError>>;

    /// `QUARANTINED → PENDING` keeping event id and payload; records the operator.
    fn requeue<'a>(&'a self, req: &'a OperatorAction<'a>) -> BoxFuture<'a, Result<(), StoreError>>;

    /// `QUARANTINED → SKIPPED` (never delivered), releasing the aggregate's successors; records
    /// the operator.
    fn skip<'a>(&'a self, req: &'a OperatorAction<'a>) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Quarantined events, oldest first.
    fn list_quarantined(
        &self,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<QuarantinedEvent>, StoreError>>;

    /// Counts for status and metrics.
    fn status(&self) -> BoxFuture<'_, Result<OutboxStatus, StoreError>>;

    /// One row's delivery state.
    fn record<'a>(
        &'a self,
        event_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<EventRecord>, StoreError>>;
}

/// The outbox store: the focused traits above plus the optional capabilities below.
/// Implemented by the PostgreSQL, MySQL/MariaDB, SQLite and in-memory backends; all pass one
/// conformance suite. Callers holding a `dyn OutboxStore` bring the traits into scope with
/// `use ferry_core::store::prelude::*`.
pub trait OutboxStore: RowDispatch + SlotOwnership + OperatorActions + Send + Sync {
    /// Short backend name (`postgres`, `mysql`, `sqlite`, `memory`).
    fn backend(&self) -> &'static str;

    /// Capability: retention. Deletes SENT rows older than `req.older_than`, in batches of at
    /// most `req.batch` rows (each its own short transaction), never touching PENDING, CLAIMED,
    /// QUARANTINED or SKIPPED rows. With a consumer, only rows recorded in that consumer's Inbox
    /// (`ferry_inbox`, same database). `dry_run` only counts. Returns the rows deleted (or that
    /// would be).
    fn purge_sent<'a>(
        &'a self,
        req: &'a PurgeRequest<'a>,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        let _ = req;
        unsupported("purge")
    }

    /// Capability: reconciliation at a fixed watermark.
    fn reconcile<'a>(
        &'a self,
        req: &'a ReconcileRequest,
    ) -> BoxFuture<'a, Result<ReconcileReport, StoreError>> {
        let _ = req;
        unsupported("reconcile")
    }

    /// Capability: replay ([`crate::replay`]). For each topic of `filter`, whether it ever had
    /// a row, how many retained SENT events (cursor dispatch: derived SENT) match and how many
    /// matching ones are not SENT, and its retention watermark.
    fn replay_scan<'a>(
        &'a self,
        filter: &'a crate::replay::ReplayFilter,
    ) -> BoxFuture<'a, Result<Vec<crate::replay::TopicScan>, StoreError>> {
        let _ = filter;
        unsupported("replay")
    }

    /// Capability: replay. The next `req.limit` matching SENT events after `req.after`, in
    /// `(aggregate_id, aggregate_version)` order (each aggregate in version order).
    fn replay_page<'a>(
        &'a self,
        req: &'a crate::replay::ReplayPageRequest<'a>,
    ) -> BoxFuture<'a, Result<crate::replay::ReplayPage, StoreError>> {
        let _ = req;
        unsupported("replay")
    }

    /// Capability: a status shared between the relays of one database. Returns counts some
    /// relay computed at most `max_age` ago (the oldest age moved on by the time since), or
    /// computes and stores them when there are none that fresh and no other relay is computing
    /// them; while another relay computes them, older stored counts, or a `Conflict` error when
    /// none is stored yet (ask again later). The default computes them on every call
    /// ([`OperatorActions::status`]).
    fn shared_status(
        &self,
        max_age: std::time::Duration,
    ) -> BoxFuture<'_, Result<OutboxStatus, StoreError>> {
        let _ = max_age;
        self.status()
    }

    /// Capability: server settings that are harmful to ferry and visible from its own session
    /// (docs/operations.md, "Server settings"): a durability setting that can lose committed
    /// intents in a crash, autovacuum off for the outbox, an outbox sequence that hands out
    /// values out of time order in cursor dispatch. Merely suboptimal values (memory) are not
    /// reported. The default reports nothing (a backend without such settings, or one that
    /// cannot see them).
    fn server_warnings(&self) -> BoxFuture<'_, Result<Vec<SettingWarning>, StoreError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Capability: the outbox's size on disk, for an operator (`ferry status`), not for a hot
    /// path: a backend may read the whole table to count it (SQLite's `dbstat`). The default
    /// tells nothing (`None`: the in-memory store has no size on disk).
    fn outbox_size(&self) -> BoxFuture<'_, Result<Option<OutboxSize>, StoreError>> {
        Box::pin(async { Ok(None) })
    }

    /// Capability: requeue or skip every quarantined event `req.filter` selects, in one
    /// transaction that also writes the action's [`OperatorRecord`](crate::OperatorRecord)
    /// (who, when, why, how many, the filter); a dry run only counts and samples. Refuses an
    /// invalid request ([`BulkRequest::validate`](crate::BulkRequest::validate)) with
    /// `InvalidInput`, before touching the database.
    fn bulk_quarantine<'a>(
        &'a self,
        req: &'a crate::bulk::BulkRequest<'a>,
    ) -> BoxFuture<'a, Result<crate::bulk::BulkOutcome, StoreError>> {
        let _ = req;
        unsupported("bulk quarantine actions")
    }

    /// Capability: the last `limit` recorded operator actions, newest first. The default
    /// records none.
    fn operator_actions(
        &self,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<crate::bulk::OperatorRecord>, StoreError>> {
        let _ = limit;
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Capability: cursor dispatch ([`CursorStore`]); `None` where the backend offers
    /// only per-row claims.
    fn cursor(&self) -> Option<&dyn CursorStore> {
        None
    }

    /// Capability: pausing topics ([`PauseControl`](crate::pause::PauseControl)); `None`
    /// where the store keeps no pauses (nothing is ever paused there).
    fn pause_control(&self) -> Option<&dyn crate::pause::PauseControl> {
        None
    }

    /// Capability: commit wake-ups. Arranges for `wake` to be called after enqueues commit
    /// (possibly coalesced) and returns `true`, or returns `false` when the backend has no such
    /// mechanism and relays must poll.
    fn listen_commits(
        &self,
        wake: std::sync::Arc<dyn Fn() + Send + Sync>,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let _ = wake;
        Box::pin(async { Ok(false) })
    }
}

/// What an optional capability a store does not offer returns: `InvalidInput`, naming it.
fn unsupported<'a, T: Send + 'a>(capability: &'static str) -> BoxFuture<'a, Result<T, StoreError>> {
    Box::pin(async move {
        Err(StoreError::new(
            StoreErrorKind::InvalidInput,
            format!("this store does not support {capability}"),
        ))
    })
}

/// The store traits, for `use ferry_core::store::prelude::*` where a `dyn OutboxStore` is used.
pub mod prelude {
    pub use crate::store::{OperatorActions, OutboxStore, RowDispatch, SlotOwnership};
}
