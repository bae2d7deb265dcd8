//! What the business rows say about the versions the producers committed, and folding old
//! orders away under retention (PostgreSQL).
use ferry_inbox::InboxPool as Pool;
use serde::Serialize;
use sqlx::PgPool;

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

/// Per touched aggregate: its orders, their lowest and highest version and the producers
/// (`order_id >> 40`, see [`Ids::order`](super::shape::Ids::order)) against its business row.
/// Grouped over the join, one index range of the orders per business row: MariaDB planned a
/// join to the grouped orders as a derived table with no key, minutes for 100,000 aggregates.
const VERSION_CHECK: &str = "SELECT COUNT(*), \
      COUNT(CASE WHEN t.producers > 1 THEN 1 END), \
      COUNT(CASE WHEN t.n = 0 OR t.n <> t.ver OR t.lo <> 1 OR t.hi <> t.ver THEN 1 END) \
    FROM (SELECT a.ver, COUNT(o.order_id) AS n, MIN(o.aggregate_version) AS lo, \
      MAX(o.aggregate_version) AS hi, COUNT(DISTINCT o.order_id >> 40) AS producers \
      FROM loadgen_aggregates a LEFT JOIN loadgen_orders o ON o.aggregate_id = a.aggregate_id \
      WHERE a.ver > 0 GROUP BY a.aggregate_id, a.ver) t";
/// PostgreSQL: [`VERSION_CHECK`] over the live orders and what [`fold_orders`] moved to
/// `loadgen_orders_folded` together, and the handoffs the business rows counted as versions
/// were taken (`loadgen_take_versions`). An aggregate passes when its orders number `ver`,
/// span `1..=ver` and their versions sum to `ver(ver+1)/2` and their squares to
/// `ver(ver+1)(2ver+1)/6`: a set of `ver` versions within `1..=ver` is exactly `1..=ver`,
/// and a version counted twice (live and folded) or missing changes the count or a sum.
/// An aggregate is shared when it has a handoff: two producers among its successive
/// versions make at least one pair of successive versions differ, and one such pair is two.
const VERSION_CHECK_PG: &str = "SELECT COUNT(*), COUNT(CASE WHEN a.handoffs > 0 THEN 1 END), \
      COUNT(CASE WHEN t.n IS NULL OR t.n <> a.ver OR t.lo <> 1 OR t.hi <> a.ver \
        OR t.vsum <> a.ver::numeric * (a.ver + 1) / 2 \
        OR t.vsq <> a.ver::numeric * (a.ver + 1) * (2 * a.ver + 1) / 6 THEN 1 END), \
      COALESCE(SUM(a.handoffs), 0)::int8 \
    FROM loadgen_aggregates a LEFT JOIN (SELECT aggregate_id, SUM(n)::int8 AS n, MIN(lo) AS lo, \
      MAX(hi) AS hi, SUM(vsum) AS vsum, SUM(vsq) AS vsq FROM ( \
        SELECT aggregate_id, COUNT(*) AS n, MIN(aggregate_version) AS lo, \
          MAX(aggregate_version) AS hi, SUM(aggregate_version::numeric) AS vsum, \
          SUM(aggregate_version::numeric * aggregate_version) AS vsq \
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
/// PostgreSQL: successive versions of an aggregate whose outbox rows' `xid` (the inserting
/// transaction's id) are in the opposite order.
const XID_INVERSIONS: &str = "SELECT COUNT(*) FROM ferry_outbox a JOIN ferry_outbox b \
    ON b.aggregate_id = a.aggregate_id AND b.aggregate_version = a.aggregate_version + 1 \
    WHERE b.xid < a.xid";
/// Successive versions committed by different producers.
const HANDOFFS: &str = "SELECT COUNT(*) FROM loadgen_orders a JOIN loadgen_orders b \
    ON b.aggregate_id = a.aggregate_id AND b.aggregate_version = a.aggregate_version + 1 \
    WHERE (a.order_id >> 40) <> (b.order_id >> 40)";

/// Aggregates touched, shared and handed off between producers, and whether every aggregate's
/// committed versions are exactly `1..=n` (see [`VersionCheck`]).
pub async fn version_check(pool: &Pool) -> sqlx::Result<VersionCheck> {
    let n = |v: i64| v.max(0) as u64;
    if let Pool::Postgres(p) = pool {
        let (touched, shared, mismatches, handoffs): (i64, i64, i64, i64) =
            sqlx::query_as(VERSION_CHECK_PG).fetch_one(p).await?;
        let xid_inversions = match sqlx::query_scalar::<_, i64>(XID_INVERSIONS)
            .fetch_one(p)
            .await
        {
            Ok(v) => Some(n(v)),
            // informative only: a schema without the column must not fail the check
            Err(e) => {
                tracing::warn!(error = %e, "cannot count transaction-id inversions");
                None
            }
        };
        return Ok(VersionCheck {
            aggregates_touched: n(touched),
            aggregates_shared: n(shared),
            handoffs: n(handoffs),
            version_mismatches: n(mismatches),
            xid_inversions,
        });
    }
    let (touched, shared, mismatches): (i64, i64, i64) =
        on_inbox!(InboxPool, pool, p => sqlx::query_as(VERSION_CHECK).fetch_one(p).await)?;
    let handoffs: i64 =
        on_inbox!(InboxPool, pool, p => sqlx::query_scalar(HANDOFFS).fetch_one(p).await)?;
    Ok(VersionCheck {
        aggregates_touched: n(touched),
        aggregates_shared: n(shared),
        handoffs: n(handoffs),
        version_mismatches: n(mismatches),
        xid_inversions: None,
    })
}

/// PostgreSQL: folds the business orders older than `age` into `loadgen_orders_folded` (see
/// `FOLD_ORDERS_PG`), then, with `vacuum`, vacuums `loadgen_orders` so their space is
/// reused. The orders folded.
pub async fn fold_orders(
    pool: &PgPool,
    age: std::time::Duration,
    vacuum: bool,
) -> sqlx::Result<u64> {
    let cutoff = ferry_core::now_micros() - age.as_micros() as i64;
    let n: i64 = sqlx::query_scalar(FOLD_ORDERS_PG)
        .bind(cutoff)
        .fetch_one(pool)
        .await?;
    if vacuum {
        sqlx::query("VACUUM loadgen_orders, loadgen_orders_folded")
            .execute(pool)
            .await?;
    }
    Ok(n.max(0) as u64)
}
