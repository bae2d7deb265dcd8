//! The business transaction: the aggregates' rows, each order's version taken from its row,
//! the orders and their outbox intents committed together.
//!
//! The business: `loadgen_aggregates (aggregate_id PRIMARY KEY, ver)` holds one row per
//! aggregate (created up front with `ver` 0); `loadgen_orders` one row per order, i.e. per
//! version of an aggregate. A business transaction first takes each of its orders' versions from
//! the aggregate's row (`ver = ver + 1`, in the orders' order, which producers make random), so
//! it holds that row's lock until it ends, exactly as an application that updates an aggregate
//! and writes its event does; then it inserts the orders and their outbox intents.
use ferry_core::{now_micros, Limits, NewEvent};
use ferry_inbox::InboxPool as Pool;
use ferry_store::Backend;
use sqlx::{Executor, MySql, QueryBuilder, Sqlite};

use super::shape::Order;
use crate::on_inbox;

/// `sql` with `?` placeholders in `pool`'s dialect.
pub fn dialect<'a>(pool: &Pool, sql: &'a str) -> std::borrow::Cow<'a, str> {
    crate::placeholder(sql, matches!(pool, Pool::Postgres(_)))
}

/// Rows per multi-row business insert (6 placeholders per row, far below SQLite's 32,766).
const CHUNK: usize = 1000;

/// What went wrong with one business transaction.
#[derive(Debug)]
pub enum TxError {
    /// Failed before COMMIT: rolled back, nothing written (its versions were rolled back too);
    /// why, and the error.
    RolledBack(Rollback, String),
    /// COMMIT itself failed: the transaction may or may not have committed.
    Unknown(String),
}

/// Why a business transaction rolled back before its COMMIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rollback {
    /// The database broke a lock cycle and chose this transaction (PostgreSQL `40P01`,
    /// MariaDB 1213): two transactions locked aggregates in opposite orders.
    Deadlock,
    /// A lock wait timed out (PostgreSQL `55P03`, MariaDB 1205) or SQLite was busy.
    LockWait,
    /// Another conflict the database asks to retry (serialization failure, MariaDB 1020).
    Conflict,
    /// Anything else: a lost connection, a failed statement.
    Other,
}

impl Rollback {
    /// Deadlocks, lock waits and other conflicts: contention, expected with shared aggregates.
    pub fn is_contention(self) -> bool {
        self != Rollback::Other
    }

    /// The kind of a failed statement.
    fn of(e: &sqlx::Error) -> Self {
        let sqlx::Error::Database(d) = e else {
            return Rollback::Other;
        };
        let code = match d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
            Some(my) => my.number().to_string(),
            None => d.code().map(|c| c.to_string()).unwrap_or_default(),
        };
        match code.as_str() {
            "40P01" | "1213" => Rollback::Deadlock,
            // SQLite: BUSY, LOCKED, BUSY_SNAPSHOT
            "55P03" | "1205" | "5" | "6" | "517" => Rollback::LockWait,
            "40001" | "1020" => Rollback::Conflict,
            _ => Rollback::Other,
        }
    }

    /// The kind of a failed enqueue, from its message (`EnqueueError` keeps no error code):
    /// on MariaDB the outbox's commit-gate trigger takes locks too.
    fn of_message(msg: &str) -> Self {
        let m = msg.to_ascii_lowercase();
        if m.contains("deadlock") {
            Rollback::Deadlock
        } else if m.contains("lock wait timeout") || m.contains("lock timeout") {
            Rollback::LockWait
        } else {
            Rollback::Other
        }
    }
}

/// The orders; `UNIQUE (aggregate_id, aggregate_version)`: one order per version (and the index
/// of the version checks after the run).
const ORDERS_DDL: &str = "CREATE TABLE IF NOT EXISTS loadgen_orders (order_id BIGINT PRIMARY KEY, \
    aggregate_id VARCHAR(255) NOT NULL, aggregate_version BIGINT NOT NULL, \
    amount_cents BIGINT NOT NULL, status VARCHAR(16) NOT NULL, created_at_us BIGINT NOT NULL, \
    UNIQUE (aggregate_id, aggregate_version))";
/// SQLite: `INTEGER PRIMARY KEY` makes the order id the rowid.
const ORDERS_DDL_SQLITE: &str = "CREATE TABLE IF NOT EXISTS loadgen_orders (order_id INTEGER \
    PRIMARY KEY, aggregate_id TEXT NOT NULL, aggregate_version INTEGER NOT NULL, \
    amount_cents INTEGER NOT NULL, status TEXT NOT NULL, created_at_us INTEGER NOT NULL, \
    UNIQUE (aggregate_id, aggregate_version))";
/// The aggregates' business rows: `ver` is the last version handed out. They also count their
/// handoffs as versions are taken (`last_producer`: the producer that took `ver`, -1 before
/// any; `handoffs`: successive versions taken by different producers), so the count holds when
/// `--fold-orders` has deleted old orders; a rolled-back transaction's update rolls back with
/// it.
const AGGREGATES_DDL: &str = "CREATE TABLE IF NOT EXISTS loadgen_aggregates \
    (aggregate_id VARCHAR(255) PRIMARY KEY, ver BIGINT NOT NULL, \
     last_producer INT NOT NULL DEFAULT -1, handoffs BIGINT NOT NULL DEFAULT 0)";
const AGGREGATES_DDL_SQLITE: &str = "CREATE TABLE IF NOT EXISTS loadgen_aggregates \
    (aggregate_id TEXT PRIMARY KEY, ver INTEGER NOT NULL, \
     last_producer INTEGER NOT NULL DEFAULT -1, handoffs INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID";
/// What `--fold-orders` deleted from `loadgen_orders`, per aggregate: how many orders, their
/// lowest and highest version, and the sums of their versions and of their squares (with the
/// live rows' own, the version check's `1..=n` holds exactly as on the whole table: see
/// `check::VERSION_CHECK_FOLDED`). 38 digits hold the sum of squares of a billion versions.
const FOLDED_DDL: &str = "CREATE TABLE IF NOT EXISTS loadgen_orders_folded \
    (aggregate_id VARCHAR(255) PRIMARY KEY, n BIGINT NOT NULL, lo BIGINT NOT NULL, \
     hi BIGINT NOT NULL, vsum DECIMAL(38, 0) NOT NULL, vsq DECIMAL(38, 0) NOT NULL)";
/// SQLite's 64-bit integers hold the sums exactly up to about three million versions of one
/// aggregate (`SUM` fails on an overflow, it never wraps).
const FOLDED_DDL_SQLITE: &str = "CREATE TABLE IF NOT EXISTS loadgen_orders_folded \
    (aggregate_id TEXT PRIMARY KEY, n INTEGER NOT NULL, lo INTEGER NOT NULL, \
     hi INTEGER NOT NULL, vsum INTEGER NOT NULL, vsq INTEGER NOT NULL) WITHOUT ROWID";
/// Business rows created per statement (a million: about 4 s on PostgreSQL, 2.5 s on MariaDB).
const AGGREGATE_ROWS_PER_STATEMENT: u64 = 1_000_000;
/// PostgreSQL: one statement takes every version of a transaction, aggregate after aggregate in
/// the order given, each `UPDATE` holding its row's lock until the transaction ends (one round
/// trip instead of one per order; the transaction's id is taken by the first `UPDATE`, before
/// any later one waits for a lock).
///
/// It also bounds each of its lock waits at 20 ms (`lock_timeout`, only while it runs: the
/// rest of the transaction, COMMIT's lock for NOTIFY included, waits as long as it must).
/// PostgreSQL looks for a deadlock only after `deadlock_timeout` (1 s by default, and only a
/// superuser may lower it), and meanwhile every producer that needs one of the cycle's rows
/// queues behind it. Measured (debug build, 8 producers, 10 orders per transaction) on 200
/// aggregates at 4,000 ev/s asked: 103 ev/s committed without a bound, about 1,000 with
/// 100 ms, 3,666 with 20 ms (220 waits timed out and retried); on 20 aggregates flat out
/// 107 ev/s with 100 ms, 640 with 20 ms, 1,121 with 10 ms; MariaDB, which finds deadlocks at
/// once, 2,634. 10 ms aborted three times as many waits in a line for one hot row (a
/// preload's single aggregate: 13 timeouts against 4) for no deadlock at all. Waits shorter
/// than the bound, the ones that reorder transaction ids and commits, still happen.
const TAKE_VERSIONS_PG: &str = r#"CREATE OR REPLACE FUNCTION loadgen_take_versions(ids text[], producer int4)
RETURNS int8[] LANGUAGE plpgsql SET lock_timeout = '20ms' AS $f$
DECLARE
  vers int8[] := '{}';
  a text;
  v int8;
BEGIN
  FOREACH a IN ARRAY ids LOOP
    UPDATE loadgen_aggregates SET ver = ver + 1,
      handoffs = handoffs + CASE WHEN last_producer >= 0 AND last_producer <> producer THEN 1 ELSE 0 END,
      last_producer = producer
      WHERE aggregate_id = a RETURNING ver INTO v;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'loadgen: aggregate % has no row in loadgen_aggregates', a;
    END IF;
    vers := vers || v;
  END LOOP;
  RETURN vers;
END
$f$"#;
/// SQLite (3.35+ has `RETURNING`; the bundled one is 3.46): `?1` the aggregate, `?2` the
/// producer (every `SET` reads the row as it was before the update).
const TAKE_VERSION_SQLITE: &str = "UPDATE loadgen_aggregates SET ver = ver + 1, \
    handoffs = handoffs + (last_producer >= 0 AND last_producer <> ?2), last_producer = ?2 \
    WHERE aggregate_id = ?1 RETURNING ver";
/// MariaDB has no `UPDATE … RETURNING`: `LAST_INSERT_ID(expr)` hands the new value back in the
/// statement's OK packet (`last_insert_id`), so it still takes one round trip. Binds: the
/// producer twice, then the aggregate. MariaDB assigns left to right, each `SET` reading the
/// values the ones before it wrote: `handoffs` reads `last_producer` before it is replaced.
const TAKE_VERSION_MYSQL: &str = "UPDATE loadgen_aggregates SET ver = LAST_INSERT_ID(ver + 1), \
    handoffs = handoffs + (last_producer >= 0 AND last_producer <> ?), last_producer = ? \
    WHERE aggregate_id = ?";
const INSERT_ORDERS: &str = "INSERT INTO loadgen_orders (order_id, aggregate_id, \
    aggregate_version, amount_cents, status, created_at_us) ";

/// Multi-row `INSERT`s of `orders` into `loadgen_orders` on `$conn` (MySQL and SQLite; the
/// PostgreSQL producer inserts from arrays in one statement).
macro_rules! insert_orders {
    ($db:ty, $conn:expr, $orders:expr, $now:expr) => {
        async {
            for chunk in $orders.chunks(CHUNK) {
                let mut qb: QueryBuilder<$db> = QueryBuilder::new(INSERT_ORDERS);
                qb.push_values(chunk, |mut b, o| {
                    b.push_bind(o.order_id)
                        .push_bind(&o.aggregate_id)
                        .push_bind(o.version)
                        .push_bind(o.amount_cents)
                        .push_bind(o.status())
                        .push_bind($now);
                });
                qb.build().execute($conn).await?;
            }
            Ok::<(), sqlx::Error>(())
        }
        .await
    };
}

/// The business transaction. First each order takes its version from its aggregate's row
/// (`ver = ver + 1`, in the order of `orders`: the row stays locked until the transaction
/// ends, and a transaction that waits for a row another one holds may deadlock with it);
/// then the order rows and their outbox intents (`intents` makes them from the numbered
/// orders) are inserted, so all of it commits or none. After a successful COMMIT, or a
/// failed one that did commit, `orders` carry the versions that committed; after a rollback
/// their versions never existed (the `UPDATE`s rolled back too).
pub async fn commit(
    pool: &Pool,
    orders: &mut [Order],
    intents: &(dyn Fn(&[Order]) -> Vec<NewEvent> + Sync),
) -> Result<(), TxError> {
    let (limits, now) = (Limits::default(), now_micros());
    let rb = |e: sqlx::Error| TxError::RolledBack(Rollback::of(&e), e.to_string());
    macro_rules! business_tx {
        ($begin:expr, $store:ident, $tx:ident => $take:expr, $insert:expr) => {{
            let mut $tx = $begin.await.map_err(rb)?;
            $take.map_err(rb)?;
            $insert.map_err(rb)?;
            let events = intents(orders);
            ferry_store::$store::enqueue_many(&mut $tx, &events, &limits)
                .await
                .map_err(|e| {
                    let msg = e.to_string();
                    TxError::RolledBack(Rollback::of_message(&msg), msg)
                })?;
            $tx.commit()
                .await
                .map_err(|e| TxError::Unknown(e.to_string()))
        }};
    }
    match pool {
        Pool::Postgres(p) => business_tx!(p.begin(), postgres, tx =>
            take_versions_pg(&mut tx, orders).await, sqlx::query(
            "INSERT INTO loadgen_orders (order_id, aggregate_id, aggregate_version, amount_cents, status, created_at_us) \
             SELECT o.*, $6::int8 FROM UNNEST($1::int8[], $2::text[], $3::int8[], $4::int8[], $5::text[]) AS o",
        )
        .bind(orders.iter().map(|o| o.order_id).collect::<Vec<_>>())
        .bind(orders.iter().map(|o| o.aggregate_id.clone()).collect::<Vec<_>>())
        .bind(orders.iter().map(|o| o.version).collect::<Vec<_>>())
        .bind(orders.iter().map(|o| o.amount_cents).collect::<Vec<_>>())
        .bind(orders.iter().map(|o| o.status()).collect::<Vec<_>>())
        .bind(now)
        .execute(&mut *tx)
        .await),
        Pool::Mysql(p) => business_tx!(p.begin(), mysql, tx =>
            take_versions_mysql(&mut tx, orders).await,
            insert_orders!(MySql, &mut *tx, orders, now)),
        // IMMEDIATE (taken up front, so no deferred read→write upgrade fails with
        // SQLITE_BUSY) behind the in-process write gate the relay's claims and acks queue
        // on too: one writer, so SQLite's producers take turns and never deadlock.
        Pool::Sqlite(p) => business_tx!(ferry_store::sqlite::begin_write(p), sqlite, tx =>
            take_versions_sqlite(&mut tx, orders).await,
            insert_orders!(Sqlite, &mut *tx, orders, now)),
    }
}

/// Whether order `order_id` exists: resolves a transaction whose COMMIT outcome was lost
/// (the order row and its intents commit together).
pub async fn order_exists(pool: &Pool, order_id: i64) -> sqlx::Result<bool> {
    let stmt = dialect(
        pool,
        "SELECT COUNT(*) FROM loadgen_orders WHERE order_id = ?",
    );
    let n: i64 = on_inbox!(InboxPool, pool, p => sqlx::query_scalar(&stmt).bind(order_id).fetch_one(p).await)?;
    Ok(n > 0)
}

/// Creates `loadgen_orders`, `loadgen_aggregates`, `loadgen_orders_folded` (PostgreSQL: and
/// `loadgen_take_versions`) and the business rows of aggregates `0..aggregates` of run `run`.
pub async fn create_tables(
    pool: &Pool,
    kind: Backend,
    run: &str,
    aggregates: u64,
) -> sqlx::Result<()> {
    let ddl = match kind {
        Backend::Sqlite => vec![
            ORDERS_DDL_SQLITE.to_string(),
            AGGREGATES_DDL_SQLITE.to_string(),
            FOLDED_DDL_SQLITE.to_string(),
        ],
        Backend::Mysql => vec![
            format!("{ORDERS_DDL} ENGINE = InnoDB"),
            format!("{AGGREGATES_DDL} ENGINE = InnoDB"),
            format!("{FOLDED_DDL} ENGINE = InnoDB"),
        ],
        Backend::Postgres => vec![
            ORDERS_DDL.to_string(),
            AGGREGATES_DDL.to_string(),
            FOLDED_DDL.to_string(),
            TAKE_VERSIONS_PG.to_string(),
        ],
    };
    for stmt in ddl {
        on_inbox!(InboxPool, pool, p => p.execute(stmt.as_str()).await.map(drop))?;
    }
    create_aggregates(pool, run, aggregates).await
}

/// `aggregate`'s business row is missing (a setup fault: every row is created before the run).
fn no_row(aggregate: &str) -> sqlx::Error {
    sqlx::Error::Protocol(format!(
        "aggregate {aggregate} has no row in loadgen_aggregates"
    ))
}

/// PostgreSQL: every order's version in one call of `loadgen_take_versions` (see
/// [`TAKE_VERSIONS_PG`]).
async fn take_versions_pg(conn: &mut sqlx::PgConnection, orders: &mut [Order]) -> sqlx::Result<()> {
    let ids: Vec<&str> = orders.iter().map(|o| o.aggregate_id.as_str()).collect();
    // every order of a transaction comes from one producer (`Ids::order`)
    let producer = orders.first().map_or(0, |o| (o.order_id >> 40) as i32);
    let versions: Vec<i64> = sqlx::query_scalar("SELECT loadgen_take_versions($1, $2)")
        .bind(&ids)
        .bind(producer)
        .fetch_one(conn)
        .await?;
    if versions.len() != orders.len() {
        return Err(sqlx::Error::Protocol(format!(
            "loadgen_take_versions returned {} versions for {} orders",
            versions.len(),
            orders.len()
        )));
    }
    for (o, v) in orders.iter_mut().zip(versions) {
        o.version = v;
    }
    Ok(())
}

/// MariaDB: one `UPDATE` per order, its new `ver` read from the OK packet.
async fn take_versions_mysql(
    conn: &mut sqlx::MySqlConnection,
    orders: &mut [Order],
) -> sqlx::Result<()> {
    for o in orders.iter_mut() {
        let producer = o.order_id >> 40;
        let r = sqlx::query(TAKE_VERSION_MYSQL)
            .bind(producer)
            .bind(producer)
            .bind(&o.aggregate_id)
            .execute(&mut *conn)
            .await?;
        if r.rows_affected() != 1 {
            return Err(no_row(&o.aggregate_id));
        }
        o.version = r.last_insert_id() as i64;
    }
    Ok(())
}

/// SQLite: one `UPDATE … RETURNING` per order (in-process: no network round trip).
async fn take_versions_sqlite(
    conn: &mut sqlx::SqliteConnection,
    orders: &mut [Order],
) -> sqlx::Result<()> {
    for o in orders.iter_mut() {
        let v: Option<i64> = sqlx::query_scalar(TAKE_VERSION_SQLITE)
            .bind(&o.aggregate_id)
            .bind(o.order_id >> 40)
            .fetch_optional(&mut *conn)
            .await?;
        o.version = v.ok_or_else(|| no_row(&o.aggregate_id))?;
    }
    Ok(())
}

/// Creates the business rows (`ver` 0) of aggregates `0..n` of run `run`, with the ids
/// [`Ids::aggregate`](super::shape::Ids::aggregate) gives them, at most
/// [`AGGREGATE_ROWS_PER_STATEMENT`] per statement.
async fn create_aggregates(pool: &Pool, run: &str, n: u64) -> sqlx::Result<()> {
    let mut lo = 0;
    while lo < n {
        let hi = (lo + AGGREGATE_ROWS_PER_STATEMENT).min(n) - 1;
        let (lo_i, hi_i) = (lo as i64, hi as i64);
        match pool {
            Pool::Postgres(p) => {
                sqlx::query(
                    "INSERT INTO loadgen_aggregates (aggregate_id, ver) \
                     SELECT 'lg-' || $1 || '-a' || g, 0 FROM generate_series($2::int8, $3::int8) AS g",
                )
                .bind(run)
                .bind(lo_i)
                .bind(hi_i)
                .execute(p)
                .await?;
            }
            // the Sequence engine's virtual tables (built into MariaDB since 10.1)
            Pool::Mysql(p) => {
                let stmt = format!(
                    "INSERT INTO loadgen_aggregates (aggregate_id, ver) \
                     SELECT CONCAT('lg-', ?, '-a', seq), 0 FROM seq_{lo}_to_{hi}"
                );
                sqlx::query(&stmt).bind(run).execute(p).await?;
            }
            Pool::Sqlite(p) => {
                sqlx::query(
                    "WITH RECURSIVE s(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM s WHERE i < ?) \
                     INSERT INTO loadgen_aggregates (aggregate_id, ver) \
                     SELECT 'lg-' || ? || '-a' || i, 0 FROM s",
                )
                .bind(lo_i)
                .bind(hi_i)
                .bind(run)
                .execute(p)
                .await?;
            }
        }
        lo = hi + 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::shape::Ids;

    fn order(aggregate_id: &str) -> Order {
        Order {
            order_id: 0,
            aggregate_id: aggregate_id.to_string(),
            version: 0,
            amount_cents: 100,
        }
    }

    #[tokio::test]
    async fn versions_come_from_the_rows_and_roll_back_with_the_transaction() {
        let p = crate::memory_sqlite().await;
        p.execute(AGGREGATES_DDL_SQLITE).await.unwrap();
        let pool = Pool::Sqlite(p.clone());
        create_aggregates(&pool, "abc123", 5).await.unwrap();
        // the rows carry the ids the producers use
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT aggregate_id FROM loadgen_aggregates ORDER BY ver, aggregate_id",
        )
        .fetch_all(&p)
        .await
        .unwrap();
        let run = Ids {
            run: "abc123".into(),
        };
        let mut want: Vec<String> = (0..5).map(|i| run.aggregate(i)).collect();
        want.sort();
        assert_eq!(ids, want);
        let take = |aggs: &[usize]| {
            aggs.iter()
                .map(|a| order(&run.aggregate(*a)))
                .collect::<Vec<_>>()
        };
        // a transaction that rolls back: its versions never existed
        let mut orders = take(&[3, 1, 3]);
        let mut tx = p.begin().await.unwrap();
        take_versions_sqlite(&mut tx, &mut orders).await.unwrap();
        assert_eq!(
            orders.iter().map(|o| o.version).collect::<Vec<_>>(),
            [1, 1, 2]
        );
        tx.rollback().await.unwrap();
        // the retry takes the same versions again, and they commit
        let mut tx = p.begin().await.unwrap();
        take_versions_sqlite(&mut tx, &mut orders).await.unwrap();
        assert_eq!(
            orders.iter().map(|o| o.version).collect::<Vec<_>>(),
            [1, 1, 2]
        );
        tx.commit().await.unwrap();
        let mut orders = take(&[1]);
        let mut tx = p.begin().await.unwrap();
        take_versions_sqlite(&mut tx, &mut orders).await.unwrap();
        assert_eq!(orders[0].version, 2);
        // an aggregate without a row is a setup fault, not a version 0
        let mut orders = take(&[5]);
        let e = take_versions_sqlite(&mut tx, &mut orders)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no row"), "{e}");
        tx.rollback().await.unwrap();
        p.close().await;
    }

    /// Through the business transaction on `backend`: producers 1, 1, 2, 1 commit versions
    /// 1..=4 of one aggregate, two handoffs; producer 3's transaction then rolls back (its
    /// intent is refused) and counts nothing.
    async fn rows_count_the_handoffs_between_producers(db: crate::TestDb) {
        let backend = db.backend;
        let pool = Pool::connect(&db.url, 2).await.unwrap();
        create_tables(&pool, backend, "h", 1).await.unwrap();
        let agg = Ids { run: "h".into() }.aggregate(0);
        let intent = |empty_topic: bool| {
            move |orders: &[Order]| {
                let ids = Ids { run: "h".into() };
                let o = &orders[0];
                let topic = if empty_topic { "" } else { "t" };
                vec![crate::workload::shape::event(
                    &ids,
                    0,
                    o.order_id as u64,
                    o,
                    topic,
                    128,
                )]
            }
        };
        for (producer, n) in [(1, 0), (1, 1), (2, 0), (1, 2)] {
            let mut orders = [Order {
                order_id: Ids::order(producer, n),
                ..order(&agg)
            }];
            commit(&pool, &mut orders, &intent(false)).await.unwrap();
        }
        let mut orders = [Order {
            order_id: Ids::order(3, 0),
            ..order(&agg)
        }];
        let e = commit(&pool, &mut orders, &intent(true)).await.unwrap_err();
        assert!(matches!(e, TxError::RolledBack(..)), "{e:?}");
        let row: (i64, i32, i64) = on_inbox!(InboxPool, &pool, p => sqlx::query_as(
            "SELECT ver, last_producer, handoffs FROM loadgen_aggregates",
        )
        .fetch_one(p)
        .await)
        .unwrap();
        assert_eq!(row, (4, 1, 2), "{backend:?}");
    }

    crate::backend_tests!(rows_count_the_handoffs_between_producers);

    #[test]
    fn rollbacks_are_classified() {
        for (msg, want) in [
            ("error returned from database: 1213 (40001): Deadlock found when trying to get lock", Rollback::Deadlock),
            ("deadlock detected", Rollback::Deadlock),
            ("Lock wait timeout exceeded; try restarting transaction", Rollback::LockWait),
            ("payload is not valid JSON", Rollback::Other),
        ] {
            assert_eq!(Rollback::of_message(msg), want, "{msg}");
        }
        assert!(!Rollback::Other.is_contention());
        assert!(Rollback::Deadlock.is_contention() && Rollback::LockWait.is_contention());
    }
}
