//! Every statement of the MariaDB backend, named: one place to read its protocol.

/// Status: cursors (mod.rs).
pub(crate) const STATUS_CURSORS: &str = "SELECT min(cursor_seq) FROM ferry_slot_lease";

/// Status: backlog (mod.rs).
pub(crate) const STATUS_BACKLOG: &str = "SELECT CAST(count(*) AS SIGNED), \
               CAST(TIMESTAMPDIFF(MICROSECOND, min(o.created_at), UTC_TIMESTAMP(6)) AS SIGNED) \
             FROM ferry_outbox o JOIN ferry_slot_lease l ON l.slot = o.shard_slot \
             WHERE o.seq > ? AND o.seq > l.cursor_seq";

/// Status: exceptions (mod.rs).
pub(crate) const STATUS_EXCEPTIONS: &str =
    "SELECT CAST(coalesce(sum(x.state = 'PENDING'), 0) AS SIGNED), \
               CAST(coalesce(sum(x.state = 'CLAIMED'), 0) AS SIGNED), \
               CAST(coalesce(sum(x.state = 'QUARANTINED'), 0) AS SIGNED), \
               CAST(TIMESTAMPDIFF(MICROSECOND, min(o.created_at), UTC_TIMESTAMP(6)) AS SIGNED), \
               count(DISTINCT CASE WHEN x.state = 'QUARANTINED' THEN x.aggregate_id END) \
             FROM ferry_outbox_exception x JOIN ferry_outbox o ON o.seq = x.seq \
             WHERE x.state IN ('PENDING', 'CLAIMED', 'QUARANTINED')";

/// Member heartbeat (mod.rs).
pub(crate) const MEMBER_HEARTBEAT: &str = "INSERT INTO ferry_relay_member (owner, instance, lease_until, sink_stalled_us) \
                 VALUES (?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?) \
                 ON DUPLICATE KEY UPDATE \
                 instance = IF(instance = VALUES(instance) OR lease_until <= UTC_TIMESTAMP(6), VALUES(instance), instance), \
                 lease_until = IF(instance = VALUES(instance), VALUES(lease_until), lease_until), \
                 sink_stalled_us = IF(instance = VALUES(instance), VALUES(sink_stalled_us), sink_stalled_us)";

/// Member heartbeat (mod.rs).
pub(crate) const MEMBER_INSTANCE: &str = "SELECT instance FROM ferry_relay_member WHERE owner = ?";

/// Members (mod.rs).
pub(crate) const LIVE_MEMBERS: &str =
    "SELECT owner FROM ferry_relay_member WHERE lease_until > UTC_TIMESTAMP(6) ORDER BY owner";

/// Members (mod.rs).
pub(crate) const MEMBERS_WITH_STALLS: &str =
    "SELECT owner, sink_stalled_us FROM ferry_relay_member \
                 WHERE lease_until > UTC_TIMESTAMP(6) ORDER BY owner";

/// Leave (mod.rs).
pub(crate) const LEAVE_MEMBER: &str = "DELETE FROM ferry_relay_member WHERE owner = ?";

/// Slot leases (mod.rs).
pub(crate) const SLOT_LEASES: &str = "SELECT slot, owner, epoch, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', lease_until) FROM ferry_slot_lease \
                 WHERE owner IS NOT NULL ORDER BY slot";

/// Dispatch mode (cursor.rs).
pub(crate) const DISPATCH_MODE_FOR_UPDATE: &str =
    "SELECT mode FROM ferry_dispatch WHERE id = 1 FOR UPDATE";

/// Dispatch mode: members (cursor.rs).
pub(crate) const DISPATCH_MODE_MEMBERS: &str =
    "SELECT count(*) FROM ferry_relay_member WHERE owner <> ? AND lease_until > UTC_TIMESTAMP(6)";

/// Dispatch mode: set (cursor.rs).
pub(crate) const DISPATCH_MODE_SET: &str =
    "UPDATE ferry_dispatch SET mode = ?, changed_at = UTC_TIMESTAMP(6) WHERE id = 1";

/// Dispatch mode: indexes (cursor.rs).
pub(crate) const DISPATCH_MODE_INDEXES: &str =
    "SELECT DISTINCT CAST(index_name AS CHAR) FROM information_schema.STATISTICS \
             WHERE table_schema = DATABASE() AND table_name = 'ferry_outbox' \
               AND index_name IN (?, ?, ?, ?)";

/// Statement (cursor.rs).
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

/// Ticker: gate (ticker.rs).
pub(crate) const TICKER_GATE: &str =
    "SELECT parity FROM ferry_commit_gate WHERE parity = ? FOR UPDATE";

/// Ticker: connection id (ticker.rs).
pub(crate) const TICKER_CONNECTION_ID: &str = "SELECT CAST(CONNECTION_ID() AS SIGNED)";

/// Ticker: election (ticker.rs).
pub(crate) const TICKER_ELECTION: &str = "SELECT GET_LOCK(CONCAT('ferry_ticker:', DATABASE()), 1)";

/// Ticker: stale check (ticker.rs).
pub(crate) const TICKER_STALE_CHECK: &str = "SELECT CAST(IS_USED_LOCK(CONCAT('ferry_ticker:', DATABASE())) AS SIGNED), ticker_conn, \
                   CAST(coalesce(ticked_at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND, 0) AS SIGNED), ticker_conns \
                 FROM ferry_gate_horizon WHERE id = 1";

/// Ticker: register (ticker.rs).
pub(crate) const TICKER_REGISTER: &str =
    "UPDATE ferry_gate_horizon SET ticker_conn = ?, ticker_conns = ?, \
         ticked_at = UTC_TIMESTAMP(6), partial_seq = NULL WHERE id = 1";

/// Ticker: register (ticker.rs).
pub(crate) const TICKER_HORIZON: &str = "SELECT horizon_seq FROM ferry_gate_horizon WHERE id = 1";

/// Ticker: head (ticker.rs).
pub(crate) const TICKER_HEAD: &str =
    "SELECT CAST(coalesce(max(seq), 0) AS SIGNED) FROM ferry_outbox";

/// Ticker: publish (ticker.rs).
pub(crate) const TICKER_PUBLISH: &str =
    "UPDATE ferry_gate_horizon SET horizon_seq = GREATEST(horizon_seq, ?), partial_seq = NULL, \
                     ticked_at = UTC_TIMESTAMP(6), ticker_conn = ? WHERE id = 1";

/// Ticker: publish (ticker.rs).
pub(crate) const TICKER_PUBLISH_PARTIAL: &str =
    "UPDATE ferry_gate_horizon SET partial_seq = GREATEST(coalesce(partial_seq, 0), ?), \
                     ticked_at = UTC_TIMESTAMP(6), ticker_conn = ? WHERE id = 1";

/// Ticker: committed rows (ticker.rs).
pub(crate) const TICKER_COMMITTED_ROWS: &str =
    "SELECT seq FROM ferry_outbox WHERE seq > ? AND seq <= ?";

/// Ticker: dirty read (ticker.rs).
pub(crate) const TICKER_DIRTY_READ: &str =
    "SELECT seq, shard_slot FROM ferry_outbox WHERE seq > ? AND seq <= ?";

/// Cursor read: horizon (ticker.rs).
pub(crate) const CURSOR_READ_HORIZON: &str =
    "SELECT h.horizon_seq, h.partial_seq, EXISTS (SELECT 1 FROM ferry_outbox_exception \
           WHERE state IN ('PENDING', 'CLAIMED', 'QUARANTINED')), x.shard_slot, x.below_seq \
         FROM ferry_gate_horizon h LEFT JOIN ferry_gate_hold x ON h.partial_seq IS NOT NULL \
         WHERE h.id = 1";
