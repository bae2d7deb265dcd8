//! What the business rows say about the versions the producers committed, and folding old
//! orders away under retention.
use ferry_inbox::InboxPool as Pool;
use serde::Serialize;

use crate::on_inbox;

/// What the business rows say about the versions the run committed (read after the drain).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VersionCheck {
    /// Aggregates with at least one committed order.
    pub aggregates_touched: u64,
    /// Of those, aggregates whose versions were committed by two or more producers.
    pub aggregates_shared: u64,
    /// Successive versions v(n), v(n+1) of one aggregate committed by different producers: each
    /// one a row lock handed from one producer's transaction to another's.
    pub handoffs: u64,
    /// Aggregates whose committed versions are not exactly `1..=n` with `n` = the business
    /// row's `ver` (a rolled-back transaction's version that survived, or one lost). Must be 0.
    pub version_mismatches: u64,
    /// PostgreSQL: successive versions whose outbox rows carry inverted transaction ids (the
    /// later version's transaction took its id first, then waited for the earlier one's row
    /// lock): what an order key fixed before the aggregate's lock gets wrong. `None` elsewhere.
    pub xid_inversions: Option<u64>,
}

/// PostgreSQL and SQLite: per touched aggregate (`ver > 0`), its orders, live and what
/// [`fold_orders`] moved to `loadgen_orders_folded`, against its business row. An aggregate
/// passes when its orders number `ver`, span `1..=ver` and their versions sum to `ver(ver+1)/2`
/// and their squares to `ver(ver+1)(2ver+1)/6`: a set of `ver` versions within `1..=ver` is
/// exactly `1..=ver`, and a version counted twice (live and folded) or missing changes the
/// count or a sum. An aggregate is shared when it has a handoff (the business row counts them
/// as versions are taken): two producers among its successive versions make at least one pair
/// of successive versions differ. (`CAST … AS NUMERIC`: exact on PostgreSQL, an integer on
/// SQLite.) The orders are grouped on their own, then joined: on 4,000,000 orders PostgreSQL
/// ran this in 2.1–2.4 s, and the same grouped over the join with the business rows in 4.1–4.3 s.
const VERSION_CHECK_FOLDED: &str = "SELECT COUNT(*), COUNT(CASE WHEN a.handoffs > 0 THEN 1 END), \
      COUNT(CASE WHEN t.n IS NULL OR t.n <> a.ver OR t.lo <> 1 OR t.hi <> a.ver \
        OR t.vsum <> CAST(a.ver AS NUMERIC) * (a.ver + 1) / 2 \
        OR t.vsq <> CAST(a.ver AS NUMERIC) * (a.ver + 1) * (2 * a.ver + 1) / 6 THEN 1 END), \
      CAST(COALESCE(SUM(a.handoffs), 0) AS BIGINT) \
    FROM loadgen_aggregates a LEFT JOIN (SELECT aggregate_id, CAST(SUM(n) AS BIGINT) AS n, \
      MIN(lo) AS lo, MAX(hi) AS hi, SUM(vsum) AS vsum, SUM(vsq) AS vsq FROM ( \
        SELECT aggregate_id, COUNT(*) AS n, MIN(aggregate_version) AS lo, \
          MAX(aggregate_version) AS hi, SUM(CAST(aggregate_version AS NUMERIC)) AS vsum, \
          SUM(CAST(aggregate_version AS NUMERIC) * aggregate_version) AS vsq \
        FROM loadgen_orders GROUP BY aggregate_id \
        UNION ALL SELECT aggregate_id, n, lo, hi, vsum, vsq FROM loadgen_orders_folded) u \
      GROUP BY aggregate_id) t ON t.aggregate_id = a.aggregate_id \
    WHERE a.ver > 0";
/// MariaDB: [`VERSION_CHECK_FOLDED`], with the live orders grouped over the join (one index
/// range of the orders per business row: MariaDB planned a join to the orders grouped on their
/// own as a derived table with no key, minutes for 100,000 aggregates), then the folded ones
/// joined by their primary key. Grouped by the business row's key alone with `ORDER BY NULL`,
/// the rows stream in key order: grouped by more columns, MariaDB built a temporary table
/// that, on 4,000,000 orders of 100,000 aggregates, took 89–94 s against 5.2 s for this
/// statement (the two it replaced, without the fold: 5–6 s and 16 s). The lower of two bounds
/// either of which may be NULL is written with `CASE`; `DECIMAL(38, 0)` sums exactly.
const VERSION_CHECK_MYSQL: &str = "SELECT COUNT(*), COUNT(CASE WHEN t.handoffs > 0 THEN 1 END), \
      COUNT(CASE WHEN t.n + COALESCE(f.n, 0) <> t.ver \
        OR COALESCE(CASE WHEN f.lo < t.lo THEN f.lo ELSE t.lo END, f.lo) <> 1 \
        OR COALESCE(CASE WHEN f.hi > t.hi THEN f.hi ELSE t.hi END, f.hi) <> t.ver \
        OR COALESCE(t.vsum, 0) + COALESCE(f.vsum, 0) \
          <> CAST(t.ver AS DECIMAL(38, 0)) * (t.ver + 1) / 2 \
        OR COALESCE(t.vsq, 0) + COALESCE(f.vsq, 0) \
          <> CAST(t.ver AS DECIMAL(38, 0)) * (t.ver + 1) * (2 * t.ver + 1) / 6 THEN 1 END), \
      CAST(COALESCE(SUM(t.handoffs), 0) AS SIGNED) \
    FROM (SELECT a.aggregate_id, MAX(a.ver) AS ver, MAX(a.handoffs) AS handoffs, \
        COUNT(o.aggregate_version) AS n, \
        MIN(o.aggregate_version) AS lo, MAX(o.aggregate_version) AS hi, \
        SUM(CAST(o.aggregate_version AS DECIMAL(38, 0))) AS vsum, \
        SUM(CAST(o.aggregate_version AS DECIMAL(38, 0)) * o.aggregate_version) AS vsq \
      FROM loadgen_aggregates a LEFT JOIN loadgen_orders o ON o.aggregate_id = a.aggregate_id \
      WHERE a.ver > 0 GROUP BY a.aggregate_id ORDER BY NULL) t \
    LEFT JOIN loadgen_orders_folded f ON f.aggregate_id = t.aggregate_id";
/// PostgreSQL [`fold_orders`]: deletes the orders created before `$1` (µs since the epoch)
/// and adds their count, version range and sums to `loadgen_orders_folded`, in one statement
/// (what it deletes is what it folds). Returns the orders folded.
const FOLD_ORDERS_PG: &str = "WITH d AS (DELETE FROM loadgen_orders WHERE created_at_us < $1 \
      RETURNING aggregate_id, aggregate_version), \
    g AS (SELECT aggregate_id, COUNT(*) AS n, MIN(aggregate_version) AS lo, \
      MAX(aggregate_version) AS hi, SUM(aggregate_version::numeric) AS vsum, \
      SUM(aggregate_version::numeric * aggregate_version) AS vsq FROM d GROUP BY aggregate_id), \
    i AS (INSERT INTO loadgen_orders_folded AS f (aggregate_id, n, lo, hi, vsum, vsq) \
      SELECT * FROM g ON CONFLICT (aggregate_id) DO UPDATE SET n = f.n + EXCLUDED.n, \
        lo = LEAST(f.lo, EXCLUDED.lo), hi = GREATEST(f.hi, EXCLUDED.hi), \
        vsum = f.vsum + EXCLUDED.vsum, vsq = f.vsq + EXCLUDED.vsq) \
    SELECT COALESCE(SUM(n), 0)::int8 FROM g";
/// SQLite [`fold_orders`], one batch: the oldest `?2` orders created before `?1`, in the order
/// of `loadgen_orders_created`, are added to `loadgen_orders_folded` by this statement and
/// deleted by [`FOLD_DELETE_SQLITE`]. Both run in one write transaction, so they pick the same
/// rows (a total order, nothing written between them). `WHERE true`: SQLite's parser needs it
/// between an `INSERT … SELECT`'s `FROM` and `ON CONFLICT`.
const FOLD_ADD_SQLITE: &str =
    "INSERT INTO loadgen_orders_folded (aggregate_id, n, lo, hi, vsum, vsq) \
      SELECT aggregate_id, COUNT(*), MIN(aggregate_version), MAX(aggregate_version), \
        SUM(aggregate_version), SUM(aggregate_version * aggregate_version) \
      FROM (SELECT aggregate_id, aggregate_version FROM loadgen_orders \
        WHERE created_at_us < ?1 ORDER BY created_at_us, order_id LIMIT ?2) \
      WHERE true GROUP BY aggregate_id \
      ON CONFLICT (aggregate_id) DO UPDATE SET n = n + excluded.n, \
        lo = min(lo, excluded.lo), hi = max(hi, excluded.hi), \
        vsum = vsum + excluded.vsum, vsq = vsq + excluded.vsq";
const FOLD_DELETE_SQLITE: &str = "DELETE FROM loadgen_orders WHERE order_id IN ( \
      SELECT order_id FROM loadgen_orders \
      WHERE created_at_us < ?1 ORDER BY created_at_us, order_id LIMIT ?2)";
/// SQLite and MariaDB: the index the fold's batches walk (created by [`prepare_fold`], so a
/// run without `--fold-orders` does not pay for it).
const FOLD_INDEX: &str =
    "CREATE INDEX IF NOT EXISTS loadgen_orders_created ON loadgen_orders (created_at_us)";
/// MariaDB [`fold_orders`], one batch: the oldest `?2` orders created before `?1`, locked, so
/// that [`FOLD_ADD_MYSQL`] and [`FOLD_DELETE_MYSQL`] then name exactly these rows.
const FOLD_PICK_MYSQL: &str = "SELECT order_id FROM loadgen_orders WHERE created_at_us < ? \
    ORDER BY created_at_us, order_id LIMIT ? FOR UPDATE";
/// MariaDB: adds the picked orders (`IN (…)`, pushed by [`fold_orders`]) to
/// `loadgen_orders_folded`; `ON DUPLICATE KEY UPDATE` assigns left to right, each column
/// from its own old value and the new row's (`VALUES`).
const FOLD_ADD_MYSQL: &str =
    "INSERT INTO loadgen_orders_folded (aggregate_id, n, lo, hi, vsum, vsq) \
      SELECT aggregate_id, COUNT(*), MIN(aggregate_version), MAX(aggregate_version), \
        SUM(CAST(aggregate_version AS DECIMAL(38, 0))), \
        SUM(CAST(aggregate_version AS DECIMAL(38, 0)) * aggregate_version) \
      FROM loadgen_orders WHERE order_id IN ";
const FOLD_ADD_MYSQL_TAIL: &str = " GROUP BY aggregate_id \
      ON DUPLICATE KEY UPDATE n = n + VALUES(n), lo = LEAST(lo, VALUES(lo)), \
        hi = GREATEST(hi, VALUES(hi)), vsum = vsum + VALUES(vsum), vsq = vsq + VALUES(vsq)";
const FOLD_DELETE_MYSQL: &str = "DELETE FROM loadgen_orders WHERE order_id IN ";
/// SQLite and MariaDB: orders folded per write transaction. On SQLite each batch queues on the
/// in-process write gate with the producers and the relays, as the purge's batches do, instead
/// of holding it for a whole run's orders; on MariaDB a batch holds the locks of its rows only.
const FOLD_BATCH: i64 = 1000;
/// PostgreSQL: successive versions of an aggregate whose outbox rows' `xid` (the inserting
/// transaction's id) are in the opposite order.
const XID_INVERSIONS: &str = "SELECT COUNT(*) FROM ferry_outbox a JOIN ferry_outbox b \
    ON b.aggregate_id = a.aggregate_id AND b.aggregate_version = a.aggregate_version + 1 \
    WHERE b.xid < a.xid";
/// Aggregates touched, shared and handed off between producers, and whether every aggregate's
/// committed versions are exactly `1..=n` (see [`VersionCheck`]).
pub async fn version_check(pool: &Pool) -> sqlx::Result<VersionCheck> {
    let n = |v: i64| v.max(0) as u64;
    let sql = match pool {
        Pool::Mysql(_) => VERSION_CHECK_MYSQL,
        _ => VERSION_CHECK_FOLDED,
    };
    let (touched, shared, mismatches, handoffs): (i64, i64, i64, i64) =
        on_inbox!(InboxPool, pool, p => sqlx::query_as(sql).fetch_one(p).await)?;
    let xid_inversions = match pool {
        Pool::Postgres(p) => match sqlx::query_scalar::<_, i64>(XID_INVERSIONS)
            .fetch_one(p)
            .await
        {
            Ok(v) => Some(n(v)),
            // informative only: a schema without the column must not fail the check
            Err(e) => {
                tracing::warn!(error = %e, "cannot count transaction-id inversions");
                None
            }
        },
        _ => None,
    };
    Ok(VersionCheck {
        aggregates_touched: n(touched),
        aggregates_shared: n(shared),
        handoffs: n(handoffs),
        version_mismatches: n(mismatches),
        xid_inversions,
    })
}

/// Folds the business orders older than `age` into `loadgen_orders_folded`: on PostgreSQL in
/// one statement (`FOLD_ORDERS_PG`), then, with `vacuum`, vacuums `loadgen_orders` so their
/// space is reused; on SQLite and MariaDB in batches of [`FOLD_BATCH`] orders, each one write
/// transaction (SQLite: behind the write gate, `FOLD_ADD_SQLITE` then `FOLD_DELETE_SQLITE`;
/// MariaDB: `FOLD_PICK_MYSQL`, then `FOLD_ADD_MYSQL` and `FOLD_DELETE_MYSQL` over the ids
/// picked). `vacuum` applies to PostgreSQL only: the others reuse freed pages by themselves.
/// The orders folded.
pub async fn fold_orders(pool: &Pool, age: std::time::Duration, vacuum: bool) -> sqlx::Result<u64> {
    let cutoff = ferry_core::now_micros() - age.as_micros() as i64;
    let mut folded = 0;
    loop {
        // n: the orders the batch deleted
        let n = match pool {
            Pool::Postgres(p) => {
                let n: i64 = sqlx::query_scalar(FOLD_ORDERS_PG)
                    .bind(cutoff)
                    .fetch_one(p)
                    .await?;
                if vacuum {
                    sqlx::query("VACUUM loadgen_orders, loadgen_orders_folded")
                        .execute(p)
                        .await?;
                }
                return Ok(n.max(0) as u64);
            }
            Pool::Sqlite(p) => {
                let mut tx = ferry_store::sqlite::begin_write(p).await?;
                let mut n = 0;
                for stmt in [FOLD_ADD_SQLITE, FOLD_DELETE_SQLITE] {
                    let q = sqlx::query(stmt).bind(cutoff).bind(FOLD_BATCH);
                    n = q.execute(&mut *tx).await?.rows_affected();
                }
                tx.commit().await?;
                n
            }
            Pool::Mysql(p) => {
                let mut tx = p.begin().await?;
                let ids: Vec<i64> = sqlx::query_scalar(FOLD_PICK_MYSQL)
                    .bind(cutoff)
                    .bind(FOLD_BATCH)
                    .fetch_all(&mut *tx)
                    .await?;
                if ids.is_empty() {
                    return Ok(folded);
                }
                let mut n = 0;
                for (head, tail) in [
                    (FOLD_ADD_MYSQL, FOLD_ADD_MYSQL_TAIL),
                    (FOLD_DELETE_MYSQL, ""),
                ] {
                    let mut qb = sqlx::QueryBuilder::<sqlx::MySql>::new(head);
                    qb.push("(");
                    let mut list = qb.separated(", ");
                    for id in &ids {
                        list.push_bind(id);
                    }
                    qb.push(")").push(tail);
                    n = qb.build().execute(&mut *tx).await?.rows_affected();
                }
                // the rows are locked: fewer deleted than picked is a fault, rolled back
                // (dropping `tx`) rather than committed as a fold of rows still live
                if n != ids.len() as u64 {
                    return Err(sqlx::Error::Protocol(format!(
                        "fold: {} orders picked, {n} deleted",
                        ids.len()
                    )));
                }
                tx.commit().await?;
                n
            }
        };
        folded += n;
        if n < FOLD_BATCH as u64 {
            return Ok(folded);
        }
    }
}

/// Prepares [`fold_orders`] before the load: on SQLite and MariaDB the index its batches walk;
/// nothing on PostgreSQL (one statement reads the small table whole).
pub async fn prepare_fold(pool: &Pool) -> sqlx::Result<()> {
    match pool {
        Pool::Sqlite(p) => sqlx::query(FOLD_INDEX).execute(p).await.map(drop),
        Pool::Mysql(p) => sqlx::query(FOLD_INDEX).execute(p).await.map(drop),
        Pool::Postgres(_) => Ok(()),
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::tx::{create_tables, dialect};
    use crate::TestDb;
    use std::time::Duration;

    /// Runs `sql` (`?` placeholders) with `binds` on `pool`.
    async fn exec(pool: &Pool, sql: &str, binds: &[Bind]) {
        let sql = dialect(pool, sql);
        on_inbox!(InboxPool, pool, p => {
            let mut q = sqlx::query(&sql);
            for b in binds {
                q = match b {
                    Bind::I(v) => q.bind(*v),
                    Bind::S(v) => q.bind(v.clone()),
                };
            }
            q.execute(p).await.map(drop)
        })
        .unwrap();
    }

    enum Bind {
        I(i64),
        S(String),
    }

    /// Orders `1..=n` of `aggregate`, the first `old` of them created long ago, and the
    /// aggregate's business row at version `n`.
    async fn commit(pool: &Pool, aggregate: &str, n: i64, old: i64, next_id: &mut i64) {
        for v in 1..=n {
            let (id, created) = (*next_id, if v <= old { 1 } else { i64::MAX / 2 });
            exec(
                pool,
                "INSERT INTO loadgen_orders VALUES (?, ?, ?, 100, 'NEW', ?)",
                &[
                    Bind::I(id),
                    Bind::S(aggregate.into()),
                    Bind::I(v),
                    Bind::I(created),
                ],
            )
            .await;
            *next_id += 1;
        }
        exec(
            pool,
            "UPDATE loadgen_aggregates SET ver = ? WHERE aggregate_id = ?",
            &[Bind::I(n), Bind::S(aggregate.into())],
        )
        .await;
    }

    async fn live_orders(pool: &Pool) -> i64 {
        on_inbox!(InboxPool, pool, p => sqlx::query_scalar("SELECT COUNT(*) FROM loadgen_orders").fetch_one(p).await)
            .unwrap()
    }

    /// The fold keeps the version check exact on `backend`, over several batches, and the
    /// check still catches a version counted twice or lost.
    async fn fold_keeps_the_version_check_exact(db: TestDb) {
        let backend = db.backend;
        let pool = Pool::connect(&db.url, 2).await.unwrap();
        create_tables(&pool, backend, "f", 4).await.unwrap();
        prepare_fold(&pool).await.unwrap();
        let agg = |i: u32| format!("lg-f-a{i}");
        let mut id = 1;
        // more old orders than one batch holds, so the fold takes several
        commit(
            &pool,
            &agg(0),
            2 * FOLD_BATCH + 500,
            2 * FOLD_BATCH + 400,
            &mut id,
        )
        .await;
        commit(&pool, &agg(1), 5, 5, &mut id).await;
        commit(&pool, &agg(2), 3, 0, &mut id).await;
        let check = version_check(&pool).await.unwrap();
        assert_eq!((check.aggregates_touched, check.version_mismatches), (3, 0));

        let folded = fold_orders(&pool, Duration::from_secs(60), false)
            .await
            .unwrap();
        assert_eq!(folded, 2 * FOLD_BATCH as u64 + 400 + 5, "{backend:?}");
        assert_eq!(live_orders(&pool).await, 100 + 3);
        let check = version_check(&pool).await.unwrap();
        assert_eq!((check.aggregates_touched, check.version_mismatches), (3, 0));
        // nothing left to fold
        let again = fold_orders(&pool, Duration::from_secs(60), false).await;
        assert_eq!(again.unwrap(), 0);

        // a version folded twice is caught, as is one lost
        exec(
            &pool,
            "UPDATE loadgen_orders_folded SET n = n + 1, vsum = vsum + 3, vsq = vsq + 9 \
             WHERE aggregate_id = ?",
            &[Bind::S(agg(1))],
        )
        .await;
        exec(
            &pool,
            "DELETE FROM loadgen_orders WHERE aggregate_id = ? AND aggregate_version = 2",
            &[Bind::S(agg(2))],
        )
        .await;
        assert_eq!(version_check(&pool).await.unwrap().version_mismatches, 2);
    }

    crate::backend_tests!(fold_keeps_the_version_check_exact);
}
