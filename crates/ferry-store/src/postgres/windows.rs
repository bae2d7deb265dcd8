//! PostgreSQL's windows: the snapshot ticks that cut the outbox into windows (taking a tick,
//! spanning several, retiring old ones) and the check that transaction ids did not go backwards.
use ferry_core::{DispatchMode, StoreError, StoreErrorKind};

use super::sql;
use super::PgStore;
use crate::error::{db_err, Ctx};

/// `xmin` (part 0) or `xmax` (part 1) of a snapshot's text form `xmin:xmax:xip,…`.
pub(super) fn snapshot_bound(snap: &str, part: usize) -> Result<i64, StoreError> {
    snap.split(':')
        .nth(part)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::Other,
                format!("unreadable snapshot {snap:?}"),
            )
        })
}

/// The xids a snapshot's text form `xmin:xmax:xip,…` lists as running.
pub(super) fn snapshot_xip(snap: &str) -> Result<Vec<i64>, StoreError> {
    let list = snap.splitn(3, ':').nth(2).unwrap_or("");
    list.split(',')
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.parse().map_err(|_| {
                StoreError::new(
                    StoreErrorKind::Other,
                    format!("unreadable snapshot {snap:?}"),
                )
            })
        })
        .collect()
}

/// Old ticks are deleted when a read's span crosses a tick that is a multiple of this (at most
/// this many ticks linger behind the slowest cursor's window).
const TICK_RETENTION_EVERY: i64 = 16;

/// Most windows one read statement spans. Several relays (or a reader that fell behind) find
/// many small windows ahead of them, one per tick another reader took; reading up to this many
/// in one statement costs two statements per span (its ticks, its rows); a reader more than
/// `MAX_SPAN` ticks behind reads further spans in the same call, two statements each.
const MAX_SPAN: i64 = 16;

/// The windows one read statement covers: `first..=last`, bounded by the snapshots of ticks
/// `first - 1` (`lo`) and `last` (`hi`).
pub(super) struct Span {
    pub(super) lo: String,
    pub(super) hi: String,
    /// Tick `last`'s `seq_hi`: no row of the span has a higher seq (`None`: a tick stored before
    /// migration 0008 recorded it).
    pub(super) seq_hi: Option<i64>,
    pub(super) last: i64,
    /// Tick `last + 1` exists already: the reader can go on without taking a tick.
    pub(super) next: bool,
}

/// A row of [`PgStore::span`]'s statement: (tick, snapshot, newest tick, inserted by this
/// statement, the server's xmax, the tick's `seq_hi`).
type TickRow = (i64, String, Option<i64>, bool, i64, Option<i64>);

impl PgStore {
    /// The windows from `t` on that one read covers (at most [`MAX_SPAN`]), creating tick `t`
    /// from the current snapshot when no reader has yet.
    ///
    /// One statement in the common case (a caught-up reader's every read): it reads tick
    /// `t - 1`, the newest tick and the last tick of the span, and when the newest tick is
    /// `t - 1` it inserts tick `t` from the statement's own snapshot. Ticks are contiguous
    /// (tick `t` is only inserted while `t - 1` is the newest; retention deletes from below).
    /// The statement's snapshot was taken after tick `t - 1` committed (it sees it), so tick
    /// `t` sees at least as much: snapshots only grow. Concurrent readers race on the primary
    /// key; the loser's insert waits for the winner and does nothing, and the loser runs the
    /// statement again (its snapshot predates the winner's tick). The tick is committed with
    /// `synchronous_commit = off` (`set_config(…, true)` lasts until this statement's implicit
    /// commit): losing it in a crash is harmless (the next read takes another), and any advance
    /// that refers to it flushes it first.
    ///
    /// A tick is only taken if the server's snapshot is not behind tick `t - 1`'s (its xmax,
    /// the next transaction id, never decreases on one server). It is behind only when the
    /// database now lives on a server whose transaction ids are lower (a logical dump restored
    /// elsewhere, a logical-replication switchover): a window cut from such a snapshot would
    /// treat every new intent as dispatched. The read then fails ([`xids_went_backwards`])
    /// until a starting relay re-bases the cursors ([`CursorStore::set_dispatch_mode`]).
    ///
    /// A span read finds the window of every candidate row before it can drop the rows a slot
    /// has read already, so a span whose first window is large costs that window's size on
    /// every read of it (a relay restarted inside a window of 1,000,000 rows spent 10 s on one
    /// read). Window `t` is therefore read alone when the reader is inside it (`inside`) or when
    /// more seqs were drawn between ticks `t - 1` and `t` than one read returns (`limit`; every
    /// row of window `t` drew its seq before tick `t`, most after tick `t - 1`); a one-window
    /// read walks the primary key from the reader's position.
    pub(super) async fn span(
        &self,
        t: i64,
        inside: bool,
        limit: usize,
    ) -> Result<Span, StoreError> {
        for _ in 0..3 {
            let rows: Vec<TickRow> = sqlx::query_as(sql::CURSOR_READ_TICKS)
                .bind(t)
                .bind(MAX_SPAN)
                .fetch_all(self.pool())
                .await
                .map_err(|e| db_err("cursor read: ticks", e))?;
            let lo = rows.iter().find(|r| r.0 == t - 1 && !r.3).ok_or_else(|| {
                StoreError::new(
                    StoreErrorKind::Other,
                    format!("snapshot tick {} is gone: this cursor was taken over and purged; reload the cursors", t - 1),
                )
            })?;
            if let Some(ins) = rows.iter().find(|r| r.3) {
                return Ok(Span {
                    lo: lo.1.clone(),
                    hi: ins.1.clone(),
                    seq_hi: ins.5,
                    last: t,
                    next: false,
                });
            }
            let newest = lo.2.unwrap_or(t - 1);
            if newest < t && lo.4 < snapshot_bound(&lo.1, 1)? {
                return Err(xids_went_backwards(snapshot_bound(&lo.1, 1)?, lo.4));
            }
            if newest < t {
                // another reader took tick t while this statement ran: read it next time
                continue;
            }
            let mut last = newest.min(t + MAX_SPAN - 1);
            if last > t {
                let drawn = rows
                    .iter()
                    .find(|r| r.0 == t && !r.3)
                    .and_then(|r| r.5)
                    .zip(lo.5)
                    .map(|(hi, lo)| hi - lo);
                // a tick stored before migration 0008 has no seq_hi: read its window alone
                if inside || drawn.is_none_or(|n| n > limit as i64) {
                    last = t;
                }
            }
            let hi = rows.iter().find(|r| r.0 == last).ok_or_else(|| {
                StoreError::new(
                    StoreErrorKind::Other,
                    format!("snapshot tick {last} vanished"),
                )
            })?;
            let next = newest > last;
            if !next && last / TICK_RETENTION_EVERY > (t - 1) / TICK_RETENTION_EVERY {
                self.retire_ticks(last).await?;
            }
            return Ok(Span {
                lo: lo.1.clone(),
                hi: hi.1.clone(),
                seq_hi: hi.5,
                last,
                next,
            });
        }
        Err(StoreError::new(
            StoreErrorKind::Other,
            format!("snapshot tick {t}: three reads in a row lost the race to take it and did not see it"),
        ))
    }

    /// Deletes the ticks every cursor is past (a window needs its own tick and the one before),
    /// asynchronously committed like the ticks themselves.
    async fn retire_ticks(&self, t: i64) -> Result<(), StoreError> {
        sqlx::query(sql::TICK_RETENTION)
            .bind(t)
            .execute(self.pool())
            .await
            .map_err(|e| db_err("tick: retention", e))?;
        Ok(())
    }
}

/// The read's refusal when the server's transaction ids are behind the stored ticks'.
fn xids_went_backwards(tick_xmax: i64, server_xmax: i64) -> StoreError {
    StoreError::new(
        StoreErrorKind::Other,
        format!(
            "transaction ids went backwards: the newest snapshot tick has xmax {tick_xmax}, this \
             server's snapshot {server_xmax} (was the database restored from a logical dump or moved \
             to another server?); nothing is dispatched until the cursors are re-based: stop every \
             relay of this database, then start one (docs/operations.md, \"After a restore\")"
        ),
    )
}

/// `Some((newest tick's xmax, this server's xmax))` when this server's transaction ids are
/// behind the stored ticks' (see [`PgStore::span`]).
pub(super) async fn xid_regression(
    c: &mut sqlx::PgConnection,
) -> Result<Option<(i64, i64)>, StoreError> {
    let (tick, server): (Option<i64>, i64) = sqlx::query_as(sql::TRANSACTION_ID_CHECK)
        .fetch_one(c)
        .await
        .map_err(|e| db_err("transaction id check", e))?;
    Ok(tick.filter(|&t| server < t).map(|t| (t, server)))
}

impl PgStore {
    /// Refuses, in cursor dispatch, what derives states from the ticks (status, reconcile,
    /// purge) while this server's transaction ids are behind them: every intent written here
    /// would look dispatched, and purge would delete it.
    pub(crate) async fn check_xids(&self, mode: DispatchMode) -> Result<(), StoreError> {
        if mode != DispatchMode::Cursor {
            return Ok(());
        }
        let mut c = self
            .pool()
            .acquire()
            .await
            .ctx("transaction id check: connect")?;
        match xid_regression(&mut c).await? {
            Some((tick, server)) => Err(xids_went_backwards(tick, server)),
            None => Ok(()),
        }
    }
}
