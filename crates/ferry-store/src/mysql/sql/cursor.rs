//! Cursor dispatch: the horizon, range reads, cursor advances, exception rows, and the switch
//! between dispatch modes with its indexes.
use ferry_core::{CursorAdvance, NewException};
use sqlx::{MySql, QueryBuilder};

use super::fragments::{due, push_list, COLUMNS_O};
use crate::exceptions::exception_row;
use crate::seq_read::SeqRange;

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

/// The published horizon, its partial part and holds, and whether any exception row is open, in one
/// read view.
pub(crate) const CURSOR_READ_HORIZON: &str =
    "SELECT h.horizon_seq, h.partial_seq, EXISTS (SELECT 1 FROM ferry_outbox_exception \
           WHERE state IN ('PENDING', 'CLAIMED', 'QUARANTINED')), x.shard_slot, x.below_seq \
         FROM ferry_gate_horizon h LEFT JOIN ferry_gate_hold x ON h.partial_seq IS NOT NULL \
         WHERE h.id = 1";

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

/// One cursor read range: the unfinished rows of `r.slots` with `lo < seq <= hi`, in seq
/// order, and whether each row's aggregate has an open exception row (probed only when
/// `held_possible`; else `0`).
pub(crate) fn cursor_range<'a>(r: &SeqRange, held_possible: bool) -> QueryBuilder<'a, MySql> {
    let held = if held_possible {
        "EXISTS (SELECT 1 FROM ferry_outbox_exception x \
           WHERE x.aggregate_id = o.aggregate_id AND x.state IN ('PENDING', 'CLAIMED', 'QUARANTINED'))"
    } else {
        "0"
    };
    let mut qb = QueryBuilder::new(format!(
        "SELECT {COLUMNS_O}, {held} FROM ferry_outbox o WHERE o.seq > "
    ));
    qb.push_bind(r.lo)
        .push(" AND o.seq <= ")
        .push_bind(r.hi)
        .push(" AND o.shard_slot IN (");
    push_list(&mut qb, r.slots.iter().map(|s| *s as i16));
    qb.push(") AND o.state IN ('PENDING', 'CLAIMED') ORDER BY o.seq LIMIT ")
        .push_bind(r.limit as i64);
    qb
}

/// A cursor advance: every slot's cursor to its new seq and version + 1, only where `owner`'s
/// live lease and each slot's `(epoch, cursor_version)` token still match.
pub(crate) fn advance_cursors(req: &CursorAdvance) -> QueryBuilder<'_, MySql> {
    let mut qb = QueryBuilder::new("UPDATE ferry_slot_lease SET cursor_seq = CASE slot");
    for s in &req.slots {
        qb.push(" WHEN ")
            .push_bind(s.slot as i16)
            .push(" THEN ")
            .push_bind(s.to.seq);
    }
    qb.push(" END, cursor_version = cursor_version + 1, cursor_claim_id = ")
        .push_bind(&req.claim_id)
        .push(" WHERE owner = ")
        .push_bind(&req.owner)
        .push(" AND lease_until > UTC_TIMESTAMP(6) AND cursor_seq IS NOT NULL AND (slot, epoch, cursor_version) IN (");
    let mut sep = qb.separated(", ");
    for s in &req.slots {
        sep.push("(")
            .push_bind_unseparated(s.slot as i16)
            .push_unseparated(", ")
            .push_bind_unseparated(s.epoch)
            .push_unseparated(", ")
            .push_bind_unseparated(s.version)
            .push_unseparated(")");
    }
    qb.push(")");
    qb
}

/// The exception rows of an advance; a row already there (a resend) keeps its state.
pub(crate) fn insert_exceptions(rows: &[NewException]) -> QueryBuilder<'_, MySql> {
    let mut qb = QueryBuilder::new(
        "INSERT INTO ferry_outbox_exception (seq, shard_slot, aggregate_id, aggregate_version, state, \
           available_at, attempts, last_error) ",
    );
    qb.push_values(rows, |mut b, x| {
        let (state, delay, err) = exception_row(&x.kind);
        b.push_bind(x.seq)
            .push_bind(x.slot as i16)
            .push_bind(&x.aggregate_id)
            .push_bind(x.aggregate_version)
            .push_bind(state)
            .push("UTC_TIMESTAMP(6) + INTERVAL ")
            .push_bind_unseparated(delay)
            .push_unseparated(" MICROSECOND")
            .push_bind(x.attempts)
            .push_bind(err.map(str::to_string));
    });
    qb.push(" ON DUPLICATE KEY UPDATE seq = seq");
    qb
}

/// Due exception rows of `slots` with no open lower version of their aggregate, not paused,
/// in seq order up to `limit`: a plain read, so the predecessor probe locks nothing.
pub(crate) fn exception_candidates<'a>(slots: &[i16], limit: usize) -> QueryBuilder<'a, MySql> {
    let mut qb =
        QueryBuilder::new("SELECT x.seq FROM ferry_outbox_exception x WHERE x.shard_slot IN (");
    push_list(&mut qb, slots.iter().copied());
    qb.push(format!(
        ") AND {} \
         AND NOT EXISTS (SELECT 1 FROM ferry_outbox_exception p WHERE p.aggregate_id = x.aggregate_id \
           AND p.state IN ('PENDING', 'CLAIMED', 'QUARANTINED') AND p.aggregate_version < x.aggregate_version) \
         AND {} ORDER BY x.seq LIMIT ",
        due("x."),
        crate::operator::pause::not_paused_exception("x")
    ))
    .push_bind(limit as i64);
    qb
}

/// The candidates still due, locked, passing over those another transaction holds:
/// `(seq, claim_version, attempts)`.
pub(crate) fn lock_exceptions<'a>(candidates: &[i64]) -> QueryBuilder<'a, MySql> {
    let mut qb = QueryBuilder::new(
        "SELECT seq, claim_version, attempts FROM ferry_outbox_exception WHERE seq IN (",
    );
    push_list(&mut qb, candidates.iter().copied());
    qb.push(format!(
        ") AND {} ORDER BY seq FOR UPDATE SKIP LOCKED",
        due("")
    ));
    qb
}

/// Adds or drops the row-dispatch indexes `changes` (`ADD INDEX …`, `DROP INDEX …` of
/// [`ROW_INDEXES`], constants), waiting at most `wait_s` for the table's metadata lock.
pub(crate) fn row_index_ddl(wait_s: u32, changes: &[String]) -> String {
    format!(
        "ALTER TABLE ferry_outbox WAIT {wait_s} {}",
        changes.join(", ")
    )
}
