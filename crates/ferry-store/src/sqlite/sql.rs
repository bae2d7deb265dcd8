//! Every statement of the SQLite backend, named: one place to read its protocol. Static
//! statements are constants; a claim's and an outcome's text depend on the table (outbox or
//! exception rows) and are built here. Every value is a bind parameter; lists travel as JSON.
use crate::outcome::Transition;

/// Whether aggregate `?` version `?` is stored.
pub(crate) const PROBE_VERSION: &str =
    "SELECT 1 FROM ferry_outbox WHERE aggregate_id = ? AND aggregate_version = ?";

/// Whether event id `?` is stored.
pub(crate) const PROBE_EVENT_ID: &str = "SELECT 1 FROM ferry_outbox WHERE event_id = ?";

/// Takes or renews slot leases for an owner: free, own or expired ones; a new owner bumps the
/// epoch.
pub(crate) const ACQUIRE_SLOTS: &str = "UPDATE ferry_slot_lease SET \
                   epoch = CASE WHEN owner IS ?1 THEN epoch ELSE epoch + 1 END, owner = ?1, lease_until = ?3 + ?4 \
                 WHERE slot IN (SELECT value FROM json_each(?2)) AND (owner IS NULL OR owner = ?1 OR lease_until <= ?3) \
                 RETURNING slot, owner, epoch, lease_until";

/// Gives back owner `?1`'s leases of the listed slots.
pub(crate) const RELEASE_SLOTS: &str =
    "UPDATE ferry_slot_lease SET owner = NULL, lease_until = NULL WHERE owner = ?1 \
                 AND slot IN (SELECT value FROM json_each(?2))";

/// Joins or renews owner `?1`'s membership (instance `?2`, `?3` µs, sink stall `?4`, now `?5`); a
/// live row of another instance is left alone.
pub(crate) const MEMBER_HEARTBEAT: &str = "INSERT INTO ferry_relay_member (owner, instance, lease_until, joined_at, sink_stalled_us) \
                 VALUES (?1, ?2, ?5 + ?3, ?5, ?4) \
                 ON CONFLICT (owner) DO UPDATE SET lease_until = excluded.lease_until, instance = excluded.instance, \
                   sink_stalled_us = excluded.sink_stalled_us \
                 WHERE ferry_relay_member.instance = excluded.instance OR ferry_relay_member.lease_until <= ?5";

/// Every owned slot lease, in slot order.
pub(crate) const SLOT_LEASES: &str = "SELECT slot, owner, epoch, lease_until FROM ferry_slot_lease WHERE owner IS NOT NULL ORDER BY slot";

/// The cursors of the listed slots whose live lease the owner holds.
pub(crate) const LOAD_CURSORS: &str = "SELECT slot, epoch, cursor_version, coalesce(cursor_xid, 0), cursor_seq FROM ferry_slot_lease \
                 WHERE owner = ?1 AND lease_until > ?2 AND cursor_seq IS NOT NULL \
                   AND slot IN (SELECT value FROM json_each(?3)) ORDER BY slot";

/// The head: the highest seq drawn so far.
pub(crate) const CURSOR_READ_HEAD: &str =
    "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'ferry_outbox'), 0)";

/// The fenced advance of the listed slots (JSON) under a claim id, for a live owner; returns the
/// slots moved.
pub(crate) const ADVANCE: &str = "UPDATE ferry_slot_lease SET cursor_xid = t.xid, cursor_seq = t.seq, \
                   cursor_version = cursor_version + 1, cursor_claim_id = ?2 \
                 FROM (SELECT value->>0 AS slot, value->>1 AS epoch, value->>2 AS version, value->>3 AS xid, \
                         value->>4 AS seq FROM json_each(?1)) AS t \
                 WHERE ferry_slot_lease.slot = t.slot AND ferry_slot_lease.owner = ?3 \
                   AND ferry_slot_lease.lease_until > ?4 AND ferry_slot_lease.epoch = t.epoch \
                   AND ferry_slot_lease.cursor_version = t.version AND ferry_slot_lease.cursor_seq IS NOT NULL \
                 RETURNING ferry_slot_lease.slot";

/// An advance's exception rows (JSON); a row already there is kept.
pub(crate) const ADVANCE_EXCEPTIONS: &str = "INSERT INTO ferry_outbox_exception (seq, shard_slot, aggregate_id, aggregate_version, state, \
                       available_at, attempts, last_error, created_at) \
                     SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5, value->>6, value->>7, ?2 \
                     FROM json_each(?1) WHERE true ON CONFLICT (seq) DO NOTHING";

pub(crate) const COLUMNS: &str =
    "seq, event_id, claim_id, claim_version, aggregate_id, aggregate_version, shard_slot, \
    topic, msg_key, event_type, headers, payload, attempts, created_at";

/// The SET clause of an outcome, the same on both tables: `?2` is now (µs), `t.num` and `t.txt`
/// the item's delay and text.
pub(crate) fn outcome_set(to: Transition) -> &'static str {
    match to {
        Transition::Ack => "state = 'SENT', sent_at = ?2, lease_until = NULL",
        Transition::Retry => "state = 'PENDING', lease_until = NULL, attempts = attempts + 1, last_error = t.txt, available_at = ?2 + t.num",
        Transition::Quarantine => "state = 'QUARANTINED', lease_until = NULL, attempts = attempts + 1, last_error = t.txt",
        Transition::Release => "state = 'PENDING', lease_until = NULL, available_at = ?2",
        Transition::Extend { .. } => "lease_until = ?2 + t.num",
    }
}

/// Rows per multi-row insert (11 placeholders per row; SQLite allows 32,766).
pub(crate) const CHUNK: usize = 1000;

/// `sqlite::COLUMNS` qualified with `o.`, in the order [`crate::sqlite::claimed_from_row`] reads.
pub(crate) const COLUMNS_O: &str =
    "o.seq, o.event_id, o.claim_id, o.claim_version, o.aggregate_id, o.aggregate_version, \
    o.shard_slot, o.topic, o.msg_key, o.event_type, o.headers, o.payload, o.attempts, o.created_at";

/// A batched CAS on `table` (`ferry_outbox` or `ferry_outbox_exception`) with the SET clause
/// `set`: `?1` the tokens and per-item number/text as one JSON array, joined with `json_each`
/// (one prepared statement for every batch size), `?2` now.
pub(crate) fn cas(table: &str, set: &str) -> String {
    format!(
        "UPDATE {table} SET {set} FROM (SELECT value->>0 AS seq, value->>1 AS cv, value->>2 AS cid, \
           value->>3 AS num, value->>4 AS txt FROM json_each(?1)) AS t \
         WHERE {table}.seq = t.seq AND {table}.state = 'CLAIMED' \
           AND {table}.claim_version = t.cv AND {table}.claim_id = t.cid \
         RETURNING {table}.seq, {table}.claim_version, {table}.claim_id"
    )
}

/// A claim's slot fence on the table aliased `a`: only slots whose live lease (at `now`) owner
/// `owner` holds; `owner` and `now` are the statement's parameter names (`?5`, `?2`).
fn fence(a: &str, owner: &str, now: &str) -> String {
    format!(
        "AND {a}.shard_slot IN (SELECT l.slot FROM ferry_slot_lease l WHERE l.owner = {owner} AND l.lease_until > {now})"
    )
}

/// The state of an unfinished row, as the partial indexes `ferry_outbox_dispatch` and
/// `ferry_outbox_unfinished` spell it (SQLite uses a partial index only when the query repeats
/// its condition).
const UNFINISHED: &str = "state IN ('PENDING', 'CLAIMED', 'QUARANTINED')";

/// A claim's due condition at `?2` on the table aliased `a`: PENDING and available, or CLAIMED
/// with an expired lease.
fn due_at(a: &str) -> String {
    format!(
        "(({a}.state = 'PENDING' AND {a}.available_at <= ?2) OR ({a}.state = 'CLAIMED' AND {a}.lease_until <= ?2))"
    )
}

/// SQLite's claim on `table` aliased `a` (`ferry_outbox o` or `ferry_outbox_exception x`): `?1`
/// the slots (JSON), `?2` now, `?3` the claim id, `?4` the lease (µs), `?5` the fence's owner
/// (with `fenced`), `?6` the limit, `?7` the last seq it may take (the end of the claim's window,
/// [`window_end`]); returns `returning` of each row claimed.
pub(crate) fn claim((table, a): (&str, &str), returning: &str, fenced: bool) -> String {
    let fence = if fenced {
        fence(a, "?5", "?2")
    } else {
        String::new()
    };
    // a paused topic's rows stay where they are (their successors wait behind them)
    let not_paused = if table == "ferry_outbox" {
        crate::operator::pause::not_paused(a)
    } else {
        crate::operator::pause::not_paused_exception(a)
    };
    let due = due_at(a);
    format!(
        "UPDATE {table} SET state = 'CLAIMED', claim_version = claim_version + 1, claim_id = ?3, \
           lease_until = ?2 + ?4 \
         WHERE seq IN (SELECT {a}.seq FROM {table} {a} \
           WHERE {a}.shard_slot IN (SELECT value FROM json_each(?1)) {fence} \
             AND {a}.state IN ('PENDING', 'CLAIMED') AND {a}.seq <= ?7 \
             AND {due} \
             AND NOT EXISTS (SELECT 1 FROM {table} p WHERE p.aggregate_id = {a}.aggregate_id \
               AND p.aggregate_version < {a}.aggregate_version \
               AND p.{UNFINISHED}) \
             AND {not_paused} \
           ORDER BY {a}.seq LIMIT ?6) \
         RETURNING {returning}"
    )
}

/// The end of a row claim's window ([`crate::heads`]): the seq of the `?4`-th row, in seq order,
/// of slots `?1` (JSON) that no live claim holds at `?2` (with `fenced`, of the slots whose live
/// lease owner `?3` holds); no row when fewer lie there, and the window reaches the end of the
/// backlog. An index-only walk of `ferry_outbox_dispatch` but for the state of each row.
pub(crate) fn window_end(fenced: bool) -> String {
    let fence = if fenced {
        fence("w", "?3", "?2")
    } else {
        String::new()
    };
    format!(
        "SELECT w.seq FROM ferry_outbox w \
         WHERE w.shard_slot IN (SELECT value FROM json_each(?1)) {fence} \
           AND w.state IN ('PENDING', 'CLAIMED') AND (w.state = 'PENDING' OR w.lease_until <= ?2) \
         ORDER BY w.seq LIMIT 1 OFFSET ?4 - 1"
    )
}

/// The heads of the aggregates after `?4` in aggregate order, at most `?5` of them: each
/// aggregate with an unfinished version, its lowest unfinished version's seq, and whether a claim
/// at `?2` of slots `?1` (JSON; with `fenced`, those whose live lease owner `?3` holds) may take
/// it: due (PENDING and available, or CLAIMED with an expired lease) and not paused. Being the
/// lowest unfinished version, a head has no unfinished predecessor. A loose index scan of
/// `ferry_outbox_unfinished` (aggregate_id, aggregate_version): one seek for the next aggregate and
/// one for its lowest version, whatever the aggregates hold.
pub(crate) fn heads_after(fenced: bool) -> String {
    let fence = if fenced {
        fence("o", "?3", "?2")
    } else {
        String::new()
    };
    let not_paused = crate::operator::pause::not_paused("o");
    let due = due_at("o");
    format!(
        "WITH RECURSIVE aggs(id) AS ( \
           SELECT (SELECT u.aggregate_id FROM ferry_outbox u WHERE u.{UNFINISHED} AND u.aggregate_id > ?4 \
                   ORDER BY u.aggregate_id LIMIT 1) \
           UNION ALL \
           SELECT (SELECT u.aggregate_id FROM ferry_outbox u WHERE u.{UNFINISHED} AND u.aggregate_id > a.id \
                   ORDER BY u.aggregate_id LIMIT 1) \
           FROM aggs a WHERE a.id IS NOT NULL LIMIT ?5), \
         heads AS (SELECT v.id, (SELECT p.seq FROM ferry_outbox p WHERE p.aggregate_id = v.id AND p.{UNFINISHED} \
             ORDER BY p.aggregate_version LIMIT 1) AS seq FROM aggs v WHERE v.id IS NOT NULL) \
         SELECT h.id, h.seq, \
           (o.shard_slot IN (SELECT value FROM json_each(?1)) {fence} \
            AND {due} \
            AND {not_paused}) \
         FROM heads h JOIN ferry_outbox o ON o.seq = h.seq ORDER BY h.id"
    )
}

/// Claims the outbox rows of seqs `?1` (JSON) under claim id `?3`, with lease `?4` (µs) from `?2`:
/// the heads a claim chose in its own write transaction ([`heads_after`]).
pub(crate) fn claim_seqs() -> String {
    format!(
        "UPDATE ferry_outbox SET state = 'CLAIMED', claim_version = claim_version + 1, claim_id = ?3, \
           lease_until = ?2 + ?4 \
         WHERE seq IN (SELECT value FROM json_each(?1)) RETURNING {COLUMNS}"
    )
}

/// The rows still claimed under claim id `?`, in seq order.
pub(crate) fn lookup_claim() -> String {
    format!(
        "SELECT {COLUMNS} FROM ferry_outbox WHERE claim_id = ? AND state = 'CLAIMED' ORDER BY seq"
    )
}

/// Cursor dispatch's status counts (`?1` now): unfinished = past the slot's cursor, or an open
/// exception.
pub(crate) const STATUS_CURSOR: &str = "SELECT coalesce(sum(state = 'PENDING'), 0), coalesce(sum(state = 'CLAIMED'), 0), \
                   coalesce(sum(state = 'QUARANTINED'), 0), ?1 - min(created_at), \
                   count(DISTINCT CASE WHEN state = 'QUARANTINED' THEN aggregate_id END) \
                 FROM (SELECT 'PENDING' AS state, o.created_at, o.aggregate_id FROM ferry_outbox o \
                         JOIN ferry_slot_lease l ON l.slot = o.shard_slot \
                       WHERE o.seq > (SELECT min(cursor_seq) FROM ferry_slot_lease) AND o.seq > l.cursor_seq \
                       UNION ALL \
                       SELECT x.state, o.created_at, x.aggregate_id FROM ferry_outbox_exception x \
                         JOIN ferry_outbox o ON o.seq = x.seq \
                       WHERE x.state IN ('PENDING', 'CLAIMED', 'QUARANTINED'))";

/// Row dispatch's status counts (`?1` now).
pub(crate) const STATUS_ROWS: &str =
    "SELECT coalesce(sum(state = 'PENDING'), 0), coalesce(sum(state = 'CLAIMED'), 0), \
                   coalesce(sum(state = 'QUARANTINED'), 0), ?1 - min(created_at), \
                   count(DISTINCT CASE WHEN state = 'QUARANTINED' THEN aggregate_id END) \
                 FROM ferry_outbox WHERE state IN ('PENDING', 'CLAIMED', 'QUARANTINED')";

/// Quarantined exception rows and how many successors each holds (cursor dispatch); `?` the limit.
pub(crate) const QUARANTINED_CURSOR: &str = "SELECT o.event_id, q.aggregate_id, q.aggregate_version, q.last_error, q.attempts, \
                   (SELECT count(*) FROM ferry_outbox_cursor_view s WHERE s.aggregate_id = q.aggregate_id \
                      AND s.aggregate_version > q.aggregate_version \
                      AND s.state IN ('PENDING', 'CLAIMED', 'QUARANTINED')) \
                 FROM ferry_outbox_exception q JOIN ferry_outbox o ON o.seq = q.seq \
                 WHERE q.state = 'QUARANTINED' ORDER BY q.seq LIMIT ?";

/// Quarantined intents and how many unfinished successors each holds (row dispatch); `?` the limit.
pub(crate) const QUARANTINED_ROWS: &str =
    "SELECT q.event_id, q.aggregate_id, q.aggregate_version, q.last_error, q.attempts, \
                   (SELECT count(*) FROM ferry_outbox s WHERE s.aggregate_id = q.aggregate_id \
                      AND s.aggregate_version > q.aggregate_version \
                      AND s.state IN ('PENDING', 'CLAIMED', 'QUARANTINED')) \
                 FROM ferry_outbox q WHERE q.state = 'QUARANTINED' ORDER BY q.seq LIMIT ?";

/// The multi-row insert of intents, its VALUES pushed per chunk.
pub(crate) const INSERT_HEAD: &str = "INSERT INTO ferry_outbox (event_id, aggregate_id, aggregate_version, shard_slot, topic, msg_key, \
                 event_type, headers, payload, created_at, available_at) ";

/// A switch to cursor dispatch, in its write transaction (`?1` now, where used).
pub(crate) const TO_CURSOR: [&str; 4] = [
    // Quarantined rows stay parked as exception rows (they hold their successors).
    "INSERT INTO ferry_outbox_exception (seq, shard_slot, aggregate_id, aggregate_version, state, \
       available_at, attempts, last_error, resolved_by, resolved_at, created_at) \
     SELECT seq, shard_slot, aggregate_id, aggregate_version, state, available_at, attempts, \
       last_error, resolved_by, resolved_at, ?1 \
     FROM ferry_outbox WHERE state = 'QUARANTINED'",
    // Each slot's cursor sits just below its first unfinished row (or at the
    // head): the cursor path sends the row-mode backlog in order, and its read
    // passes over rows row mode already finished (their state is not PENDING).
    "UPDATE ferry_slot_lease SET cursor_xid = 0, cursor_version = cursor_version + 1, \
       cursor_claim_id = NULL, epoch = epoch + 1, owner = NULL, lease_until = NULL, \
       cursor_seq = coalesce((SELECT min(o.seq) - 1 FROM ferry_outbox o \
           WHERE o.shard_slot = ferry_slot_lease.slot AND o.state IN ('PENDING', 'CLAIMED')), \
         (SELECT seq FROM sqlite_sequence WHERE name = 'ferry_outbox'), 0)",
    "DROP INDEX IF EXISTS ferry_outbox_dispatch",
    "DROP INDEX IF EXISTS ferry_outbox_unfinished",
];

/// A switch to row dispatch, in its write transaction (`?1` now, where used).
pub(crate) const TO_ROW: [&str; 5] = [
    // Rows behind their slot's cursor take the state the cursor gave them.
    "UPDATE ferry_outbox SET state = v.state, \
       sent_at = CASE WHEN v.state = 'SENT' THEN coalesce(ferry_outbox.sent_at, v.sent_at, ?1) END, \
       attempts = v.attempts, last_error = v.last_error, resolved_by = v.resolved_by, \
       available_at = coalesce(v.available_at, ferry_outbox.available_at), lease_until = NULL \
     FROM (SELECT seq, CASE state WHEN 'CLAIMED' THEN 'PENDING' ELSE state END AS state, \
             sent_at, attempts, last_error, resolved_by, available_at \
           FROM ferry_outbox_cursor_view) v \
     WHERE ferry_outbox.seq = v.seq \
       AND (v.state <> ferry_outbox.state OR v.attempts <> ferry_outbox.attempts)",
    "DELETE FROM ferry_outbox_exception",
    "UPDATE ferry_slot_lease SET cursor_xid = NULL, cursor_seq = NULL, cursor_claim_id = NULL, \
       cursor_version = cursor_version + 1, epoch = epoch + 1, owner = NULL, lease_until = NULL",
    "CREATE INDEX IF NOT EXISTS ferry_outbox_dispatch \
       ON ferry_outbox (seq, shard_slot) WHERE state IN ('PENDING', 'CLAIMED')",
    "CREATE INDEX IF NOT EXISTS ferry_outbox_unfinished \
       ON ferry_outbox (aggregate_id, aggregate_version) WHERE state IN ('PENDING', 'CLAIMED', 'QUARANTINED')",
];

/// A cursor read's range ([`crate::seq_read::SeqRange`]): the unfinished rows of slots `?3` (JSON)
/// with `?1 < seq <= ?2`, at most `?4`, each with whether an open exception holds its aggregate.
pub(crate) fn read_range() -> String {
    format!(
        "SELECT {COLUMNS_O}, EXISTS (SELECT 1 FROM ferry_outbox_exception x \
           WHERE x.aggregate_id = o.aggregate_id AND x.state IN ('PENDING', 'CLAIMED', 'QUARANTINED')) \
         FROM ferry_outbox o WHERE o.seq > ?1 AND o.seq <= ?2 \
           AND o.shard_slot IN (SELECT value FROM json_each(?3)) \
           AND o.state IN ('PENDING', 'CLAIMED') ORDER BY o.seq LIMIT ?4"
    )
}

/// The intents of seqs `?1` (JSON), in seq order (the events of exception rows just claimed).
pub(crate) fn events_by_seq() -> String {
    format!(
        "SELECT {COLUMNS_O} FROM ferry_outbox o WHERE o.seq IN (SELECT value FROM json_each(?1)) ORDER BY o.seq"
    )
}

/// The payload of [`crate::lookup::record_sql`] as text and bytes, one of them NULL (one
/// column here: its value's type tells them apart).
pub(crate) const RECORD_PAYLOAD: &str =
    "CASE WHEN typeof(payload) = 'blob' THEN NULL ELSE payload END, \
     CASE WHEN typeof(payload) = 'blob' THEN payload END";

/// The outbox's size: the pages of the table and of its indexes (`dbstat` reads them all).
pub(crate) const OUTBOX_SIZE: &str =
    "SELECT COALESCE(SUM(CASE WHEN name = 'ferry_outbox' THEN pgsize END), 0), \
    COALESCE(SUM(CASE WHEN name <> 'ferry_outbox' THEN pgsize END), 0) FROM dbstat \
    WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = 'ferry_outbox')";
pub(crate) const OUTBOX_SIZE_SOURCE: &str =
    "dbstat: exact, every page of the outbox read (a cost that grows with the table)";
