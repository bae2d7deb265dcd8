//! Operator queries shared by the SQL backends: retention (purge), reconciliation, and the
//! requeue or skip of a quarantined intent.
//!
//! The statements differ only in placeholders, clocks and string concatenation, so they are
//! written once against a small [`Dialect`]; [`Pools`] runs them on the right pool.
use std::collections::HashMap;

use ferry_core::{
    now_micros, BusinessTable, DispatchMode, PurgeRequest, ReconcileReport, ReconcileRequest,
    StoreError, StoreErrorKind, Watermark,
};
use sqlx::query::Query;
use sqlx::{MySqlPool, PgPool, Row, SqlitePool};

use crate::common::{micros, state_table};
use crate::db_err;

/// A borrowed pool of one backend.
#[derive(Clone, Copy)]
pub(crate) enum Pools<'a> {
    Pg(&'a PgPool),
    My(&'a MySqlPool),
    Lite(&'a SqlitePool),
}

/// A bind value.
#[derive(Debug, Clone)]
enum Bind {
    I64(i64),
    Str(String),
}

/// Evaluates `$body` once per backend, with `$pool` bound to that backend's pool and `$q` to
/// `$sql` in its placeholders (`?` in bind order; PostgreSQL gets `$n`). A macro: the arms'
/// pool, row and query types differ by driver.
macro_rules! on_pool {
    ($pools:expr, $sql:expr, |$pool:ident, $q:ident| $body:expr) => {
        match $pools {
            Pools::Pg($pool) => {
                let $q = &pg_placeholders($sql);
                $body
            }
            Pools::My($pool) => {
                let $q = $sql;
                $body
            }
            Pools::Lite($pool) => {
                let $q = $sql;
                $body
            }
        }
    };
}

impl Pools<'_> {
    /// The rows of `sql`, every column as text (`None` for NULL).
    async fn rows(
        &self,
        sql: &str,
        binds: &[Bind],
    ) -> Result<Vec<Vec<Option<String>>>, StoreError> {
        Ok(on_pool!(*self, sql, |pool, q| {
            let rows = bound(q, binds)
                .fetch_all(pool)
                .await
                .map_err(|e| db_err("operator query", e))?;
            rows.iter()
                .map(|r| {
                    (0..r.len())
                        .map(|i| {
                            r.try_get::<Option<i64>, _>(i)
                                .map(|v| v.map(|v| v.to_string()))
                                .or_else(|_| r.try_get::<Option<String>, _>(i))
                                .or_else(|_| {
                                    r.try_get::<Option<Vec<u8>>, _>(i).map(|v| {
                                        v.map(|b| String::from_utf8_lossy(&b).into_owned())
                                    })
                                })
                                .unwrap_or(None)
                        })
                        .collect()
                })
                .collect()
        }))
    }

    /// The rows `sql` changed.
    async fn exec(&self, sql: &str, binds: &[Bind]) -> Result<u64, StoreError> {
        self.exec_as(sql, binds, "operator statement").await
    }

    /// [`Self::exec`], its errors in the context `what`.
    async fn exec_as(&self, sql: &str, binds: &[Bind], what: &str) -> Result<u64, StoreError> {
        Ok(on_pool!(*self, sql, |pool, q| {
            bound(q, binds)
                .execute(pool)
                .await
                .map_err(|e| db_err(what, e))?
                .rows_affected()
        }))
    }

    fn dialect(&self) -> Dialect {
        match self {
            Pools::Pg(_) => Dialect::Pg,
            Pools::My(_) => Dialect::My,
            Pools::Lite(_) => Dialect::Lite,
        }
    }
}

/// `sql` with `binds` bound in order.
fn bound<'q, DB: sqlx::Database>(sql: &'q str, binds: &[Bind]) -> Query<'q, DB, DB::Arguments<'q>>
where
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    binds.iter().fold(sqlx::query(sql), |q, b| match b {
        Bind::I64(v) => q.bind(*v),
        Bind::Str(s) => q.bind(s.clone()),
    })
}

fn pg_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
    }
    out
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Pg,
    My,
    Lite,
}

impl Dialect {
    /// An expression for "now minus `?` µs" in the column's own representation.
    fn now_minus_param(self) -> &'static str {
        match self {
            Dialect::Pg => "(now() - ?::int8 * interval '1 microsecond')",
            Dialect::My => "(UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)",
            Dialect::Lite => "(? )", // the caller binds now - age (process clock)
        }
    }
    /// A timestamp column as µs since the epoch.
    fn micros(self, col: &str) -> String {
        match self {
            Dialect::Pg => format!("(extract(epoch from {col}) * 1000000)::int8"),
            Dialect::My => format!("TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {col})"),
            Dialect::Lite => col.to_string(),
        }
    }
    /// "now" as µs since the epoch.
    fn now_micros(self) -> &'static str {
        match self {
            Dialect::Pg => "(extract(epoch from now()) * 1000000)::int8",
            Dialect::My => "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
            Dialect::Lite => "?",
        }
    }
    fn concat_param_id(self, col: &str) -> String {
        match self {
            Dialect::Pg => format!("(?::text || CAST({col} AS TEXT))"),
            Dialect::My => format!("CONCAT(?, {col})"),
            Dialect::Lite => format!("(? || CAST({col} AS TEXT))"),
        }
    }
}

/// A value of an operator update, in the order a backend's placeholders take them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OperatorParam {
    EventId,
    Operator,
    /// The process clock (µs), for a backend that binds its time.
    Now,
}

/// How a backend's SQL names the values of an operator update: the event id's and the
/// operator's placeholders, the current time, and the order the placeholders bind in.
/// (PostgreSQL's `$n` pass [`Pools`]' `?` translation untouched: the statement has no `?`.)
pub(crate) struct OperatorSql {
    pub(crate) event_id: &'static str,
    pub(crate) operator: &'static str,
    pub(crate) now: &'static str,
    pub(crate) binds: &'static [OperatorParam],
}

/// An operator action on a quarantined intent, `target` `PENDING` (requeue: due now, attempts
/// reset) or `SKIPPED`, in the backend's SQL `p`. In cursor dispatch a quarantined intent's
/// state is its exception row. Returns how many rows it changed: one, or none when the intent
/// is not (or no longer) quarantined ([`operator_outcome`]).
pub(crate) async fn operator_update(
    pools: Pools<'_>,
    mode: DispatchMode,
    target: &str,
    p: &OperatorSql,
    event_id: &str,
    operator: &str,
) -> Result<u64, StoreError> {
    let (e, o, now) = (p.event_id, p.operator, p.now);
    let extra = if target == "PENDING" {
        format!(", available_at = {now}, attempts = 0")
    } else {
        String::new()
    };
    let (table, which) = match mode {
        DispatchMode::Row => ("ferry_outbox", format!("event_id = {e}")),
        DispatchMode::Cursor => (
            "ferry_outbox_exception",
            format!("seq = (SELECT seq FROM ferry_outbox WHERE event_id = {e})"),
        ),
    };
    let sql = format!(
        "UPDATE {table} SET state = '{target}', resolved_by = {o}, resolved_at = {now}, \
         lease_until = NULL{extra} WHERE {which} AND state = 'QUARANTINED'"
    );
    let binds: Vec<Bind> = p
        .binds
        .iter()
        .map(|b| match b {
            OperatorParam::EventId => Bind::Str(event_id.to_string()),
            OperatorParam::Operator => Bind::Str(operator.to_string()),
            OperatorParam::Now => Bind::I64(now_micros()),
        })
        .collect();
    pools.exec_as(&sql, &binds, "operator update").await
}

/// An operator update's result from the rows it changed: one, or the reason none was, from the
/// event's record (`record`, read only then).
pub(crate) async fn operator_outcome(
    changed: u64,
    event_id: &str,
    record: impl std::future::Future<Output = Result<Option<ferry_core::EventRecord>, StoreError>>,
) -> Result<(), StoreError> {
    if changed == 1 {
        return Ok(());
    }
    Err(crate::common::not_quarantined(event_id, record.await?))
}

/// Accepts `[A-Za-z_][A-Za-z0-9_]{0,62}` only: table and column names are interpolated, so
/// anything else is refused (parameterised SQL cannot bind identifiers).
pub fn validate_identifier(what: &str, name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .next()
            .map(|c| c.is_ascii_alphabetic() || c == '_')
            .unwrap_or(false)
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(StoreError::new(
            StoreErrorKind::InvalidInput,
            format!("invalid {what} {name:?}: use letters, digits and underscores (not starting with a digit), at most 63 characters"),
        ))
    }
}

/// "consumed by the consumer", for outbox rows qualified as `q`: its row is in the consumer's
/// Inbox, or the consumer's contiguous mark for the aggregate covers its version (the Inbox
/// row may have been pruned: `ferry_inbox::Inbox::prune`). Binds the consumer twice
/// ([`consumer_binds`]).
fn inbox_exists(q: &str) -> String {
    format!(
        "(EXISTS (SELECT 1 FROM ferry_inbox i WHERE i.consumer = ? AND i.event_id = {q}.event_id) \
         OR EXISTS (SELECT 1 FROM ferry_inbox_aggregate a WHERE a.consumer = ? \
         AND a.aggregate_id = {q}.aggregate_id AND a.applied_upto >= {q}.aggregate_version))"
    )
}

/// The binds of one [`inbox_exists`].
fn consumer_binds(consumer: &str) -> [Bind; 2] {
    [
        Bind::Str(consumer.to_string()),
        Bind::Str(consumer.to_string()),
    ]
}

pub(crate) async fn purge_sent(
    pools: Pools<'_>,
    mode: DispatchMode,
    req: &PurgeRequest<'_>,
) -> Result<u64, StoreError> {
    let PurgeRequest {
        older_than,
        batch,
        consumer,
        dry_run,
        vacuum,
    } = *req;
    if batch == 0 {
        return Err(StoreError::new(
            StoreErrorKind::InvalidInput,
            "purge batch size must be at least 1",
        ));
    }
    let d = pools.dialect();
    let cutoff = if d == Dialect::Lite {
        now_micros() - micros(older_than)
    } else {
        micros(older_than)
    };
    let total = if mode == DispatchMode::Cursor {
        purge_cursor(pools, cutoff, batch, consumer, dry_run).await?
    } else {
        purge_rows(pools, cutoff, batch, consumer, dry_run).await?
    };
    if vacuum && !dry_run {
        if let Pools::Pg(pool) = pools {
            // Simple protocol: VACUUM cannot run inside the implicit transaction some drivers
            // wrap an extended-protocol statement in.
            // the outbox, and the small tables every advance and read rewrites (the slot leases
            // with the cursors, the ticks, the exception rows), which bloat just as fast without
            // autovacuum and slow every advance down
            sqlx::raw_sql(
                "VACUUM ferry_outbox, ferry_slot_lease, ferry_tick, ferry_outbox_exception",
            )
            .execute(pool)
            .await
            .map_err(|e| db_err("purge: vacuum", e))?;
        }
    }
    Ok(total)
}

/// Row dispatch: SENT rows by `sent_at` (an index of its own), `batch` per statement in seq
/// order, until a statement deletes fewer.
async fn purge_rows(
    pools: Pools<'_>,
    cutoff: i64,
    batch: usize,
    consumer: Option<&str>,
    dry_run: bool,
) -> Result<u64, StoreError> {
    let d = pools.dialect();
    // MySQL: a single-table DELETE (its bounded form, with ORDER BY/LIMIT) takes no alias.
    let (q, source) = if d == Dialect::My {
        ("ferry_outbox", "ferry_outbox")
    } else {
        ("o", "ferry_outbox o")
    };
    let mut filter = format!(
        "{q}.state = 'SENT' AND {q}.sent_at < {}",
        d.now_minus_param()
    );
    if d == Dialect::Pg {
        // the sent_at index is partial on `phase = 2` (migration 0002)
        filter.push_str(" AND o.phase = 2");
    }
    let mut binds = vec![Bind::I64(cutoff)];
    if let Some(c) = consumer {
        filter.push_str(" AND ");
        filter.push_str(&inbox_exists(q));
        binds.extend(consumer_binds(c));
    }
    if dry_run {
        return count(
            pools,
            &format!("SELECT COUNT(*) FROM {source} WHERE {filter}"),
            &binds,
        )
        .await;
    }
    let sql = if d == Dialect::My {
        format!("DELETE FROM ferry_outbox WHERE {filter} ORDER BY seq LIMIT {batch}")
    } else {
        format!(
            "DELETE FROM ferry_outbox WHERE seq IN (SELECT o.seq FROM {source} WHERE {filter} ORDER BY o.seq LIMIT {batch})"
        )
    };
    let mut total = 0u64;
    loop {
        let n = pools.exec(&sql, &binds).await?;
        total += n;
        if (n as usize) < batch {
            return Ok(total);
        }
        // give concurrent claims and acks a moment between bounded batches
        tokio::task::yield_now().await;
    }
}

/// Cursor dispatch: a row is SENT when it is behind its slot's cursor with no open exception
/// (`ferry_outbox_cursor_view` derives it); its age is its `created_at` (the derived state has
/// no delivery time).
///
/// The rows are walked once, in seq order, in ranges of `batch` seq values: from the lowest row
/// up to the first row in seq order that is not older than the cutoff (found by a primary-key
/// scan that stops there). Each statement deletes the rows of one range that the view derives
/// as SENT, so it looks at no more than `batch` rows whatever the table holds. (A `LIMIT batch`
/// over the whole old part instead let the planner hash-join and sort every old row for each
/// statement, its estimate of the derived-state filter being far too low: 7.3 s per 1,000
/// rows with 1.4 million old rows, docs/notes/2026-12-06-performance-log.md.) The young part
/// of the table, which is what retention keeps, is never walked. A row older than the cutoff
/// above the bound (its transaction ran long enough for a younger row to take a lower seq) is
/// deleted by a later run.
async fn purge_cursor(
    pools: Pools<'_>,
    cutoff: i64,
    batch: usize,
    consumer: Option<&str>,
    dry_run: bool,
) -> Result<u64, StoreError> {
    let d = pools.dialect();
    let hi = first_i64(
        pools
            .rows(
                &format!(
                    "SELECT seq FROM ferry_outbox WHERE created_at >= {} ORDER BY seq LIMIT 1",
                    d.now_minus_param()
                ),
                &[Bind::I64(cutoff)],
            )
            .await?,
    )
    .unwrap_or(i64::MAX);
    let Some(lowest) = first_i64(
        pools
            .rows("SELECT seq FROM ferry_outbox ORDER BY seq LIMIT 1", &[])
            .await?,
    ) else {
        return Ok(0);
    };
    let mut filter = format!(
        "o.seq >= ? AND o.seq < ? AND o.state = 'SENT' AND o.created_at < {}",
        d.now_minus_param()
    );
    if consumer.is_some() {
        filter.push_str(" AND ");
        filter.push_str(&inbox_exists("o"));
    }
    let range = |from: i64, to: i64| {
        let mut b = vec![Bind::I64(from), Bind::I64(to), Bind::I64(cutoff)];
        if let Some(c) = consumer {
            b.extend(consumer_binds(c));
        }
        b
    };
    let source = "ferry_outbox_cursor_view o";
    if dry_run {
        return count(
            pools,
            &format!("SELECT COUNT(*) FROM {source} WHERE {filter}"),
            &range(lowest, hi),
        )
        .await;
    }
    // MariaDB cannot read the table it deletes from in a subquery (the view reads
    // ferry_outbox): a derived table, materialised first, lets it.
    let pick = format!("SELECT o.seq FROM {source} WHERE {filter}");
    let sql = if d == Dialect::My {
        format!("DELETE FROM ferry_outbox WHERE seq IN (SELECT seq FROM ({pick}) AS b)")
    } else {
        format!("DELETE FROM ferry_outbox WHERE seq IN ({pick})")
    };
    let step = i64::try_from(batch).unwrap_or(i64::MAX);
    let mut total = 0u64;
    let mut from = lowest;
    while from < hi {
        let to = from.saturating_add(step).min(hi);
        let n = pools.exec(&sql, &range(from, to)).await?;
        total += n;
        from = if n > 0 {
            to
        } else {
            // nothing to delete there (a gap, or rows kept: undelivered, quarantined): go on
            // from the next row, so that a long-kept row does not make every run walk the
            // empty ranges above it
            first_i64(
                pools
                    .rows(
                        "SELECT seq FROM ferry_outbox WHERE seq >= ? ORDER BY seq LIMIT 1",
                        &[Bind::I64(to)],
                    )
                    .await?,
            )
            .unwrap_or(hi)
            .max(to)
        };
        // give concurrent reads and advances a moment between bounded statements
        tokio::task::yield_now().await;
    }
    // exception rows of purged (SENT) intents
    pools
        .exec(
            "DELETE FROM ferry_outbox_exception WHERE state = 'SENT' AND NOT EXISTS \
             (SELECT 1 FROM ferry_outbox o WHERE o.seq = ferry_outbox_exception.seq)",
            &[],
        )
        .await?;
    Ok(total)
}

/// The single count `sql` returns.
async fn count(pools: Pools<'_>, sql: &str, binds: &[Bind]) -> Result<u64, StoreError> {
    Ok(first_i64(pools.rows(sql, binds).await?).map_or(0, |n| n.max(0) as u64))
}

/// The first column of the first row, as an integer (`None`: no row, NULL).
fn first_i64(rows: Vec<Vec<Option<String>>>) -> Option<i64> {
    rows.first()
        .and_then(|r| r[0].as_deref())
        .and_then(|v| v.parse::<i64>().ok())
}

pub(crate) async fn reconcile(
    pools: Pools<'_>,
    mode: DispatchMode,
    req: &ReconcileRequest,
) -> Result<ReconcileReport, StoreError> {
    let d = pools.dialect();
    let (wm_sql, wm_bind) = match req.watermark {
        Watermark::Seq(n) => ("o.seq <= ?".to_string(), Bind::I64(n)),
        Watermark::Time(t) => match d {
            Dialect::Pg => (
                "o.created_at <= to_timestamp(?::int8 / 1000000.0)".to_string(),
                Bind::I64(t),
            ),
            Dialect::My => (
                "o.created_at <= TIMESTAMPADD(MICROSECOND, ?, '1970-01-01 00:00:00')".to_string(),
                Bind::I64(t),
            ),
            Dialect::Lite => ("o.created_at <= ?".to_string(), Bind::I64(t)),
        },
    };
    let consumed = match &req.consumer {
        Some(_) => inbox_exists("o"),
        None => "1 = 0".to_string(),
    };
    // cursor mode: the effective state (exception row, else SENT behind the slot's cursor)
    let table = state_table(mode);
    let class = format!(
        "CASE WHEN {consumed} THEN 'consumed' WHEN o.state = 'QUARANTINED' THEN 'quarantined' \
         WHEN o.state = 'SKIPPED' THEN 'skipped' WHEN o.state = 'SENT' THEN 'published' \
         WHEN o.state = 'CLAIMED' THEN 'unknown' ELSE 'pending' END"
    );
    let sql = format!(
        "SELECT t.class, COUNT(*), MAX({} - t.created_us) FROM \
         (SELECT {class} AS class, {} AS created_us FROM {table} o WHERE {wm_sql}) t GROUP BY t.class",
        d.now_micros(),
        d.micros("o.created_at")
    );
    // binds in text order: now (SQLite only), consumer (in the CASE), watermark
    let mut ordered = Vec::new();
    if d == Dialect::Lite {
        ordered.push(Bind::I64(now_micros()));
    }
    if let Some(c) = &req.consumer {
        ordered.extend(consumer_binds(c));
    }
    ordered.push(wm_bind.clone());
    let mut counts: HashMap<String, (i64, Option<i64>)> = HashMap::new();
    for r in pools.rows(&sql, &ordered).await? {
        let class = r[0].clone().unwrap_or_default();
        let n = r[1].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0);
        let age = r[2]
            .as_deref()
            .and_then(|v| v.parse::<f64>().ok())
            .map(|v| v as i64);
        counts.insert(class, (n, age));
    }
    let get = |k: &str| counts.get(k).map(|c| c.0).unwrap_or(0);
    let mut report = ReconcileReport {
        consumed: get("consumed"),
        quarantined: get("quarantined"),
        skipped: get("skipped"),
        published_awaiting_consumption: get("published"),
        outcome_unknown: get("unknown"),
        not_yet_published: get("pending"),
        oldest_not_published_age_us: counts.get("pending").and_then(|c| c.1),
        ..Default::default()
    };
    report.total = counts.values().map(|c| c.0).sum();
    // list the classes that must be listed, never counted as success
    let list = |state: &'static str| {
        let mut b = Vec::new();
        let mut sql =
            format!("SELECT o.event_id FROM {table} o WHERE o.state = '{state}' AND {wm_sql}");
        b.push(wm_bind.clone());
        if let Some(c) = &req.consumer {
            sql.push_str(" AND NOT ");
            sql.push_str(&inbox_exists("o"));
            b.extend(consumer_binds(c));
        }
        sql.push_str(&format!(" ORDER BY o.seq LIMIT {}", req.list_limit));
        (sql, b)
    };
    let (sql, b) = list("CLAIMED");
    report.unknown_ids = pools
        .rows(&sql, &b)
        .await?
        .into_iter()
        .filter_map(|r| r[0].clone())
        .collect();
    let (sql, b) = list("QUARANTINED");
    report.quarantined_ids = pools
        .rows(&sql, &b)
        .await?
        .into_iter()
        .filter_map(|r| r[0].clone())
        .collect();
    if let Some(bt) = &req.business {
        business(pools, d, bt, req.list_limit, &mut report).await?;
    }
    Ok(report)
}

async fn business(
    pools: Pools<'_>,
    d: Dialect,
    bt: &BusinessTable,
    limit: usize,
    report: &mut ReconcileReport,
) -> Result<(), StoreError> {
    validate_identifier("business table", &bt.table)?;
    validate_identifier("business id column", &bt.id_column)?;
    let (t, c) = (&bt.table, &bt.id_column);
    let mut where_sql = "1 = 1".to_string();
    let mut binds = Vec::new();
    if let Some(max) = bt.max_id {
        where_sql = format!("b.{c} <= ?");
        binds.push(Bind::I64(max));
    }
    let rows = pools
        .rows(
            &format!("SELECT COUNT(*) FROM {t} b WHERE {where_sql}"),
            &binds,
        )
        .await?;
    report.business_rows = rows
        .first()
        .and_then(|r| r[0].as_deref())
        .and_then(|v| v.parse().ok());
    let missing = format!(
        "FROM {t} b WHERE {where_sql} AND NOT EXISTS (SELECT 1 FROM ferry_outbox o WHERE o.aggregate_id = {})",
        d.concat_param_id(&format!("b.{c}"))
    );
    let mut b2 = binds.clone();
    b2.push(Bind::Str(bt.aggregate_prefix.clone()));
    let rows = pools
        .rows(&format!("SELECT COUNT(*) {missing}"), &b2)
        .await?;
    report.business_without_intent = rows
        .first()
        .and_then(|r| r[0].as_deref())
        .and_then(|v| v.parse().ok());
    let rows = pools
        .rows(
            &format!("SELECT b.{c} {missing} ORDER BY b.{c} LIMIT {limit}"),
            &b2,
        )
        .await?;
    report.business_without_intent_ids = rows
        .into_iter()
        .filter_map(|r| r[0].as_deref().and_then(|v| v.parse().ok()))
        .collect();
    Ok(())
}
