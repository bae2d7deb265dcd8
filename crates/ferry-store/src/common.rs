//! Backend-neutral helpers shared by the SQL backends (PostgreSQL, MySQL/MariaDB, SQLite) and
//! the in-memory store: the enqueue path (validate, insert on the caller's connection, the
//! operator's own transaction), sqlx error context, URL parsing, row decoding and the reads every
//! backend runs alike (claim lookup, record, dispatch mode), and the cursor-dispatch glue
//! (exception rows, slot-less advances, seq-ordered reads). Generic functions over
//! `sqlx::Database` take the statement's dialect (placeholders) as data.
use std::future::Future;
use std::ops::DerefMut;
use std::str::FromStr;
use std::time::Duration;

use ferry_core::{
    DispatchMode, EnqueueError, EventRecord, EventState, ExceptionKind, Limits, NewEvent,
    OutboxStatus, QuarantinedEvent, SlotId, SlotLease, StoreError, StoreErrorKind, ValidatedEvent,
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

/// A backend's connection, on which validated intents are inserted inside whatever transaction
/// it is in (each backend's multi-row insert).
pub(crate) trait InsertIntents {
    /// Inserts `rows`; on error nothing of this call is written once the transaction rolls back.
    fn insert_intents(
        &mut self,
        rows: &[ValidatedEvent],
    ) -> impl Future<Output = Result<(), EnqueueError>> + Send;
}

/// Pushes one intent's values to a multi-row insert, in the column order of every backend's
/// INSERT (`event_id, aggregate_id, aggregate_version, shard_slot, topic, msg_key, event_type,
/// headers, payload`); `slot` is the shard slot in the backend's column type.
pub(crate) fn push_intent<'a, DB, S>(
    b: &mut sqlx::query_builder::Separated<'_, 'a, DB, &'static str>,
    r: &'a ValidatedEvent,
    slot: S,
) where
    DB: sqlx::Database,
    &'a String: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    S: 'a + sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    b.push_bind(&r.event_id)
        .push_bind(&r.aggregate_id)
        .push_bind(r.aggregate_version)
        .push_bind(slot)
        .push_bind(&r.topic)
        .push_bind(&r.key)
        .push_bind(&r.event_type)
        .push_bind(&r.headers)
        .push_bind(&r.payload);
}

/// The body of every backend's `enqueue_many`: validates `events`, inserts them on the caller's
/// connection (never beginning or committing) and returns their event ids, in order.
pub(crate) async fn enqueue_on<C: InsertIntents>(
    conn: &mut C,
    events: &[NewEvent],
    limits: &Limits,
) -> Result<Vec<String>, EnqueueError> {
    let rows = crate::validate(events, limits)?;
    conn.insert_intents(&rows).await?;
    Ok(rows.into_iter().map(|r| r.event_id).collect())
}

/// The public `enqueue` and `enqueue_many` of a backend module, on its connection type `$conn`,
/// so that a caller passes `&mut *tx` of its own transaction. A macro rather than one generic
/// function: the public API names each backend's concrete connection type.
macro_rules! enqueue_fns {
    ($conn:ty) => {
        /// Enqueues one event inside the caller's transaction (`&mut *tx`). Returns its event id.
        pub async fn enqueue(
            conn: &mut $conn,
            event: &ferry_core::NewEvent,
            limits: &ferry_core::Limits,
        ) -> Result<String, ferry_core::EnqueueError> {
            let mut ids = enqueue_many(conn, std::slice::from_ref(event), limits).await?;
            Ok(ids.remove(0))
        }

        /// Enqueues many events with multi-row inserts inside the caller's transaction.
        /// On error roll the caller's transaction back: nothing of this call is then written.
        pub async fn enqueue_many(
            conn: &mut $conn,
            events: &[ferry_core::NewEvent],
            limits: &ferry_core::Limits,
        ) -> Result<Vec<String>, ferry_core::EnqueueError> {
            $crate::common::enqueue_on(conn, events, limits).await
        }
    };
}
pub(crate) use enqueue_fns;

/// An operator enqueue ([`ferry_core::OperatorActions::enqueue`]) in a transaction of the
/// store's own: validates `events`, then begins (`begin`, not yet polled), inserts, and commits
/// (`commit`) past the `enqueue-before-commit` failpoint. Returns the event ids, in order.
pub(crate) async fn enqueue_in_own_tx<T, C, CF>(
    events: &[NewEvent],
    limits: &Limits,
    begin: impl Future<Output = Result<T, sqlx::Error>>,
    commit: impl FnOnce(T) -> CF,
) -> Result<Vec<String>, EnqueueError>
where
    T: DerefMut<Target = C>,
    C: InsertIntents,
    CF: Future<Output = Result<(), sqlx::Error>>,
{
    let rows = crate::validate(events, limits)?;
    let mut tx = begin
        .await
        .map_err(|e| EnqueueError::Store(db_err("begin", e).to_string()))?;
    tx.insert_intents(&rows).await?;
    ferry_core::failpoint::hit("enqueue-before-commit");
    commit(tx)
        .await
        .map_err(|e| EnqueueError::Store(db_err("commit", e).to_string()))?;
    Ok(rows.into_iter().map(|r| r.event_id).collect())
}

/// Parses a database URL into a backend's connect options; an error names the backend and shows
/// the URL as `shown` (redacted where it may carry a password).
pub(crate) fn url_options<O>(url: &str, backend: &str, shown: &str) -> Result<O, StoreError>
where
    O: FromStr<Err = sqlx::Error>,
{
    O::from_str(url).map_err(|e| {
        StoreError::new(
            StoreErrorKind::InvalidInput,
            format!("invalid {backend} URL {shown}: {e}"),
        )
    })
}

/// A claim's rows (`sql`, whose one parameter is the claim id) as events read by `from_row`.
pub(crate) async fn lookup_claim<DB>(
    pool: &sqlx::Pool<DB>,
    sql: &str,
    claim_id: &str,
    from_row: fn(&DB::Row) -> ferry_core::ClaimedEvent,
) -> Result<Vec<ferry_core::ClaimedEvent>, StoreError>
where
    DB: sqlx::Database,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let rows = sqlx::query(sql)
        .bind(claim_id)
        .fetch_all(pool)
        .await
        .map_err(|e| db_err("lookup_claim", e))?;
    Ok(rows.iter().map(from_row).collect())
}

/// The statement of [`ferry_core::OperatorActions::record`]: an intent's delivery-state row
/// ([`RecordRow`]) by event id (placeholder `p`), from the relation holding its effective state.
pub(crate) fn record_sql(mode: DispatchMode, p: &str) -> String {
    let table = state_table(mode);
    format!(
        "SELECT event_id, state, claim_version, claim_id, attempts, last_error, resolved_by, payload \
         FROM {table} WHERE event_id = {p}"
    )
}

/// [`record_sql`] run on a backend whose driver decodes a [`RecordRow`] (not MariaDB's binary
/// text columns).
pub(crate) async fn record<DB>(
    pool: &sqlx::Pool<DB>,
    mode: DispatchMode,
    p: &str,
    event_id: &str,
) -> Result<Option<EventRecord>, StoreError>
where
    DB: sqlx::Database,
    RecordRow: for<'r> sqlx::FromRow<'r, DB::Row>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let r: Option<RecordRow> = sqlx::query_as(&record_sql(mode, p))
        .bind(event_id)
        .fetch_optional(pool)
        .await
        .map_err(|e| db_err("record", e))?;
    r.map(record_from).transpose()
}

/// The stored dispatch mode (`ferry_dispatch`), on any backend's pool. `T` is what the driver
/// decodes the text column as (MariaDB reports its binary collation as bytes).
pub(crate) async fn stored_mode<DB, T>(pool: &sqlx::Pool<DB>) -> Result<DispatchMode, StoreError>
where
    DB: sqlx::Database,
    T: AsRef<[u8]> + Send + Unpin + for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let m: T = sqlx::query_scalar("SELECT mode FROM ferry_dispatch WHERE id = 1")
        .fetch_one(pool)
        .await
        .map_err(|e| db_err("dispatch mode", e))?;
    String::from_utf8_lossy(m.as_ref())
        .parse()
        .map_err(|e: String| StoreError::new(StoreErrorKind::Other, e))
}

/// Whether an advance with `claim_id` was applied (its claim id is still some slot's
/// `cursor_claim_id`), on a backend with `?` placeholders (SQLite, MariaDB).
pub(crate) async fn advance_applied<DB>(
    pool: &sqlx::Pool<DB>,
    claim_id: &str,
) -> Result<bool, StoreError>
where
    DB: sqlx::Database,
    i64: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ferry_slot_lease WHERE cursor_claim_id = ?")
            .bind(claim_id)
            .fetch_one(pool)
            .await
            .map_err(|e| db_err("lookup advance", e))?;
    Ok(n > 0)
}

/// Runs `claim` (not yet polled) unless `req` asks for no slot or no row: such a claim (of
/// rows or of exception rows) takes nothing and touches no table.
pub(crate) async fn claiming(
    req: &ferry_core::ClaimRequest,
    claim: impl Future<Output = Result<Vec<ferry_core::ClaimedEvent>, StoreError>>,
) -> Result<Vec<ferry_core::ClaimedEvent>, StoreError> {
    if req.slots.is_empty() || req.limit == 0 {
        return Ok(Vec::new());
    }
    claim.await
}

/// The answer to an advance of no slot, which every backend gives before it touches the
/// database: nothing to do, unless it would write exceptions, which only a fenced slot advance
/// may. `None` when the advance names slots.
pub(crate) fn slotless_advance(
    req: &ferry_core::CursorAdvance,
) -> Option<Result<ferry_core::AdvanceResult, StoreError>> {
    if !req.slots.is_empty() {
        return None;
    }
    // exceptions are only written under a fenced slot advance
    Some(if req.exceptions.is_empty() {
        Ok(ferry_core::AdvanceResult::Applied)
    } else {
        Err(StoreError::new(
            StoreErrorKind::InvalidInput,
            "an advance that writes exceptions must advance (and so fence) at least one slot",
        ))
    })
}

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

/// A seq-ordered cursor read (SQLite, MySQL/MariaDB: positions are `seq` alone) cut into at
/// most two statements. Most reads have every slot at one position, and one statement reads
/// them all from it. A slot more than `limit` positions behind the leading one (held back
/// behind an aggregate in flight while the others went on) would make that statement start at
/// its position and fill the limit with rows the others passed, read after read, while the
/// others wait; it is read in a range of its own instead, of at most [`LAG_SPAN`] limits'
/// worth of positions and half the limit, and the others go on from their own positions.
pub(crate) struct SeqRead {
    from: std::collections::HashMap<SlotId, i64>,
    limit: usize,
    lagging: Vec<SlotId>,
    rest: Vec<SlotId>,
}

/// How many limits' worth of positions a lagging slots' range spans at most.
const LAG_SPAN: i64 = 2;

/// One statement of a [`SeqRead`]: the rows of `slots` with `lo < seq <= hi`, in `seq` order,
/// at most `limit` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeqRange {
    pub(crate) slots: Vec<SlotId>,
    pub(crate) lo: i64,
    pub(crate) hi: i64,
    pub(crate) limit: usize,
}

impl SeqRange {
    /// Whether the statement can return anything (else it is not run).
    pub(crate) fn runs(&self) -> bool {
        self.hi > self.lo && self.limit > 0
    }
}

/// What one [`SeqRange`] statement returned: how many rows and the last row's `seq`.
pub(crate) struct RangeRows {
    pub(crate) rows: usize,
    pub(crate) last: Option<i64>,
}

impl RangeRows {
    /// How far the statement read its slots: to its last row when it returned `limit` rows
    /// (more may follow), else to the end of its range.
    fn upto(&self, r: &SeqRange) -> ferry_core::CursorPos {
        let seq = if self.full(r) {
            self.last.unwrap_or(r.lo)
        } else {
            r.hi.max(r.lo)
        };
        ferry_core::CursorPos::new(0, seq)
    }
    fn full(&self, r: &SeqRange) -> bool {
        self.rows >= r.limit
    }
}

/// Where a [`SeqRead`] runs its statements: one backend's read of a [`SeqRange`], returning its
/// rows in `seq` order as events, each with whether an open exception holds its aggregate.
pub(crate) trait SeqRanges {
    fn read_range(
        &mut self,
        r: &SeqRange,
    ) -> impl Future<Output = Result<Vec<(ferry_core::ClaimedEvent, bool)>, StoreError>> + Send;
}

impl SeqRead {
    /// Runs the read on `src` up to `horizon`: the lagging slots' statement first (if any slot
    /// lags), then the others'. Returns the batch, and whether the others' statement came back
    /// short of its limit (it caught up with the horizon).
    pub(crate) async fn run<R: SeqRanges>(
        &self,
        src: &mut R,
        horizon: i64,
    ) -> Result<(ferry_core::CursorBatch, bool), StoreError> {
        let mut events = Vec::new();
        let lagging = match self.lagging(horizon) {
            Some(r) => {
                let rows = self.take(src, &r, &mut events).await?;
                Some((r, rows))
            }
            None => None,
        };
        let rest = self.rest(horizon, events.len());
        let rows = self.take(src, &rest, &mut events).await?;
        let short = rows.rows < rest.limit;
        let batch = self.finish(
            lagging.as_ref().map(|(r, n)| (r, n)),
            (&rest, &rows),
            events,
            horizon,
        );
        Ok((batch, short))
    }

    /// Runs one statement (unless it can return nothing), appending the rows it wants to
    /// `events`.
    async fn take<R: SeqRanges>(
        &self,
        src: &mut R,
        r: &SeqRange,
        events: &mut Vec<ferry_core::CursorEvent>,
    ) -> Result<RangeRows, StoreError> {
        if !r.runs() {
            return Ok(RangeRows {
                rows: 0,
                last: None,
            });
        }
        let rows = src.read_range(r).await?;
        let read = RangeRows {
            rows: rows.len(),
            last: rows.last().map(|(e, _)| e.token.seq),
        };
        events.extend(
            rows.into_iter()
                .filter(|(e, _)| self.wanted(e.shard_slot, e.token.seq))
                .map(|(event, held)| ferry_core::CursorEvent {
                    pos: ferry_core::CursorPos::new(0, event.token.seq),
                    held,
                    event,
                }),
        );
        Ok(read)
    }

    /// `None` for a read of no slot.
    pub(crate) fn new(req: &ferry_core::CursorRead) -> Option<Self> {
        let lead = req.from.iter().map(|(_, p)| p.seq).max()?;
        let from: std::collections::HashMap<SlotId, i64> =
            req.from.iter().map(|(s, p)| (*s, p.seq)).collect();
        let gap = i64::try_from(req.limit).unwrap_or(i64::MAX);
        let (lagging, rest) = from
            .iter()
            .map(|(s, p)| (*s, *p))
            .partition::<Vec<_>, _>(|(_, p)| req.limit >= 2 && p.saturating_add(gap) < lead);
        Some(Self {
            limit: req.limit,
            lagging: lagging.into_iter().map(|(s, _)| s).collect(),
            rest: rest.into_iter().map(|(s, _)| s).collect(),
            from,
        })
    }

    fn low(&self, slots: &[SlotId]) -> i64 {
        slots.iter().map(|s| self.from[s]).min().unwrap_or(0)
    }

    /// The lagging slots' statement, run first, if any slot lags.
    pub(crate) fn lagging(&self, horizon: i64) -> Option<SeqRange> {
        if self.lagging.is_empty() {
            return None;
        }
        let lo = self.low(&self.lagging);
        let span = LAG_SPAN.saturating_mul(i64::try_from(self.limit).unwrap_or(i64::MAX));
        Some(SeqRange {
            slots: self.lagging.clone(),
            lo,
            hi: horizon.min(lo.saturating_add(span)),
            limit: self.limit / 2,
        })
    }

    /// The other slots' statement, after the lagging slots' one returned `taken` rows.
    pub(crate) fn rest(&self, horizon: i64, taken: usize) -> SeqRange {
        SeqRange {
            slots: self.rest.clone(),
            lo: self.low(&self.rest),
            hi: horizon,
            limit: self.limit.saturating_sub(taken),
        }
    }

    /// Whether a row of `slot` at `seq` is past that slot's position (rows of a slot that
    /// another slot's lower position brought into a statement are dropped).
    pub(crate) fn wanted(&self, slot: SlotId, seq: i64) -> bool {
        self.from.get(&slot).is_some_and(|p| seq > *p)
    }

    /// The batch: `events` (wanted rows of both statements) in `seq` order, how far each slot
    /// was read, and whether more rows may follow right now.
    pub(crate) fn finish(
        &self,
        lagging: Option<(&SeqRange, &RangeRows)>,
        rest: (&SeqRange, &RangeRows),
        mut events: Vec<ferry_core::CursorEvent>,
        horizon: i64,
    ) -> ferry_core::CursorBatch {
        events.sort_by_key(|e| e.pos);
        let (r, rows) = rest;
        let mut more = rows.full(r);
        let mut slot_upto = Vec::new();
        if let Some((l, lrows)) = lagging {
            more |= lrows.full(l) || l.hi < horizon;
            let upto = lrows.upto(l);
            slot_upto = l.slots.iter().map(|s| (*s, upto)).collect();
        }
        ferry_core::CursorBatch {
            events,
            upto: rows.upto(r),
            more,
            slot_upto,
        }
    }
}

/// The statements of a backend's `ferry_status_cache` (PostgreSQL, MariaDB): take the counting
/// lease (`max_age` in µs bound once), read the stored count (its oldest age moved on by the
/// time since), give the lease back, store a count (five values bound).
pub(crate) struct StatusCacheSql {
    pub(crate) lease: &'static str,
    pub(crate) stored: &'static str,
    pub(crate) clear: &'static str,
    pub(crate) store: &'static str,
}

/// [`ferry_core::OutboxStore::shared_status`] over a `ferry_status_cache` row: the relay that
/// wins the lease counts with `count` and stores the result; the others read the stored count
/// (younger than `max_age`, or older while the winner counts), or get a `Conflict` error while
/// nothing is stored yet. A winner whose count fails gives the lease back; one that dies holds
/// it for the lease's 60 s.
pub(crate) async fn shared_status<DB, F>(
    pool: &sqlx::Pool<DB>,
    sql: &StatusCacheSql,
    rows_affected: fn(&DB::QueryResult) -> u64,
    max_age: std::time::Duration,
    count: F,
) -> Result<OutboxStatus, StoreError>
where
    DB: sqlx::Database,
    F: std::future::Future<Output = Result<OutboxStatus, StoreError>>,
    i64: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<i64>: for<'q> sqlx::Encode<'q, DB>,
    StatusRow: for<'r> sqlx::FromRow<'r, DB::Row>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let max_age_us = max_age.as_micros().min(i64::MAX as u128) as i64;
    // A lease statement that matches nothing changes no row: the relays that read the stored
    // count pay a primary-key lookup for it.
    let leased = sqlx::query(sql.lease)
        .bind(max_age_us)
        .execute(pool)
        .await
        .map_err(|e| db_err("status: lease", e))?;
    // (sqlx has no backend-independent `rows_affected`: each backend passes its own)
    let won = rows_affected(&leased) == 1;
    if !won {
        let stored: Option<StatusRow> = sqlx::query_as(sql.stored)
            .fetch_optional(pool)
            .await
            .map_err(|e| db_err("status: stored", e))?;
        return match stored {
            Some(r) => Ok(status_from(r)),
            // Nothing stored yet: another relay is counting for the first time. Counting here
            // too would repeat the walk once per relay, at once, when a fleet starts on a large
            // backlog; the caller keeps its gauges and asks again next interval.
            None => Err(StoreError::new(
                StoreErrorKind::Conflict,
                "status: another relay is counting; no count stored yet",
            )),
        };
    }
    let s = match count.await {
        Ok(s) => s,
        Err(e) => {
            // give the lease back so that another relay (or the next poll) counts
            let _ = sqlx::query(sql.clear).execute(pool).await;
            return Err(e);
        }
    };
    sqlx::query(sql.store)
        .bind(s.pending)
        .bind(s.claimed)
        .bind(s.quarantined)
        .bind(s.oldest_unfinished_age_us)
        .bind(s.blocked_aggregates)
        .execute(pool)
        .await
        .map_err(|e| db_err("status: store", e))?;
    Ok(s)
}

#[cfg(test)]
mod seq_read_tests {
    use super::*;
    use ferry_core::{CursorPos, CursorRead};

    fn read(from: &[(SlotId, i64)], limit: usize) -> SeqRead {
        SeqRead::new(&CursorRead {
            from: from
                .iter()
                .map(|(s, p)| (*s, CursorPos::new(0, *p)))
                .collect(),
            limit,
        })
        .unwrap()
    }

    #[test]
    fn slots_near_one_position_are_one_statement() {
        let r = read(&[(1, 100), (2, 95), (3, 100)], 10);
        assert_eq!(r.lagging(500), None);
        let rest = r.rest(500, 0);
        assert_eq!((rest.lo, rest.hi, rest.limit), (95, 500, 10));
        let mut slots = rest.slots.clone();
        slots.sort();
        assert_eq!(slots, vec![1, 2, 3]);
        // not full: read to the horizon; full: to the last row
        let b = r.finish(
            None,
            (
                &rest,
                &RangeRows {
                    rows: 3,
                    last: Some(120),
                },
            ),
            vec![],
            500,
        );
        assert_eq!((b.upto.seq, b.more, b.slot_upto.len()), (500, false, 0));
        let b = r.finish(
            None,
            (
                &rest,
                &RangeRows {
                    rows: 10,
                    last: Some(120),
                },
            ),
            vec![],
            500,
        );
        assert_eq!((b.upto.seq, b.more), (120, true));
    }

    #[test]
    fn a_slot_far_behind_gets_a_bounded_range_of_its_own() {
        let r = read(&[(1, 1000), (2, 10), (3, 1000)], 100);
        let lag = r.lagging(5000).unwrap();
        assert_eq!(
            (lag.slots.clone(), lag.lo, lag.hi, lag.limit),
            (vec![2], 10, 210, 50)
        );
        let rest = r.rest(5000, 7);
        assert_eq!((rest.lo, rest.hi, rest.limit), (1000, 5000, 93));
        // the lagging slot moves to the end of its range, the others to the horizon
        let b = r.finish(
            Some((
                &lag,
                &RangeRows {
                    rows: 7,
                    last: Some(150),
                },
            )),
            (
                &rest,
                &RangeRows {
                    rows: 3,
                    last: Some(1200),
                },
            ),
            vec![],
            5000,
        );
        assert_eq!(b.upto.seq, 5000);
        assert_eq!(b.upto_of(2).seq, 210);
        assert_eq!(b.upto_of(1).seq, 5000);
        assert!(b.more, "the lagging slot has more behind the horizon");
        // its range reaching the horizon and not full: nothing more right now
        let lag = r.lagging(200).unwrap();
        assert_eq!(lag.hi, 200);
        let rest = r.rest(200, 0);
        assert!(!rest.runs(), "the others are at or past the horizon");
        let b = r.finish(
            Some((
                &lag,
                &RangeRows {
                    rows: 0,
                    last: None,
                },
            )),
            (
                &rest,
                &RangeRows {
                    rows: 0,
                    last: None,
                },
            ),
            vec![],
            200,
        );
        assert_eq!(
            (b.upto_of(2).seq, b.upto_of(1).seq, b.more),
            (200, 1000, false)
        );
    }

    #[test]
    fn rows_at_or_below_their_slot_position_are_dropped() {
        let r = read(&[(1, 1000), (2, 10)], 100);
        assert!(!r.wanted(1, 1000));
        assert!(r.wanted(1, 1001));
        assert!(r.wanted(2, 11));
        assert!(!r.wanted(3, 5000), "a slot not in the read");
    }
}
