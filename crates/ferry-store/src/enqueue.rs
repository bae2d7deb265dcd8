//! The enqueue path every backend shares: validate, insert on the caller's connection (never
//! beginning or committing), or in the operator's own transaction.
use std::future::Future;
use std::ops::DerefMut;

use ferry_core::{EnqueueError, Limits, NewEvent, ValidatedEvent};

use crate::error::db_err;

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
/// headers`); `slot` is the shard slot in the backend's column type. The caller pushes the
/// payload next: its columns differ by backend (one on SQLite, text and bytes elsewhere).
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
        .push_bind(&r.headers);
}

/// Validates `events` for an enqueue (shared by every backend).
pub(crate) fn validate(
    events: &[NewEvent],
    limits: &Limits,
) -> Result<Vec<ValidatedEvent>, EnqueueError> {
    ferry_core::validate_batch(events, limits)
}

/// The body of every backend's `enqueue_many`: validates `events`, inserts them on the caller's
/// connection (never beginning or committing) and returns their event ids, in order.
pub(crate) async fn enqueue_on<C: InsertIntents>(
    conn: &mut C,
    events: &[NewEvent],
    limits: &Limits,
) -> Result<Vec<String>, EnqueueError> {
    let rows = validate(events, limits)?;
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
            $crate::enqueue::enqueue_on(conn, events, limits).await
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
    let rows = validate(events, limits)?;
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
