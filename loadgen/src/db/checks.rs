//! What the store and the business rows say after the run: SENT counts, the SENT-order check
//! and the versions the producers committed.
use ferry_core::DispatchMode;
use ferry_store::Backend;
use ferry_testkit::on_inbox;
use hdrhistogram::Histogram;
use serde::Serialize;

use super::database::{new_histogram, Database};
use crate::error::{Error, Result};
use ferry_testkit::workload::dialect;

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
/// (`order_id >> 40`, see [`crate::workload::Ids::order`]) against its business row.
const VERSION_CHECK: &str = "SELECT COUNT(*), \
      COUNT(CASE WHEN t.producers > 1 THEN 1 END), \
      COUNT(CASE WHEN t.n IS NULL OR t.n <> a.ver OR t.lo <> 1 OR t.hi <> a.ver THEN 1 END) \
    FROM loadgen_aggregates a LEFT JOIN (SELECT aggregate_id, COUNT(*) AS n, \
      MIN(aggregate_version) AS lo, MAX(aggregate_version) AS hi, \
      COUNT(DISTINCT order_id >> 40) AS producers \
      FROM loadgen_orders GROUP BY aggregate_id) t ON t.aggregate_id = a.aggregate_id \
    WHERE a.ver > 0";
/// PostgreSQL: [`VERSION_CHECK`] over the live orders and what `--fold-orders` moved to
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
/// PostgreSQL `--fold-orders`: deletes the orders created before `$1` (µs since the epoch)
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

/// Successive versions of an aggregate both SENT, the later one marked SENT first. The relay
/// claims v(n+1) only after v(n) is SENT, so this must be zero; it is the ordering check when
/// no consumer reads the events back (null and stdout sinks).
const SENT_ORDER_VIOLATIONS: &str = "SELECT COUNT(*) FROM ferry_outbox a JOIN ferry_outbox b \
    ON b.aggregate_id = a.aggregate_id AND b.aggregate_version = a.aggregate_version + 1 \
    WHERE a.state = 'SENT' AND b.state = 'SENT' AND b.sent_at < a.sent_at";

/// [`SENT_ORDER_VIOLATIONS`] as pairs, `(aggregate, later version)`, before a purge run: also a
/// SENT version whose predecessor is still unfinished (PENDING, CLAIMED or QUARANTINED), which
/// the relay never allows in row dispatch and which a purge could otherwise delete before its
/// predecessor is SENT (and the end-of-run check could compare them). `{agg}` is the aggregate
/// id as text, `{limit}` the most pairs returned.
const SENT_ORDER_VIOLATION_PAIRS: &str = "SELECT {agg}, b.aggregate_version FROM ferry_outbox a \
    JOIN ferry_outbox b ON b.aggregate_id = a.aggregate_id \
      AND b.aggregate_version = a.aggregate_version + 1 \
    WHERE b.state = 'SENT' AND (a.state IN ('PENDING', 'CLAIMED', 'QUARANTINED') \
      OR (a.state = 'SENT' AND b.sent_at < a.sent_at)) \
    ORDER BY b.seq LIMIT {limit}";
/// Whether [`SENT_ORDER_VIOLATIONS`] counts the pair of `(aggregate, later version)`.
const SENT_ORDER_VIOLATION_OF: &str = "SELECT COUNT(*) FROM ferry_outbox a JOIN ferry_outbox b \
    ON b.aggregate_id = a.aggregate_id AND b.aggregate_version = a.aggregate_version + 1 \
    WHERE b.aggregate_id = ? AND b.aggregate_version = ? \
      AND a.state = 'SENT' AND b.state = 'SENT' AND b.sent_at < a.sent_at";

impl Database {
    /// Aggregates touched, shared and handed off between producers, and whether every
    /// aggregate's committed versions are exactly `1..=n` (see [`VersionCheck`]).
    pub async fn version_check(&self) -> Result<VersionCheck> {
        if let ferry_inbox::InboxPool::Postgres(p) = &self.pool {
            let (touched, shared, mismatches, handoffs): (i64, i64, i64, i64) =
                sqlx::query_as(VERSION_CHECK_PG)
                    .fetch_one(p)
                    .await
                    .map_err(Error::sql("check the committed versions"))?;
            let n = |v: i64| v.max(0) as u64;
            let xid_inversions = match self.scalar(XID_INVERSIONS, "count xid inversions").await {
                // informative only: a schema without the column must not fail the run
                Ok(v) => Some(n(v)),
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
            on_inbox!(InboxPool, &self.pool, p => sqlx::query_as(VERSION_CHECK).fetch_one(p).await)
                .map_err(Error::sql("check the committed versions"))?;
        let handoffs = self.scalar(HANDOFFS, "count version handoffs").await?;
        let n = |v: i64| v.max(0) as u64;
        Ok(VersionCheck {
            aggregates_touched: n(touched),
            aggregates_shared: n(shared),
            handoffs: n(handoffs),
            version_mismatches: n(mismatches),
            xid_inversions: None,
        })
    }

    /// PostgreSQL `--fold-orders`: folds the business orders older than `age` into
    /// `loadgen_orders_folded` (see [`FOLD_ORDERS_PG`]), then, with `vacuum`, vacuums
    /// `loadgen_orders` so their space is reused. The orders folded.
    pub async fn fold_orders(&self, age: std::time::Duration, vacuum: bool) -> Result<u64> {
        let ferry_inbox::InboxPool::Postgres(p) = &self.pool else {
            return Err(Error::Setup("--fold-orders needs --store postgres".into()));
        };
        let cutoff = ferry_core::now_micros() - age.as_micros() as i64;
        let n: i64 = sqlx::query_scalar(FOLD_ORDERS_PG)
            .bind(cutoff)
            .fetch_one(p)
            .await
            .map_err(Error::sql("fold old business orders"))?;
        if vacuum {
            sqlx::query("VACUUM loadgen_orders, loadgen_orders_folded")
                .execute(p)
                .await
                .map_err(Error::sql("vacuum loadgen_orders"))?;
        }
        Ok(n.max(0) as u64)
    }

    /// The relation whose `state` is an intent's effective state: the outbox in row mode, the
    /// cursor view (an exception row's state, else SENT behind the slot's cursor) in cursor mode.
    fn state_table(&self) -> &'static str {
        match self.dispatch {
            DispatchMode::Row => "ferry_outbox",
            DispatchMode::Cursor => "ferry_outbox_cursor_view",
        }
    }

    /// Outbox rows in `SENT` (cursor mode: effectively SENT, see `ferry_outbox_cursor_view`).
    pub async fn count_sent(&self) -> Result<i64> {
        let stmt = format!(
            "SELECT COUNT(*) FROM {} WHERE state = 'SENT'",
            self.state_table()
        );
        self.scalar(&stmt, "count SENT rows").await
    }

    /// Up to ten unsent rows, `event_id (STATE)`.
    pub async fn unsent_examples(&self) -> Result<Vec<String>> {
        // MySQL: event ids are binary strings
        let cols = match self.kind {
            Backend::Mysql => "CAST(event_id AS CHAR), CAST(state AS CHAR)",
            _ => "event_id, state",
        };
        let stmt = format!(
            "SELECT {cols} FROM {} WHERE state <> 'SENT' ORDER BY seq LIMIT 10",
            self.state_table()
        );
        let rows: Vec<(String, String)> =
            on_inbox!(InboxPool, &self.pool, p => sqlx::query_as(&stmt).fetch_all(p).await)
                .map_err(Error::sql("list unsent rows"))?;
        Ok(rows
            .into_iter()
            .map(|(id, s)| format!("{id} ({s})"))
            .collect())
    }

    /// Pairs of successive versions marked SENT out of order (see [`SENT_ORDER_VIOLATIONS`]);
    /// `None` in cursor mode, where rows dispatched by the cursor carry no `sent_at`.
    pub async fn sent_order_violations(&self) -> Result<Option<i64>> {
        if self.dispatch == DispatchMode::Cursor {
            return Ok(None);
        }
        let n = self
            .scalar(SENT_ORDER_VIOLATIONS, "check SENT order")
            .await?;
        Ok(Some(n))
    }

    /// Row dispatch: the pairs [`SENT_ORDER_VIOLATION_PAIRS`] finds (at most `limit`); none in
    /// cursor mode.
    pub async fn sent_order_violation_pairs(&self, limit: usize) -> Result<Vec<(String, i64)>> {
        if self.dispatch == DispatchMode::Cursor {
            return Ok(Vec::new());
        }
        let stmt = violation_pairs_sql(self.kind, limit);
        on_inbox!(InboxPool, &self.pool, p => sqlx::query_as(&stmt).fetch_all(p).await)
            .map_err(Error::sql("check SENT order before a purge"))
    }

    /// Whether the end-of-run [`SENT_ORDER_VIOLATIONS`] counts the pair of `aggregate`'s
    /// `version` and its predecessor (both still there, both SENT, out of order).
    pub async fn counts_as_sent_order_violation(
        &self,
        aggregate: &str,
        version: i64,
    ) -> Result<bool> {
        let stmt = dialect(&self.pool, SENT_ORDER_VIOLATION_OF);
        let n: i64 = on_inbox!(InboxPool, &self.pool, p => sqlx::query_scalar(&stmt)
            .bind(aggregate)
            .bind(version)
            .fetch_one(p)
            .await)
        .map_err(Error::sql("look up an out-of-order pair"))?;
        Ok(n > 0)
    }

    /// Commit→SENT latency of every SENT row, from `created_at`/`sent_at` (used when relays
    /// run as processes and their metrics are out of reach). Values in µs. `None` in cursor
    /// mode: rows dispatched by the cursor are never updated, so they have no `sent_at`.
    pub async fn commit_to_ack_from_rows(&self) -> Result<Option<Histogram<u64>>> {
        if self.dispatch == DispatchMode::Cursor {
            return Ok(None);
        }
        let us = match self.kind {
            Backend::Postgres => "(extract(epoch from (sent_at - created_at)) * 1000000)::int8",
            Backend::Mysql => "CAST(TIMESTAMPDIFF(MICROSECOND, created_at, sent_at) AS SIGNED)",
            Backend::Sqlite => "sent_at - created_at",
        };
        let stmt =
            format!("SELECT {us} FROM ferry_outbox WHERE state = 'SENT' AND sent_at IS NOT NULL");
        let values: Vec<i64> =
            on_inbox!(InboxPool, &self.pool, p => sqlx::query_scalar(&stmt).fetch_all(p).await)
                .map_err(Error::sql("read commit→SENT latencies"))?;
        let mut h = new_histogram();
        for v in values {
            let _ = h.record(v.clamp(1, 3_600_000_000) as u64);
        }
        Ok(Some(h))
    }
}

/// [`SENT_ORDER_VIOLATION_PAIRS`] for `kind` (MariaDB: aggregate ids are binary strings).
fn violation_pairs_sql(kind: Backend, limit: usize) -> String {
    let agg = match kind {
        Backend::Mysql => "CAST(b.aggregate_id AS CHAR)",
        _ => "b.aggregate_id",
    };
    SENT_ORDER_VIOLATION_PAIRS
        .replace("{agg}", agg)
        .replace("{limit}", &limit.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::sqlite::SqlitePoolOptions;
    use sqlx::Executor;

    #[tokio::test]
    async fn the_pre_purge_order_check_finds_both_kinds_of_violation() {
        let p = SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        // the columns the checks read
        p.execute(
            "CREATE TABLE ferry_outbox (seq INTEGER PRIMARY KEY, aggregate_id TEXT, \
             aggregate_version INTEGER, state TEXT, sent_at INTEGER)",
        )
        .await
        .unwrap();
        let rows = [
            // a: v2 marked SENT before v1
            ("a", 1, "SENT", Some(10)),
            ("a", 2, "SENT", Some(5)),
            // b: v2 SENT while v1 is still unsent (a purge could delete v2 first)
            ("b", 1, "PENDING", None),
            ("b", 2, "SENT", Some(7)),
            ("q", 1, "QUARANTINED", None),
            ("q", 2, "SENT", Some(8)),
            // in order, or allowed
            ("c", 1, "SENT", Some(1)),
            ("c", 2, "SENT", Some(2)),
            ("d", 1, "SKIPPED", None),
            ("d", 2, "SENT", Some(3)),
            ("e", 1, "SENT", Some(4)),
            ("e", 2, "CLAIMED", None),
        ];
        for (agg, ver, state, sent_at) in rows {
            sqlx::query(
                "INSERT INTO ferry_outbox (aggregate_id, aggregate_version, state, sent_at) \
                 VALUES (?, ?, ?, ?)",
            )
            .bind(agg)
            .bind(ver)
            .bind(state)
            .bind(sent_at)
            .execute(&p)
            .await
            .unwrap();
        }
        let pairs: Vec<(String, i64)> = sqlx::query_as(&violation_pairs_sql(Backend::Sqlite, 1000))
            .fetch_all(&p)
            .await
            .unwrap();
        let want = [("a", 2), ("b", 2), ("q", 2)].map(|(a, v)| (a.to_string(), v));
        assert_eq!(pairs, want);
        // the limit holds
        let one: Vec<(String, i64)> = sqlx::query_as(&violation_pairs_sql(Backend::Sqlite, 1))
            .fetch_all(&p)
            .await
            .unwrap();
        assert_eq!(one.len(), 1);
        // the end-of-run count sees only a's pair (b's and q's predecessors are not SENT)
        let n: i64 = sqlx::query_scalar(SENT_ORDER_VIOLATIONS)
            .fetch_one(&p)
            .await
            .unwrap();
        assert_eq!(n, 1);
        for (agg, counted) in [("a", 1), ("b", 0), ("q", 0)] {
            let n: i64 = sqlx::query_scalar(SENT_ORDER_VIOLATION_OF)
                .bind(agg)
                .bind(2i64)
                .fetch_one(&p)
                .await
                .unwrap();
            assert_eq!(n, counted, "{agg}");
        }
        p.close().await;
    }
}
