//! Every statement of the PostgreSQL backend, named: one place to read its protocol. Static
//! statements are constants; the few whose shape depends on the request (a claim's slot fence,
//! an outcome's per-item columns, a cursor read's span) are functions returning the text.
//! Every value is a bind parameter.
use ferry_core::ClaimRequest;

use crate::outcome::Transition;

/// A claim walks the dispatch index in seq order: bitmap and sequential scans off for its
/// transaction.
pub(crate) const CLAIM_PLAN_SETTINGS: &str = "SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)";

/// Gives back owner `$1`'s leases of slots `$2`, locked in slot order.
pub(crate) const RELEASE_SLOTS: &str = "UPDATE ferry_slot_lease l SET owner = NULL, lease_until = NULL \
              FROM (SELECT slot FROM ferry_slot_lease WHERE slot = ANY($2) ORDER BY slot FOR UPDATE) k \
              WHERE l.slot = k.slot AND l.owner = $1";

/// Joins or renews owner `$1`'s membership (instance `$2`, `$3` µs, sink stall `$4`); a live row of
/// another instance is left alone (no row changed: the owner is in use). ON CONFLICT DO UPDATE
/// locks the row and checks WHERE against its latest version: of two instances racing for an
/// expired row, one takes it.
pub(crate) const MEMBER_HEARTBEAT: &str = "INSERT INTO ferry_relay_member (owner, instance, lease_until, sink_stalled_us) \
                 VALUES ($1, $2, now() + $3 * interval '1 microsecond', $4) \
                 ON CONFLICT (owner) DO UPDATE SET lease_until = EXCLUDED.lease_until, instance = EXCLUDED.instance, \
                   sink_stalled_us = EXCLUDED.sink_stalled_us \
                 WHERE ferry_relay_member.instance = EXCLUDED.instance OR ferry_relay_member.lease_until <= now()";

/// Every owned slot lease, in slot order.
pub(crate) const SLOT_LEASES: &str = "SELECT slot, owner, epoch, (extract(epoch from lease_until) * 1000000)::int8 FROM ferry_slot_lease \
                 WHERE owner IS NOT NULL ORDER BY slot";

/// The lowest window's lower snapshot xmin over every cursor: no row below it is unfinished without
/// an exception row.
pub(crate) const STATUS_LOW_XID: &str =
    "SELECT coalesce(min(pg_snapshot_xmin(t.snap)::text::int8), 0) FROM ferry_slot_lease l \
                         JOIN ferry_tick t ON t.tick_id = l.cursor_tick - 1";

/// Cursor status reads the (xid, seq) index, not the whole table: sequential scans and JIT off for
/// its transaction.
pub(crate) const STATUS_PLAN_SETTINGS: &str =
    "SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)";

/// A read's span (`$1` its first tick, `$2` the most ticks it spans): ticks `$1 - 1`, `$1` and its
/// last, the newest, and tick `$1` taken from this statement's snapshot when no reader has yet
/// (asynchronously committed).
pub(crate) const CURSOR_READ_TICKS: &str = "WITH cfg AS (SELECT set_config('synchronous_commit', 'off', true) AS v), \
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
                 UNION ALL SELECT tick_id, snap, tick_id, true, 0::int8, seq_hi FROM ins";

/// Deletes the ticks every cursor is past (below tick `$1 - 1`), asynchronously committed.
pub(crate) const TICK_RETENTION: &str = "WITH cfg AS (SELECT set_config('synchronous_commit', 'off', true) AS v) \
             DELETE FROM ferry_tick WHERE tick_id < (SELECT min(cursor_tick) - 1 FROM ferry_slot_lease) \
               AND tick_id < $1 - 1 AND EXISTS (SELECT 1 FROM cfg)";

/// A re-base locks the outbox (waits at most the 10 s lock timeout).
pub(crate) const LOCK_OUTBOX: &str = "LOCK TABLE ferry_outbox IN ACCESS EXCLUSIVE MODE";

/// The highest seq written on the server the ticks come from.
pub(crate) const RE_BASE_CURSORS_RESTORED_ROWS: &str =
    "SELECT coalesce(max(seq), 0) FROM ferry_outbox \
                         WHERE xid >= pg_snapshot_xmax(pg_current_snapshot())::text::int8";

/// A re-base drops the exception rows (their states are in the rows by then).
pub(crate) const RE_BASE_CURSORS_EXCEPTIONS: &str = "DELETE FROM ferry_outbox_exception";

/// A re-base puts every unfinished row in the first window.
pub(crate) const RE_BASE_CURSORS_XIDS: &str =
    "UPDATE ferry_outbox SET xid = 3 WHERE state IN ('PENDING', 'CLAIMED')";

/// Rows written before migration 0003 have no xid: unfinished ones get 3, the first normal xid, so
/// the first window reads them.
pub(crate) const DISPATCH_MODE_XIDS_OF_OLD_ROWS: &str =
    "UPDATE ferry_outbox SET xid = 3 WHERE xid IS NULL AND state IN ('PENDING', 'CLAIMED')";

/// An advance commits asynchronously, like the ticks: lost in a crash it only moves the cursor
/// back.
pub(crate) const ADVANCE_ASYNC_COMMIT: &str = "SET LOCAL synchronous_commit = off";

/// The fenced advance of slots `$1` (epochs `$2`, cursor versions `$3`) to positions (`$8` tick,
/// `$4` xid, `$5` seq) under claim id `$6`, for live owner `$7`; rows locked in slot order; returns
/// the slots moved.
pub(crate) const ADVANCE_CURSORS: &str = "WITH k AS (SELECT slot FROM ferry_slot_lease WHERE slot = ANY($1) ORDER BY slot FOR UPDATE) \
                 UPDATE ferry_slot_lease l SET cursor_tick = t.tick, cursor_xid = t.xid, cursor_seq = t.seq, \
                   cursor_version = l.cursor_version + 1, cursor_claim_id = $6 \
                 FROM UNNEST($1::int2[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $8::int8[]) \
                   AS t(slot, epoch, version, xid, seq, tick) \
                 WHERE l.slot = t.slot AND t.slot IN (SELECT slot FROM k) AND l.owner = $7 AND l.lease_until > now() \
                   AND l.epoch = t.epoch AND l.cursor_version = t.version AND l.cursor_tick IS NOT NULL \
                 RETURNING l.slot";

/// An advance's exception rows, one array per column (a row already there is kept).
pub(crate) const ADVANCE_EXCEPTIONS: &str = "INSERT INTO ferry_outbox_exception (seq, shard_slot, aggregate_id, aggregate_version, \
                       state, available_at, attempts, last_error) \
                     SELECT t.seq, t.slot, t.aggregate_id, t.aggregate_version, t.state, \
                       now() + t.delay_us * interval '1 microsecond', t.attempts, t.last_error \
                     FROM UNNEST($1::int8[], $2::int2[], $3::varchar[], $4::int8[], $5::varchar[], \
                       $6::int8[], $7::int4[], $8::text[]) \
                       AS t(seq, slot, aggregate_id, aggregate_version, state, delay_us, attempts, last_error) \
                     ON CONFLICT (seq) DO NOTHING";

/// Whether an advance with claim id `$1` was applied.
pub(crate) const LOOKUP_ADVANCE: &str =
    "SELECT EXISTS (SELECT 1 FROM ferry_slot_lease WHERE cursor_claim_id = $1)";

/// The oldest transaction holding the horizon back: its pid and age (prepared transactions as pid
/// 0).
pub(crate) const HORIZON: &str = "SELECT pid, age_us FROM ( \
                   SELECT pid::int8 AS pid, (extract(epoch from now() - xact_start) * 1000000)::int8 AS age_us, \
                     age(backend_xid) AS xid_age \
                   FROM pg_stat_activity WHERE backend_xid IS NOT NULL \
                   UNION ALL \
                   SELECT 0::int8, (extract(epoch from now() - prepared) * 1000000)::int8, age(transaction) \
                   FROM pg_prepared_xacts) t \
                 ORDER BY xid_age DESC LIMIT 1";

/// Tick 0's xid: below the first unfinished row's xid and every open transaction.
pub(crate) const DISPATCH_MODE_FIRST_WINDOW: &str =
    "SELECT least(pg_snapshot_xmin(pg_current_snapshot())::text::int8, \
               coalesce((SELECT min(xid) FROM ferry_outbox WHERE state IN ('PENDING', 'CLAIMED')), \
                        9223372036854775807))";

/// A switch drops every tick.
pub(crate) const DISPATCH_MODE_TICKS: &str = "DELETE FROM ferry_tick";

/// Tick 0 from its snapshot's text `$1`.
pub(crate) const DISPATCH_MODE_TICK_0: &str =
    "INSERT INTO ferry_tick (tick_id, snap) VALUES (0, $1::text::pg_snapshot)";

/// A switch to cursor dispatch parks quarantined rows as exception rows (they hold their
/// successors).
pub(crate) const DISPATCH_MODE_EXCEPTIONS: &str =
    "INSERT INTO ferry_outbox_exception (seq, shard_slot, aggregate_id, aggregate_version, \
           state, available_at, attempts, last_error, resolved_by, resolved_at, created_at) \
         SELECT seq, shard_slot, aggregate_id, aggregate_version, state, available_at, attempts, \
           last_error, resolved_by, resolved_at, now() \
         FROM ferry_outbox WHERE state = 'QUARANTINED'";

/// A switch to cursor dispatch starts every slot at window 1 and ends every lease.
pub(crate) const DISPATCH_MODE_CURSORS: &str =
    "UPDATE ferry_slot_lease SET cursor_tick = 1, cursor_xid = 0, cursor_seq = 0, \
               cursor_version = cursor_version + 1, cursor_claim_id = NULL, \
               epoch = epoch + 1, owner = NULL, lease_until = NULL";

/// The newest tick's xmax and this server's: the ticks must not be ahead of the server.
pub(crate) const TRANSACTION_ID_CHECK: &str =
    "SELECT (SELECT max(pg_snapshot_xmax(snap)::text::int8) FROM ferry_tick), \
                pg_snapshot_xmax(pg_current_snapshot())::text::int8";

/// The outbox's identity sequence and how many values it caches per session.
pub(crate) const CURSOR_DISPATCH_OUTBOX_SEQUENCE: &str = "SELECT pg_get_serial_sequence('ferry_outbox', 'seq'), s.seqcache \
             FROM pg_sequence s WHERE s.seqrelid = pg_get_serial_sequence('ferry_outbox', 'seq')::regclass";

/// A mode switch waits at most 10 s for the outbox's table lock.
pub(crate) const DISPATCH_MODE_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '10s'";

pub(crate) const INSERT: &str = "INSERT INTO ferry_outbox \
    (event_id, aggregate_id, aggregate_version, shard_slot, topic, msg_key, event_type, headers, payload, \
    payload_bytes) \
    SELECT * FROM UNNEST($1::varchar[], $2::varchar[], $3::int8[], $4::int2[], $5::varchar[], \
    $6::varchar[], $7::varchar[], $8::text[], $9::text[], $10::bytea[])";

/// The claimed row's columns in `claimed_from_row`'s order; a key left NULL is the aggregate id
/// (migration 16).
pub(crate) const CLAIM_COLUMNS: &str =
    "o.seq, o.event_id, o.claim_id, o.claim_version, o.aggregate_id, o.aggregate_version, \
    o.shard_slot, o.topic, coalesce(o.msg_key, o.aggregate_id), o.event_type, o.headers, \
    o.payload, o.payload_bytes, o.attempts, (extract(epoch from o.created_at) * 1000000)::int8";

/// The SET clause of an outcome on the table aliased `a`; `t.delay_us` and `t.txt` are the
/// item's delay and text.
pub(crate) fn outcome_set(to: Transition, a: &str) -> String {
    match to {
        Transition::Ack => "state = 'SENT', sent_at = now(), lease_until = NULL".into(),
        Transition::Retry => format!(
            "state = 'PENDING', lease_until = NULL, attempts = {a}.attempts + 1, last_error = t.txt, \
             available_at = now() + t.delay_us * interval '1 microsecond'"
        ),
        Transition::Quarantine => format!(
            "state = 'QUARANTINED', lease_until = NULL, attempts = {a}.attempts + 1, last_error = t.txt"
        ),
        Transition::Release => "state = 'PENDING', lease_until = NULL, available_at = now()".into(),
        Transition::Extend { .. } => {
            "lease_until = now() + t.delay_us * interval '1 microsecond'".into()
        }
    }
}

/// The slot filter of a claim on the table aliased `a` (`$1` the requested slots, `$5` the
/// fence's owner). With a slot fence, only slots whose lease this owner holds at the claim's start
/// count: a relay whose lease ended claims nothing. The lease rows are read without a lock: a
/// share lock made the owner's own lease renewal (and a takeover) queue behind slow claims until
/// every lease expired. A claim racing a takeover is harmless: rows are taken one at a time under
/// SKIP LOCKED, state and token, never twice. ARRAY(...) is an InitPlan, evaluated once per claim
/// whatever the planner's row estimates (an IN-subquery became a per-row SubPlan on un-ANALYZEd
/// tables).
pub(crate) fn claim_slot_filter(a: &str, req: &ClaimRequest) -> String {
    if req.fence.is_some() {
        format!(
            "{a}.shard_slot = ANY(ARRAY(SELECT l.slot FROM ferry_slot_lease l WHERE l.slot = ANY($1) \
             AND l.owner = $5 AND l.lease_until > now()))"
        )
    } else {
        format!("{a}.shard_slot = ANY($1)")
    }
}

/// `ferry_status_cache` on PostgreSQL ([`crate::status_cache::shared_status`]).
pub(crate) const STATUS_CACHE: crate::status_cache::StatusCacheSql = crate::status_cache::StatusCacheSql {
    lease: "UPDATE ferry_status_cache SET computing_until = now() + interval '60 seconds' \
            WHERE id = 1 AND (computed_at IS NULL OR computed_at < now() - make_interval(secs => $1::float8 / 1e6)) \
              AND (computing_until IS NULL OR computing_until < now())",
    stored: "SELECT pending, claimed, quarantined, \
               oldest_age_us + (extract(epoch from (now() - computed_at)) * 1000000)::int8, blocked \
             FROM ferry_status_cache WHERE id = 1 AND computed_at IS NOT NULL",
    clear: "UPDATE ferry_status_cache SET computing_until = NULL WHERE id = 1",
    store: "UPDATE ferry_status_cache SET pending = $1, claimed = $2, quarantined = $3, \
              oldest_age_us = $4, blocked = $5, computed_at = now(), computing_until = NULL \
            WHERE id = 1",
};

/// The intent columns of `ferry_outbox o` in [`event_at`]'s order (`created_at` as µs since the
/// epoch, like the row-mode claim; a key left NULL is the aggregate id, migration 16).
pub(crate) const EVENT_COLUMNS: &str = "o.seq, o.event_id, coalesce(o.claim_id, '') AS claim_id, \
    o.claim_version, o.aggregate_id, o.aggregate_version, o.shard_slot, o.topic, \
    coalesce(o.msg_key, o.aggregate_id), o.event_type, o.headers, o.payload, o.payload_bytes, \
    o.attempts, (extract(epoch from o.created_at) * 1000000)::int8 AS created_us";

/// The open exception states: they hold their aggregate's later events.
pub(crate) const OPEN: &str = "('PENDING', 'CLAIMED', 'QUARANTINED')";

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
///   parallel workers, 7–14 ms against 0.7 ms serially. At a window's start (`from_floor`) the scan
///   begins at the lowest seq any of these transactions wrote, found by one `(xid, seq)` index
///   probe per transaction (a loose index scan), not at seq 0; within a window it begins at the
///   start seq, below which every row of the window was read.
///
/// Several windows: each row's window is looked up among the span's ticks `$8 ..= $9` (a later
/// window can hold a lower seq), and rows come in `(window, seq)` order, so a read cut at its
/// limit stops at a position of the one-window form.
pub(crate) fn read_sql(
    one_window: bool,
    from_floor: bool,
    slot_flags: bool,
    bound: SlotBound,
) -> String {
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

/// How a read statement keeps each row past its slot's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotBound {
    /// The start position is every slot's bound (one window, every slot at one position).
    Start,
    /// One `(tick, xid, seq)` for every slot.
    Uniform,
    /// Three arrays indexed by slot + 1.
    PerSlot,
}

/// Writes each row's cursor-mode state (`ferry_outbox_cursor_view`, a claimed exception as
/// PENDING) into the row itself, for rows with `seq <= $1` or an exception row.
pub(crate) const MATERIALIZE_STATES: &str = "UPDATE ferry_outbox o SET state = v.state, \
       sent_at = CASE WHEN v.state = 'SENT' THEN coalesce(o.sent_at, v.sent_at, now()) END, \
       attempts = v.attempts, last_error = v.last_error, resolved_by = v.resolved_by, \
       available_at = coalesce(v.available_at, o.available_at), lease_until = NULL \
     FROM (SELECT seq, CASE state WHEN 'CLAIMED' THEN 'PENDING' ELSE state END AS state, \
             sent_at, attempts, last_error, resolved_by, available_at \
           FROM ferry_outbox_cursor_view) v \
     WHERE o.seq = v.seq AND (v.state <> o.state OR v.attempts <> o.attempts) \
       AND (o.seq <= $1 OR EXISTS (SELECT 1 FROM ferry_outbox_exception e WHERE e.seq = o.seq))";

/// The row-dispatch claim of the window (`$1` slots, `$2` limit, `$3` claim id, `$4` lease µs,
/// `$5` the fence's owner, `$6` the window's rows; [`super::claim`]): one CTE that locks
/// due, predecessor-free rows of the window `FOR UPDATE SKIP LOCKED` and returns their new tokens,
/// then the rows it passed over (with `measure`; else 0) and the window's last seq (NULL when the
/// window reached the end of the backlog). One row with NULL tokens when it claimed nothing.
pub(crate) fn claim(req: &ClaimRequest, measure: bool) -> String {
    let slot_filter = claim_slot_filter("o", req);
    // The window: the first `$6` rows of the claim's slots that no live claim holds. Its end is
    // an InitPlan, so the walk below is an index range scan that stops there. Rows under a live
    // claim do not count: in-flight rows would otherwise fill it.
    let span = format!(
        "span AS (SELECT (SELECT w.seq FROM ferry_outbox w \
           WHERE w.phase = 0 AND {} AND (w.state = 'PENDING' OR w.lease_until <= now()) \
           ORDER BY w.seq OFFSET $6 - 1 LIMIT 1) AS last)",
        claim_slot_filter("w", req)
    );
    // The predecessor rule as "o is its aggregate's lowest unfinished version": a scalar
    // subquery stays a per-candidate index probe. The equivalent NOT EXISTS was planned,
    // under load, as an anti join scanning the whole unfinished index per candidate
    // (measured: 64M rows filtered, 82 s for one claim, against 6.7 ms for this form).
    let due = format!(
        "{slot_filter} \
         AND o.seq <= coalesce((SELECT last FROM span), {NO_END}) \
         AND o.phase = 0 AND {} \
         AND o.aggregate_version = (SELECT min(p.aggregate_version) FROM ferry_outbox p \
           WHERE p.aggregate_id = o.aggregate_id AND p.phase < 2) \
         AND {}",
        due_now("o"),
        crate::operator::pause::not_paused("o")
    );
    // With `measure`, `passed` counts contention: when the claim comes back short of its
    // limit, the same span read without locks (this statement's snapshot, where the
    // rows just claimed still look due) minus what was claimed is what SKIP LOCKED passed
    // over. The recount is an InitPlan under CASE, evaluated only for short claims.
    let passed = if measure {
        format!(
            "SELECT CASE WHEN (SELECT count(*) FROM claimed) < $2 \
               THEN (SELECT count(*) FROM (SELECT 1 FROM ferry_outbox o WHERE {due} \
                       ORDER BY o.seq LIMIT $2) w) - (SELECT count(*) FROM claimed) \
               ELSE 0 END AS n"
        )
    } else {
        "SELECT 0::int8 AS n".to_owned()
    };
    // The LEFT JOIN returns one row even when nothing was claimed, to carry the span's end.
    let claimed = claim_due_rows();
    format!(
        "WITH {span}, \
         due AS ( \
           SELECT o.seq FROM ferry_outbox o WHERE {due} \
           ORDER BY o.seq LIMIT $2 \
           FOR UPDATE OF o SKIP LOCKED), \
         claimed AS ({claimed}), \
         passed AS ({passed}) \
         SELECT c.*, passed.n, span.last FROM span CROSS JOIN passed LEFT JOIN claimed c ON true"
    )
}

/// The heads-first row claim (`$1`–`$5` as [`claim`]'s, `$6` the aggregate id the scan starts
/// after, `$7` how many aggregates it visits at most; [`super::claim`]): it walks
/// `ferry_outbox_unfinished` (aggregate_id, aggregate_version) one aggregate at a time (a loose
/// index scan, two index probes per aggregate, whatever its backlog), takes each visited
/// aggregate's lowest unfinished version, and locks those that are due `FOR UPDATE SKIP LOCKED`,
/// in aggregate order, up to `$2`. Returns the claimed rows, 0 and the aggregate id the next scan
/// starts after: the last one claimed when the claim is full, else the last one visited, NULL when
/// the scan reached the last aggregate (the next one starts from the first). One row with NULL
/// tokens when it claimed nothing.
pub(crate) fn claim_heads(req: &ClaimRequest) -> String {
    let slot_filter = claim_slot_filter("o", req);
    let due_now = due_now("o");
    let not_paused = crate::operator::pause::not_paused("o");
    let claimed = claim_due_rows();
    format!(
        "WITH RECURSIVE aggs(id) AS ( \
           (SELECT u.aggregate_id FROM ferry_outbox u WHERE u.phase < 2 AND u.aggregate_id > $6 \
            ORDER BY u.aggregate_id LIMIT 1) \
           UNION ALL \
           SELECT (SELECT u.aggregate_id FROM ferry_outbox u WHERE u.phase < 2 AND u.aggregate_id > a.id \
                   ORDER BY u.aggregate_id LIMIT 1) \
           FROM aggs a WHERE a.id IS NOT NULL), \
         visited AS (SELECT id FROM aggs WHERE id IS NOT NULL LIMIT $7), \
         heads AS (SELECT v.id, (SELECT p.seq FROM ferry_outbox p WHERE p.aggregate_id = v.id \
             AND p.phase < 2 ORDER BY p.aggregate_version LIMIT 1) AS seq FROM visited v), \
         due AS ( \
           SELECT o.seq FROM heads h JOIN ferry_outbox o ON o.seq = h.seq \
           WHERE {slot_filter} AND o.phase = 0 AND {due_now} AND {not_paused} \
           ORDER BY h.id LIMIT $2 \
           FOR UPDATE OF o SKIP LOCKED), \
         claimed AS ({claimed}) \
         SELECT c.*, 0::int8, \
           CASE WHEN (SELECT count(*) FROM claimed) >= $2 THEN (SELECT max(aggregate_id) FROM claimed) \
                WHEN (SELECT count(*) FROM visited) >= $7 THEN (SELECT max(id) FROM visited) END \
         FROM (SELECT 1) one LEFT JOIN claimed c ON true"
    )
}

/// A claim's due condition on the table aliased `a`: PENDING and available, or CLAIMED with an
/// expired lease.
fn due_now(a: &str) -> String {
    format!(
        "(({a}.state = 'PENDING' AND {a}.available_at <= now()) \
          OR ({a}.state = 'CLAIMED' AND {a}.lease_until <= now()))"
    )
}

/// A claim's SET clause on the table aliased `a` (`$3` the claim id, `$4` the lease in µs).
fn claim_set(a: &str) -> String {
    format!(
        "state = 'CLAIMED', claim_version = {a}.claim_version + 1, claim_id = $3, \
         lease_until = now() + $4 * interval '1 microsecond'"
    )
}

/// The `claimed` step of a row claim: the rows of `due` become CLAIMED ([`claim_set`]) and their
/// [`CLAIM_COLUMNS`] are returned.
fn claim_due_rows() -> String {
    format!(
        "UPDATE ferry_outbox o SET {} FROM due WHERE o.seq = due.seq RETURNING {CLAIM_COLUMNS}",
        claim_set("o")
    )
}

/// A seq past every row: the end of a window that reaches the end of the backlog.
const NO_END: &str = "9223372036854775807";

/// Quarantined exception rows and how many successors each holds (cursor dispatch; successors are
/// held exceptions or not yet read past the cursor); `$1` the limit.
pub(crate) const QUARANTINED_CURSOR: &str = "SELECT o.event_id, q.aggregate_id, q.aggregate_version, q.last_error, q.attempts, \
                       (SELECT count(*) FROM ferry_outbox_cursor_view s WHERE s.aggregate_id = q.aggregate_id \
                          AND s.aggregate_version > q.aggregate_version \
                          AND s.state IN ('PENDING', 'CLAIMED', 'QUARANTINED')) \
                     FROM ferry_outbox_exception q JOIN ferry_outbox o ON o.seq = q.seq \
                     WHERE q.state = 'QUARANTINED' ORDER BY q.seq LIMIT $1";

/// Quarantined intents and how many unfinished successors each holds (row dispatch); `$1` the
/// limit.
pub(crate) const QUARANTINED_ROWS: &str =
    "SELECT q.event_id, q.aggregate_id, q.aggregate_version, q.last_error, q.attempts, \
                       (SELECT count(*) FROM ferry_outbox s WHERE s.aggregate_id = q.aggregate_id \
                          AND s.aggregate_version > q.aggregate_version \
                          AND s.phase < 2) \
                     FROM ferry_outbox q WHERE q.phase = 1 ORDER BY q.seq LIMIT $1";

/// Takes or renews the leases of slots `$2` for owner `$1` for `$3` µs: free, own or expired ones;
/// a new owner bumps the epoch. Rows are locked in slot order first (the cursor advance does the
/// same), so a renewal and an advance over overlapping slots cannot deadlock.
pub(crate) const ACQUIRE_SLOTS: &str = "UPDATE ferry_slot_lease l SET \
                   epoch = CASE WHEN l.owner IS DISTINCT FROM $1 THEN l.epoch + 1 ELSE l.epoch END, \
                   owner = $1, lease_until = now() + $3 * interval '1 microsecond' \
                 FROM (SELECT slot FROM ferry_slot_lease WHERE slot = ANY($2) ORDER BY slot FOR UPDATE) k \
                 WHERE l.slot = k.slot AND (l.owner IS NULL OR l.owner = $1 OR l.lease_until <= now()) \
                 RETURNING l.slot, l.owner, l.epoch, (extract(epoch from l.lease_until) * 1000000)::int8";

/// A fenced outcome on `table` aliased `a`: one `UPDATE … FROM UNNEST(…) RETURNING` per batch,
/// fenced on `(state = 'CLAIMED', claim_version, claim_id)`; `$1..$3` the tokens' seq, claim
/// version and claim id, then the per-item delays (`int8[]`) and texts (`text[]`) `to` reads.
pub(crate) fn cas(table: &str, a: &str, to: Transition) -> String {
    let (decl, cols) = match to {
        Transition::Ack | Transition::Release => ("", ""),
        Transition::Extend { .. } => (", $4::int8[]", ", delay_us"),
        Transition::Quarantine => (", $4::text[]", ", txt"),
        Transition::Retry => (", $4::int8[], $5::text[]", ", delay_us, txt"),
    };
    let set = outcome_set(to, a);
    format!(
        "UPDATE {table} {a} SET {set} \
         FROM UNNEST($1::int8[], $2::int8[], $3::varchar[]{decl}) AS t(seq, cv, cid{cols}) \
         WHERE {a}.seq = t.seq AND {a}.state = 'CLAIMED' AND {a}.claim_version = t.cv AND {a}.claim_id = t.cid \
         RETURNING {a}.seq, {a}.claim_version, {a}.claim_id"
    )
}

/// The rows still claimed under claim id `$1`, in seq order.
pub(crate) fn lookup_claim() -> String {
    format!(
        "SELECT {CLAIM_COLUMNS} FROM ferry_outbox o WHERE o.phase = 0 AND o.claim_id = $1 AND o.state = 'CLAIMED' ORDER BY o.seq"
    )
}

/// The status counts over rows of `state, created_at, aggregate_id` ([`crate::rows::StatusRow`]).
pub(crate) const COUNTS: &str = "count(*) FILTER (WHERE state = 'PENDING'), \
    count(*) FILTER (WHERE state = 'CLAIMED'), count(*) FILTER (WHERE state = 'QUARANTINED'), \
    (extract(epoch from (now() - min(created_at))) * 1000000)::int8, \
    count(DISTINCT aggregate_id) FILTER (WHERE state = 'QUARANTINED')";

/// Row dispatch's status: the unfinished rows.
pub(crate) fn status_rows() -> String {
    format!("SELECT {COUNTS} FROM ferry_outbox WHERE phase < 2")
}

/// Cursor dispatch's status: rows past `$1`, the lowest window's lower snapshot xmin (`$2` = 0),
/// not yet behind their slot's cursor without an exception row, and the open exception rows.
pub(crate) fn status_cursor() -> String {
    format!(
        "SELECT {COUNTS} FROM ( \
           SELECT 'PENDING'::varchar AS state, v.created_at, v.aggregate_id \
           FROM ferry_outbox_cursor_view v \
           WHERE v.xid >= $1 AND v.state = 'PENDING' AND $2 = 0 \
             AND NOT EXISTS (SELECT 1 FROM ferry_outbox_exception e WHERE e.seq = v.seq) \
           UNION ALL \
           SELECT x.state, o.created_at, x.aggregate_id FROM ferry_outbox_exception x \
             JOIN ferry_outbox o ON o.seq = x.seq \
           WHERE x.state IN ('PENDING', 'CLAIMED', 'QUARANTINED')) u"
    )
}

/// The claim of exception rows, parameters as [`claim`]'s; returns each row's intent
/// ([`EVENT_COLUMNS`]) and then the exception row's claim id, claim version and attempts.
pub(crate) fn claim_exceptions(req: &ClaimRequest) -> String {
    // As the row-mode claim: with a fence, only slots whose lease the owner holds now.
    let slot_filter = claim_slot_filter("x", req);
    let due_now = due_now("x");
    let set = claim_set("x");
    let not_paused = crate::operator::pause::not_paused_exception("x");
    // The predecessor rule among open exceptions, as "x is its aggregate's lowest open
    // version" (an index probe per candidate on ferry_outbox_exception_open).
    format!(
        "WITH due AS ( \
           SELECT x.seq FROM ferry_outbox_exception x WHERE {slot_filter} AND {due_now} \
             AND x.aggregate_version = (SELECT min(p.aggregate_version) FROM ferry_outbox_exception p \
               WHERE p.aggregate_id = x.aggregate_id AND p.state IN {OPEN}) \
             AND {not_paused} \
           ORDER BY x.seq LIMIT $2 \
           FOR UPDATE OF x SKIP LOCKED), \
         claimed AS ( \
           UPDATE ferry_outbox_exception x SET {set} \
           FROM due WHERE x.seq = due.seq \
           RETURNING x.seq, x.claim_id, x.claim_version, x.attempts) \
         SELECT {EVENT_COLUMNS}, c.claim_id, c.claim_version, c.attempts \
         FROM claimed c JOIN ferry_outbox o ON o.seq = c.seq ORDER BY o.seq"
    )
}

/// The cursors of slots `$2` whose live lease owner `$1` holds. A position with an xid was written
/// by a relay of a version that read windows in (xid, seq) order; it goes back to its window's
/// start (sent again, never skipped).
pub(crate) const LOAD_CURSORS: &str = "SELECT slot, epoch, cursor_version, cursor_tick, 0::int8, \
                   CASE WHEN cursor_xid = 0 THEN cursor_seq ELSE 0 END FROM ferry_slot_lease \
                 WHERE owner = $1 AND lease_until > now() AND cursor_tick IS NOT NULL AND slot = ANY($2) \
                 ORDER BY slot";

/// A switch to cursor dispatch drops the row-dispatch indexes; cursor dispatch never updates an
/// outbox row, so no room is kept on new heap pages for HOT updates (migration 0009).
pub(crate) const TO_CURSOR_DDL: [&str; 3] = [
    "DROP INDEX IF EXISTS ferry_outbox_dispatch",
    "DROP INDEX IF EXISTS ferry_outbox_unfinished",
    "ALTER TABLE ferry_outbox SET (fillfactor = 100)",
];

/// The rest of a switch to row dispatch, after [`MATERIALIZE_STATES`], each with its error
/// context: drop the exception rows, ticks and cursors; recreate the row-dispatch indexes.
pub(crate) const TO_ROW: [(&str, &str); 6] = [
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

/// The payload of [`crate::lookup::record_sql`] as text and bytes, one of them NULL.
pub(crate) const RECORD_PAYLOAD: &str = "payload, payload_bytes";

/// The outbox's size: the table with TOAST and its maps, and the indexes (exact: the files'
/// sizes).
pub(crate) const OUTBOX_SIZE: &str =
    "SELECT pg_total_relation_size('ferry_outbox') - pg_indexes_size('ferry_outbox'), \
    pg_indexes_size('ferry_outbox')";
pub(crate) const OUTBOX_SIZE_SOURCE: &str = "pg_total_relation_size and pg_indexes_size: exact";
