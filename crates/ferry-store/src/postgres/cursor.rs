//! Cursor dispatch on PostgreSQL: snapshot windows, as PgQ reads its event tables.
//!
//! Each row stores its inserting top-level transaction id (`ferry_outbox.xid`, default
//! `pg_current_xact_id()`). A *tick* stores a snapshot (`ferry_tick`); window `t` is the set of
//! rows whose transaction is visible in tick `t`'s snapshot and not in tick `t - 1`'s. Ticks
//! only grow (tick `t` is taken after tick `t - 1` committed), so every committed row is in
//! exactly one window, the first whose snapshot sees its transaction commit; and a window's row
//! set is fixed once its tick exists, so reading it in `seq` order in LIMIT-sized pieces can
//! never skip a row ("no skipped commit", whatever order transactions commit in). Within a
//! window the order is `seq`, never `xid`: a transaction takes its xid at its first write, and
//! may insert an aggregate's `v(n+1)` after a transaction with a higher xid committed `v(n)`;
//! the seq is drawn at the insert, after that commit. One read statement covers up to
//! [`MAX_SPAN`] consecutive windows, each row's window being the first of their ticks whose
//! snapshot sees it, in `(window, seq)` order: positions keep their one-window meaning. A long
//! transaction delays only its own rows (it stays in the lower snapshots' running lists, which
//! reads look up by xid), and [`CursorStore::horizon`] reports it.
use std::collections::{HashMap, HashSet};

use ferry_core::{
    AdvanceResult, BoxFuture, CasReport, ClaimRequest, ClaimToken, ClaimedEvent, CursorAdvance,
    CursorBatch, CursorEvent, CursorPos, CursorRead, CursorStore, DispatchMode, ExceptionOutcomes,
    HorizonInfo, SlotCursor, SlotId, StoreError, StoreErrorKind,
};
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::common::{claiming, exception_row, mode_in_use, slotless_advance, Ctx};
use crate::db_err;
use crate::outcome::Outcome;
use crate::postgres::{PgStore, EXCEPTIONS};

/// The intent columns of `ferry_outbox o` in [`event_at`]'s order (`created_at` as µs since the
/// epoch, like the row-mode claim).
const EVENT_COLUMNS: &str = "o.seq, o.event_id, coalesce(o.claim_id, '') AS claim_id, o.claim_version, \
    o.aggregate_id, o.aggregate_version, o.shard_slot, o.topic, o.msg_key, o.event_type, o.headers, \
    o.payload, o.attempts, (extract(epoch from o.created_at) * 1000000)::int8 AS created_us";

/// The open exception states: they hold their aggregate's later events.
const OPEN: &str = "('PENDING', 'CLAIMED', 'QUARANTINED')";

/// Reads [`EVENT_COLUMNS`] starting at column `off`.
fn event_at(r: &PgRow, off: usize) -> ClaimedEvent {
    ClaimedEvent {
        token: ClaimToken {
            seq: r.get(off),
            event_id: r.get(off + 1),
            claim_id: r.get(off + 2),
            claim_version: r.get(off + 3),
        },
        aggregate_id: r.get(off + 4),
        aggregate_version: r.get(off + 5),
        shard_slot: r.get::<i16, _>(off + 6) as SlotId,
        topic: r.get(off + 7),
        key: r.get(off + 8),
        event_type: r.get(off + 9),
        headers: r.get(off + 10),
        payload: r.get(off + 11),
        attempts: r.get(off + 12),
        created_at: r.get(off + 13),
    }
}

fn slots_i16(slots: impl IntoIterator<Item = SlotId>) -> Vec<i16> {
    slots.into_iter().map(|s| s as i16).collect()
}

/// `xmin` (part 0) or `xmax` (part 1) of a snapshot's text form `xmin:xmax:xip,…`.
fn snapshot_bound(snap: &str, part: usize) -> Result<i64, StoreError> {
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
fn snapshot_xip(snap: &str) -> Result<Vec<i64>, StoreError> {
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

/// How a read statement keeps each row past its slot's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotBound {
    /// The start position is every slot's bound (one window, every slot at one position).
    Start,
    /// One `(tick, xid, seq)` for every slot.
    Uniform,
    /// Three arrays indexed by slot + 1.
    PerSlot,
}

/// The read statement of [`CursorStore::read_batch`] for one span. Parameters: `$1` the lower
/// snapshot's xmax, `$2` the upper one's, `$3` the start seq (rows at or below it are not
/// returned), `$4` the upper tick's `seq_hi` (no row of the span has a higher seq), `$5` the
/// lower snapshot's running xids, `$6` the upper one's, `$7` the limit, `$8, $9` the span's first
/// and last tick; then, in this order and only when used, the slot flags (`bool[256]`, when not
/// every slot is read) and the bound (`SlotBound::Uniform`: tick, seq; `PerSlot`: the same as
/// `int8[256]` arrays).
///
/// **Order.** Rows come in `(window, seq)` order. `seq` is drawn at the insert, so a transaction
/// that wrote `v(n+1)` after seeing `v(n)` committed (a row lock, the unique
/// `(aggregate_id, aggregate_version)` constraint) drew a higher seq, whatever its xid: an xid is
/// taken at a transaction's first write, possibly before it waited for the aggregate's lock
/// (docs/architecture.md, "Per-aggregate order"). The identity sequence must not cache values
/// (`check_seq_cache`), or a session could draw a lower seq after another's higher one.
///
/// **Which rows.** The rows a span can hold are those whose transaction the lower snapshot does
/// not see: transactions that were running at it (`xid = ANY($5)`) and those that began after it
/// (`xid >= $1`), up to the upper snapshot's xmax. Rows of the transactions between its xmin and
/// xmax that it does see were dispatched by earlier windows. The upper snapshot sees a
/// transaction below its xmax iff it is not in its running list (`xid <> ALL($6)`): a plain
/// comparison the planner estimates, where `pg_visible_in_snapshot` got a default selectivity.
/// For the same reason the slot flags and the bound are left out when they hold for every row,
/// and the slots read are flags (`($n::bool[])[slot + 1]`), not `shard_slot = ANY(array)`.
///
/// `one_window` (`$8` = `$9`): two branches, each in seq order and cut at the limit, merged.
/// * Transactions running at the lower snapshot (few, possibly long): per xid, its rows in seq
///   order from the `(xid, seq)` index, at most a limit each.
/// * Transactions begun after it (the bulk): the primary key from the start seq to `$4`, keeping
///   the rows whose xid lies in the window. `xid + 0 >= $1` keeps the planner off the
///   `(xid, seq)` index here: read in xid order, a window of a million rows (a burn-down) would
///   be sorted whole for every limit-sized piece. The upper bound stays a plain `xid < $2`, which
///   the planner estimates from the column's statistics (nearly every row): with both bounds
///   opaque it estimated a 700,000-row range to hold 3,500 matches and read 2,000 rows with two
///   parallel workers, 7–14 ms against 0.7 ms serially. At a window's start (`from_floor`) the scan begins at
///   the lowest seq any of these transactions wrote, found by one `(xid, seq)` index probe per
///   transaction (a loose index scan), not at seq 0; within a window it begins at the start seq,
///   below which every row of the window was read.
///
/// Several windows: each row's window is looked up among the span's ticks `$8 ..= $9` (a later
/// window can hold a lower seq), and rows come in `(window, seq)` order, so a read cut at its
/// limit stops at a position of the one-window form.
fn read_sql(one_window: bool, from_floor: bool, slot_flags: bool, bound: SlotBound) -> String {
    let mut n = 9;
    let mut next = || {
        n += 1;
        n
    };
    let tick = if one_window {
        "least($8::int8, $9::int8)" // = $8
    } else {
        "w.tick"
    };
    let flags = if slot_flags {
        format!(" AND (${}::bool[])[o.shard_slot + 1]", next())
    } else {
        String::new()
    };
    let bound = match bound {
        SlotBound::Start => String::new(),
        SlotBound::Uniform => {
            let (t, q) = (next(), next());
            format!(" AND ({tick}, o.seq) > (${t}::int8, ${q}::int8)")
        }
        SlotBound::PerSlot => {
            let (t, q) = (next(), next());
            format!(
                " AND ({tick}, o.seq) > ((${t}::int8[])[o.shard_slot + 1], \
                 (${q}::int8[])[o.shard_slot + 1])"
            )
        }
    };
    let filter =
        format!("o.xid <> ALL($6::int8[]) AND o.state IN ('PENDING', 'CLAIMED'){flags}{bound}");
    // One window only: a span's rows are found by their xids alone (a seq range there let the
    // planner walk the primary key over the whole table: 9 s on 12,000,000 rows).
    let seq_range = "o.seq > $3 AND o.seq <= $4";
    let cols = format!(
        "o.xid, {tick} AS tick, {EVENT_COLUMNS}, \
         EXISTS (SELECT 1 FROM ferry_outbox_exception x WHERE x.aggregate_id = o.aggregate_id \
           AND x.state IN {OPEN}) AS held"
    );
    if one_window {
        let (with, floor) = if from_floor {
            (
                "WITH RECURSIVE fx AS ( \
                   (SELECT f.xid, f.seq FROM ferry_outbox f WHERE f.xid >= $1 AND f.xid < $2 \
                    ORDER BY f.xid, f.seq LIMIT 1) \
                   UNION ALL \
                   SELECT n.xid, n.seq FROM fx CROSS JOIN LATERAL \
                     (SELECT f.xid, f.seq FROM ferry_outbox f WHERE f.xid > fx.xid AND f.xid < $2 \
                      ORDER BY f.xid, f.seq LIMIT 1) n), \
                 fl AS (SELECT min(fx.seq) AS seq FROM fx) ",
                " AND o.seq >= (SELECT fl.seq FROM fl)",
            )
        } else {
            ("", "")
        };
        format!(
            "{with}SELECT * FROM ( \
               (SELECT q.* FROM unnest($5::int8[]) AS r(xid) CROSS JOIN LATERAL \
                  (SELECT {cols} FROM ferry_outbox o WHERE o.xid = r.xid AND o.xid < $2 AND {seq_range} AND {filter} \
                   ORDER BY o.seq LIMIT $7) q) \
               UNION ALL \
               (SELECT {cols} FROM ferry_outbox o WHERE o.xid + 0 >= $1 AND o.xid < $2{floor} \
                  AND {seq_range} AND {filter} \
                ORDER BY o.seq LIMIT $7)) u \
             ORDER BY 3 LIMIT $7"
        )
    } else {
        // `$3` and `$4` are not needed here; they are referenced so that the server can type them.
        format!(
            "SELECT {cols} FROM ferry_outbox o \
               CROSS JOIN LATERAL (SELECT k.tick_id AS tick FROM ferry_tick k \
                 WHERE k.tick_id BETWEEN $8 AND $9 \
                   AND pg_visible_in_snapshot(o.xid::text::xid8, k.snap) \
                 ORDER BY k.tick_id LIMIT 1) w \
             WHERE (o.xid = ANY($5::int8[]) OR o.xid >= $1) AND o.xid < $2 AND $3::int8 IS NOT NULL \
               AND $4::int8 IS NOT NULL AND {filter} \
             ORDER BY 2, o.seq LIMIT $7"
        )
    }
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
struct Span {
    lo: String,
    hi: String,
    /// Tick `last`'s `seq_hi`: no row of the span has a higher seq (`None`: a tick stored before
    /// migration 0008 recorded it).
    seq_hi: Option<i64>,
    last: i64,
    /// Tick `last + 1` exists already: the reader can go on without taking a tick.
    next: bool,
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
    async fn span(&self, t: i64, inside: bool, limit: usize) -> Result<Span, StoreError> {
        for _ in 0..3 {
            let rows: Vec<TickRow> = sqlx::query_as(
                "WITH cfg AS (SELECT set_config('synchronous_commit', 'off', true) AS v), \
                 top AS (SELECT max(tick_id) AS m FROM ferry_tick), \
                 cur AS (SELECT pg_current_snapshot() AS snap), \
                 ins AS (INSERT INTO ferry_tick (tick_id, snap, seq_hi) \
                         SELECT $1, cur.snap, \
                           coalesce(pg_sequence_last_value(pg_get_serial_sequence('ferry_outbox', 'seq')::regclass), 0) \
                         FROM cfg, top, cur WHERE top.m = $1 - 1 \
                           AND pg_snapshot_xmax(cur.snap) >= \
                               (SELECT pg_snapshot_xmax(k.snap) FROM ferry_tick k WHERE k.tick_id = $1 - 1) \
                         ON CONFLICT (tick_id) DO NOTHING RETURNING tick_id, snap::text, seq_hi) \
                 SELECT k.tick_id, k.snap::text, top.m, false, pg_snapshot_xmax(cur.snap)::text::int8, k.seq_hi \
                   FROM ferry_tick k, top, cur \
                   WHERE k.tick_id = $1 - 1 OR k.tick_id = $1 OR k.tick_id = least(top.m, $1 + $2 - 1) \
                 UNION ALL SELECT tick_id, snap, tick_id, true, 0::int8, seq_hi FROM ins",
            )
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
        sqlx::query(
            "WITH cfg AS (SELECT set_config('synchronous_commit', 'off', true) AS v) \
             DELETE FROM ferry_tick WHERE tick_id < (SELECT min(cursor_tick) - 1 FROM ferry_slot_lease) \
               AND tick_id < $1 - 1 AND EXISTS (SELECT 1 FROM cfg)",
        )
        .bind(t)
        .execute(self.pool())
        .await
        .map_err(|e| db_err("tick: retention", e))?;
        Ok(())
    }

    /// The stored dispatch mode (`ferry_dispatch`).
    pub(crate) async fn stored_mode(&self) -> Result<DispatchMode, StoreError> {
        crate::common::stored_mode::<_, String>(self.pool()).await
    }
}

impl CursorStore for PgStore {
    fn dispatch_mode(&self) -> BoxFuture<'_, Result<DispatchMode, StoreError>> {
        Box::pin(self.stored_mode())
    }

    fn set_dispatch_mode<'a>(
        &'a self,
        mode: DispatchMode,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            if mode == DispatchMode::Cursor {
                self.check_seq_cache().await?;
            }
            let mut tx = self.pool().begin().await.ctx("dispatch mode: begin")?;
            // A conversion takes ferry_outbox's table lock, which waits for every open
            // transaction that wrote to it: give up with a clear error rather than stall
            // producers behind it.
            exec_lock_timeout(&mut tx).await?;
            // Serialises conversions: a second one waits here, then finds the mode set.
            let current: String =
                sqlx::query_scalar("SELECT mode FROM ferry_dispatch WHERE id = 1 FOR UPDATE")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| db_err("dispatch mode", e))?;
            // Already in cursor mode, but on a server whose transaction ids are behind the
            // stored ticks (see `span`): re-base the cursors (docs/architecture.md, "After a
            // restore").
            let rebase = current == mode.as_str()
                && mode == DispatchMode::Cursor
                && xid_regression(&mut tx).await?.is_some();
            if current == mode.as_str() && !rebase {
                return Ok(false);
            }
            let others: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM ferry_relay_member WHERE owner <> $1 AND lease_until > now()",
            )
            .bind(owner)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| db_err("dispatch mode: members", e))?;
            if others > 0 && rebase {
                return Err(StoreError::new(
                    StoreErrorKind::InvalidInput,
                    format!(
                        "this server's transaction ids are behind the outbox's snapshot ticks (restored \
                         from a logical dump, or moved to another server?) and the cursors must be \
                         re-based, but {others} other relay(s) of this database are live: stop them first"
                    ),
                ));
            }
            if others > 0 {
                return Err(mode_in_use(&current, others, mode));
            }
            let exec = |sql: &'static str| sqlx::query(sql);
            match mode {
                DispatchMode::Cursor if rebase => {
                    exec("LOCK TABLE ferry_outbox IN ACCESS EXCLUSIVE MODE")
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| db_err("re-base cursors: lock the outbox (waits at most 10 s for transactions that wrote to it)", e))?;
                    // Rows at or below `old` were written on the server the ticks come from
                    // (a row whose xid this server has not reached yet is one of them, and every
                    // row written here has a higher seq than every restored row): their states
                    // follow from the old ticks and cursors. Rows above it may have been
                    // written here, so they count as not yet dispatched (sent again if they
                    // were: duplicates, never a loss). Exception rows keep their states.
                    let old: i64 = sqlx::query_scalar(
                        "SELECT coalesce(max(seq), 0) FROM ferry_outbox \
                         WHERE xid >= pg_snapshot_xmax(pg_current_snapshot())::text::int8",
                    )
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| db_err("re-base cursors: restored rows", e))?;
                    let n = sqlx::query(MATERIALIZE_STATES)
                        .bind(old)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| db_err("re-base cursors: states", e))?
                        .rows_affected();
                    exec("DELETE FROM ferry_outbox_exception")
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| db_err("re-base cursors: exceptions", e))?;
                    // every unfinished row goes to the first window, in seq order
                    exec("UPDATE ferry_outbox SET xid = 3 WHERE state IN ('PENDING', 'CLAIMED')")
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| db_err("re-base cursors: xids", e))?;
                    tracing::warn!(
                        restored_up_to_seq = old,
                        states_written = n,
                        "this server's transaction ids are behind the outbox's snapshot ticks: re-based the cursors; \
                         intents above the restored seq are sent again if they had been sent"
                    );
                    start_cursors(&mut tx).await?;
                }
                DispatchMode::Cursor => {
                    // First, so that the ACCESS EXCLUSIVE lock on ferry_outbox is the first lock
                    // this transaction takes on it (no lock upgrade): in-flight inserts finish,
                    // new ones wait for the commit.
                    // Cursor dispatch never updates an outbox row: no room is kept on new heap
                    // pages for HOT updates (migration 0009).
                    for s in [
                        "DROP INDEX IF EXISTS ferry_outbox_dispatch",
                        "DROP INDEX IF EXISTS ferry_outbox_unfinished",
                        "ALTER TABLE ferry_outbox SET (fillfactor = 100)",
                    ] {
                        exec(s)
                            .execute(&mut *tx)
                            .await
                            .map_err(|e| db_err("dispatch mode: drop row-mode indexes (waits at most 10 s for transactions that wrote to ferry_outbox)", e))?;
                    }
                    // Rows written before migration 0003 have no xid: give unfinished ones a
                    // low one (3, the first normal xid), so the first window reads them.
                    exec("UPDATE ferry_outbox SET xid = 3 WHERE xid IS NULL AND state IN ('PENDING', 'CLAIMED')")
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| db_err("dispatch mode: xids of old rows", e))?;
                    start_cursors(&mut tx).await?;
                }
                DispatchMode::Row => {
                    // Rows behind their slot's cursor take the state the cursor gave them.
                    sqlx::query(MATERIALIZE_STATES)
                        .bind(i64::MAX)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| db_err("dispatch mode: row states", e))?;
                    let stmts: [(&'static str, &str); 6] = [
                        (
                            "DELETE FROM ferry_outbox_exception",
                            "dispatch mode: exceptions",
                        ),
                        ("DELETE FROM ferry_tick", "dispatch mode: ticks"),
                        (
                            "UPDATE ferry_slot_lease SET cursor_tick = NULL, cursor_xid = NULL, cursor_seq = NULL, cursor_claim_id = NULL, \
                               cursor_version = cursor_version + 1, epoch = epoch + 1, owner = NULL, lease_until = NULL",
                            "dispatch mode: cursors",
                        ),
                        // exactly as migration 0002 defines them
                        (
                            "CREATE INDEX IF NOT EXISTS ferry_outbox_dispatch ON ferry_outbox (seq) WHERE phase = 0",
                            "dispatch mode: dispatch index",
                        ),
                        (
                            "CREATE INDEX IF NOT EXISTS ferry_outbox_unfinished \
                               ON ferry_outbox (aggregate_id, aggregate_version) WHERE phase < 2",
                            "dispatch mode: unfinished index",
                        ),
                        // room for the HOT updates of claims and acks again (migration 0002)
                        (
                            "ALTER TABLE ferry_outbox SET (fillfactor = 70)",
                            "dispatch mode: fillfactor",
                        ),
                    ];
                    for (s, what) in stmts {
                        exec(s)
                            .execute(&mut *tx)
                            .await
                            .map_err(|e| db_err(what, e))?;
                    }
                }
            }
            sqlx::query("UPDATE ferry_dispatch SET mode = $1, changed_at = now() WHERE id = 1")
                .bind(mode.as_str())
                .execute(&mut *tx)
                .await
                .map_err(|e| db_err("dispatch mode: set", e))?;
            tx.commit().await.ctx("dispatch mode: commit")?;
            Ok(true)
        })
    }

    fn load_cursors<'a>(
        &'a self,
        owner: &'a str,
        slots: &'a [SlotId],
    ) -> BoxFuture<'a, Result<Vec<SlotCursor>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(
                // A position with an xid was written by a relay of a version that read windows
                // in (xid, seq) order; it goes back to its window's start (sent again, never
                // skipped).
                "SELECT slot, epoch, cursor_version, cursor_tick, 0::int8, \
                   CASE WHEN cursor_xid = 0 THEN cursor_seq ELSE 0 END FROM ferry_slot_lease \
                 WHERE owner = $1 AND lease_until > now() AND cursor_tick IS NOT NULL AND slot = ANY($2) \
                 ORDER BY slot",
            )
            .bind(owner)
            .bind(slots_i16(slots.iter().copied()))
            .fetch_all(self.pool())
            .await
            .map_err(|e| db_err("load cursors", e))?;
            Ok(rows
                .iter()
                .map(|r| SlotCursor {
                    slot: r.get::<i16, _>(0) as SlotId,
                    epoch: r.get(1),
                    version: r.get(2),
                    pos: CursorPos::at(r.get(3), r.get(4), r.get(5)),
                })
                .collect())
        })
    }

    fn read_batch<'a>(
        &'a self,
        req: &'a CursorRead,
    ) -> BoxFuture<'a, Result<CursorBatch, StoreError>> {
        Box::pin(async move {
            let Some(min) = req.from.iter().map(|(_, p)| *p).min() else {
                return Ok(CursorBatch::default());
            };
            if req.limit == 0 {
                return Ok(CursorBatch {
                    upto: min,
                    ..CursorBatch::default()
                });
            }
            // Windows in order, from the lowest requested one, up to MAX_SPAN per statement:
            // each statement takes the slots whose position is in its span or below (rows at or
            // below a slot's own position are dropped), and a read goes on to the next span
            // while its first tick exists already (another reader took it), so a reader behind
            // the newest tick catches up in one call.
            let mut events = Vec::new();
            let mut t = min.tick;
            let mut start = min;
            let mut more = false;
            let upto = loop {
                let inside = start.tick == t && start.seq > 0;
                let span = self.span(t, inside, req.limit - events.len()).await?;
                let from: HashMap<SlotId, CursorPos> = req
                    .from
                    .iter()
                    .copied()
                    .filter(|(_, p)| p.tick <= span.last)
                    .collect();
                let (lo_xmax, hi_xmax) =
                    (snapshot_bound(&span.lo, 1)?, snapshot_bound(&span.hi, 1)?);
                let (lo_xip, hi_xip) = (snapshot_xip(&span.lo)?, snapshot_xip(&span.hi)?);
                let limit = req.limit - events.len();
                let one_window = span.last == t;
                if !one_window {
                    // later windows of a span can hold lower xids than the start position
                    start = CursorPos::at(t, i64::MIN, i64::MIN);
                }
                // Per slot, its position: rows a slot has read already are filtered here, so
                // they neither come back nor use up the limit when one slot lags the others (a
                // slot whose read was cut before an aggregate still in flight). Most reads have
                // every slot at one position (a batch's `upto` moves all the slots it read): one
                // bound for all, and in one window that bound is the start.
                let bound = |p: &CursorPos| {
                    if p.tick >= t {
                        *p
                    } else {
                        CursorPos::at(i64::MIN, i64::MIN, i64::MIN)
                    }
                };
                let mut bounds = from.values().map(bound);
                let first = bounds.next();
                let uniform = first.filter(|b| bounds.all(|o| o == *b));
                let slot_bound = match uniform {
                    Some(b) if one_window => {
                        if b.tick == t {
                            start = start.max(b);
                        }
                        SlotBound::Start
                    }
                    Some(_) => SlotBound::Uniform,
                    None => SlotBound::PerSlot,
                };
                let n = ferry_core::SLOT_COUNT as usize;
                let slot_flags = from.len() < n;
                // At a window's start the primary-key scan begins at the window's lowest seq.
                let from_floor = start.seq <= 0;
                let sql = read_sql(one_window, from_floor, slot_flags, slot_bound);
                let mut q = sqlx::query(&sql)
                    .bind(lo_xmax)
                    .bind(hi_xmax)
                    .bind(start.seq)
                    .bind(span.seq_hi.unwrap_or(i64::MAX))
                    .bind(&lo_xip)
                    .bind(&hi_xip)
                    .bind(limit as i64)
                    .bind(t)
                    .bind(span.last);
                if slot_flags {
                    let mut read_slots = vec![false; n];
                    for slot in from.keys() {
                        read_slots[*slot as usize] = true;
                    }
                    q = q.bind(read_slots);
                }
                match (slot_bound, uniform) {
                    (SlotBound::Uniform, Some(b)) => q = q.bind(b.tick).bind(b.seq),
                    (SlotBound::PerSlot, _) => {
                        let (mut ticks, mut seqs) = (vec![None::<i64>; n], vec![None::<i64>; n]);
                        for (slot, p) in &from {
                            let b = bound(p);
                            ticks[*slot as usize] = Some(b.tick);
                            seqs[*slot as usize] = Some(b.seq);
                        }
                        q = q.bind(ticks).bind(seqs);
                    }
                    _ => {}
                }
                let rows = q
                    .fetch_all(self.pool())
                    .await
                    .map_err(|e| db_err("cursor read", e))?;
                // Positions are (window, seq): the xid is not part of the order.
                let pos = |r: &PgRow| CursorPos::at(r.get(1), 0, r.get(2));
                let full = rows.len() >= limit;
                let last = rows.last().map(pos);
                events.extend(
                    rows.iter()
                        .filter(|r| {
                            let slot = r.get::<i16, _>(8) as SlotId;
                            from.get(&slot).is_some_and(|p| pos(r) > *p)
                        })
                        .map(|r| CursorEvent {
                            pos: pos(r),
                            held: r.get(16),
                            event: event_at(r, 2),
                        }),
                );
                match last {
                    Some(last) if full => {
                        more = true;
                        break last;
                    }
                    // the span is read: the next read starts the window after it
                    _ if !span.next => break CursorPos::at(span.last + 1, 0, 0),
                    _ => {
                        t = span.last + 1;
                        start = CursorPos::at(t, 0, 0);
                    }
                }
            };
            Ok(CursorBatch {
                events,
                upto,
                more,
                slot_upto: Vec::new(),
            })
        })
    }

    fn advance<'a>(
        &'a self,
        req: &'a CursorAdvance,
    ) -> BoxFuture<'a, Result<AdvanceResult, StoreError>> {
        Box::pin(async move {
            if let Some(done) = slotless_advance(req) {
                return done;
            }
            // rows are locked in slot order (as acquire_slots does): no deadlock between them.
            // The locking subquery is a CTE: evaluated once (as a join input it was rescanned,
            // and re-locked, for every slot: 67k buffer hits for 256 slots, 2.2k as a CTE).
            let mut slots = req.slots.clone();
            slots.sort_by_key(|s| s.slot);
            let mut tx = self.pool().begin().await.ctx("advance: begin")?;
            // Committed asynchronously, like the ticks: an advance lost in a server crash only
            // moves the cursor back, and its events are read and sent again (docs/architecture.md,
            // "The four crash windows"). Every later synchronous commit (a producer's, an
            // exception's SENT) flushes it first: the WAL is written in order.
            sqlx::query("SET LOCAL synchronous_commit = off")
                .execute(&mut *tx)
                .await
                .map_err(|e| db_err("advance", e))?;
            let moved: Vec<i16> = sqlx::query_scalar(
                "WITH k AS (SELECT slot FROM ferry_slot_lease WHERE slot = ANY($1) ORDER BY slot FOR UPDATE) \
                 UPDATE ferry_slot_lease l SET cursor_tick = t.tick, cursor_xid = t.xid, cursor_seq = t.seq, \
                   cursor_version = l.cursor_version + 1, cursor_claim_id = $6 \
                 FROM UNNEST($1::int2[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $8::int8[]) \
                   AS t(slot, epoch, version, xid, seq, tick) \
                 WHERE l.slot = t.slot AND t.slot IN (SELECT slot FROM k) AND l.owner = $7 AND l.lease_until > now() \
                   AND l.epoch = t.epoch AND l.cursor_version = t.version AND l.cursor_tick IS NOT NULL \
                 RETURNING l.slot",
            )
            .bind(slots_i16(slots.iter().map(|s| s.slot)))
            .bind(slots.iter().map(|s| s.epoch).collect::<Vec<_>>())
            .bind(slots.iter().map(|s| s.version).collect::<Vec<_>>())
            .bind(slots.iter().map(|s| s.to.xid).collect::<Vec<_>>())
            .bind(slots.iter().map(|s| s.to.seq).collect::<Vec<_>>())
            .bind(&req.claim_id)
            .bind(&req.owner)
            .bind(slots.iter().map(|s| s.to.tick).collect::<Vec<_>>())
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| db_err("advance", e))?;
            let wanted: HashSet<SlotId> = slots.iter().map(|s| s.slot).collect();
            let got: HashSet<i16> = moved.into_iter().collect();
            if got.len() != wanted.len() {
                tx.rollback()
                    .await
                    .map_err(|e| db_err("advance: rollback", e))?;
                return Ok(AdvanceResult::Fenced);
            }
            if !req.exceptions.is_empty() {
                let rows: Vec<_> = req
                    .exceptions
                    .iter()
                    .map(|x| (x, exception_row(&x.kind)))
                    .collect();
                sqlx::query(
                    "INSERT INTO ferry_outbox_exception (seq, shard_slot, aggregate_id, aggregate_version, \
                       state, available_at, attempts, last_error) \
                     SELECT t.seq, t.slot, t.aggregate_id, t.aggregate_version, t.state, \
                       now() + t.delay_us * interval '1 microsecond', t.attempts, t.last_error \
                     FROM UNNEST($1::int8[], $2::int2[], $3::varchar[], $4::int8[], $5::varchar[], \
                       $6::int8[], $7::int4[], $8::text[]) \
                       AS t(seq, slot, aggregate_id, aggregate_version, state, delay_us, attempts, last_error) \
                     ON CONFLICT (seq) DO NOTHING",
                )
                .bind(rows.iter().map(|(x, _)| x.seq).collect::<Vec<_>>())
                .bind(slots_i16(rows.iter().map(|(x, _)| x.slot)))
                .bind(
                    rows.iter()
                        .map(|(x, _)| x.aggregate_id.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rows.iter()
                        .map(|(x, _)| x.aggregate_version)
                        .collect::<Vec<_>>(),
                )
                .bind(rows.iter().map(|(_, r)| r.0).collect::<Vec<_>>())
                .bind(rows.iter().map(|(_, r)| r.1).collect::<Vec<_>>())
                .bind(rows.iter().map(|(x, _)| x.attempts).collect::<Vec<_>>())
                .bind(rows.iter().map(|(_, r)| r.2).collect::<Vec<Option<&str>>>())
                .execute(&mut *tx)
                .await
                .map_err(|e| db_err("advance: exceptions", e))?;
            }
            tx.commit().await.ctx("advance: commit")?;
            Ok(AdvanceResult::Applied)
        })
    }

    fn lookup_advance<'a>(&'a self, claim_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM ferry_slot_lease WHERE cursor_claim_id = $1)",
            )
            .bind(claim_id)
            .fetch_one(self.pool())
            .await
            .map_err(|e| db_err("lookup advance", e))
        })
    }

    fn claim_exceptions<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Vec<ClaimedEvent>, StoreError>> {
        Box::pin(claiming(req, async move {
            // As the row-mode claim: with a fence, only slots whose lease the owner holds now.
            let slot_filter = crate::postgres::claim_slot_filter("x", req);
            // The predecessor rule among open exceptions, as "x is its aggregate's lowest open
            // version" (an index probe per candidate on ferry_outbox_exception_open).
            let sql = format!(
                "WITH due AS ( \
                   SELECT x.seq FROM ferry_outbox_exception x WHERE {slot_filter} \
                     AND ((x.state = 'PENDING' AND x.available_at <= now()) \
                       OR (x.state = 'CLAIMED' AND x.lease_until <= now())) \
                     AND x.aggregate_version = (SELECT min(p.aggregate_version) FROM ferry_outbox_exception p \
                       WHERE p.aggregate_id = x.aggregate_id AND p.state IN {OPEN}) \
                   ORDER BY x.seq LIMIT $2 \
                   FOR UPDATE OF x SKIP LOCKED), \
                 claimed AS ( \
                   UPDATE ferry_outbox_exception x SET state = 'CLAIMED', claim_version = x.claim_version + 1, \
                     claim_id = $3, lease_until = now() + $4 * interval '1 microsecond' \
                   FROM due WHERE x.seq = due.seq \
                   RETURNING x.seq, x.claim_id, x.claim_version, x.attempts) \
                 SELECT {EVENT_COLUMNS}, c.claim_id, c.claim_version, c.attempts \
                 FROM claimed c JOIN ferry_outbox o ON o.seq = c.seq ORDER BY o.seq"
            );
            let rows = crate::postgres::bind_claim(&sql, req)
                .fetch_all(self.pool())
                .await
                .map_err(|e| db_err("claim exceptions", e))?;
            Ok(rows
                .iter()
                .map(|r| {
                    let mut e = event_at(r, 0);
                    e.token.claim_id = r.get(14);
                    e.token.claim_version = r.get(15);
                    e.attempts = r.get(16);
                    e
                })
                .collect())
        }))
    }

    fn settle_exceptions<'a>(
        &'a self,
        out: &'a ExceptionOutcomes,
    ) -> BoxFuture<'a, Result<CasReport, StoreError>> {
        Box::pin(async move {
            let mut tx = self.pool().begin().await.ctx("settle exceptions: begin")?;
            let mut report = CasReport::default();
            for o in Outcome::settling(out) {
                let done = crate::postgres::cas_on(&mut *tx, &EXCEPTIONS, &o).await?;
                report.items.extend(done.items);
            }
            tx.commit().await.ctx("settle exceptions: commit")?;
            Ok(report)
        })
    }

    fn horizon(&self) -> BoxFuture<'_, Result<HorizonInfo, StoreError>> {
        Box::pin(async move {
            // The horizon (pg_snapshot_xmin) is the oldest xid still running anywhere in the
            // cluster: an open transaction that wrote (or asked for its xid), or a prepared one.
            let row: Option<(i64, Option<i64>)> = sqlx::query_as(
                "SELECT pid, age_us FROM ( \
                   SELECT pid::int8 AS pid, (extract(epoch from now() - xact_start) * 1000000)::int8 AS age_us, \
                     age(backend_xid) AS xid_age \
                   FROM pg_stat_activity WHERE backend_xid IS NOT NULL \
                   UNION ALL \
                   SELECT 0::int8, (extract(epoch from now() - prepared) * 1000000)::int8, age(transaction) \
                   FROM pg_prepared_xacts) t \
                 ORDER BY xid_age DESC LIMIT 1",
            )
            .fetch_optional(self.pool())
            .await
            .map_err(|e| db_err("horizon", e))?;
            Ok(match row {
                Some((pid, age)) => HorizonInfo {
                    oldest_xact_age_us: age,
                    oldest_xact_pid: Some(pid),
                    held_slots: None,
                },
                None => HorizonInfo::default(),
            })
        })
    }
}

/// Writes each row's cursor-mode state (`ferry_outbox_cursor_view`, a claimed exception as
/// PENDING) into the row itself, for rows with `seq <= $1` or an exception row.
const MATERIALIZE_STATES: &str = "UPDATE ferry_outbox o SET state = v.state, \
       sent_at = CASE WHEN v.state = 'SENT' THEN coalesce(o.sent_at, v.sent_at, now()) END, \
       attempts = v.attempts, last_error = v.last_error, resolved_by = v.resolved_by, \
       available_at = coalesce(v.available_at, o.available_at), lease_until = NULL \
     FROM (SELECT seq, CASE state WHEN 'CLAIMED' THEN 'PENDING' ELSE state END AS state, \
             sent_at, attempts, last_error, resolved_by, available_at \
           FROM ferry_outbox_cursor_view) v \
     WHERE o.seq = v.seq AND (v.state <> o.state OR v.attempts <> o.attempts) \
       AND (o.seq <= $1 OR EXISTS (SELECT 1 FROM ferry_outbox_exception e WHERE e.seq = o.seq))";

/// The cursor side of a switch to cursor dispatch (and of a re-base), inside the switch's
/// transaction once every unfinished row has an xid: tick 0, quarantined rows as exception
/// rows, every slot at the start of window 1.
async fn start_cursors(tx: &mut sqlx::PgConnection) -> Result<(), StoreError> {
    let exec = |sql: &'static str| sqlx::query(sql);
    // Tick 0 sees exactly the transactions below the first unfinished row's xid (and below
    // every open transaction): everything it sees is finished.
    let x: i64 = sqlx::query_scalar(
        "SELECT least(pg_snapshot_xmin(pg_current_snapshot())::text::int8, \
               coalesce((SELECT min(xid) FROM ferry_outbox WHERE state IN ('PENDING', 'CLAIMED')), \
                        9223372036854775807))",
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(|e| db_err("dispatch mode: first window", e))?;
    exec("DELETE FROM ferry_tick")
        .execute(&mut *tx)
        .await
        .map_err(|e| db_err("dispatch mode: ticks", e))?;
    sqlx::query("INSERT INTO ferry_tick (tick_id, snap) VALUES (0, $1::text::pg_snapshot)")
        .bind(format!("{x}:{x}:"))
        .execute(&mut *tx)
        .await
        .map_err(|e| db_err("dispatch mode: tick 0", e))?;
    // Quarantined rows stay parked as exception rows (they hold their successors).
    exec(
        "INSERT INTO ferry_outbox_exception (seq, shard_slot, aggregate_id, aggregate_version, \
           state, available_at, attempts, last_error, resolved_by, resolved_at, created_at) \
         SELECT seq, shard_slot, aggregate_id, aggregate_version, state, available_at, attempts, \
           last_error, resolved_by, resolved_at, now() \
         FROM ferry_outbox WHERE state = 'QUARANTINED'",
    )
    .execute(&mut *tx)
    .await
    .map_err(|e| db_err("dispatch mode: exceptions", e))?;
    // Every slot starts at window 1; its read passes over rows already finished (their state
    // is not PENDING or CLAIMED).
    exec(
        "UPDATE ferry_slot_lease SET cursor_tick = 1, cursor_xid = 0, cursor_seq = 0, \
               cursor_version = cursor_version + 1, cursor_claim_id = NULL, \
               epoch = epoch + 1, owner = NULL, lease_until = NULL",
    )
    .execute(&mut *tx)
    .await
    .map_err(|e| db_err("dispatch mode: cursors", e))?;
    Ok(())
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
async fn xid_regression(c: &mut sqlx::PgConnection) -> Result<Option<(i64, i64)>, StoreError> {
    let (tick, server): (Option<i64>, i64) = sqlx::query_as(
        "SELECT (SELECT max(pg_snapshot_xmax(snap)::text::int8) FROM ferry_tick), \
                pg_snapshot_xmax(pg_current_snapshot())::text::int8",
    )
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

impl PgStore {
    /// Refuses cursor dispatch when the outbox's identity sequence hands out cached values.
    /// Windows are read in seq order, which is an aggregate's version order only if a seq drawn
    /// later is higher: with `CACHE n > 1` each session draws from its own block of `n`, so a
    /// producer could insert `v(n+1)` with a lower seq than `v(n)`'s.
    async fn check_seq_cache(&self) -> Result<(), StoreError> {
        let (name, cache): (String, i64) = sqlx::query_as(
            "SELECT pg_get_serial_sequence('ferry_outbox', 'seq'), s.seqcache \
             FROM pg_sequence s WHERE s.seqrelid = pg_get_serial_sequence('ferry_outbox', 'seq')::regclass",
        )
        .fetch_one(self.pool())
        .await
        .map_err(|e| db_err("cursor dispatch: outbox sequence", e))?;
        if cache > 1 {
            return Err(StoreError::new(
                StoreErrorKind::InvalidInput,
                format!(
                    "the outbox's sequence {name} caches {cache} values per session, so a later \
                     insert can draw a lower seq and cursor dispatch would send an aggregate's \
                     versions out of order: run ALTER SEQUENCE {name} CACHE 1 (or use --dispatch row)"
                ),
            ));
        }
        Ok(())
    }
}

async fn exec_lock_timeout(tx: &mut sqlx::PgConnection) -> Result<(), StoreError> {
    sqlx::query("SET LOCAL lock_timeout = '10s'")
        .execute(tx)
        .await
        .map_err(|e| db_err("dispatch mode: lock timeout", e))?;
    Ok(())
}
