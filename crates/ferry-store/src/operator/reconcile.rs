//! Reconciliation: every intent under a watermark put in exactly one class, and the business
//! rows without an intent.
use std::collections::HashMap;

use ferry_core::{
    now_micros, BusinessTable, DispatchMode, ReconcileReport, ReconcileRequest, StoreError,
    Watermark,
};

use super::{consumer_binds, inbox_exists, validate_identifier, Bind, Pools};
use crate::dialect::Dialect;
use crate::lookup::state_table;

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
