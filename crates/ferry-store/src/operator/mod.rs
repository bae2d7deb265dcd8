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
    /// A number or NULL.
    Nullable(Option<i64>),
}

/// Evaluates `$body` once per backend of `$value` (a [`Pools`] or a [`bulk::Conn`], named by
/// `$enum`), with `$x` bound to that backend's pool or connection and `$q` to `$sql` in its
/// placeholders (`?` in bind order; PostgreSQL gets `$n`). A macro: the arms' pool, connection,
/// row and query types differ by driver.
macro_rules! on_backend {
    ($enum:ident, $value:expr, $sql:expr, |$x:ident, $q:ident| $body:expr) => {
        match $value {
            $enum::Pg($x) => {
                let $q = &$crate::dialect::numbered_placeholders($sql);
                $body
            }
            $enum::My($x) => {
                let $q = $sql;
                $body
            }
            $enum::Lite($x) => {
                let $q = $sql;
                $body
            }
        }
    };
}
pub(crate) use on_backend;

impl Pools<'_> {
    /// The rows of `sql`, every column as text (`None` for NULL).
    pub(crate) async fn rows(
        &self,
        sql: &str,
        binds: &[Bind],
    ) -> Result<Vec<Vec<Option<String>>>, StoreError> {
        self.rows_as(sql, binds, "operator query").await
    }

    /// [`Self::rows`], its errors in the context `what`.
    pub(crate) async fn rows_as(
        &self,
        sql: &str,
        binds: &[Bind],
        what: &str,
    ) -> Result<Vec<Vec<Option<String>>>, StoreError> {
        Ok(on_backend!(Pools, *self, sql, |pool, q| {
            let rows = bound(q, binds)
                .fetch_all(pool)
                .await
                .map_err(|e| db_err(what, e))?;
            rows.iter()
                .map(|r| (0..r.len()).map(|i| text_at(r, i)).collect())
                .collect()
        }))
    }

    /// The rows `sql` changed, its errors in the context `what`.
    pub(crate) async fn exec_as(
        &self,
        sql: &str,
        binds: &[Bind],
        what: &str,
    ) -> Result<u64, StoreError> {
        Ok(on_backend!(Pools, *self, sql, |pool, q| {
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
    ///
    /// A transaction the database rolled back to break a deadlock or a lock wait (a purge
    /// beside producers and relays, measured on MariaDB: 3 of 485 runs under load) is run
    /// again, up to [`DELETE_ATTEMPTS`] times: it wrote nothing, and its statement deletes only
    /// what it would have deleted the first time.
    pub(crate) async fn delete_marking(
        &self,
        delete: &str,
        binds: &[Bind],
    ) -> Result<u64, StoreError> {
        retry_conflicts(DELETE_ATTEMPTS, || self.delete_marking_once(delete, binds)).await
    }

    /// One attempt of [`Self::delete_marking`].
    async fn delete_marking_once(&self, delete: &str, binds: &[Bind]) -> Result<u64, StoreError> {
        let d = self.dialect();
        let upsert = if d == Dialect::Pg {
            numbered_placeholders(d.retention_mark_upsert())
        } else {
            d.retention_mark_upsert().to_string()
        };
        let now = now_micros();
        Ok(on_backend!(Pools, *self, delete, |pool, q| {
            let mut tx = pool
                .begin_write_tx()
                .await
                .map_err(|e| db_err("purge: begin", e))?;
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

/// A write transaction on a backend's pool. On SQLite (its impl is beside the write gate, in
/// `sqlite/write_gate.rs`) it is [`crate::sqlite::begin_write`]:
/// `BEGIN IMMEDIATE` behind the file's in-process write gate, so a purge's batches queue in
/// order with the producers' transactions, the claims and the cursor advances of this process.
/// Left to SQLite's busy handler (a plain `BEGIN`), a batch and the writers it met slept in
/// steps of up to 100 ms each time they collided, and every purge run showed as a latency spike
/// of the whole relay (docs/performance.md, "Retention beside the load on SQLite").
pub(crate) trait BeginWrite {
    type Tx;
    fn begin_write_tx(&self) -> impl std::future::Future<Output = Result<Self::Tx, sqlx::Error>>;
}

impl BeginWrite for PgPool {
    type Tx = sqlx::Transaction<'static, sqlx::Postgres>;
    async fn begin_write_tx(&self) -> Result<Self::Tx, sqlx::Error> {
        self.begin().await
    }
}

impl BeginWrite for MySqlPool {
    type Tx = sqlx::Transaction<'static, sqlx::MySql>;
    async fn begin_write_tx(&self) -> Result<Self::Tx, sqlx::Error> {
        self.begin().await
    }
}

/// Column `i` of `r` as text (`None` for NULL): a number, a text, or bytes (MariaDB's binary
/// collation) read as UTF-8.
pub(crate) fn text_at<R: Row>(r: &R, i: usize) -> Option<String>
where
    usize: sqlx::ColumnIndex<R>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i16: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    r.try_get::<Option<i64>, _>(i)
        .or_else(|_| r.try_get::<Option<i32>, _>(i).map(|v| v.map(i64::from)))
        .or_else(|_| r.try_get::<Option<i16>, _>(i).map(|v| v.map(i64::from)))
        .map(|v| v.map(|v| v.to_string()))
        .or_else(|_| r.try_get::<Option<String>, _>(i))
        .or_else(|_| {
            r.try_get::<Option<Vec<u8>>, _>(i)
                .map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned()))
        })
        .unwrap_or(None)
}

/// `sql` with `binds` bound in order.
pub(crate) fn bound<'q, DB: sqlx::Database>(
    sql: &'q str,
    binds: &[Bind],
) -> Query<'q, DB, DB::Arguments<'q>>
where
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<i64>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    binds.iter().fold(sqlx::query(sql), |q, b| match b {
        Bind::I64(v) => q.bind(*v),
        Bind::Str(s) => q.bind(s.clone()),
        Bind::Nullable(v) => q.bind(*v),
    })
}

/// An operator action on a quarantined intent, `target` `PENDING` (requeue: due now, attempts
/// reset) or `SKIPPED`. In cursor dispatch a quarantined intent's state is its exception row.
/// Returns how many rows it changed: one, or none when the intent is not (or no longer)
/// quarantined ([`operator_outcome`]).
pub(crate) async fn operator_update(
    pools: Pools<'_>,
    mode: DispatchMode,
    target: &str,
    event_id: &str,
    operator: &str,
) -> Result<u64, StoreError> {
    let (now, clock) = pools.dialect().now_at();
    let mut binds = vec![Bind::Str(operator.to_string())];
    binds.extend(clock.map(Bind::I64));
    let extra = if target == "PENDING" {
        binds.extend(clock.map(Bind::I64));
        format!(", available_at = {now}, attempts = 0")
    } else {
        String::new()
    };
    binds.push(Bind::Str(event_id.to_string()));
    let (table, which) = match mode {
        DispatchMode::Row => ("ferry_outbox", "event_id = ?"),
        DispatchMode::Cursor => (
            "ferry_outbox_exception",
            "seq = (SELECT seq FROM ferry_outbox WHERE event_id = ?)",
        ),
    };
    let sql = format!(
        "UPDATE {table} SET state = '{target}', resolved_by = ?, resolved_at = {now}, \
         lease_until = NULL{extra} WHERE {which} AND state = 'QUARANTINED'"
    );
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

/// Attempts of a purge batch rolled back by a deadlock or a lock wait ([`Pools::delete_marking`]).
pub(crate) const DELETE_ATTEMPTS: u32 = 5;

/// Runs `attempt` until it succeeds, fails with anything but a conflict
/// ([`StoreErrorKind::Conflict`]: a deadlock, a lock wait or a serialization failure, whose
/// transaction was rolled back), or has failed `attempts` times; 10 ms before the second
/// attempt, doubling.
pub(crate) async fn retry_conflicts<T, F, Fut>(
    attempts: u32,
    mut attempt: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut pause = std::time::Duration::from_millis(10);
    let mut n = 1;
    loop {
        match attempt().await {
            Err(e) if e.kind() == StoreErrorKind::Conflict && n < attempts => {
                tracing::debug!(error = %e, attempt = n, "rolled back by a conflict; running it again");
                tokio::time::sleep(pause).await;
                pause *= 2;
                n += 1;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn err(kind: StoreErrorKind) -> StoreError {
        StoreError::new(kind, "test")
    }

    /// Fails with `kinds` in turn, then returns how many calls it took.
    async fn run(kinds: &[StoreErrorKind], attempts: u32) -> (Result<u32, StoreError>, u32) {
        let calls = AtomicU32::new(0);
        let result = retry_conflicts(attempts, || async {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            match kinds.get(n as usize) {
                Some(k) => Err(err(*k)),
                None => Ok(n + 1),
            }
        })
        .await;
        (result, calls.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn conflicts_are_run_again_and_other_errors_are_not() {
        use StoreErrorKind::{Conflict, Other, Unavailable};
        // two deadlocks, then the batch goes through
        let (r, calls) = run(&[Conflict, Conflict], DELETE_ATTEMPTS).await;
        assert_eq!((r.unwrap(), calls), (3, 3));
        // a conflict every time: the last one is returned, after `attempts` calls
        let (r, calls) = run(&[Conflict; 10], DELETE_ATTEMPTS).await;
        assert_eq!(r.unwrap_err().kind(), Conflict);
        assert_eq!(calls, DELETE_ATTEMPTS);
        // anything else is returned at once: the caller decides (a lost connection may have
        // committed)
        for kind in [Other, Unavailable] {
            let (r, calls) = run(&[Conflict, kind], DELETE_ATTEMPTS).await;
            assert_eq!((r.unwrap_err().kind(), calls), (kind, 2));
        }
    }
}
