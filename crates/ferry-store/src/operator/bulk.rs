//! Bulk operator actions on quarantined events (`ferry quarantine requeue|skip` with a filter)
//! and their record (`ferry_operator_action`), written once for every backend.
//!
//! An action is one transaction of the backend's own ([`crate::protocol::bulk_quarantine`]), in
//! which [`act`]:
//! 1. reads the dispatch mode under a shared lock of its row (`ferry_dispatch`; SQLite: the
//!    transaction's write lock), so a mode switch, which takes that row for update, cannot move
//!    the quarantined events to the other mode's table in the middle of the action;
//! 2. moves every quarantined event the filter selects with one `UPDATE … WHERE state =
//!    'QUARANTINED' AND <filter>` (the single-event action's SET clause), and takes its row
//!    count as the count;
//! 3. inserts the record with that count.
//!
//! Nothing but an operator action changes a `QUARANTINED` row (a relay's outcomes are fenced on
//! `CLAIMED`, and cursor dispatch's exception claims take `PENDING` rows only), so a concurrent
//! relay can add matching events (quarantining them while the action runs: they are moved and
//! counted if committed before the `UPDATE` reached them, left alone and uncounted otherwise)
//! but never take one away or make one count twice. A dry run ([`preview`]) runs the same
//! selection as a count and a sample on the pool, changing nothing.
use ferry_core::{
    BulkOutcome, BulkRequest, DispatchMode, OperatorRecord, QuarantineFilter, StoreError,
    StoreErrorKind,
};
use sqlx::{MySqlConnection, PgConnection, Row, SqliteConnection};

use super::{count, on_backend, text_at, Bind, Pools};
use crate::dialect::Dialect;
use crate::error::db_err;

/// A connection inside a transaction the caller opened (and commits).
pub(crate) enum Conn<'a> {
    Pg(&'a mut PgConnection),
    My(&'a mut MySqlConnection),
    Lite(&'a mut SqliteConnection),
}

/// A bind value that may be NULL (the record's filter columns).
#[derive(Debug, Clone)]
pub(crate) enum Val {
    I64(Option<i64>),
    Str(Option<String>),
}

impl From<Bind> for Val {
    fn from(b: Bind) -> Self {
        match b {
            Bind::I64(v) => Val::I64(Some(v)),
            Bind::Str(s) => Val::Str(Some(s)),
            Bind::Nullable(v) => Val::I64(v),
        }
    }
}

/// `sql` with `vals` bound in order.
fn with_vals<'q, DB: sqlx::Database>(
    sql: &'q str,
    vals: &[Val],
) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    Option<i64>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<String>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    vals.iter().fold(sqlx::query(sql), |q, v| match v {
        Val::I64(v) => q.bind(*v),
        Val::Str(s) => q.bind(s.clone()),
    })
}

impl Conn<'_> {
    pub(crate) fn dialect(&self) -> Dialect {
        match self {
            Conn::Pg(_) => Dialect::Pg,
            Conn::My(_) => Dialect::My,
            Conn::Lite(_) => Dialect::Lite,
        }
    }

    /// The rows `sql` changed.
    pub(crate) async fn exec(
        &mut self,
        sql: &str,
        vals: &[Val],
        what: &str,
    ) -> Result<u64, StoreError> {
        Ok(on_backend!(Conn, self, sql, |c, q| {
            with_vals(q, vals)
                .execute(&mut **c)
                .await
                .map_err(|e| db_err(what, e))?
                .rows_affected()
        }))
    }

    /// The first column of the first row `sql` returns, as text (`None`: no row, or NULL).
    pub(crate) async fn first_text(
        &mut self,
        sql: &str,
        vals: &[Val],
        what: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(on_backend!(Conn, self, sql, |c, q| {
            with_vals(q, vals)
                .fetch_optional(&mut **c)
                .await
                .map_err(|e| db_err(what, e))?
                .and_then(|r| text_at(&r, 0))
        }))
    }

    /// The stored dispatch mode, its row locked against a mode switch until the transaction ends.
    async fn locked_mode(&mut self) -> Result<DispatchMode, StoreError> {
        const WHAT: &str = "bulk action: dispatch mode";
        // one row, one column, as `$ty`, on connection `$c`
        macro_rules! mode_as {
            ($c:expr, $sql:expr, $ty:ty) => {
                sqlx::query($sql)
                    .fetch_one(&mut **$c)
                    .await
                    .map_err(|e| db_err(WHAT, e))?
                    .try_get::<$ty, _>(0)
                    .map_err(|e| db_err(WHAT, e))?
            };
        }
        let mode: Vec<u8> = match self {
            Conn::Pg(c) => mode_as!(
                c,
                "SELECT mode FROM ferry_dispatch WHERE id = 1 FOR SHARE",
                String
            )
            .into_bytes(),
            // MariaDB reports the binary collation's text as bytes
            Conn::My(c) => mode_as!(
                c,
                "SELECT mode FROM ferry_dispatch WHERE id = 1 LOCK IN SHARE MODE",
                Vec<u8>
            ),
            // the caller's BEGIN IMMEDIATE holds the write lock a mode switch needs
            Conn::Lite(c) => {
                mode_as!(c, "SELECT mode FROM ferry_dispatch WHERE id = 1", String).into_bytes()
            }
        };
        String::from_utf8_lossy(&mode)
            .parse()
            .map_err(|e: String| StoreError::new(StoreErrorKind::Other, e))
    }
}

/// The quarantined rows `f` selects in `mode`: the table the state lives in (row dispatch: the
/// outbox; cursor dispatch: the exception rows), the `WHERE` clause over its unqualified
/// columns, its binds, and an expression for the event id.
struct Selection {
    table: &'static str,
    filter: String,
    binds: Vec<Bind>,
    event_id: &'static str,
}

fn selection(d: Dialect, mode: DispatchMode, f: &QuarantineFilter) -> Selection {
    // [0]: conditions on the state table's columns; [1]: on the outbox row `o` (cursor
    // dispatch only), each with its binds in text order
    let mut conds: [(Vec<String>, Vec<Bind>); 2] = Default::default();
    let cursor = mode == DispatchMode::Cursor;
    // topic and creation time are the intent's: the state table's own in row dispatch
    let (o, q) = if cursor { (1, "o.") } else { (0, "") };
    // PostgreSQL's row dispatch finds quarantined rows by `phase`, the column its partial
    // indexes are on (migration 0002); `state` says the same and is kept for clarity.
    conds[0].0.push(if d == Dialect::Pg && !cursor {
        "phase = 1 AND state = 'QUARANTINED'".to_string()
    } else {
        "state = 'QUARANTINED'".to_string()
    });
    let mut add = |i: usize, cond: String, b: Bind| {
        conds[i].0.push(cond);
        conds[i].1.push(b);
    };
    if let Some(t) = &f.topic {
        add(o, format!("{q}topic = ?"), Bind::Str(t.clone()));
    }
    // aggregate and last error are on the state table in both modes
    if let Some(a) = &f.aggregate_id {
        add(0, "aggregate_id = ?".into(), Bind::Str(a.clone()));
    }
    if let Some(e) = &f.error_contains {
        add(0, contains(d, "last_error"), Bind::Str(e.clone()));
    }
    if let Some(t) = f.created_since {
        add(
            o,
            format!("{q}created_at >= {}", at_micros(d)),
            Bind::I64(t),
        );
    }
    if let Some(t) = f.created_until {
        add(o, format!("{q}created_at < {}", at_micros(d)), Bind::I64(t));
    }
    let [(own, mut binds), (intent, intent_binds)] = conds;
    let mut filter = own.join(" AND ");
    if cursor {
        filter.push_str(
            " AND EXISTS (SELECT 1 FROM ferry_outbox o WHERE o.seq = ferry_outbox_exception.seq",
        );
        for c in &intent {
            filter.push_str(" AND ");
            filter.push_str(c);
        }
        filter.push(')');
        binds.extend(intent_binds);
    }
    Selection {
        table: if cursor {
            "ferry_outbox_exception"
        } else {
            "ferry_outbox"
        },
        filter,
        binds,
        event_id: if cursor {
            "(SELECT o.event_id FROM ferry_outbox o WHERE o.seq = ferry_outbox_exception.seq)"
        } else {
            "event_id"
        },
    }
}

/// "`col` contains the bound text", byte for byte (case-sensitive on every backend; no `LIKE`,
/// so `%` and `_` in the text are plain characters).
fn contains(d: Dialect, col: &str) -> String {
    match d {
        Dialect::Pg => format!("strpos({col}, ?::text) > 0"),
        Dialect::My => format!("LOCATE(CAST(? AS BINARY), CAST({col} AS BINARY)) > 0"),
        Dialect::Lite => format!("instr({col}, ?) > 0"),
    }
}

/// A bound µs-since-the-epoch value as the backend's `created_at` (SQLite stores µs).
fn at_micros(d: Dialect) -> &'static str {
    match d {
        Dialect::Pg => "('epoch'::timestamptz + ?::int8 * interval '1 microsecond')",
        Dialect::My => "TIMESTAMPADD(MICROSECOND, ?, '1970-01-01 00:00:00')",
        Dialect::Lite => "?",
    }
}

/// "now" in a timestamp column, and its bind where the backend binds the process clock.
pub(crate) fn now(d: Dialect, vals: &mut Vec<Val>) -> &'static str {
    let (sql, clock) = d.now_at();
    vals.extend(clock.map(|t| Val::I64(Some(t))));
    sql
}

/// A dry run: how many quarantined events `req.filter` selects now in `mode`, and the ids of
/// the first `req.sample` of them (oldest first). Changes nothing.
pub(crate) async fn preview(
    pools: Pools<'_>,
    mode: DispatchMode,
    req: &BulkRequest<'_>,
) -> Result<BulkOutcome, StoreError> {
    let s = selection(pools.dialect(), mode, req.filter);
    let n = count(
        pools,
        &format!("SELECT count(*) FROM {} WHERE {}", s.table, s.filter),
        &s.binds,
    )
    .await?;
    let mut binds = s.binds.clone();
    binds.push(Bind::I64(req.sample.min(100_000) as i64));
    let rows = pools
        .rows(
            &format!(
                "SELECT {} FROM {} WHERE {} ORDER BY seq LIMIT ?",
                s.event_id, s.table, s.filter
            ),
            &binds,
        )
        .await?;
    Ok(BulkOutcome {
        count: n,
        sample: rows
            .into_iter()
            .filter_map(|r| r.into_iter().next().flatten())
            .collect(),
    })
}

/// The action, in the caller's open transaction on `conn`: moves every quarantined event
/// `req.filter` selects and records it (module docs). Returns how many it moved.
pub(crate) async fn act(mut conn: Conn<'_>, req: &BulkRequest<'_>) -> Result<u64, StoreError> {
    let d = conn.dialect();
    let mode = conn.locked_mode().await?;
    let s = selection(d, mode, req.filter);
    // the single-event action's SET clause (operator_update in the parent module)
    let mut vals = vec![Val::Str(Some(req.operator.to_string()))];
    let mut set = format!(
        "state = '{}', resolved_by = ?, resolved_at = {}, lease_until = NULL",
        req.verb.target_state(),
        now(d, &mut vals)
    );
    if req.verb == ferry_core::BulkVerb::Requeue {
        set.push_str(&format!(
            ", available_at = {}, attempts = 0",
            now(d, &mut vals)
        ));
    }
    vals.extend(s.binds.into_iter().map(Val::from));
    let sql = format!("UPDATE {} SET {set} WHERE {}", s.table, s.filter);
    let moved = conn.exec(&sql, &vals, "bulk action: update").await?;
    let f = req.filter;
    let mut vals = Vec::new();
    let at = now(d, &mut vals);
    vals.extend([
        Val::Str(Some(req.operator.to_string())),
        Val::Str(Some(req.verb.as_str().to_string())),
        Val::Str(Some(req.reason.to_string())),
        Val::Str(Some(mode.to_string())),
        Val::I64(Some(moved as i64)),
        Val::Str(f.topic.clone()),
        Val::Str(f.aggregate_id.clone()),
        Val::Str(f.error_contains.clone()),
        Val::I64(f.created_since),
        Val::I64(f.created_until),
    ]);
    let sql = format!(
        "INSERT INTO ferry_operator_action (at, operator, action, reason, dispatch, moved, \
         where_topic, where_aggregate, where_error, created_since_us, created_until_us) \
         VALUES ({at}, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    );
    conn.exec(&sql, &vals, "bulk action: record").await?;
    Ok(moved)
}

/// The newest `limit` records, newest first.
pub(crate) async fn recent(
    pools: Pools<'_>,
    limit: usize,
) -> Result<Vec<OperatorRecord>, StoreError> {
    let sql = format!(
        "SELECT id, {}, operator, action, reason, dispatch, moved, where_topic, where_aggregate, \
         where_error, created_since_us, created_until_us \
         FROM ferry_operator_action ORDER BY id DESC LIMIT ?",
        pools.dialect().micros("at")
    );
    let rows = pools
        .rows(&sql, &[Bind::I64(limit.min(10_000) as i64)])
        .await?;
    Ok(rows.into_iter().map(record_from).collect())
}

fn record_from(r: Vec<Option<String>>) -> OperatorRecord {
    let mut c = r.into_iter();
    let mut text = || c.next().flatten();
    let id = text();
    let at = text();
    let (operator, action, reason, dispatch) = (text(), text(), text(), text());
    let moved = text();
    let (topic, aggregate_id, error_contains) = (text(), text(), text());
    let (since, until) = (text(), text());
    let int = |v: Option<String>| v.and_then(|v| v.parse::<i64>().ok());
    OperatorRecord {
        id: int(id).unwrap_or(0),
        at_us: int(at).unwrap_or(0),
        operator: operator.unwrap_or_default(),
        action: action.unwrap_or_default(),
        reason: reason.unwrap_or_default(),
        dispatch: dispatch.unwrap_or_default(),
        count: int(moved).unwrap_or(0),
        filter: QuarantineFilter {
            topic,
            aggregate_id,
            error_contains,
            created_since: int(since),
            created_until: int(until),
        },
    }
}
