//! Replay's reads (`ferry replay`): what a filter matches per topic, pages of matching SENT
//! events in `(aggregate_id, aggregate_version)` order, and the retention watermark purge raises
//! ([`super::Pools::delete_marking`]) read back. Nothing here writes.
use ferry_core::replay::{ReplayFilter, ReplayPage, ReplayPageRequest, RetentionMark, TopicScan};
use ferry_core::{ClaimToken, ClaimedEvent, DispatchMode, Payload, StoreError, StoreErrorKind};

use super::{count, Bind, Pools};
use crate::dialect::Dialect;

/// The rows a replay reads from and the expression of their delivery state: the row's own state
/// in row dispatch, the derived one (`ferry_outbox_cursor_view`) in cursor dispatch.
fn source(mode: DispatchMode) -> (&'static str, &'static str) {
    match mode {
        DispatchMode::Row => ("ferry_outbox o", "o.state"),
        DispatchMode::Cursor => (
            "ferry_outbox o JOIN ferry_outbox_cursor_view v ON v.seq = o.seq",
            "v.state",
        ),
    }
}

/// The filter's conditions on `o` (topics, aggregates, created_at bounds) and their binds.
fn conditions(d: Dialect, f: &ReplayFilter, topics: &[String]) -> (String, Vec<Bind>) {
    let list = |n: usize| vec!["?"; n].join(", ");
    let mut sql = format!("o.topic IN ({})", list(topics.len()));
    let mut binds: Vec<Bind> = topics.iter().map(|t| Bind::Str(t.clone())).collect();
    if !f.aggregates.is_empty() {
        sql.push_str(&format!(
            " AND o.aggregate_id IN ({})",
            list(f.aggregates.len())
        ));
        binds.extend(f.aggregates.iter().map(|a| Bind::Str(a.clone())));
    }
    let created = d.micros("o.created_at");
    if let Some(from) = f.from {
        sql.push_str(&format!(" AND {created} >= ?"));
        binds.push(Bind::I64(from));
    }
    if let Some(to) = f.to {
        sql.push_str(&format!(" AND {created} <= ?"));
        binds.push(Bind::I64(to));
    }
    (sql, binds)
}

/// [`ferry_core::OutboxStore::replay_scan`].
pub(crate) async fn scan(
    pools: Pools<'_>,
    mode: DispatchMode,
    f: &ReplayFilter,
) -> Result<Vec<TopicScan>, StoreError> {
    let d = pools.dialect();
    let (src, state) = source(mode);
    let mut out = Vec::with_capacity(f.topics.len());
    for topic in &f.topics {
        let one = std::slice::from_ref(topic);
        let (cond, binds) = conditions(d, f, one);
        let matched = count(
            pools,
            &format!("SELECT COUNT(*) FROM {src} WHERE {cond} AND {state} = 'SENT'"),
            &binds,
        )
        .await?;
        let all = count(
            pools,
            &format!("SELECT COUNT(*) FROM ferry_outbox o WHERE {cond}"),
            &binds,
        )
        .await?;
        let mark = pools
            .rows(
                "SELECT purged_created_at, purged_at FROM ferry_retention_mark WHERE topic = ?",
                &[Bind::Str(topic.clone())],
            )
            .await?;
        let retention = mark.first().and_then(|r| {
            let n = |i: usize| r[i].as_deref().and_then(|v| v.parse::<i64>().ok());
            Some(RetentionMark {
                purged_created_at: n(0)?,
                purged_at: n(1)?,
            })
        });
        // COUNT of at most one row: stops at the first row of the topic
        let retained = count(
            pools,
            "SELECT COUNT(*) FROM (SELECT 1 AS x FROM ferry_outbox WHERE topic = ? LIMIT 1) t",
            &[Bind::Str(topic.clone())],
        )
        .await?
            > 0;
        out.push(TopicScan {
            topic: topic.clone(),
            known: retained || retention.is_some(),
            matched,
            not_sent: all.saturating_sub(matched),
            retention,
        });
    }
    Ok(out)
}

/// [`ferry_core::OutboxStore::replay_page`].
pub(crate) async fn page(
    pools: Pools<'_>,
    mode: DispatchMode,
    req: &ReplayPageRequest<'_>,
) -> Result<ReplayPage, StoreError> {
    if req.limit == 0 {
        return Err(StoreError::new(
            StoreErrorKind::InvalidInput,
            "replay page size must be at least 1",
        ));
    }
    let d = pools.dialect();
    let (src, state) = source(mode);
    let (mut cond, mut binds) = conditions(d, req.filter, &req.filter.topics);
    if let Some((agg, v)) = &req.after {
        cond.push_str(
            " AND (o.aggregate_id > ? OR (o.aggregate_id = ? AND o.aggregate_version > ?))",
        );
        binds.extend([
            Bind::Str(agg.clone()),
            Bind::Str(agg.clone()),
            Bind::I64(*v),
        ]);
    }
    let sql = format!(
        "SELECT o.seq, o.event_id, o.aggregate_id, o.aggregate_version, {}, o.topic, \
         coalesce(o.msg_key, o.aggregate_id), o.event_type, o.headers, {}, {} FROM {src} \
         WHERE {cond} AND {state} = 'SENT' \
         ORDER BY o.aggregate_id, o.aggregate_version LIMIT {}",
        // PostgreSQL's slot is a smallint, which the text decoding of `Pools::rows` skips
        if d == Dialect::Pg {
            "o.shard_slot::int8"
        } else {
            "o.shard_slot"
        },
        // the payload as text, or its bytes in hex (the rows are decoded as text)
        match d {
            Dialect::Pg => "o.payload, encode(o.payload_bytes, 'hex')",
            Dialect::My => "o.payload, HEX(o.payload_bytes)",
            Dialect::Lite => {
                "CASE WHEN typeof(o.payload) = 'blob' THEN NULL ELSE o.payload END, \
                 CASE WHEN typeof(o.payload) = 'blob' THEN hex(o.payload) END"
            }
        },
        d.micros("o.created_at"),
        req.limit
    );
    let rows = pools.rows(&sql, &binds).await?;
    rows.into_iter().map(event).collect()
}

/// One row of [`page`] as a [`ClaimedEvent`] without a claim.
fn event(r: Vec<Option<String>>) -> Result<ClaimedEvent, StoreError> {
    let bad = || {
        StoreError::new(
            StoreErrorKind::Other,
            "replay: unexpected NULL or non-number in an outbox row",
        )
    };
    let text = |i: usize| r[i].clone().ok_or_else(bad);
    let int = |i: usize| -> Result<i64, StoreError> {
        r[i].as_deref()
            .and_then(|v| v.parse::<i64>().ok())
            .ok_or_else(bad)
    };
    Ok(ClaimedEvent {
        token: ClaimToken {
            seq: int(0)?,
            event_id: text(1)?,
            claim_id: String::new(),
            claim_version: 0,
        },
        aggregate_id: text(2)?,
        aggregate_version: int(3)?,
        shard_slot: u16::try_from(int(4)?).map_err(|_| bad())?,
        topic: text(5)?,
        key: text(6)?,
        event_type: text(7)?,
        headers: text(8)?,
        payload: match (r[9].clone(), r[10].as_deref()) {
            (Some(t), _) => Payload::Text(t),
            (None, Some(h)) => Payload::Bytes(unhex(h).ok_or_else(bad)?),
            (None, None) => return Err(bad()),
        },
        attempts: 0,
        created_at: int(11)?,
    })
}

/// Hex text (either case) → bytes; `None` if it is not.
fn unhex(h: &str) -> Option<Vec<u8>> {
    if !h.len().is_multiple_of(2) {
        return None;
    }
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect()
}
