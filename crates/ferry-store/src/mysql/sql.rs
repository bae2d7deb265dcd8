//! Every statement of the MariaDB backend, named: one place to read its protocol. Static
//! statements are constants; those with a list of values (slots, candidates, tokens) are built
//! with a `QueryBuilder` by the functions here, every value bound.
use std::borrow::Cow;

use ferry_core::ClaimToken;
use sqlx::{MySql, QueryBuilder};

use crate::outcome::Transition;

/// `SELECT <columns> FROM ferry_slot_lease` of the slots in `slots` whose live lease `owner`
/// holds (and `extra`, a further condition), in slot order.
pub(crate) fn owned_slots<'a>(
    columns: &str,
    owner: &'a str,
    extra: &str,
    slots: &[ferry_core::SlotId],
) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::new(format!(
        "SELECT {columns} FROM ferry_slot_lease WHERE owner = "
    ));
    qb.push_bind(owner).push(format!(
        " AND lease_until > UTC_TIMESTAMP(6){extra} AND slot IN ("
    ));
    push_list(&mut qb, slots.iter().map(|s| *s as i16));
    qb.push(") ORDER BY slot");
    qb
}

/// The rows of the statement `qb` built, on `ex`; its errors in the context `what`.
pub(crate) async fn fetch_rows<'c>(
    qb: &mut QueryBuilder<'_, MySql>,
    ex: impl sqlx::Executor<'c, Database = MySql>,
    what: &str,
) -> Result<Vec<sqlx::mysql::MySqlRow>, ferry_core::StoreError> {
    qb.build()
        .fetch_all(ex)
        .await
        .map_err(|e| crate::error::db_err(what, e))
}

/// The lowest cursor.
pub(crate) const STATUS_CURSORS: &str = "SELECT min(cursor_seq) FROM ferry_slot_lease";

/// The intents behind the cursors (`?`: the lowest cursor) and the oldest one's age.
pub(crate) const STATUS_BACKLOG: &str = "SELECT CAST(count(*) AS SIGNED), \
               CAST(TIMESTAMPDIFF(MICROSECOND, min(o.created_at), UTC_TIMESTAMP(6)) AS SIGNED) \
             FROM ferry_outbox o JOIN ferry_slot_lease l ON l.slot = o.shard_slot \
             WHERE o.seq > ? AND o.seq > l.cursor_seq";

/// The open exception rows' counts, oldest age and blocked aggregates.
pub(crate) const STATUS_EXCEPTIONS: &str =
    "SELECT CAST(coalesce(sum(x.state = 'PENDING'), 0) AS SIGNED), \
               CAST(coalesce(sum(x.state = 'CLAIMED'), 0) AS SIGNED), \
               CAST(coalesce(sum(x.state = 'QUARANTINED'), 0) AS SIGNED), \
               CAST(TIMESTAMPDIFF(MICROSECOND, min(o.created_at), UTC_TIMESTAMP(6)) AS SIGNED), \
               count(DISTINCT CASE WHEN x.state = 'QUARANTINED' THEN x.aggregate_id END) \
             FROM ferry_outbox_exception x JOIN ferry_outbox o ON o.seq = x.seq \
             WHERE x.state IN ('PENDING', 'CLAIMED', 'QUARANTINED')";

/// Joins or renews an owner's membership; a live row of another instance is left alone.
pub(crate) const MEMBER_HEARTBEAT: &str = "INSERT INTO ferry_relay_member (owner, instance, lease_until, sink_stalled_us) \
                 VALUES (?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?) \
                 ON DUPLICATE KEY UPDATE \
                 instance = IF(instance = VALUES(instance) OR lease_until <= UTC_TIMESTAMP(6), VALUES(instance), instance), \
                 lease_until = IF(instance = VALUES(instance), VALUES(lease_until), lease_until), \
                 sink_stalled_us = IF(instance = VALUES(instance), VALUES(sink_stalled_us), sink_stalled_us)";

/// The instance holding owner `?`'s membership row.
pub(crate) const MEMBER_INSTANCE: &str = "SELECT instance FROM ferry_relay_member WHERE owner = ?";

/// Every owned slot lease, in slot order.
pub(crate) const SLOT_LEASES: &str = "SELECT slot, owner, epoch, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', lease_until) FROM ferry_slot_lease \
                 WHERE owner IS NOT NULL ORDER BY slot";

/// Which of the row-dispatch indexes exist.
pub(crate) const DISPATCH_MODE_INDEXES: &str =
    "SELECT DISTINCT CAST(index_name AS CHAR) FROM information_schema.STATISTICS \
             WHERE table_schema = DATABASE() AND table_name = 'ferry_outbox' \
               AND index_name IN (?, ?, ?, ?)";

/// The oldest open transaction that wrote (`INNODB_TRX`, needs the PROCESS privilege): its age and
/// thread, and while a partial horizon is published how many slots are held back.
pub(crate) const HORIZON_OLDEST_TRANSACTION: &str = "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) AS SIGNED), \
                   CAST(t.trx_mysql_thread_id AS SIGNED), \
                   (SELECT CASE WHEN h.partial_seq IS NULL THEN NULL \
                           ELSE (SELECT CAST(count(*) AS SIGNED) FROM ferry_gate_hold) END \
                    FROM ferry_gate_horizon h WHERE h.id = 1) \
                 FROM information_schema.INNODB_TRX t \
                 WHERE t.trx_rows_modified > 0 \
                   AND t.trx_mysql_thread_id <> coalesce((SELECT ticker_conn FROM ferry_gate_horizon WHERE id = 1), 0) \
                   AND t.trx_mysql_thread_id <> CONNECTION_ID() \
                 ORDER BY t.trx_started LIMIT 1";

/// Requests gate row `?` exclusively.
pub(crate) const TICKER_GATE: &str =
    "SELECT parity FROM ferry_commit_gate WHERE parity = ? FOR UPDATE";

/// This connection's id.
pub(crate) const TICKER_CONNECTION_ID: &str = "SELECT CAST(CONNECTION_ID() AS SIGNED)";

/// The ticker election: this database's ticker lock, waited for 1 s.
pub(crate) const TICKER_ELECTION: &str = "SELECT GET_LOCK(CONCAT('ferry_ticker:', DATABASE()), 1)";

/// Who holds the ticker lock, the registered ticker's connection and gate connections, and whether
/// it has not ticked for `?` s.
pub(crate) const TICKER_STALE_CHECK: &str = "SELECT CAST(IS_USED_LOCK(CONCAT('ferry_ticker:', DATABASE())) AS SIGNED), ticker_conn, \
                   CAST(coalesce(ticked_at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND, 0) AS SIGNED), ticker_conns \
                 FROM ferry_gate_horizon WHERE id = 1";

/// Registers this session's ticker connection and gate connections; drops an earlier session's
/// partial horizon.
pub(crate) const TICKER_REGISTER: &str =
    "UPDATE ferry_gate_horizon SET ticker_conn = ?, ticker_conns = ?, \
         ticked_at = UTC_TIMESTAMP(6), partial_seq = NULL WHERE id = 1";

/// The published horizon.
pub(crate) const TICKER_HORIZON: &str = "SELECT horizon_seq FROM ferry_gate_horizon WHERE id = 1";

/// The head: the highest seq drawn so far.
pub(crate) const TICKER_HEAD: &str =
    "SELECT CAST(coalesce(max(seq), 0) AS SIGNED) FROM ferry_outbox";

/// Publishes a closed head for every slot.
pub(crate) const TICKER_PUBLISH: &str =
    "UPDATE ferry_gate_horizon SET horizon_seq = GREATEST(horizon_seq, ?), partial_seq = NULL, \
                     ticked_at = UTC_TIMESTAMP(6), ticker_conn = ? WHERE id = 1";

/// Publishes a head closed outside the held slots.
pub(crate) const TICKER_PUBLISH_PARTIAL: &str =
    "UPDATE ferry_gate_horizon SET partial_seq = GREATEST(coalesce(partial_seq, 0), ?), \
                     ticked_at = UTC_TIMESTAMP(6), ticker_conn = ? WHERE id = 1";

/// The committed rows of a range.
pub(crate) const TICKER_COMMITTED_ROWS: &str =
    "SELECT seq FROM ferry_outbox WHERE seq > ? AND seq <= ?";

/// Every row of a range, committed or not (read uncommitted), with its slot.
pub(crate) const TICKER_DIRTY_READ: &str =
    "SELECT seq, shard_slot FROM ferry_outbox WHERE seq > ? AND seq <= ?";

/// The published horizon, its partial part and holds, and whether any exception row is open, in one
/// read view.
pub(crate) const CURSOR_READ_HORIZON: &str =
    "SELECT h.horizon_seq, h.partial_seq, EXISTS (SELECT 1 FROM ferry_outbox_exception \
           WHERE state IN ('PENDING', 'CLAIMED', 'QUARANTINED')), x.shard_slot, x.below_seq \
         FROM ferry_gate_horizon h LEFT JOIN ferry_gate_hold x ON h.partial_seq IS NOT NULL \
         WHERE h.id = 1";

pub(crate) const COLUMNS: &str = "seq, event_id, claim_id, claim_version, aggregate_id, aggregate_version, shard_slot, \
    topic, msg_key, event_type, headers, payload, payload_bytes, attempts, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at)";

pub(crate) fn push_list<'a, T>(qb: &mut QueryBuilder<'a, MySql>, items: impl IntoIterator<Item = T>)
where
    T: 'a + sqlx::Encode<'a, MySql> + sqlx::Type<MySql> + Send,
{
    let mut sep = qb.separated(", ");
    for i in items {
        sep.push_bind(i);
    }
}

/// `{head} FROM ferry_outbox WHERE seq IN (candidates) AND <still due> ORDER BY seq LIMIT n`:
/// the window the claim's locking re-check reads, and its contention recount reads again.
pub(crate) fn due_window<'a>(
    head: &str,
    candidates: &[i64],
    limit: usize,
) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::<MySql>::new(format!("{head} FROM ferry_outbox WHERE seq IN ("));
    push_list(&mut qb, candidates.iter().copied());
    qb.push(
        ") AND ((state = 'PENDING' AND available_at <= UTC_TIMESTAMP(6)) OR (state = 'CLAIMED' AND lease_until <= UTC_TIMESTAMP(6))) \
         ORDER BY seq LIMIT ",
    );
    qb.push_bind(limit as i64);
    qb
}

/// Due rows of one state in the owner's slots, in `seq` order up to `upto` (the window's end, when
/// it has one), whose aggregate has no unfinished lower version. `FORCE INDEX`:
/// `ferry_outbox_due` (state, seq, shard_slot, available_at, lease_until) yields seq order and
/// filters slot and due time without touching rows; left to itself the optimizer walked the
/// primary key through every SENT row, or sorted all pending rows of the slots, once the table
/// grew (docs/schema.md, "MariaDB claim plan").
pub(crate) fn candidate_query<'a>(
    state: &str,
    due_column: &str,
    slots: &[i16],
    upto: Option<i64>,
    limit: usize,
) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::<MySql>::new(format!(
        "SELECT o.seq FROM ferry_outbox o FORCE INDEX (ferry_outbox_due) WHERE o.state = '{state}' \
         AND o.shard_slot IN ("
    ));
    push_list(&mut qb, slots.iter().copied());
    qb.push(format!(") AND {due_column} <= UTC_TIMESTAMP(6)"));
    if let Some(end) = upto {
        qb.push(" AND o.seq <= ").push_bind(end);
    }
    qb.push(format!(
        " AND {} AND {} ORDER BY o.seq LIMIT ",
        predecessor_free("o"),
        crate::operator::pause::not_paused("o")
    ));
    qb.push_bind(limit as i64);
    qb
}

/// The predecessor rule on the row aliased `a`: its aggregate has no unfinished lower version.
/// One probe of `ferry_outbox_predecessor` (state, aggregate_id, aggregate_version) per unfinished
/// state, each an equality on `state` and `aggregate_id`: MariaDB reads a dependent subquery by
/// `ref` on an equality prefix only. With `state IN (…)` it took the unique key's
/// `aggregate_id` instead and read every version of the aggregate, SENT ones included, so a
/// probe cost the aggregate's history; left to choose, it read all CLAIMED rows by
/// `ferry_outbox_sent_at` (state, sent_at) for each probe, hence `FORCE INDEX`. The PENDING probe reads one entry, the aggregate's lowest
/// PENDING version (a `NOT EXISTS` would read all of them for a row that is the lowest);
/// CLAIMED and QUARANTINED versions of an aggregate are few.
fn predecessor_free(a: &str) -> String {
    let none_lower = |state: &str| {
        format!(
            "NOT EXISTS (SELECT 1 FROM ferry_outbox p FORCE INDEX (ferry_outbox_predecessor) \
               WHERE p.state = '{state}' AND p.aggregate_id = {a}.aggregate_id \
               AND p.aggregate_version < {a}.aggregate_version)"
        )
    };
    format!(
        "{a}.aggregate_version <= COALESCE((SELECT p.aggregate_version \
           FROM ferry_outbox p FORCE INDEX (ferry_outbox_predecessor) \
           WHERE p.state = 'PENDING' AND p.aggregate_id = {a}.aggregate_id \
           ORDER BY p.aggregate_version LIMIT 1), {a}.aggregate_version) \
         AND {} AND {}",
        none_lower("CLAIMED"),
        none_lower("QUARANTINED")
    )
}

/// The window's end: the seq of the `rows`-th due PENDING row of the slots (`OFFSET rows - 1`),
/// none when fewer are due. An index-only walk of `ferry_outbox_due`.
pub(crate) fn window_end<'a>(slots: &[i16], rows: i64) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::<MySql>::new(
        "SELECT o.seq FROM ferry_outbox o FORCE INDEX (ferry_outbox_due) WHERE o.state = 'PENDING' \
         AND o.shard_slot IN (",
    );
    push_list(&mut qb, slots.iter().copied());
    qb.push(") AND o.available_at <= UTC_TIMESTAMP(6) ORDER BY o.seq LIMIT 1 OFFSET ")
        .push_bind((rows - 1).max(0));
    qb
}

/// PENDING index entries one statement of the scan for heads reads ([`heads_after`]).
pub(crate) const HEAD_ENTRIES: i64 = 1024;

/// The heads of the aggregates after `from` that have a PENDING version, among the next
/// [`HEAD_ENTRIES`] PENDING entries of `ferry_outbox_predecessor` (state, aggregate_id,
/// aggregate_version) in index order, and whether the claim may take each:
/// `(aggregate_id, seq, claimable, entries)`, in aggregate order. The head of an aggregate is its
/// lowest PENDING version (the first of its entries: the read starts after `from`'s last); it is
/// claimable under the window's predicate (due, in the claim's slots, no unfinished lower version,
/// not paused) and lies past the window's end `after`. `entries` summed over the rows is how many
/// index entries the read took: fewer than [`HEAD_ENTRIES`] means it reached the last aggregate.
/// The last aggregate may have more versions past the read; its head is still the first.
/// Parameters, bound in this order: the slots, `after`, `from`, the entries.
pub(crate) fn heads_after<'a>(slots: &[i16], after: i64, from: &'a str) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::<MySql>::new("SELECT w.aggregate_id, o.seq, (o.shard_slot IN (");
    push_list(&mut qb, slots.iter().copied());
    qb.push(") AND o.available_at <= UTC_TIMESTAMP(6) AND o.seq > ")
        .push_bind(after);
    qb.push(format!(
        " AND {} AND {}), w.entries \
         FROM (SELECT u.aggregate_id, MIN(u.aggregate_version) AS v, COUNT(*) AS entries \
               FROM (SELECT aggregate_id, aggregate_version FROM ferry_outbox FORCE INDEX (ferry_outbox_predecessor) \
                     WHERE state = 'PENDING' AND aggregate_id > ",
        predecessor_free("o"),
        crate::operator::pause::not_paused("o")
    ));
    qb.push_bind(from);
    qb.push(" ORDER BY aggregate_id, aggregate_version LIMIT ")
        .push_bind(HEAD_ENTRIES);
    qb.push(
        ") u GROUP BY u.aggregate_id) w \
         JOIN ferry_outbox o ON o.aggregate_id = w.aggregate_id AND o.aggregate_version = w.v \
         ORDER BY w.aggregate_id",
    );
    qb
}

/// A CAS predicate over tokens: `seq IN (…) AND (seq, claim_version, claim_id) IN ((…), …)`.
pub(crate) fn push_tokens<'a>(qb: &mut QueryBuilder<'a, MySql>, tokens: &'a [ClaimToken]) {
    qb.push("state = 'CLAIMED' AND seq IN (");
    push_list(qb, tokens.iter().map(|t| t.seq));
    qb.push(") AND (seq, claim_version, claim_id) IN (");
    let mut first = true;
    for t in tokens {
        if !first {
            qb.push(", ");
        }
        first = false;
        qb.push("(")
            .push_bind(t.seq)
            .push(", ")
            .push_bind(t.claim_version)
            .push(", ")
            .push_bind(&t.claim_id)
            .push(")");
    }
    qb.push(")");
}

/// The SET clause of an outcome, the same on both tables. Per-item values are bound in the
/// order the clause reads them (delay, then text).
pub(crate) fn outcome_set(to: Transition) -> Cow<'static, str> {
    match to {
        Transition::Ack => "state = 'SENT', sent_at = UTC_TIMESTAMP(6), lease_until = NULL".into(),
        Transition::Retry => "available_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, last_error = ?, state = 'PENDING', \
             lease_until = NULL, attempts = attempts + 1"
            .into(),
        Transition::Quarantine => "available_at = available_at + INTERVAL ? MICROSECOND, last_error = ?, state = 'QUARANTINED', \
             lease_until = NULL, attempts = attempts + 1"
            .into(),
        Transition::Release => {
            "state = 'PENDING', lease_until = NULL, available_at = UTC_TIMESTAMP(6)".into()
        }
        Transition::Extend { lease_us } => {
            format!("lease_until = UTC_TIMESTAMP(6) + INTERVAL {lease_us} MICROSECOND").into()
        }
    }
}

/// `ferry_status_cache` on MariaDB ([`crate::status_cache::shared_status`]; migration 5).
pub(crate) const STATUS_CACHE: crate::status_cache::StatusCacheSql = crate::status_cache::StatusCacheSql {
    lease: "UPDATE ferry_status_cache SET computing_until = UTC_TIMESTAMP(6) + INTERVAL 60 SECOND \
            WHERE id = 1 AND (computed_at IS NULL OR computed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND) \
              AND (computing_until IS NULL OR computing_until < UTC_TIMESTAMP(6))",
    stored: "SELECT pending, claimed, quarantined, \
               oldest_age_us + TIMESTAMPDIFF(MICROSECOND, computed_at, UTC_TIMESTAMP(6)), blocked \
             FROM ferry_status_cache WHERE id = 1 AND computed_at IS NOT NULL",
    clear: "UPDATE ferry_status_cache SET computing_until = NULL WHERE id = 1",
    store: "UPDATE ferry_status_cache SET pending = ?, claimed = ?, quarantined = ?, \
              oldest_age_us = ?, blocked = ?, computed_at = UTC_TIMESTAMP(6), computing_until = NULL \
            WHERE id = 1",
};

/// `COLUMNS` qualified with `o.`, in the order [`claimed_from_row`] reads.
pub(crate) const COLUMNS_O: &str =
    "o.seq, o.event_id, o.claim_id, o.claim_version, o.aggregate_id, o.aggregate_version, \
    o.shard_slot, o.topic, o.msg_key, o.event_type, o.headers, o.payload, o.payload_bytes, o.attempts, \
    TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', o.created_at)";

/// The row-dispatch indexes of `ferry_outbox` (migrations 0001 and 0002) and their columns.
/// Cursor dispatch never reads them and never updates an outbox row, but without partial
/// indexes each one still takes an entry for every intent a producer writes: a switch to cursor
/// dispatch drops them, a switch to row dispatch builds them again (row claims force
/// `ferry_outbox_due`).
pub(crate) const ROW_INDEXES: [(&str, &str); 4] = [
    (
        "ferry_outbox_due",
        "state, seq, shard_slot, available_at, lease_until",
    ),
    (
        "ferry_outbox_predecessor",
        "state, aggregate_id, aggregate_version",
    ),
    ("ferry_outbox_claim_id", "claim_id"),
    ("ferry_outbox_sent_at", "state, sent_at"),
];

/// Rows per multi-row statement (9 placeholders per row: 9,000 per statement, far below the
/// protocol's 65,535).
pub(crate) const CHUNK: usize = 1000;

/// Row dispatch's status counts ([`crate::rows::StatusRow`]).
pub(crate) const STATUS_ROWS: &str = "SELECT (SELECT count(*) FROM ferry_outbox WHERE state = 'PENDING'), \
                   (SELECT count(*) FROM ferry_outbox WHERE state = 'CLAIMED'), \
                   (SELECT count(*) FROM ferry_outbox WHERE state = 'QUARANTINED'), \
                   (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) AS SIGNED) FROM ferry_outbox \
                      WHERE seq = (SELECT min(seq) FROM ferry_outbox WHERE state = 'PENDING')), \
                   (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) AS SIGNED) FROM ferry_outbox \
                      WHERE seq = (SELECT min(seq) FROM ferry_outbox WHERE state = 'CLAIMED')), \
                   (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) AS SIGNED) FROM ferry_outbox \
                      WHERE seq = (SELECT min(seq) FROM ferry_outbox WHERE state = 'QUARANTINED')), \
                   (SELECT count(DISTINCT aggregate_id) FROM ferry_outbox WHERE state = 'QUARANTINED')";

/// Quarantined exception rows and how many successors each holds (cursor dispatch); `?` the limit.
pub(crate) const QUARANTINED_CURSOR: &str = "SELECT o.event_id, q.aggregate_id, q.aggregate_version, q.last_error, q.attempts, \
                   (SELECT COUNT(*) FROM ferry_outbox_cursor_view s WHERE s.aggregate_id = q.aggregate_id \
                      AND s.state IN ('PENDING', 'CLAIMED', 'QUARANTINED') AND s.aggregate_version > q.aggregate_version) \
                 FROM ferry_outbox_exception q JOIN ferry_outbox o ON o.seq = q.seq \
                 WHERE q.state = 'QUARANTINED' ORDER BY q.seq LIMIT ?";

/// Quarantined intents and how many unfinished successors each holds (row dispatch); `?` the limit.
pub(crate) const QUARANTINED_ROWS: &str = "SELECT q.event_id, q.aggregate_id, q.aggregate_version, q.last_error, q.attempts, \
                   (SELECT COUNT(*) FROM ferry_outbox s WHERE s.aggregate_id = q.aggregate_id \
                      AND s.state IN ('PENDING', 'CLAIMED', 'QUARANTINED') AND s.aggregate_version > q.aggregate_version) \
                 FROM ferry_outbox q WHERE q.state = 'QUARANTINED' ORDER BY q.seq LIMIT ?";

/// MariaDB 10.3+: abort a session idle for 10 s inside a transaction, so a stalled relay cannot
/// hold its row locks (and block a takeover) forever. MySQL has no such variable; the error is
/// ignored there.
pub(crate) const SESSION_IDLE_TIMEOUT: &str = "SET SESSION idle_transaction_timeout = 10";

/// Every store session runs at READ COMMITTED.
pub(crate) const SESSION_READ_COMMITTED: &str =
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// The multi-row insert of intents, its VALUES pushed per chunk.
pub(crate) const INSERT_HEAD: &str = "INSERT INTO ferry_outbox (event_id, aggregate_id, aggregate_version, shard_slot, topic, msg_key, \
                 event_type, headers, payload, payload_bytes) ";

/// A switch to cursor dispatch, in its transaction.
pub(crate) const TO_CURSOR: [&str; 2] = [
    // Quarantined rows stay parked as exception rows (they hold their successors).
    "INSERT INTO ferry_outbox_exception (seq, shard_slot, aggregate_id, aggregate_version, state, \
       available_at, attempts, last_error, resolved_by, resolved_at) \
     SELECT seq, shard_slot, aggregate_id, aggregate_version, state, available_at, attempts, \
       last_error, resolved_by, resolved_at \
     FROM ferry_outbox WHERE state = 'QUARANTINED' \
     ON DUPLICATE KEY UPDATE state = VALUES(state)",
    // Each slot's cursor sits just below its first unfinished row (or at the
    // head): the cursor sends the row-mode backlog in order and passes over rows
    // row mode already finished (their state is not PENDING).
    "UPDATE ferry_slot_lease l \
     LEFT JOIN (SELECT shard_slot, min(seq) - 1 AS below FROM ferry_outbox \
                WHERE state IN ('PENDING', 'CLAIMED') GROUP BY shard_slot) u ON u.shard_slot = l.slot \
     SET l.cursor_seq = coalesce(u.below, (SELECT coalesce(max(seq), 0) FROM ferry_outbox)), \
       l.cursor_version = l.cursor_version + 1, l.cursor_claim_id = NULL, \
       l.epoch = l.epoch + 1, l.owner = NULL, l.lease_until = NULL",
];

/// A switch to row dispatch, in its transaction.
pub(crate) const TO_ROW: [&str; 3] = [
    // Rows behind their slot's cursor take the state the cursor gave them (the
    // view's effective state, written out: MySQL cannot update a table through a
    // view of itself). SET runs left to right: `state` goes last.
    "UPDATE ferry_outbox o JOIN ferry_slot_lease l ON l.slot = o.shard_slot \
     LEFT JOIN ferry_outbox_exception x ON x.seq = o.seq \
     SET o.sent_at = CASE WHEN coalesce(x.state, CASE WHEN o.state NOT IN ('PENDING', 'CLAIMED') THEN o.state \
           WHEN l.cursor_seq IS NOT NULL AND o.seq <= l.cursor_seq THEN 'SENT' ELSE 'PENDING' END) = 'SENT' \
           THEN coalesce(o.sent_at, x.sent_at, UTC_TIMESTAMP(6)) END, \
       o.attempts = coalesce(x.attempts, o.attempts), o.last_error = coalesce(x.last_error, o.last_error), \
       o.resolved_by = coalesce(x.resolved_by, o.resolved_by), \
       o.available_at = coalesce(x.available_at, o.available_at), o.lease_until = NULL, \
       o.state = CASE coalesce(x.state, CASE WHEN o.state NOT IN ('PENDING', 'CLAIMED') THEN o.state \
           WHEN l.cursor_seq IS NOT NULL AND o.seq <= l.cursor_seq THEN 'SENT' ELSE 'PENDING' END) \
         WHEN 'CLAIMED' THEN 'PENDING' \
         ELSE coalesce(x.state, CASE WHEN o.state NOT IN ('PENDING', 'CLAIMED') THEN o.state \
           WHEN l.cursor_seq IS NOT NULL AND o.seq <= l.cursor_seq THEN 'SENT' ELSE 'PENDING' END) END \
     WHERE x.seq IS NOT NULL OR o.state = 'CLAIMED' \
       OR (o.state = 'PENDING' AND l.cursor_seq IS NOT NULL AND o.seq <= l.cursor_seq)",
    "DELETE FROM ferry_outbox_exception",
    "UPDATE ferry_slot_lease SET cursor_seq = NULL, cursor_claim_id = NULL, \
       cursor_version = cursor_version + 1, epoch = epoch + 1, owner = NULL, lease_until = NULL",
];

/// The rows still claimed under claim id `?`, in seq order.
pub(crate) fn lookup_claim() -> String {
    format!(
        "SELECT {COLUMNS} FROM ferry_outbox WHERE claim_id = ? AND state = 'CLAIMED' ORDER BY seq"
    )
}

/// A gate connection's transaction, in which it requests its gate row.
pub(crate) const GATE_BEGIN: &str = "START TRANSACTION";

/// The dirty read of a frozen row's holders' uncommitted rows.
pub(crate) const DIRTY_READ_ISOLATION: &str = "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED";

/// Drops every held-back slot (`ferry_gate_hold`).
pub(crate) const CLEAR_GATE_HOLDS: &str = "DELETE FROM ferry_gate_hold";

/// A new ticker session drops an earlier session's held-back slots.
pub(crate) const CLEAR_GATE_HOLDS_ON_REGISTER: &str = "DELETE FROM ferry_gate_hold";

/// The ticker's sessions wait inside transactions by design: no idle-in-transaction timeout.
pub(crate) const TICKER_NO_IDLE_TIMEOUT: &str = "SET SESSION idle_transaction_timeout = 0";

/// The ticker's sessions run at READ COMMITTED.
pub(crate) const TICKER_READ_COMMITTED: &str =
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// The update of a claim's locked rows `seqs` of `table` (`ferry_outbox` or
/// `ferry_outbox_exception`, fixed constants): CLAIMED under the request's claim id, the next
/// claim version, a lease to now + the request's lease.
pub(crate) fn claim_update<'a>(
    table: &str,
    req: &'a ferry_core::ClaimRequest,
    seqs: impl IntoIterator<Item = i64>,
) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::<MySql>::new(format!(
        "UPDATE {table} SET state = 'CLAIMED', claim_version = claim_version + 1, claim_id = "
    ));
    qb.push_bind(&req.claim_id)
        .push(", lease_until = UTC_TIMESTAMP(6) + INTERVAL ")
        .push_bind(crate::time::micros(req.lease))
        .push(" MICROSECOND WHERE seq IN (");
    push_list(&mut qb, seqs);
    qb.push(")");
    qb
}

/// The payload of [`crate::lookup::record_sql`] as text and bytes, one of them NULL.
pub(crate) const RECORD_PAYLOAD: &str = "payload, payload_bytes";
