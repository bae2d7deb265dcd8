//! What the business rows say about the versions the producers committed, and folding old
//! orders away under retention (PostgreSQL and SQLite).
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

/// MariaDB (no fold): per touched aggregate, its orders, their lowest and highest version and
/// the producers (`order_id >> 40`, see [`Ids::order`](super::shape::Ids::order)) against its
/// business row.
/// Grouped over the join, one index range of the orders per business row: MariaDB planned a
/// join to the grouped orders as a derived table with no key, minutes for 100,000 aggregates.
const VERSION_CHECK: &str = "SELECT COUNT(*), \
      COUNT(CASE WHEN t.producers > 1 THEN 1 END), \
      COUNT(CASE WHEN t.n = 0 OR t.n <> t.ver OR t.lo <> 1 OR t.hi <> t.ver THEN 1 END) \
    FROM (SELECT a.ver, COUNT(o.order_id) AS n, MIN(o.aggregate_version) AS lo, \
      MAX(o.aggregate_version) AS hi, COUNT(DISTINCT o.order_id >> 40) AS producers \
      FROM loadgen_aggregates a LEFT JOIN loadgen_orders o ON o.aggregate_id = a.aggregate_id \
      WHERE a.ver > 0 GROUP BY a.aggregate_id, a.ver) t";
/// PostgreSQL and SQLite: [`VERSION_CHECK`] over the live orders and what [`fold_orders`]
/// moved to `loadgen_orders_folded` together, and the handoffs the business rows counted as
/// versions were taken. An aggregate passes when its orders number `ver`, span `1..=ver` and
/// their versions sum to `ver(ver+1)/2` and their squares to `ver(ver+1)(2ver+1)/6`: a set of
/// `ver` versions within `1..=ver` is exactly `1..=ver`, and a version counted twice (live and
/// folded) or missing changes the count or a sum. An aggregate is shared when it has a
/// handoff: two producers among its successive versions make at least one pair of successive
/// versions differ, and one such pair is two. (`CAST … AS NUMERIC`: exact on PostgreSQL,
/// an integer on SQLite.)
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
/// SQLite: the index the fold's batches walk (created by [`prepare_fold`], so a run without
/// `--fold-orders` does not pay for it).
const FOLD_INDEX_SQLITE: &str =
    "CREATE INDEX IF NOT EXISTS loadgen_orders_created ON loadgen_orders (created_at_us)";
/// SQLite: orders folded per write transaction. Each batch queues on the in-process write gate
/// with the producers and the relays, as the purge's batches do, instead of holding it for a
/// whole run's orders.
const FOLD_BATCH: i64 = 1000;
/// PostgreSQL: successive versions of an aggregate whose outbox rows' `xid` (the inserting
/// transaction's id) are in the opposite order.
const XID_INVERSIONS: &str = "SELECT COUNT(*) FROM ferry_outbox a JOIN ferry_outbox b \
    ON b.aggregate_id = a.aggregate_id AND b.aggregate_version = a.aggregate_version + 1 \
    WHERE b.xid < a.xid";
/// MariaDB: successive versions committed by different producers.
const HANDOFFS: &str = "SELECT COUNT(*) FROM loadgen_orders a JOIN loadgen_orders b \
    ON b.aggregate_id = a.aggregate_id AND b.aggregate_version = a.aggregate_version + 1 \
    WHERE (a.order_id >> 40) <> (b.order_id >> 40)";

/// Aggregates touched, shared and handed off between producers, and whether every aggregate's
/// committed versions are exactly `1..=n` (see [`VersionCheck`]).
pub async fn version_check(pool: &Pool) -> sqlx::Result<VersionCheck> {
    let n = |v: i64| v.max(0) as u64;
    let (touched, shared, mismatches, handoffs): (i64, i64, i64, i64) = match pool {
        Pool::Mysql(p) => {
            let (t, s, m) = sqlx::query_as(VERSION_CHECK).fetch_one(p).await?;
            (t, s, m, sqlx::query_scalar(HANDOFFS).fetch_one(p).await?)
        }
        _ => {
            on_inbox!(InboxPool, pool, p => sqlx::query_as(VERSION_CHECK_FOLDED).fetch_one(p).await)?
        }
    };
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
/// space is reused; on SQLite in batches of [`FOLD_BATCH`] behind the write gate
/// (`FOLD_ADD_SQLITE`, `FOLD_DELETE_SQLITE`; `vacuum` does not apply: SQLite reuses freed
/// pages by itself). The orders folded. MariaDB has no fold.
pub async fn fold_orders(pool: &Pool, age: std::time::Duration, vacuum: bool) -> sqlx::Result<u64> {
    let cutoff = ferry_core::now_micros() - age.as_micros() as i64;
    match pool {
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
            Ok(n.max(0) as u64)
        }
        Pool::Sqlite(p) => {
            let mut folded = 0;
            loop {
                let mut tx = ferry_store::sqlite::begin_write(p).await?;
                // n: the orders the batch's DELETE took (the last statement)
                let mut n = 0;
                for stmt in [FOLD_ADD_SQLITE, FOLD_DELETE_SQLITE] {
                    let q = sqlx::query(stmt).bind(cutoff).bind(FOLD_BATCH);
                    n = q.execute(&mut *tx).await?.rows_affected();
                }
                tx.commit().await?;
                folded += n;
                if n < FOLD_BATCH as u64 {
                    return Ok(folded);
                }
            }
        }
        Pool::Mysql(_) => Err(sqlx::Error::Protocol(
            "folding business orders is implemented for PostgreSQL and SQLite".into(),
        )),
    }
}

/// Prepares [`fold_orders`] before the load: on SQLite the index its batches walk; nothing
/// elsewhere.
pub async fn prepare_fold(pool: &Pool) -> sqlx::Result<()> {
    if let Pool::Sqlite(p) = pool {
        sqlx::query(FOLD_INDEX_SQLITE).execute(p).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::tx::create_tables;
    use ferry_store::Backend;
    use std::time::Duration;

    /// Orders `1..=n` of `aggregate`, the first `old` of them created long ago, and the
    /// aggregate's business row at version `n`.
    async fn commit(p: &sqlx::SqlitePool, aggregate: &str, n: i64, old: i64, next_id: &mut i64) {
        for v in 1..=n {
            let created = if v <= old { 1 } else { i64::MAX / 2 };
            sqlx::query("INSERT INTO loadgen_orders VALUES (?, ?, ?, 100, 'NEW', ?)")
                .bind(*next_id)
                .bind(aggregate)
                .bind(v)
                .bind(created)
                .execute(p)
                .await
                .unwrap();
            *next_id += 1;
        }
        sqlx::query("UPDATE loadgen_aggregates SET ver = ? WHERE aggregate_id = ?")
            .bind(n)
            .bind(aggregate)
            .execute(p)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn sqlite_fold_keeps_the_version_check_exact() {
        let p = crate::memory_sqlite().await;
        let pool = Pool::Sqlite(p.clone());
        create_tables(&pool, Backend::Sqlite, "f", 4).await.unwrap();
        prepare_fold(&pool).await.unwrap();
        let agg = |i: u32| format!("lg-f-a{i}");
        let mut id = 1;
        // more old orders than one batch holds, so the fold takes several
        commit(
            &p,
            &agg(0),
            2 * FOLD_BATCH + 500,
            2 * FOLD_BATCH + 400,
            &mut id,
        )
        .await;
        commit(&p, &agg(1), 5, 5, &mut id).await;
        commit(&p, &agg(2), 3, 0, &mut id).await;
        let check = version_check(&pool).await.unwrap();
        assert_eq!((check.aggregates_touched, check.version_mismatches), (3, 0));

        let folded = fold_orders(&pool, Duration::from_secs(60), false)
            .await
            .unwrap();
        assert_eq!(folded, 2 * FOLD_BATCH as u64 + 400 + 5);
        let live: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM loadgen_orders")
            .fetch_one(&p)
            .await
            .unwrap();
        assert_eq!(live, 100 + 3);
        let check = version_check(&pool).await.unwrap();
        assert_eq!((check.aggregates_touched, check.version_mismatches), (3, 0));
        // nothing left to fold
        assert_eq!(
            fold_orders(&pool, Duration::from_secs(60), false)
                .await
                .unwrap(),
            0
        );

        // a version folded twice is caught, as is one lost
        sqlx::query("UPDATE loadgen_orders_folded SET n = n + 1, vsum = vsum + 3, vsq = vsq + 9 WHERE aggregate_id = ?")
            .bind(agg(1))
            .execute(&p)
            .await
            .unwrap();
        sqlx::query("DELETE FROM loadgen_orders WHERE aggregate_id = ? AND aggregate_version = 2")
            .bind(agg(2))
            .execute(&p)
            .await
            .unwrap();
        assert_eq!(version_check(&pool).await.unwrap().version_mismatches, 2);
        p.close().await;
    }
}
