//! Operator queries shared by the SQL backends: retention (purge), reconciliation, and the
//! requeue or skip of a quarantined intent.
//!
//! The statements differ only in placeholders, clocks and string concatenation, so they are
//! written once against a small [`Dialect`](crate::dialect::Dialect); [`Pools`] runs them on
//! the right pool. Purge and reconcile are in [`purge`] and [`reconcile`].
use ferry_core::{now_micros, DispatchMode, StoreError, StoreErrorKind};
use sqlx::query::Query;
use sqlx::{MySqlPool, PgPool, Row, SqlitePool};

use crate::dialect::{numbered_placeholders, Dialect};
use crate::error::db_err;

pub(crate) mod bulk;
pub(crate) mod pause;
pub(crate) mod purge;
pub(crate) mod reconcile;
pub(crate) mod replay;

/// A borrowed pool of one backend.
#[derive(Clone, Copy)]
pub(crate) enum Pools<'a> {
    Pg(&'a PgPool),
    My(&'a MySqlPool),
    Lite(&'a SqlitePool),
}

/// A bind value.
#[derive(Debug, Clone)]
pub(crate) enum Bind {
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
                let $q = &numbered_placeholders($sql);
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
    pub(crate) async fn rows(
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
    pub(crate) async fn exec(&self, sql: &str, binds: &[Bind]) -> Result<u64, StoreError> {
        self.exec_as(sql, binds, "operator statement").await
    }

    /// [`Self::exec`], its errors in the context `what`.
    pub(crate) async fn exec_as(
        &self,
        sql: &str,
        binds: &[Bind],
        what: &str,
    ) -> Result<u64, StoreError> {
        Ok(on_pool!(*self, sql, |pool, q| {
            bound(q, binds)
                .execute(pool)
                .await
                .map_err(|e| db_err(what, e))?
                .rows_affected()
        }))
    }

    /// Runs `delete` (a `DELETE … RETURNING topic, <created_at in µs>`) and raises each
    /// deleted topic's retention watermark (`ferry_retention_mark`, never lowered) in the same
    /// transaction: a row is never gone without its watermark covering it, whatever crashes.
    /// Returns the rows deleted.
    pub(crate) async fn delete_marking(
        &self,
        delete: &str,
        binds: &[Bind],
    ) -> Result<u64, StoreError> {
        let d = self.dialect();
        let upsert = if d == Dialect::Pg {
            numbered_placeholders(d.retention_mark_upsert())
        } else {
            d.retention_mark_upsert().to_string()
        };
        let now = now_micros();
        Ok(on_pool!(*self, delete, |pool, q| {
            let mut tx = pool.begin().await.map_err(|e| db_err("purge: begin", e))?;
            let rows = bound(q, binds)
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| db_err("purge: delete", e))?;
            let mut newest: std::collections::BTreeMap<String, i64> = Default::default();
            for r in &rows {
                // MariaDB returns a binary-collated column of RETURNING as VARBINARY
                let topic: String = r
                    .try_get::<String, _>(0)
                    .or_else(|_| {
                        r.try_get::<Vec<u8>, _>(0)
                            .map(|b| String::from_utf8_lossy(&b).into_owned())
                    })
                    .map_err(|e| db_err("purge: deleted row", e))?;
                let created: i64 = r.try_get(1).map_err(|e| db_err("purge: deleted row", e))?;
                let e = newest.entry(topic).or_insert(created);
                *e = (*e).max(created);
            }
            for (topic, created) in newest {
                bound(
                    &upsert,
                    &[Bind::Str(topic), Bind::I64(created), Bind::I64(now)],
                )
                .execute(&mut *tx)
                .await
                .map_err(|e| db_err("purge: retention mark", e))?;
            }
            tx.commit().await.map_err(|e| db_err("purge: commit", e))?;
            rows.len() as u64
        }))
    }

    pub(crate) fn dialect(&self) -> Dialect {
        match self {
            Pools::Pg(_) => Dialect::Pg,
            Pools::My(_) => Dialect::My,
            Pools::Lite(_) => Dialect::Lite,
        }
    }
}

/// `sql` with `binds` bound in order.
pub(crate) fn bound<'q, DB: sqlx::Database>(
    sql: &'q str,
    binds: &[Bind],
) -> Query<'q, DB, DB::Arguments<'q>>
where
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    binds.iter().fold(sqlx::query(sql), |q, b| match b {
        Bind::I64(v) => q.bind(*v),
        Bind::Str(s) => q.bind(s.clone()),
    })
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
    Err(crate::error::not_quarantined(event_id, record.await?))
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
pub(crate) fn inbox_exists(q: &str) -> String {
    format!(
        "(EXISTS (SELECT 1 FROM ferry_inbox i WHERE i.consumer = ? AND i.event_id = {q}.event_id) \
         OR EXISTS (SELECT 1 FROM ferry_inbox_aggregate a WHERE a.consumer = ? \
         AND a.aggregate_id = {q}.aggregate_id AND a.applied_upto >= {q}.aggregate_version))"
    )
}

/// The binds of one [`inbox_exists`].
pub(crate) fn consumer_binds(consumer: &str) -> [Bind; 2] {
    [
        Bind::Str(consumer.to_string()),
        Bind::Str(consumer.to_string()),
    ]
}

/// The single count `sql` returns.
pub(crate) async fn count(pools: Pools<'_>, sql: &str, binds: &[Bind]) -> Result<u64, StoreError> {
    Ok(first_i64(pools.rows(sql, binds).await?).map_or(0, |n| n.max(0) as u64))
}

/// The first column of the first row, as an integer (`None`: no row, NULL).
pub(crate) fn first_i64(rows: Vec<Vec<Option<String>>>) -> Option<i64> {
    rows.first()
        .and_then(|r| r[0].as_deref())
        .and_then(|v| v.parse::<i64>().ok())
}

/// The three writes of [`ferry_core::OperatorActions`] (enqueue, requeue, skip) for an
/// `impl OperatorActions` block of a store with a `limits` field and an inherent
/// `async fn operator_update(&self, event_id, operator, target)`: an enqueue runs in a
/// transaction of the store's own (`self.$begin()`, committed by `$commit`), requeue and skip are
/// one fenced operator update each. A macro, not a blanket impl: `OperatorActions` belongs to
/// ferry-core (the orphan rule), as [`crate::outcome::row_outcomes`] explains.
macro_rules! operator_writes {
    ($($begin:ident).+, $commit:path) => {
        fn enqueue<'a>(
            &'a self,
            events: &'a [ferry_core::NewEvent],
        ) -> ferry_core::BoxFuture<'a, Result<Vec<String>, ferry_core::EnqueueError>> {
            Box::pin($crate::enqueue::enqueue_in_own_tx(
                events,
                &self.limits,
                self.$($begin).+(),
                $commit,
            ))
        }

        fn requeue<'a>(
            &'a self,
            req: &'a ferry_core::OperatorAction<'a>,
        ) -> ferry_core::BoxFuture<'a, Result<(), ferry_core::StoreError>> {
            Box::pin(self.operator_update(req.event_id, req.operator, "PENDING"))
        }

        fn skip<'a>(
            &'a self,
            req: &'a ferry_core::OperatorAction<'a>,
        ) -> ferry_core::BoxFuture<'a, Result<(), ferry_core::StoreError>> {
            Box::pin(self.operator_update(req.event_id, req.operator, "SKIPPED"))
        }
    };
}
pub(crate) use operator_writes;
