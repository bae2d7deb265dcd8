//! Every statement of the MariaDB backend, named: one place to read its protocol. Static
//! statements are constants; those with a list of values (slots, candidates, tokens) are built
//! with a `QueryBuilder` by the functions here, every value bound. This file holds the
//! statements every mode runs (status, membership, slot leases, sessions, inserts, lookups) and
//! what the others share; [`claim`] row dispatch's, [`cursor`] cursor dispatch's and the mode
//! switch, [`ticker`] the commit gate's.
use ferry_core::SlotId;
use sqlx::{MySql, QueryBuilder};

mod claim;
mod cursor;
mod fragments;
mod ticker;

pub(crate) use self::claim::*;
pub(crate) use self::cursor::*;
pub(crate) use self::fragments::*;
pub(crate) use self::ticker::*;

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

/// The rows still claimed under claim id `?`, in seq order.
pub(crate) fn lookup_claim() -> String {
    format!(
        "SELECT {COLUMNS} FROM ferry_outbox WHERE claim_id = ? AND state = 'CLAIMED' ORDER BY seq"
    )
}

/// The payload of [`crate::lookup::record_sql`] as text and bytes, one of them NULL.
pub(crate) const RECORD_PAYLOAD: &str = "payload, payload_bytes";

/// Takes the slots in `slots` that are free, ours, or whose lease expired: a new epoch when the
/// owner changes (MariaDB assigns left to right, so `epoch` reads the old owner), a lease of
/// `ttl_us` from now.
pub(crate) fn acquire_slots<'a>(
    owner: &'a str,
    ttl_us: i64,
    slots: &[SlotId],
) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::new("UPDATE ferry_slot_lease SET epoch = IF(owner <=> ");
    qb.push_bind(owner)
        .push(", epoch, epoch + 1), owner = ")
        .push_bind(owner)
        .push(", lease_until = UTC_TIMESTAMP(6) + INTERVAL ")
        .push_bind(ttl_us)
        .push(" MICROSECOND WHERE slot IN (");
    push_list(&mut qb, slots.iter().map(|s| *s as i16));
    qb.push(") AND (owner IS NULL OR owner = ")
        .push_bind(owner)
        .push(" OR lease_until <= UTC_TIMESTAMP(6))");
    qb
}

/// Gives up `owner`'s leases of `slots`.
pub(crate) fn release_slots<'a>(owner: &'a str, slots: &[SlotId]) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::new(
        "UPDATE ferry_slot_lease SET owner = NULL, lease_until = NULL WHERE owner = ",
    );
    qb.push_bind(owner).push(" AND slot IN (");
    push_list(&mut qb, slots.iter().map(|s| *s as i16));
    qb.push(")");
    qb
}

/// The intents of `seqs`, in seq order.
pub(crate) fn intents<'a>(seqs: impl IntoIterator<Item = i64>) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::new(format!("SELECT {COLUMNS} FROM ferry_outbox WHERE seq IN ("));
    push_list(&mut qb, seqs);
    qb.push(") ORDER BY seq");
    qb
}

/// The outbox's size from InnoDB's persistent statistics: the clustered index and the secondary
/// indexes, in pages the statistics last counted.
pub(crate) const OUTBOX_SIZE: &str =
    "SELECT CAST(DATA_LENGTH AS SIGNED), CAST(INDEX_LENGTH AS SIGNED) \
    FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'ferry_outbox'";
pub(crate) const OUTBOX_SIZE_SOURCE: &str =
    "information_schema.TABLES: InnoDB statistics, approximate \
    (recounted after about 10 % of the rows changed, or by ANALYZE TABLE ferry_outbox)";
