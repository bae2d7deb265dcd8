//! The store protocol, written once for the three SQL backends.
//!
//! Each backend implements [`Ops`], [`Switch`] and [`Cursor`]: about one method (or associated
//! constant) per statement, run on its pool or on the caller's transaction; its handles
//! ([`Handles`]) are declared by [`impls::handles!`] in the backend. Statements that differ between backends only in
//! their dialect (placeholders, the clock) are written once here. The
//! steps of [`ferry_core`]'s store traits — transactions, loops, fences, error contexts, row
//! decoding shared by all — are the generic functions here, and [`store_traits!`] gives each
//! backend's store type its `impl`s of those traits, every method handing over to its step.
//! Where a backend really differs, the difference is a named step of [`Ops`] with a default
//! that does nothing: PostgreSQL's windows check ([`Ops::check_windows`]) and its mode-switch
//! checks ([`Switch`]), MariaDB's row-dispatch indexes ([`Switch::after_switch`]), SQLite's
//! write gate ([`Ops::write_gate`]).
//!
//! Files: the traits [`Handles`], [`Statements`] and [`Ops`] and the steps over them here; the
//! dispatch-mode switch in [`switch`]; cursor dispatch in [`cursor`]; the macros that give a
//! backend its trait `impl`s in [`impls`] (a backend names them by path, so that no two of
//! these files import each other).
use std::future::Future;
use std::ops::DerefMut;

use ferry_core::{
    ClaimRequest, ClaimedEvent, DispatchMode, Limits, MemberHeartbeat, OutboxStatus,
    QuarantinedEvent, SlotId, SlotLease, SlotRelease, SlotRequest, StoreError,
};

use crate::enqueue::InsertIntents;
use crate::error::Ctx;
use crate::operator::bulk::Conn;
use crate::operator::{operator_outcome, Bind, Pools};
use crate::request::claiming;

pub(crate) mod cursor;
pub(crate) mod impls;
pub(crate) mod switch;

/// A store's handles: its pool, its limits, and its own write transactions.
pub(crate) trait Handles: Send + Sync + Sized {
    /// The connection a transaction's statements run on.
    type Conn: InsertIntents + Send;
    /// A write transaction of the store's own, dereferencing to its connection.
    type Tx: DerefMut<Target = Self::Conn> + Send;

    /// The pool, for the statements written once in the operator module.
    fn pools(&self) -> Pools<'_>;
    /// The limits enqueues are validated against.
    fn limits(&self) -> &Limits;
    /// Begins a write transaction of the store's own.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, sqlx::Error>> + Send;
    /// Commits it.
    fn commit(tx: Self::Tx) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// The connection as the bulk operator actions take it.
    fn bulk_conn(c: &mut Self::Conn) -> Conn<'_>;
}

/// The statements of a backend's `sql.rs` that the steps here run as they are, with the same
/// name in every backend ([`store_traits!`] implements this trait from them).
pub(crate) trait Statements {
    /// Joins or renews owner `?`'s membership (binds: owner, instance, lease in µs, sink stall in
    /// µs or NULL, and now where the backend binds the clock).
    const MEMBER_HEARTBEAT: &'static str;
    /// Every owned slot lease (`slot, owner, epoch, lease_until` in µs), in slot order.
    const SLOT_LEASES: &'static str;
    /// `list_quarantined`'s statement in row dispatch (`?`: the limit).
    const QUARANTINED_ROWS: &'static str;
    /// `list_quarantined`'s statement in cursor dispatch (`?`: the limit).
    const QUARANTINED_CURSOR: &'static str;
    /// The outbox's size: one row of `table bytes, index bytes`.
    const OUTBOX_SIZE: &'static str;
    /// Where [`Self::OUTBOX_SIZE`]'s figures come from ([`ferry_core::OutboxSize::source`]).
    const OUTBOX_SIZE_SOURCE: &'static str;
}

/// What a backend provides: its handles and its statements. Statement methods that take a
/// connection run on the caller's transaction; the others on the store's pool.
pub(crate) trait Ops: Handles + Statements {
    /// SQLite's in-process write gate, held around writes on the pool; `None` elsewhere.
    fn write_gate(&self) -> Option<&tokio::sync::Mutex<()>> {
        None
    }

    /// PostgreSQL's windows: before a read of derived states, refuses a server whose
    /// transaction ids went back behind the stored ticks. Nothing to check elsewhere.
    fn check_windows(
        &self,
        mode: DispatchMode,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = mode;
        async { Ok(()) }
    }

    // ---- row dispatch
    /// A claim of rows that names slots and rows.
    fn claim_rows(
        &self,
        req: &ClaimRequest,
    ) -> impl Future<Output = Result<Vec<ClaimedEvent>, StoreError>> + Send;
    /// [`ferry_core::RowDispatch::rows_skipped_locked`].
    fn rows_skipped_locked(&self) -> Option<u64>;
    /// The rows of a claim, by claim id.
    fn lookup_claim(
        &self,
        claim_id: &str,
    ) -> impl Future<Output = Result<Vec<ClaimedEvent>, StoreError>> + Send;

    // ---- slot ownership
    /// Takes or renews the leases of `req`'s slots (not empty), in any order.
    fn acquire_slots(
        &self,
        req: &SlotRequest<'_>,
    ) -> impl Future<Output = Result<Vec<SlotLease>, StoreError>> + Send;
    /// Gives back the leases of `req`'s slots (not empty).
    fn release_slots(
        &self,
        req: &SlotRelease<'_>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Whether the membership `req`'s heartbeat upsert (changing `affected` rows) holds is
    /// `req`'s: by default when it changed a row (a live row of another instance is left alone).
    fn member_held(
        &self,
        req: &MemberHeartbeat<'_>,
        affected: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = req;
        std::future::ready(Ok(affected > 0))
    }

    // ---- operator reads
    /// Status in row dispatch.
    fn status_rows(&self) -> impl Future<Output = Result<OutboxStatus, StoreError>> + Send;
    /// Status in cursor dispatch.
    fn status_cursor(&self) -> impl Future<Output = Result<OutboxStatus, StoreError>> + Send;
    /// An event's record in `mode`.
    fn record(
        &self,
        mode: DispatchMode,
        event_id: &str,
    ) -> impl Future<Output = Result<Option<ferry_core::EventRecord>, StoreError>> + Send;

    // ---- capabilities only some backends have
    /// [`ferry_core::OutboxStore::shared_status`]; by default a count of its own.
    fn shared_status(
        &self,
        max_age: std::time::Duration,
    ) -> impl Future<Output = Result<OutboxStatus, StoreError>> + Send {
        let _ = max_age;
        status(self)
    }
    /// [`ferry_core::OutboxStore::listen_commits`]; by default none (relays poll).
    fn listen_commits(
        &self,
        wake: std::sync::Arc<dyn Fn() + Send + Sync>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = wake;
        async { Ok(false) }
    }
    /// [`ferry_core::OutboxStore::server_warnings`]; by default none.
    fn server_warnings(
        &self,
    ) -> impl Future<Output = Result<Vec<ferry_core::SettingWarning>, StoreError>> + Send {
        async { Ok(Vec::new()) }
    }
}

/// The stored dispatch mode (`ferry_dispatch`).
pub(crate) async fn stored_mode<S: Ops>(s: &S) -> Result<DispatchMode, StoreError> {
    let rows = s
        .pools()
        .rows_as(
            "SELECT mode FROM ferry_dispatch WHERE id = 1",
            &[],
            "dispatch mode",
        )
        .await?;
    let mode = rows
        .into_iter()
        .next()
        .and_then(|r| r.into_iter().next().flatten());
    mode.unwrap_or_default()
        .parse()
        .map_err(|e: String| StoreError::new(ferry_core::StoreErrorKind::Other, e))
}

/// Holds SQLite's write gate (if the backend has one) until dropped.
async fn gate<S: Ops>(s: &S) -> Option<tokio::sync::MutexGuard<'_, ()>> {
    match s.write_gate() {
        Some(g) => Some(g.lock().await),
        None => None,
    }
}

/// The stored mode, after the backend's windows check.
async fn checked_mode<S: Ops>(s: &S) -> Result<DispatchMode, StoreError> {
    let mode = stored_mode(s).await?;
    s.check_windows(mode).await?;
    Ok(mode)
}

/// [`ferry_core::RowDispatch::claim`].
pub(crate) async fn claim<S: Ops>(
    s: &S,
    req: &ClaimRequest,
) -> Result<Vec<ClaimedEvent>, StoreError> {
    claiming(req, s.claim_rows(req)).await
}

/// [`ferry_core::SlotOwnership::acquire_slots`]: the leases held afterwards, in slot order.
pub(crate) async fn acquire_slots<S: Ops>(
    s: &S,
    req: &SlotRequest<'_>,
) -> Result<Vec<SlotLease>, StoreError> {
    if req.slots.is_empty() {
        return Ok(Vec::new());
    }
    let mut leases = s.acquire_slots(req).await?;
    leases.sort_by_key(|l| l.slot);
    Ok(leases)
}

/// [`ferry_core::SlotOwnership::release_slots`].
pub(crate) async fn release_slots<S: Ops>(s: &S, req: &SlotRelease<'_>) -> Result<(), StoreError> {
    if req.slots.is_empty() {
        return Ok(());
    }
    let _gate = gate(s).await;
    s.release_slots(req).await.ctx("release slots")
}

/// [`ferry_core::SlotOwnership::heartbeat_member`]: the live members' owners, or `OwnerInUse`.
pub(crate) async fn heartbeat_member<S: Ops>(
    s: &S,
    req: &MemberHeartbeat<'_>,
) -> Result<Vec<String>, StoreError> {
    let (_, clock) = s.pools().dialect().now_at();
    let mut binds = vec![
        Bind::Str(req.owner.to_string()),
        Bind::Str(req.instance.to_string()),
        Bind::I64(crate::time::micros(req.ttl)),
        Bind::Nullable(req.sink_stalled_us()),
    ];
    binds.extend(clock.map(Bind::I64));
    let gate = gate(s).await;
    let affected = s
        .pools()
        .exec_as(S::MEMBER_HEARTBEAT, &binds, "member heartbeat")
        .await?;
    drop(gate);
    if !s.member_held(req, affected).await? {
        return Err(crate::error::owner_in_use(req.owner));
    }
    Ok(live_members(s)
        .await?
        .into_iter()
        .map(|m| m.owner)
        .collect())
}

/// [`ferry_core::SlotOwnership::members`]: the live members with their sink stall, by owner.
pub(crate) async fn members<S: Ops>(s: &S) -> Result<Vec<ferry_core::MemberInfo>, StoreError> {
    live_members(s).await
}

async fn live_members<S: Ops>(s: &S) -> Result<Vec<ferry_core::MemberInfo>, StoreError> {
    let (now, clock) = s.pools().dialect().now_at();
    let sql = format!(
        "SELECT owner, sink_stalled_us FROM ferry_relay_member WHERE lease_until > {now} ORDER BY owner"
    );
    let binds: Vec<Bind> = clock.map(Bind::I64).into_iter().collect();
    let rows = s.pools().rows_as(&sql, &binds, "members").await?;
    Ok(crate::rows::members_from(rows.into_iter().map(|r| {
        let [owner, stalled] = columns(r);
        (
            owner.unwrap_or_default(),
            stalled.and_then(|v| v.parse().ok()),
        )
    })))
}

/// [`ferry_core::SlotOwnership::leave_member`].
pub(crate) async fn leave_member<S: Ops>(s: &S, owner: &str) -> Result<(), StoreError> {
    let _gate = gate(s).await;
    let sql = "DELETE FROM ferry_relay_member WHERE owner = ?";
    s.pools()
        .exec_as(sql, &[Bind::Str(owner.to_string())], "leave")
        .await?;
    Ok(())
}

/// [`ferry_core::OperatorActions::requeue`]: the intent is due now, its attempts reset.
pub(crate) async fn requeue<S: Ops>(
    s: &S,
    req: &ferry_core::OperatorAction<'_>,
) -> Result<(), StoreError> {
    operator_update(s, req, "PENDING").await
}

/// [`ferry_core::OperatorActions::skip`].
pub(crate) async fn skip<S: Ops>(
    s: &S,
    req: &ferry_core::OperatorAction<'_>,
) -> Result<(), StoreError> {
    operator_update(s, req, "SKIPPED").await
}

/// Requeue (`target` `PENDING`) or skip (`SKIPPED`) of a quarantined intent.
async fn operator_update<S: Ops>(
    s: &S,
    req: &ferry_core::OperatorAction<'_>,
    target: &str,
) -> Result<(), StoreError> {
    let (event_id, operator) = (req.event_id, req.operator);
    let mode = stored_mode(s).await?;
    let gate = gate(s).await;
    let n = crate::operator::operator_update(s.pools(), mode, target, event_id, operator).await?;
    drop(gate);
    operator_outcome(n, event_id, s.record(mode, event_id)).await
}

/// [`ferry_core::OperatorActions::enqueue`]: in a transaction of the store's own.
pub(crate) async fn enqueue<S: Ops>(
    s: &S,
    events: &[ferry_core::NewEvent],
) -> Result<Vec<String>, ferry_core::EnqueueError> {
    crate::enqueue::enqueue_in_own_tx(events, s.limits(), s.begin(), S::commit).await
}

/// [`ferry_core::OperatorActions::list_quarantined`].
pub(crate) async fn list_quarantined<S: Ops>(
    s: &S,
    limit: usize,
) -> Result<Vec<QuarantinedEvent>, StoreError> {
    let sql = match stored_mode(s).await? {
        DispatchMode::Row => S::QUARANTINED_ROWS,
        // successors are held exceptions, or not yet read past the cursor
        DispatchMode::Cursor => S::QUARANTINED_CURSOR,
    };
    let rows = s
        .pools()
        .rows_as(sql, &[Bind::I64(limit as i64)], "list quarantined")
        .await?;
    rows.into_iter()
        .map(|r| {
            let [event_id, aggregate_id, version, last_error, attempts, blocked] = columns(r);
            Ok(QuarantinedEvent {
                event_id: event_id.unwrap_or_default(),
                aggregate_id: aggregate_id.unwrap_or_default(),
                aggregate_version: int(version, "list quarantined")?,
                last_error,
                attempts: int(attempts, "list quarantined")? as i32,
                blocked_successors: int(blocked, "list quarantined")?,
            })
        })
        .collect()
}

/// [`ferry_core::SlotOwnership::slot_leases`].
pub(crate) async fn slot_leases<S: Ops>(s: &S) -> Result<Vec<SlotLease>, StoreError> {
    let rows = s
        .pools()
        .rows_as(S::SLOT_LEASES, &[], "slot leases")
        .await?;
    rows.into_iter()
        .map(|r| {
            let [slot, owner, epoch, lease_until] = columns(r);
            Ok(SlotLease {
                slot: int(slot, "slot leases")? as SlotId,
                owner: owner.unwrap_or_default(),
                epoch: int(epoch, "slot leases")?,
                lease_until: int(lease_until, "slot leases")?,
            })
        })
        .collect()
}

/// The first `N` columns of a row read as text.
fn columns<const N: usize>(r: Vec<Option<String>>) -> [Option<String>; N] {
    let mut c = r.into_iter();
    std::array::from_fn(|_| c.next().flatten())
}

/// A column read as text, as a number (0: NULL); anything else is an error of `what`, never a
/// silent 0.
fn int(v: Option<String>, what: &str) -> Result<i64, StoreError> {
    match v {
        None => Ok(0),
        Some(t) => t.parse().map_err(|_| {
            StoreError::new(
                ferry_core::StoreErrorKind::Other,
                format!("{what}: expected a whole number, the database returned {t:?}"),
            )
        }),
    }
}

/// [`ferry_core::OperatorActions::status`].
pub(crate) async fn status<S: Ops>(s: &S) -> Result<OutboxStatus, StoreError> {
    match stored_mode(s).await? {
        DispatchMode::Row => s.status_rows().await,
        // unfinished = not yet behind the slot's cursor, or an open exception
        DispatchMode::Cursor => {
            s.check_windows(DispatchMode::Cursor).await?;
            s.status_cursor().await
        }
    }
}

/// [`ferry_core::OperatorActions::record`].
pub(crate) async fn record<S: Ops>(
    s: &S,
    event_id: &str,
) -> Result<Option<ferry_core::EventRecord>, StoreError> {
    s.record(stored_mode(s).await?, event_id).await
}

/// [`ferry_core::OutboxStore::bulk_quarantine`]: a dry run on the pool, or the action in a
/// transaction of the store's own ([`crate::operator::bulk`]).
pub(crate) async fn bulk_quarantine<S: Ops>(
    s: &S,
    req: &ferry_core::BulkRequest<'_>,
) -> Result<ferry_core::BulkOutcome, StoreError> {
    req.validate()?;
    if req.dry_run {
        let mode = stored_mode(s).await?;
        return crate::operator::bulk::preview(s.pools(), mode, req).await;
    }
    let mut tx = s.begin().await.ctx("bulk action: begin")?;
    let count = crate::operator::bulk::act(S::bulk_conn(&mut tx), req).await?;
    S::commit(tx).await.ctx("bulk action: commit")?;
    Ok(ferry_core::BulkOutcome {
        count,
        sample: Vec::new(),
    })
}

/// [`ferry_core::OutboxStore::operator_actions`].
pub(crate) async fn operator_actions<S: Ops>(
    s: &S,
    limit: usize,
) -> Result<Vec<ferry_core::OperatorRecord>, StoreError> {
    crate::operator::bulk::recent(s.pools(), limit).await
}

/// [`ferry_core::PauseControl::pause`].
pub(crate) async fn pause<S: Ops>(
    s: &S,
    req: &ferry_core::PauseRequest<'_>,
) -> Result<Vec<String>, StoreError> {
    crate::operator::pause::pause(s.pools(), req).await
}

/// [`ferry_core::PauseControl::resume`].
pub(crate) async fn resume<S: Ops>(
    s: &S,
    topics: &[String],
) -> Result<Vec<ferry_core::PausedTopic>, StoreError> {
    crate::operator::pause::resume(s.pools(), topics).await
}

/// [`ferry_core::PauseControl::paused`].
pub(crate) async fn paused<S: Ops>(s: &S) -> Result<Vec<ferry_core::PausedTopic>, StoreError> {
    crate::operator::pause::paused(s.pools()).await
}

/// [`ferry_core::OutboxStore::purge_sent`].
pub(crate) async fn purge_sent<S: Ops>(
    s: &S,
    req: &ferry_core::PurgeRequest<'_>,
) -> Result<u64, StoreError> {
    crate::operator::purge::purge_sent(s.pools(), checked_mode(s).await?, req).await
}

/// [`ferry_core::OutboxStore::outbox_size`].
pub(crate) async fn outbox_size<S: Ops>(
    s: &S,
) -> Result<Option<ferry_core::OutboxSize>, StoreError> {
    let rows = s
        .pools()
        .rows_as(S::OUTBOX_SIZE, &[], "outbox size")
        .await?;
    let row = rows.into_iter().next().unwrap_or_default();
    let at = |i: usize| row.get(i).cloned().flatten()?.parse::<i64>().ok();
    Ok(at(0)
        .zip(at(1))
        .map(|(table_bytes, index_bytes)| ferry_core::OutboxSize {
            table_bytes,
            index_bytes,
            source: S::OUTBOX_SIZE_SOURCE,
        }))
}

/// [`ferry_core::OutboxStore::reconcile`].
pub(crate) async fn reconcile<S: Ops>(
    s: &S,
    req: &ferry_core::ReconcileRequest,
) -> Result<ferry_core::ReconcileReport, StoreError> {
    crate::operator::reconcile::reconcile(s.pools(), checked_mode(s).await?, req).await
}

/// [`ferry_core::OutboxStore::replay_scan`].
pub(crate) async fn replay_scan<S: Ops>(
    s: &S,
    filter: &ferry_core::replay::ReplayFilter,
) -> Result<Vec<ferry_core::replay::TopicScan>, StoreError> {
    crate::operator::replay::scan(s.pools(), checked_mode(s).await?, filter).await
}

/// [`ferry_core::OutboxStore::replay_page`].
pub(crate) async fn replay_page<S: Ops>(
    s: &S,
    req: &ferry_core::replay::ReplayPageRequest<'_>,
) -> Result<ferry_core::replay::ReplayPage, StoreError> {
    crate::operator::replay::page(s.pools(), checked_mode(s).await?, req).await
}
