//! The reads every backend runs alike, their statements differing only in placeholders: a claim's
//! rows, an event's record, the stored dispatch mode, whether an advance was applied.
use ferry_core::{DispatchMode, EventRecord, StoreError};

use crate::error::db_err;
use crate::rows::{record_from, RecordRow};

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
/// `payload` selects the payload as two columns, text and bytes (the backend's
/// `RECORD_PAYLOAD`: exactly one of them is not NULL).
pub(crate) fn record_sql(mode: DispatchMode, p: &str, payload: &str) -> String {
    let table = state_table(mode);
    format!(
        "SELECT event_id, state, claim_version, claim_id, attempts, last_error, resolved_by, {payload} \
         FROM {table} WHERE event_id = {p}"
    )
}

/// [`record_sql`] run on a backend whose driver decodes a [`RecordRow`] (not MariaDB's binary
/// text columns).
pub(crate) async fn record<DB>(
    pool: &sqlx::Pool<DB>,
    mode: DispatchMode,
    p: &str,
    payload: &str,
    event_id: &str,
) -> Result<Option<EventRecord>, StoreError>
where
    DB: sqlx::Database,
    RecordRow: for<'r> sqlx::FromRow<'r, DB::Row>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let r: Option<RecordRow> = sqlx::query_as(&record_sql(mode, p, payload))
        .bind(event_id)
        .fetch_optional(pool)
        .await
        .map_err(|e| db_err("record", e))?;
    r.map(record_from).transpose()
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

/// The relation whose `state` is an intent's effective state: the outbox in row dispatch; in
/// cursor dispatch the view (the exception row's state, else SENT behind the slot's cursor).
pub(crate) fn state_table(mode: DispatchMode) -> &'static str {
    match mode {
        DispatchMode::Row => "ferry_outbox",
        DispatchMode::Cursor => "ferry_outbox_cursor_view",
    }
}
