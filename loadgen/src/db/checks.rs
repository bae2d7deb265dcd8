//! What the store says after the run: SENT counts and the SENT-order check (the business
//! rows' version check is the workload's: [`ferry_testkit::workload::check`]).
use ferry_core::DispatchMode;
use ferry_store::Backend;
use ferry_testkit::on_inbox;
use hdrhistogram::Histogram;

use super::database::{new_histogram, Database};
use crate::error::{Error, Result};
use ferry_testkit::workload::{dialect, VersionCheck};

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
        ferry_testkit::workload::version_check(&self.pool)
            .await
            .map_err(Error::sql("check the committed versions"))
    }

    /// `--fold-orders`: folds the business orders older than `age` (see
    /// [`ferry_testkit::workload::fold_orders`]). The orders folded.
    pub async fn fold_orders(&self, age: std::time::Duration, vacuum: bool) -> Result<u64> {
        ferry_testkit::workload::fold_orders(&self.pool, age, vacuum)
            .await
            .map_err(Error::sql("fold old business orders"))
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
    use sqlx::Executor;

    #[tokio::test]
    async fn the_pre_purge_order_check_finds_both_kinds_of_violation() {
        let p = ferry_testkit::memory_sqlite().await;
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
