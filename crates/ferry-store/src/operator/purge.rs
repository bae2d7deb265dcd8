//! Retention: deleting SENT intents older than a cut-off, in bounded statements (row dispatch by
//! `sent_at`, cursor dispatch by seq ranges of the derived state).
use ferry_core::{now_micros, DispatchMode, PurgeRequest, StoreError, StoreErrorKind};

use super::{consumer_binds, count, first_i64, inbox_exists, Bind, Pools};
use crate::dialect::Dialect;
use crate::error::db_err;
use crate::time::micros;

pub(crate) async fn purge_sent(
    pools: Pools<'_>,
    mode: DispatchMode,
    req: &PurgeRequest<'_>,
) -> Result<u64, StoreError> {
    let PurgeRequest {
        older_than,
        batch,
        consumer,
        dry_run,
        vacuum,
    } = *req;
    if batch == 0 {
        return Err(StoreError::new(
            StoreErrorKind::InvalidInput,
            "purge batch size must be at least 1",
        ));
    }
    let d = pools.dialect();
    let cutoff = if d == Dialect::Lite {
        now_micros() - micros(older_than)
    } else {
        micros(older_than)
    };
    let total = if mode == DispatchMode::Cursor {
        purge_cursor(pools, cutoff, batch, consumer, dry_run).await?
    } else {
        purge_rows(pools, cutoff, batch, consumer, dry_run).await?
    };
    if vacuum && !dry_run {
        if let Pools::Pg(pool) = pools {
            // Simple protocol: VACUUM cannot run inside the implicit transaction some drivers
            // wrap an extended-protocol statement in.
            // the outbox, and the small tables every advance and read rewrites (the slot leases
            // with the cursors, the ticks, the exception rows), which bloat just as fast without
            // autovacuum and slow every advance down
            sqlx::raw_sql(
                "VACUUM ferry_outbox, ferry_slot_lease, ferry_tick, ferry_outbox_exception",
            )
            .execute(pool)
            .await
            .map_err(|e| db_err("purge: vacuum", e))?;
        }
    }
    Ok(total)
}

/// Row dispatch: SENT rows by `sent_at` (an index of its own), `batch` per statement in seq
/// order, until a statement deletes fewer.
async fn purge_rows(
    pools: Pools<'_>,
    cutoff: i64,
    batch: usize,
    consumer: Option<&str>,
    dry_run: bool,
) -> Result<u64, StoreError> {
    let d = pools.dialect();
    // MySQL: a single-table DELETE (its bounded form, with ORDER BY/LIMIT) takes no alias.
    let (q, source) = if d == Dialect::My {
        ("ferry_outbox", "ferry_outbox")
    } else {
        ("o", "ferry_outbox o")
    };
    let mut filter = format!(
        "{q}.state = 'SENT' AND {q}.sent_at < {}",
        d.now_minus_param()
    );
    if d == Dialect::Pg {
        // the sent_at index is partial on `phase = 2` (migration 0002)
        filter.push_str(" AND o.phase = 2");
    }
    let mut binds = vec![Bind::I64(cutoff)];
    if let Some(c) = consumer {
        filter.push_str(" AND ");
        filter.push_str(&inbox_exists(q));
        binds.extend(consumer_binds(c));
    }
    if dry_run {
        return count(
            pools,
            &format!("SELECT COUNT(*) FROM {source} WHERE {filter}"),
            &binds,
        )
        .await;
    }
    let sql = if d == Dialect::My {
        format!("DELETE FROM ferry_outbox WHERE {filter} ORDER BY seq LIMIT {batch}")
    } else {
        format!(
            "DELETE FROM ferry_outbox WHERE seq IN (SELECT o.seq FROM {source} WHERE {filter} ORDER BY o.seq LIMIT {batch})"
        )
    } + &returning(d);
    let mut total = 0u64;
    loop {
        let n = pools.delete_marking(&sql, &binds).await?;
        total += n;
        if (n as usize) < batch {
            return Ok(total);
        }
        // give concurrent claims and acks a moment between bounded batches
        tokio::task::yield_now().await;
    }
}

/// Cursor dispatch: a row is SENT when it is behind its slot's cursor with no open exception
/// (`ferry_outbox_cursor_view` derives it); its age is its `created_at` (the derived state has
/// no delivery time).
///
/// The rows are walked once, in seq order, in ranges of `batch` seq values: from the lowest row
/// up to the first row in seq order that is not older than the cutoff (found by a primary-key
/// scan that stops there). Each statement deletes the rows of one range that the view derives
/// as SENT, so it looks at no more than `batch` rows whatever the table holds. (A `LIMIT batch`
/// over the whole old part instead let the planner hash-join and sort every old row for each
/// statement, its estimate of the derived-state filter being far too low: 7.3 s per 1,000
/// rows with 1.4 million old rows.) The young part
/// of the table, which is what retention keeps, is never walked. A row older than the cutoff
/// above the bound (its transaction ran long enough for a younger row to take a lower seq) is
/// deleted by a later run.
async fn purge_cursor(
    pools: Pools<'_>,
    cutoff: i64,
    batch: usize,
    consumer: Option<&str>,
    dry_run: bool,
) -> Result<u64, StoreError> {
    let d = pools.dialect();
    let hi = first_i64(
        pools
            .rows(
                &format!(
                    "SELECT seq FROM ferry_outbox WHERE created_at >= {} ORDER BY seq LIMIT 1",
                    d.now_minus_param()
                ),
                &[Bind::I64(cutoff)],
            )
            .await?,
    )
    .unwrap_or(i64::MAX);
    let Some(lowest) = first_i64(
        pools
            .rows("SELECT seq FROM ferry_outbox ORDER BY seq LIMIT 1", &[])
            .await?,
    ) else {
        return Ok(0);
    };
    let mut filter = format!(
        "o.seq >= ? AND o.seq < ? AND o.state = 'SENT' AND o.created_at < {}",
        d.now_minus_param()
    );
    if consumer.is_some() {
        filter.push_str(" AND ");
        filter.push_str(&inbox_exists("o"));
    }
    let range = |from: i64, to: i64| {
        let mut b = vec![Bind::I64(from), Bind::I64(to), Bind::I64(cutoff)];
        if let Some(c) = consumer {
            b.extend(consumer_binds(c));
        }
        b
    };
    let source = "ferry_outbox_cursor_view o";
    if dry_run {
        return count(
            pools,
            &format!("SELECT COUNT(*) FROM {source} WHERE {filter}"),
            &range(lowest, hi),
        )
        .await;
    }
    let pick = format!("SELECT o.seq FROM {source} WHERE {filter}");
    let sql = format!("DELETE FROM ferry_outbox WHERE seq IN ({pick})") + &returning(d);
    let step = i64::try_from(batch).unwrap_or(i64::MAX);
    let mut total = 0u64;
    let mut from = lowest;
    while from < hi {
        let to = from.saturating_add(step).min(hi);
        let n = if d == Dialect::My {
            delete_picked(pools, &pick, &range(from, to)).await?
        } else {
            pools.delete_marking(&sql, &range(from, to)).await?
        };
        total += n;
        from = if n > 0 {
            to
        } else {
            // nothing to delete there (a gap, or rows kept: undelivered, quarantined): go on
            // from the next row, so that a long-kept row does not make every run walk the
            // empty ranges above it
            first_i64(
                pools
                    .rows(
                        "SELECT seq FROM ferry_outbox WHERE seq >= ? ORDER BY seq LIMIT 1",
                        &[Bind::I64(to)],
                    )
                    .await?,
            )
            .unwrap_or(hi)
            .max(to)
        };
        // give concurrent reads and advances a moment between bounded statements
        tokio::task::yield_now().await;
    }
    // exception rows of purged (SENT) intents
    pools
        .exec_as(
            "DELETE FROM ferry_outbox_exception WHERE state = 'SENT' AND NOT EXISTS \
             (SELECT 1 FROM ferry_outbox o WHERE o.seq = ferry_outbox_exception.seq)",
            &[],
            "purge: exception rows",
        )
        .await?;
    Ok(total)
}

/// MariaDB's purge batch: the rows `pick` chooses, by a plain read, then deleted by key.
///
/// InnoDB reads the tables of a subquery inside a `DELETE` with shared locks (a locking read,
/// as `INSERT … SELECT` does), and the cursor view joins every row to its slot's
/// `ferry_slot_lease` row: one statement `DELETE … WHERE seq IN (SELECT … FROM
/// ferry_outbox_cursor_view …)` share-locked the slot leases for as long as it ran, so the
/// relays' lease renewals and cursor advances (which update those rows) waited behind it, up to
/// 23 s beside a flat-out load, until the relay lost its slots. The plain read takes no lock; a
/// row it finds SENT stays SENT (a cursor never moves back, a delivered exception is final, a
/// switch of dispatch mode keeps finished rows finished), so deleting it by key later is still
/// right. A row another purge deleted meanwhile is simply not returned.
async fn delete_picked(pools: Pools<'_>, pick: &str, binds: &[Bind]) -> Result<u64, StoreError> {
    let seqs: Vec<Bind> = pools
        .rows_as(pick, binds, "purge: choose rows")
        .await?
        .into_iter()
        .filter_map(|r| r[0].as_deref().and_then(|v| v.parse().ok()).map(Bind::I64))
        .collect();
    if seqs.is_empty() {
        return Ok(0);
    }
    let marks = vec!["?"; seqs.len()].join(", ");
    let delete = format!(
        "DELETE FROM ferry_outbox WHERE seq IN ({marks}){}",
        returning(pools.dialect())
    );
    pools.delete_marking(&delete, &seqs).await
}

/// What a purge's DELETE returns for the retention watermark ([`Pools::delete_marking`]): each
/// deleted row's topic and `created_at` in µs. The watermark is by `created_at` in both modes,
/// also where the purge cuts by `sent_at` (row dispatch): a replay selects by `created_at`, and
/// every purged row's `created_at` is at or below the newest one, so a range that starts after
/// it contains no purged row.
fn returning(d: Dialect) -> String {
    format!(" RETURNING topic, {}", d.micros("created_at"))
}
